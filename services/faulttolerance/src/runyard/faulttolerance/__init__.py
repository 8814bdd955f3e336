"""Fault tolerance (SPEC R-30 to R-35): env check, restarts, reschedules, hangs, slowdowns.

Modules (import them directly; this package imports nothing so that the
env check program runs in a worker's image with the standard library alone):

- `bootcheck`: the env check program, `python -m runyard.faulttolerance.bootcheck`
  (or `python bootcheck.py`: it needs only the standard library, and torch for
  the all-reduce);
- `slowdown`, `resume`, `hang`: the detectors;
- `stacks`: the report of a capture (the capture itself is the deployer's: a
  `CaptureStacks` command, answered by `StacksCaptured`);
- `ftlog`: the fault-tolerance log of a task, a pure view of its events
  (`fault_tolerance_log`, `read_fault_tolerance_log`);
- `app`, `main`, `reports`, `http`: the service and its own routes.
"""

"""`python -m runyard.scheduler`: the scheduler service as a process of its own."""

from runyard.stack.serve import main

main("scheduler")

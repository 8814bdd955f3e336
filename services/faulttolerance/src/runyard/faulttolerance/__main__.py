"""`python -m runyard.faulttolerance`: the faulttolerance service as a process of its own."""

from runyard.stack.serve import main

main("faulttolerance")

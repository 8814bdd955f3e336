"""`python -m runyard.logs`: the logs service as a process of its own."""

from runyard.stack.serve import main

main("logs")

"""`python -m runyard.submission`: the submission service as a process of its own."""

from runyard.stack.serve import main

main("submission")

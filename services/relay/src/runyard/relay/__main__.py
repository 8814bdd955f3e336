"""`python -m runyard.relay`: the relay service as a process of its own."""

from runyard.stack.serve import main

main("relay")

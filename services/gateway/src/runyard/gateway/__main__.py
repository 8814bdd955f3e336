"""`python -m runyard.gateway`: the gateway service as a process of its own."""

from runyard.stack.serve import main

main("gateway")

"""`python -m runyard.deployer`: the deployer service as a process of its own."""

from runyard.stack.serve import main

main("deployer")

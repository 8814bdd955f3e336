"""`python -m runyard.notification`: the notification service as a process of its own."""

from runyard.stack.serve import main

main("notification")

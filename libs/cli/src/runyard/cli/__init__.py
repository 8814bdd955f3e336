"""The `runyard` command line (`runyard.cli.main:app`).

`main` is imported first, whichever module of the CLI is asked for: it defines the
app and the shared options, then imports the modules that register the other
commands, each of which imports `main` back. Asking for one of those first
(`import runyard.cli.audit`) would otherwise find `main` half made.
"""

from runyard.cli import main as _main  # noqa: F401

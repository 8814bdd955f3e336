"""Files the CLI writes from a download (a support bundle, a log export).

The target is looked at before anything is asked of the gateway, so a typo in a
folder name costs no export and shows no traceback. The download goes to
`FILE.part` first and takes the file's name only when it is whole, so a cut
connection never leaves a file that looks complete.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import typer
from runyard.cli.main import err
from runyard.cli.terminal import markup

#: How often a download reports progress.
PROGRESS_BYTES = 8 * 1024 * 1024
#: Exit status of a target that cannot be written (as a usage error).
EXIT_BAD_TARGET = 2


def check_target(target: Path) -> None:
    """Exit with a clear error when `target` cannot be written: a folder, a missing
    folder above it, or one this user may not write in."""
    folder = target.parent
    why = None
    if target.is_dir():
        why = "it is a folder"
    elif not folder.is_dir():
        why = f"the folder {folder} does not exist"
    elif not os.access(folder, os.W_OK | os.X_OK):
        why = f"this user may not write in {folder}"
    elif target.exists() and not os.access(target, os.W_OK):
        why = "this user may not replace it"
    if why is not None:
        err.print(f"[red]error:[/red] cannot write {markup(target)}: {markup(why)}")
        err.print("hint: give a file in a folder you can write, e.g. ./" + markup(target.name))
        raise typer.Exit(EXIT_BAD_TARGET)


def save(answer: httpx.Response, target: Path) -> int:
    """Stream `answer`'s body into `target` (through `target.part`); its size in bytes.
    A body cut short raises `httpx.ReadError` (inside a client's `stream`: the gateway
    unreachable), a file that cannot be written exits with its reason; either way no
    file is left behind."""
    partial = target.with_name(target.name + ".part")
    expected = int(answer.headers.get("content-length") or 0)
    done, reported = 0, 0
    try:
        with partial.open("wb") as sink:
            for chunk in answer.iter_bytes():
                sink.write(chunk)
                done += len(chunk)
                if done - reported >= PROGRESS_BYTES:
                    reported = done
                    err.print(f"received {done // 1024} KiB of {expected // 1024} KiB")
        if expected and done != expected:
            raise httpx.ReadError(f"got {done} of {expected} bytes")
    except OSError as exc:  # the disk full, the folder removed meanwhile
        partial.unlink(missing_ok=True)
        err.print(f"[red]error:[/red] cannot write {markup(target)}: {markup(exc.strerror or exc)}")
        err.print("hint: give a file in a folder you can write, with room for it")
        raise typer.Exit(EXIT_BAD_TARGET) from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.replace(target)
    return done

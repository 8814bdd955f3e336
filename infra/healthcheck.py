"""A container's health probe: GET http://127.0.0.1:<port><path>, exit 0 on a 2xx.

docker-compose's healthchecks run it (`python /app/infra/healthcheck.py 8101`),
since the slim image has no curl. The port defaults to RUNYARD_SERVICE_PORT,
the path to /healthz (the process is alive); `/readyz` asks whether it is
connected to Postgres and the broker as well. Standard library only, so the
probe costs an interpreter start and no import of Runyard.

    python infra/healthcheck.py [port] [path]
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request

TIMEOUT_S = 3.0


def probe(port: int, path: str = "/healthz") -> str | None:
    """None when the service answers 2xx, else why not (one line)."""
    url = f"http://127.0.0.1:{port}{path}"
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S) as answer:
            return None if 200 <= answer.status < 300 else f"{url}: HTTP {answer.status}"
    except urllib.error.HTTPError as exc:
        return f"{url}: HTTP {exc.code}"
    except OSError as exc:
        return f"{url}: {exc}"


def main(argv: list[str]) -> int:
    port = int(argv[1] if len(argv) > 1 else os.environ.get("RUNYARD_SERVICE_PORT", "0"))
    path = argv[2] if len(argv) > 2 else "/healthz"
    failure = probe(port, path)
    if failure is not None:
        print(failure, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

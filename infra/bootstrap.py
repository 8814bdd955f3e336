"""One-shot steps of a deployment, run from the control-plane image.

    python infra/bootstrap.py migrate        migrations, grants and topics
    python infra/bootstrap.py token PATH     the first admin token (printed, kept in PATH)

`migrate` is docker-compose's `migrate` service and Kubernetes' `runyard-migrate`
Job, run once per rollout before the services. Each service also applies its
own migrations when it starts, but only the owner role may run DDL and no
service holds the owner's password: this step is the one place that does (as
RUNYARD_OWNER_DATABASE_URL), then grants the services' roles their rights
(runyard.stack.roles). It also creates the Kafka topics with their partition
counts (the deployer's command topic among them), as the relay's broker user
(the only one allowed to), so that no consumer starts on a missing topic.
Idempotent: what exists is left alone.

`token` is how the first platform admin gets in where `runyard up` is not the
one starting the stack (it mints the same `dev` admin token, with the
DATABASE_URL of the container it runs in, and reuses it while it is valid):
`docker compose exec gateway python /app/infra/bootstrap.py token
/var/lib/runyard/token`. Revoke it once real tokens exist.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from runyard.deployer.main import ensure_command_topic
from runyard.messaging import KafkaSettings, ensure_topics
from runyard.stack.up import migrate

USAGE = "usage: python infra/bootstrap.py {migrate | token PATH}"


async def migrate_all() -> None:
    """Every migration and grant as the owner role, then the topics."""
    owner_dsn = os.environ.get("RUNYARD_OWNER_DATABASE_URL") or os.environ["DATABASE_URL"]
    applied = await migrate(owner_dsn, grants=True)
    print(f"migrate: {len(applied)} migration(s) applied: {', '.join(applied) or 'none missing'}")
    if not os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        print("migrate: KAFKA_BOOTSTRAP_SERVERS unset, topics left to the services")
        return
    kafka = KafkaSettings.from_env()
    created = await ensure_topics(kafka.bootstrap, kafka.topics, **kafka.security.client_options())
    print(f"migrate: {len(created)} topic(s) created: {', '.join(created) or 'all there'}")
    # The deployer's command topic too, so that fault tolerance can send a stack
    # capture before any deployer has started (each creates it when missing).
    await ensure_command_topic(kafka)


async def admin_token(path: Path) -> str:
    """The dev platform admin token in `path` (minted when missing or no longer valid)."""
    from runyard.api.auth import ensure_dev_token

    token: str = await ensure_dev_token(os.environ["DATABASE_URL"], path)
    return token


def main(argv: list[str]) -> int:
    if argv[1:2] == ["migrate"] and len(argv) == 2:
        if not (os.environ.get("RUNYARD_OWNER_DATABASE_URL") or os.environ.get("DATABASE_URL")):
            print("migrate: set RUNYARD_OWNER_DATABASE_URL (the owner role's DSN)", file=sys.stderr)
            return 2
        asyncio.run(migrate_all())
        return 0
    if argv[1:2] == ["token"] and len(argv) == 3 and os.environ.get("DATABASE_URL"):
        print(asyncio.run(admin_token(Path(argv[2]))))
        return 0
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))

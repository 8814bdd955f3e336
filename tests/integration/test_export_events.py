"""`runyard export-events` and `runyard import-events` on a real Postgres: the round
trip gives the same events and the same folded states, masked values never
leave the store, and an import refuses a store that is not empty."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from runyard.cli import audit as cli_audit
from runyard.cli.main import app as cli_app
from runyard.contracts import Metadata, NewEvent, default_mapper
from runyard.contracts.pool_events import NodeUncordoned
from runyard.contracts.spec import TaskSpec
from runyard.domain import TaskState, fold
from runyard.eventstore import PostgresEventStore, export
from runyard.eventstore.audit import mask_payload
from runyard.eventstore.export import FIELDS
from typer.testing import CliRunner, Result

from tests.conftest import fresh_database
from tests.integration.audit_log import (
    SECRET_REF,
    T0,
    WEBHOOK_PATH,
    AuditLog,
    connect,
)


async def _cli(*args: str) -> Result:
    return await asyncio.to_thread(CliRunner().invoke, cli_app, list(args))


async def _rows(store: PostgresEventStore) -> list[dict[str, object]]:
    async with store.pool.acquire() as conn:
        rows = await conn.fetch(
            "SELECT global_position, event_id, stream_id, stream_version, event_type,"
            " schema_version, data, metadata, occurred_at, recorded_at"
            " FROM events ORDER BY global_position"
        )
    return [
        {**r, "data": json.loads(r["data"]), "metadata": json.loads(r["metadata"])} for r in rows
    ]


async def test_round_trip_gives_the_same_events_and_states(
    log: AuditLog,
    dsn: str,
    postgres_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(cli_audit, "PROGRESS_EVERY", 10)
    monkeypatch.setattr(export, "BATCH", 7)  # several pages of the store
    exported = tmp_path / "incident.jsonl"
    result = await _cli("export-events", "--dsn", dsn, "-o", str(exported))
    assert result.exit_code == 0, result.output
    progress = [line for line in result.stderr.splitlines() if "(position" in line]
    assert len(progress) == len(log.events) // 10, "progress every 10 events on stderr"
    assert f"exported {len(log.events)} events" in result.stderr
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert all(set(FIELDS) <= set(line) for line in lines)
    text = exported.read_text()
    assert SECRET_REF not in text and WEBHOOK_PATH not in text and "******" in text

    async with fresh_database(postgres_url) as target:
        result = await _cli("import-events", str(exported), "--dsn", target)
        assert result.exit_code == 0, result.output
        copy = await connect(target)
        try:
            source_rows, copy_rows = await _rows(log.store), await _rows(copy)
            masked = [{**r, "data": mask_payload(r["data"])} for r in source_rows]
            assert copy_rows == masked
            streams = "SELECT stream_id, version FROM streams ORDER BY stream_id"
            async with log.store.pool.acquire() as a, copy.pool.acquire() as b:
                assert await a.fetch(streams) == await b.fetch(streams)
                facets = "SELECT * FROM audit_facets ORDER BY kind, value, global_position"
                assert await a.fetch(facets) == await b.fetch(facets)
            for task, state in log.states.items():
                copied = fold(await copy.read_stream(f"task-{task}"))
                source = fold(await log.store.read_stream(f"task-{task}"))
                assert copied == _masked_state(source)
                assert (copied.status, copied.run, copied.attempt) == (
                    state.status, state.run, state.attempt,
                )  # fmt: skip
            # the imported store goes on: versions and positions continue
            head = max(e.position for e in log.events)
            meta = Metadata(actor="user:ops/root")
            appended = await copy.append(
                "pool-h100",
                [NewEvent(NodeUncordoned(node="h2"), meta, T0)],
                expected=sum(e.stream_id == "pool-h100" for e in log.events),
            )
            assert appended.positions == (head + 1,)
            # and an import refuses a store that is not empty
            again = await _cli("import-events", str(exported), "--dsn", target)
            assert again.exit_code == 1
            assert "import.store_not_empty" in again.stderr and "empty" in again.stderr
            assert len(await _rows(copy)) == len(log.events) + 1
        finally:
            await copy.close()


def _masked_state(state: TaskState) -> TaskState:
    """The fold of the source with the export's masking applied to its spec."""
    spec = TaskSpec.model_validate(mask_payload(state.spec.model_dump(mode="json")))
    return replace(state, spec=spec)


async def test_export_of_one_task_in_a_window(log: AuditLog, dsn: str, tmp_path: Path) -> None:
    since, until = T0 + timedelta(minutes=3), T0 + timedelta(minutes=12)
    result = await _cli(
        "export-events", "--dsn", dsn, "--task", "ta-1",
        "--from", since.isoformat(), "--to", until.isoformat(),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    positions = [json.loads(line)["position"] for line in result.stdout.splitlines()]
    expected = [e.position for e in log.events if e.task == "ta-1" and since <= e.at < until]
    assert positions == expected and expected


async def test_a_file_that_is_not_an_export_writes_nothing(
    log: AuditLog, postgres_url: str, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"position": 1}\n')
    async with fresh_database(postgres_url) as target:
        result = await _cli("import-events", str(broken), "--dsn", target)
        assert result.exit_code == 1
        assert "import.bad_line" in result.stderr and "line 1" in result.stderr
        store = await PostgresEventStore.connect(target, default_mapper())
        try:
            assert await store.head_position() == 0
        finally:
            await store.close()

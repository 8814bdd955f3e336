"""The scheduler service on a real Postgres: the app layer driven event by event.

Tests append task events as the other services would (through the task
domain's `decide`), hand each stored event to `SchedulerApp.handle` as the
Kafka consumer would, and read the streams back. One slow test runs the whole
path through the relay, Kafka and the service's `run()`.
"""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from runyard.contracts import Event, Metadata, NewEvent, RecordedEvent, default_mapper
from runyard.contracts.pool_events import WorkersAllocated, WorkersReleased
from runyard.contracts.spec import SpotOptions, TaskSpec
from runyard.contracts.task_events import (
    ResourcesReleased,
    TaskFailed,
    TaskMarkedAbnormal,
    TaskPlaced,
    TaskPreempted,
    TaskQueued,
    TaskRequeued,
    TaskRescheduleFailed,
    TaskSucceeded,
)
from runyard.domain.task import (
    Command,
    RequestReschedule,
    RequestStop,
    Rerun,
    Submit,
    decide,
    fold,
)
from runyard.eventstore import PostgresEventStore
from runyard.messaging import KafkaSettings
from runyard.scheduler.app import SchedulerApp
from runyard.scheduler.config import parse_pools
from runyard.scheduler.domain import fold_pool
from runyard.scheduler.views import (
    ensure_schema,
    list_pools,
    read_pool_view,
    read_queue,
    read_queue_entries,
)

pytestmark = pytest.mark.integration

POOLS = {
    "pools": [
        {
            "id": "dev-a100",
            "zone": "cn-north-1",
            "resource_type": "subscription",
            "gpu_model": "A100",
            "network": "roce",
            "specs": [
                {"name": f"{g}gpu", "gpus": g, "cpus": 12 * g, "memory_gib": 100 * g}
                for g in (1, 2, 4, 8)
            ],
            "nodes": {"prefix": "a-", "count": 4},
        },
        {
            "id": "dev-spot",
            "zone": "cn-north-1",
            "resource_type": "spot",
            "gpu_model": "A100",
            "network": "ethernet",
            "specs": [{"name": "8gpu", "gpus": 8, "cpus": 96, "memory_gib": 800}],
            "nodes": {"prefix": "s-", "count": 2},
        },
    ]
}
T0 = datetime(2026, 1, 1, tzinfo=UTC)


class Clock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def spec(worker_spec: str = "8gpu", count: int = 1, pool: str = "dev-a100", **kw: Any) -> TaskSpec:
    return TaskSpec(
        name="t",
        pool=pool,
        worker_spec=worker_spec,
        worker_count=count,
        image="img",
        command="python train.py",
        resource_type="spot" if pool == "dev-spot" else "subscription",
        **kw,
    )


class Harness:
    """A store, one or more scheduler apps, and helpers acting as the other services."""

    def __init__(self, store: PostgresEventStore, apps: list[SchedulerApp], clock: Clock) -> None:
        self.store = store
        self.apps = apps
        self.clock = clock

    @property
    def app(self) -> SchedulerApp:
        return self.apps[0]

    async def events(self, stream: str) -> list[RecordedEvent[Event]]:
        return await self.store.read_stream(stream)

    async def types(self, task_id: str) -> list[str]:
        return [e.type for e in await self.events(f"task-{task_id}")]

    async def append(self, task_id: str, events: list[Event]) -> list[RecordedEvent[Event]]:
        stream = f"task-{task_id}"
        version = await self.store.stream_version(stream)
        meta = Metadata(actor="user:acme/alice")
        await self.store.append(
            stream, [NewEvent(e, meta, self.clock.now) for e in events], version
        )
        return await self.store.read_stream(stream, version + 1)

    async def command(self, task_id: str, command: Command, *, deliver: bool = True) -> None:
        """Decide a command as its owning service would, append, and deliver it."""
        stream = await self.events(f"task-{task_id}")
        state = fold(stream) if stream else None
        new = decide(state, command, now=self.clock.now, ids=lambda: "x")
        recorded = await self.append(task_id, new)
        if deliver:
            await self.deliver(recorded)

    async def submit(self, task_id: str, task_spec: TaskSpec, *, deliver: bool = True) -> None:
        await self.command(task_id, Submit(task_id, "acme", "alice", task_spec), deliver=deliver)

    async def finish(self, task_id: str) -> None:
        """The deployer reports success."""
        state = fold(await self.events(f"task-{task_id}"))
        await self.deliver(
            await self.append(task_id, [TaskSucceeded(run=state.run, attempt=state.attempt)])
        )

    async def deliver(self, events: list[RecordedEvent[Event]]) -> None:
        for event in events:
            for app in self.apps:
                await app.handle(event)

    async def pool(self, pool_id: str = "dev-a100") -> Any:
        return fold_pool(e.event for e in await self.events(f"pool-{pool_id}"))


@contextlib.asynccontextmanager
async def harness(dsn: str, apps: int = 1) -> Any:
    clock = Clock()
    stores = [await PostgresEventStore.connect(dsn, default_mapper()) for _ in range(apps)]
    instances = [SchedulerApp(s, parse_pools(POOLS), clock=clock) for s in stores]
    for app in instances:
        await app.start()
    try:
        yield Harness(stores[0], instances, clock)
    finally:
        for store in stores:
            await store.close()


async def test_start_registers_pools_once_and_writes_views(dsn: str) -> None:
    async with harness(dsn) as h:
        first = await h.events("pool-dev-a100")
    async with harness(dsn) as h:  # a restart registers nothing again
        assert len(await h.events("pool-dev-a100")) == len(first) == 5
        view = await read_pool_view(h.store.pool, "dev-a100")
        assert view is not None
        assert view["capacity"]["launchable"]["8"] == 4
        assert {s["name"]: s["launchable"] for s in view["specs"]}["2gpu"] == 16
        assert [p["pool_id"] for p in await list_pools(h.store.pool)] == ["dev-a100", "dev-spot"]


async def test_the_first_views_of_all_pools_appear_at_once(dsn: str) -> None:
    """The submission checks specs against `pools.yaml` until the scheduler's first views
    are written: seeing one pool's view and not the other's, it refused tasks of the
    other ("pool dev-spot does not exist")."""
    store = await PostgresEventStore.connect(dsn, default_mapper())
    try:
        await ensure_schema(store.pool)
        await store.pool.execute(
            """CREATE TABLE view_writes (pool_id text, tx bigint);
               CREATE FUNCTION note_view_write() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN
                   INSERT INTO view_writes VALUES (NEW.pool_id, txid_current());
                   RETURN NEW;
               END $$;
               CREATE TRIGGER note_view_write AFTER INSERT ON scheduler_pool_views
               FOR EACH ROW EXECUTE FUNCTION note_view_write();"""
        )
        await SchedulerApp(store, parse_pools(POOLS), clock=Clock()).start()
        writes = await store.pool.fetch("SELECT pool_id, tx FROM view_writes")
        assert sorted(w["pool_id"] for w in writes) == ["dev-a100", "dev-spot"]
        assert len({w["tx"] for w in writes}) == 1, "written in separate transactions"
    finally:
        await store.close()


async def test_placement_writes_workers_allocated_and_task_placed_together(dsn: str) -> None:
    async with harness(dsn) as h:
        await h.submit("t1", spec("4gpu", count=2))
        task = await h.events("task-t1")
        assert [e.type for e in task] == ["TaskSubmitted", "TaskPlaced"]
        placed = task[1].event
        assert isinstance(placed, TaskPlaced) and placed.attempt == 1
        allocated = (await h.events("pool-dev-a100"))[-1]
        assert isinstance(allocated.event, WorkersAllocated)
        assert allocated.event.task_id == "t1"
        assert [w.gpus for w in allocated.event.workers] == [w.gpus for w in placed.workers]
        # Each worker with the CPUs and memory of its spec, for the deployer.
        assert [(w.cpus, w.memory_gib) for w in placed.workers] == [(48, 400)] * 2
        # One transaction: the two events got neighbouring global positions.
        assert abs(allocated.global_position - task[1].global_position) == 1
        view = await read_pool_view(h.store.pool, "dev-a100")
        assert view is not None
        assert view["occupancy"]["items"][0]["task_id"] == "t1"
        assert view["capacity"]["free_gpus"] == 24


async def test_gang_waits_holding_nothing_then_starts_after_a_release(dsn: str) -> None:
    async with harness(dsn) as h:
        await h.submit("one", spec("8gpu"))
        await h.submit("gang", spec("8gpu", count=4))
        assert await h.types("gang") == ["TaskSubmitted", "TaskQueued"]
        queued = (await h.events("task-gang"))[-1].event
        assert isinstance(queued, TaskQueued)
        assert "needs 4 x 8-GPU workers, pool can start 3" in queued.reason
        assert queued.position == 0 and queued.launchable == 3
        pool = await h.pool()
        assert set(pool.allocations) == {"one"}, "the waiting gang holds nothing"

        await h.finish("one")
        assert (await h.types("one"))[-1] == "ResourcesReleased"
        assert (await h.types("gang"))[-1] == "TaskPlaced"
        pool = await h.pool()
        assert set(pool.allocations) == {"gang"} and pool.free_gpus == 0
        released = [e.event for e in await h.events("pool-dev-a100")][-2]
        assert isinstance(released, WorkersReleased) and released.task_id == "one"


async def test_a_wait_is_one_task_queued_while_the_read_model_follows_the_queue(
    dsn: str,
) -> None:
    async with harness(dsn) as h:
        await h.submit("big", spec("8gpu", count=4))
        await h.submit("w1", spec("8gpu", count=4))
        await h.submit("w2", spec("8gpu", count=4))
        assert await h.types("w2") == ["TaskSubmitted", "TaskQueued"]
        entries = await read_queue_entries(h.store.pool, ["w1", "w2", "big"])
        assert set(entries) == {"w1", "w2"}, "only waiting tasks have a row"
        assert entries["w2"]["position"] == 1
        assert entries["w2"]["reason"] == "needs 4 x 8-GPU workers, pool can start 0; 1 task ahead"
        await h.app.tick()  # nothing changed: nothing appended
        assert await h.types("w2") == ["TaskSubmitted", "TaskQueued"]
        await h.finish("big")
        assert (await h.types("w1"))[-1] == "TaskPlaced"
        # w2 moved up: the read model says so, the task's history does not
        assert await h.types("w2") == ["TaskSubmitted", "TaskQueued"]
        entries = await read_queue_entries(h.store.pool, ["w1", "w2"])
        assert set(entries) == {"w2"}
        assert entries["w2"]["position"] == 0
        assert entries["w2"]["reason"].endswith("; first in queue")


async def test_task_queued_again_only_when_the_wait_changes_kind(dsn: str) -> None:
    async with harness(dsn) as h:
        await h.submit("big", spec("8gpu", count=4))
        await h.submit("gang", spec("8gpu", count=4))
        node = next(iter((await h.pool()).nodes))
        await h.app.cordon_node("dev-a100", node)  # 3 schedulable nodes: 4 workers never fit
        await h.app.cordon_node("dev-a100", node)
        events = [e.event for e in await h.events("task-gang")]
        assert [getattr(e, "blocked", None) for e in events[1:]] == [False, True]
        assert isinstance(events[-1], TaskQueued)
        assert "even if idle" in events[-1].reason
        entry = (await read_queue_entries(h.store.pool, ["gang"]))["gang"]
        assert entry["blocked"] and "could start only 3 even if idle" in entry["reason"]
        await h.app.uncordon_node("dev-a100", node)
        events = [e.event for e in await h.events("task-gang")]
        assert [getattr(e, "blocked", None) for e in events[1:]] == [False, True, False]


async def test_150_queued_tasks_append_one_task_queued_each_and_the_api_shows_them_move(
    dsn: str,
) -> None:
    """Positions are derived data: 150 waiting tasks moving up the queue add no event
    to their streams, while the read model (and so the API) shows where each stands;
    the read model equals a rebuild from the log."""
    async with harness(dsn) as h:
        await h.submit("full", spec("8gpu", count=4))
        ids = [f"q{n:03}" for n in range(150)]
        for n, task_id in enumerate(ids):
            h.clock.now += timedelta(seconds=1)
            await h.submit(task_id, spec("1gpu" if n % 3 else "2gpu", priority=n % 2))
        order = sorted(ids, key=lambda t: (-(int(t[1:]) % 2), t))  # priority, then submission
        await _expect_positions(h, order)

        await h.finish("full")  # 32 GPUs free: the first tasks start, the rest move up
        placed = [t for t in ids if "TaskPlaced" in await h.types(t)]
        assert placed and len(placed) < len(ids)
        waiting = [t for t in order if t not in placed]
        assert waiting == order[len(placed) :], "the queue starts in order"
        await _expect_positions(h, waiting)
        for task_id in ids:
            counts = (await h.types(task_id)).count("TaskQueued")
            assert counts == 1, f"{task_id}: {counts} TaskQueued for one wait"

        # a placed task leaving makes room: positions move again, still no event
        await h.finish(placed[0])
        moved = [t for t in waiting if "TaskPlaced" not in await h.types(t)]
        assert len(moved) < len(waiting)
        await _expect_positions(h, moved)
        assert [(await h.types(t)).count("TaskQueued") for t in ids] == [1] * len(ids)

        live = await read_queue(h.store.pool, "dev-a100")
        assert [row["task_id"] for row in live] == moved
    async with harness(dsn) as rebuilt:  # a fresh scheduler rebuilds from the log
        assert await read_queue(rebuilt.store.pool, "dev-a100") == live
        assert [(await rebuilt.types(t)).count("TaskQueued") for t in ids] == [1] * len(ids)


async def test_queue_rows_lost_with_a_rolled_back_transaction_come_back_at_the_tick(
    dsn: str,
) -> None:
    """The consumer writes queue rows in its batch transaction; if that rolls back (a
    database outage mid-batch), the next tick finds the rows missing and writes them."""
    async with harness(dsn) as h:
        await h.submit("full", spec("8gpu", count=4))
        await h.submit("kept", spec("1gpu"))
        await h.submit("lost", spec("1gpu"), deliver=False)
        async with h.store.pool.acquire() as conn:
            transaction = conn.transaction()
            await transaction.start()
            for event in await h.events("task-lost"):
                await h.app.handle(event, conn)  # its row goes on the consumer's connection
            await transaction.rollback()
        assert (await h.types("lost"))[-1] == "TaskQueued", "the event itself was appended"
        assert set(await read_queue_entries(h.store.pool, ["kept", "lost"])) == {"kept"}
        await h.app.tick()
        entries = await read_queue_entries(h.store.pool, ["kept", "lost"])
        assert {t: e["position"] for t, e in entries.items()} == {"kept": 0, "lost": 1}
        # the same for a delete: "kept" is stopped in a transaction that rolls back
        await h.command("kept", RequestStop("kept", by="bob", role="member"), deliver=False)
        async with h.store.pool.acquire() as conn:
            transaction = conn.transaction()
            await transaction.start()
            for event in await h.events("task-kept"):
                await h.app.handle(event, conn)
            await transaction.rollback()
        assert set(await read_queue_entries(h.store.pool, ["kept", "lost"])) == {"kept", "lost"}
        await h.app.tick()
        entries = await read_queue_entries(h.store.pool, ["kept", "lost"])
        assert {t: e["position"] for t, e in entries.items()} == {"lost": 0}


async def test_a_pool_view_lost_with_a_rolled_back_transaction_comes_back_at_the_tick(
    dsn: str,
) -> None:
    """The consumer writes pool views in its batch transaction too; if that rolls back,
    the next tick writes the view again from what the scheduler holds."""
    async with harness(dsn) as h:
        await h.submit("t1", spec("4gpu", count=2), deliver=False)
        async with h.store.pool.acquire() as conn:
            transaction = conn.transaction()
            await transaction.start()
            for event in await h.events("task-t1"):
                await h.app.handle(event, conn)
            await transaction.rollback()
        assert (await h.types("t1"))[-1] == "TaskPlaced", "the placement itself was appended"
        view = await read_pool_view(h.store.pool, "dev-a100")
        assert view is not None and view["capacity"]["free_gpus"] == 32  # the lost write
        await h.app.tick()
        view = await read_pool_view(h.store.pool, "dev-a100")
        assert view is not None and view["capacity"]["free_gpus"] == 24
        assert view["occupancy"]["items"][0]["task_id"] == "t1"


async def test_a_log_from_before_the_rule_still_folds_and_gets_nothing_appended(
    dsn: str,
) -> None:
    """A log written by an older scheduler holds a v1 TaskQueued per position change;
    it folds, and a scheduler starting on it appends nothing for the same wait."""
    import json

    async with harness(dsn) as h:
        await h.submit("full", spec("8gpu", count=4))
        await h.submit("old", spec("1gpu"), deliver=False)
        for version, ahead in enumerate([5, 4, 3, 2, 1, 0], start=2):
            reason = f"needs 1 x 1-GPU worker, pool can start 0; {ahead} tasks ahead"
            await h.store.pool.execute(
                """INSERT INTO events (event_id, stream_id, stream_version, event_type,
                       schema_version, data, metadata, occurred_at)
                   VALUES (gen_random_uuid(), 'task-old', $1, 'TaskQueued', 1, $2, $3, now())""",
                version,
                json.dumps(
                    {
                        "run": 1,
                        "reason": reason,
                        "position": ahead,
                        "gpus_needed": 1,
                        "launchable": 0,
                    }
                ),
                json.dumps({"actor": "service:scheduler"}),
            )
    async with harness(dsn) as h:  # a scheduler of today starts on that log
        events = await h.events("task-old")
        assert [e.type for e in events] == ["TaskSubmitted"] + ["TaskQueued"] * 6
        state = fold(events)
        assert state.status == "queued" and state.queue is not None
        assert (state.queue.position, state.queue.blocked) == (0, False)
        entry = (await read_queue_entries(h.store.pool, ["old"]))["old"]
        assert entry["reason"] == "needs 1 x 1-GPU worker, pool can start 0; first in queue"


async def _expect_positions(h: Harness, order: list[str]) -> None:
    entries = await read_queue_entries(h.store.pool, order)
    assert [entries[t]["position"] for t in order] == list(range(len(order)))
    for n, task_id in enumerate(order):
        place = "first in queue" if n == 0 else f"{n} task{'s' if n > 1 else ''} ahead"
        assert entries[task_id]["reason"].endswith(f"; {place}"), entries[task_id]


async def test_stop_of_a_queued_task(dsn: str) -> None:
    async with harness(dsn) as h:
        await h.submit("full", spec("8gpu", count=4))
        await h.submit("waits", spec("1gpu"))
        assert (await h.types("waits"))[-1] == "TaskQueued"
        await h.command("waits", RequestStop("waits"))
        assert (await h.types("waits"))[-2:] == ["TaskStopRequested", "TaskStopped"]
        assert h.app.view("dev-a100")["queue"]["waiting"] == 0
        view = await read_pool_view(h.store.pool, "dev-a100")
        assert view is not None and view["queue"]["waiting"] == 0


async def test_stop_requested_alone_on_a_queued_task_is_confirmed(dsn: str) -> None:
    from runyard.contracts.task_events import TaskStopRequested

    async with harness(dsn) as h:
        await h.submit("full", spec("8gpu", count=4))
        await h.submit("waits", spec("1gpu"))
        await h.deliver(await h.append("waits", [TaskStopRequested(reason="owner")]))
        assert (await h.types("waits"))[-1] == "TaskStopped"
        assert h.app.view("dev-a100")["queue"]["waiting"] == 0


async def test_the_sweep_acts_on_an_event_that_never_reached_the_scheduler(dsn: str) -> None:
    async with harness(dsn) as h:
        await h.submit("lost", spec("8gpu"), deliver=False)
        # First sighting: it may still be on its way to the consumer.
        assert await h.app.sweep() == []
        assert await h.types("lost") == ["TaskSubmitted"]
        h.clock.now += timedelta(seconds=30)
        # Still not folded at the next sweep: read from the log and placed.
        assert await h.app.sweep() == ["lost"]
        assert await h.types("lost") == ["TaskSubmitted", "TaskPlaced"]
        assert await h.app.sweep() == []  # nothing more to do


async def test_a_sweep_cut_short_by_an_outage_keeps_what_it_had_read(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep reads the log on from where it stopped: a batch it read before the
    database went away must still be compared at the next sweep, not skipped."""
    monkeypatch.setattr("runyard.scheduler.app.SWEEP_BATCH", 2)
    async with harness(dsn) as h:
        assert await h.app.sweep() == []
        await h.submit("lost", spec("8gpu"), deliver=False)
        for n in range(3):
            await h.submit(f"other{n}", spec("1gpu"))
        reader = h.app._swept
        assert reader is not None
        read, reads = reader._read, 0

        async def cut(*args: object) -> object:
            nonlocal reads
            reads += 1
            if reads == 2:  # the first batch (with "lost") was read; the next fails
                raise ConnectionResetError("the database went away")
            return await read(*args)

        monkeypatch.setattr(reader, "_read", cut)
        with pytest.raises(ConnectionResetError):
            await h.app.sweep()
        h.clock.now += timedelta(seconds=30)
        assert await h.app.sweep() == []  # first sighting: it may be on its way
        h.clock.now += timedelta(seconds=30)
        assert await h.app.sweep() == ["lost"]
        assert await h.types("lost") == ["TaskSubmitted", "TaskPlaced"]


async def test_an_event_the_consumer_brings_late_is_not_acted_on_twice(dsn: str) -> None:
    async with harness(dsn) as h:
        await h.submit("late", spec("8gpu"), deliver=False)
        assert await h.app.sweep() == []
        await h.deliver(await h.events("task-late"))  # the consumer catches up
        assert await h.types("late") == ["TaskSubmitted", "TaskPlaced"]
        assert await h.app.sweep() == []
        assert await h.types("late") == ["TaskSubmitted", "TaskPlaced"]


async def test_the_sweep_finds_an_event_still_committing_when_the_term_started(dsn: str) -> None:
    """A submission whose append took its position before a new term read the head,
    and committed after the term folded the log, is in neither: were the consumer
    never to bring it, the sweep must."""
    async with harness(dsn) as h:
        submitted = decide(
            None, Submit("slow", "acme", "alice", spec("8gpu")), now=h.clock.now, ids=lambda: "x"
        )
        async with h.store.pool.acquire() as slow:
            transaction = slow.transaction()
            await transaction.start()
            meta = Metadata(actor="user:acme/alice")
            await h.store.append_in(
                slow, "task-slow", [NewEvent(e, meta, h.clock.now) for e in submitted]
            )
            await h.submit("fast", spec("1gpu"))  # a later position, committed
            term = SchedulerApp(h.store, parse_pools(POOLS), clock=h.clock)
            await term.start()
            await transaction.commit()
        assert "slow" not in term.tasks
        assert await term.sweep() == []  # first seen: it may be on its way
        assert await term.sweep() == ["slow"]
        assert (await h.types("slow"))[-1] == "TaskPlaced"


async def test_memory_keeps_the_last_finished_tasks_and_a_forgotten_one_can_run_again(
    dsn: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A long-running scheduler must not hold something for every task that ever
    finished or ran in another pool: it keeps the last REMEMBERED of each. A
    forgotten task is read from its stream at its next event; the sweep, which
    reads only the log recorded since the last one, takes none of them for lost."""
    monkeypatch.setattr("runyard.scheduler.app.REMEMBERED", 2)
    async with harness(dsn) as h:
        for n in range(5):
            await h.submit(f"t{n}", spec("8gpu"))
            await h.finish(f"t{n}")
            await h.submit(f"elsewhere{n}", spec("8gpu", pool="other-pool"))
        assert list(h.app._done) == ["t3", "t4"]
        assert list(h.app._foreign) == ["elsewhere3", "elsewhere4"]
        for _ in range(2):
            assert await h.app.sweep() == []
        assert "never reached it" not in caplog.text
        # A late event of a forgotten task changes nothing; a rerun places it again.
        await h.deliver(await h.append("t0", [ResourcesReleased(run=1, attempt=1, reason="late")]))
        assert (await h.types("t0"))[-1] == "ResourcesReleased"
        await h.command("t0", Rerun("t0"))
        assert (await h.types("t0"))[-1] == "TaskPlaced"
        assert "t0" in h.app.tasks and "t0" not in h.app._done
        await h.finish("t0")
        assert list(h.app._done)[-1] == "t0"
        await h.submit("open", spec("8gpu"))
        for _ in range(2):
            assert await h.app.sweep() == []
        assert "never reached it" not in caplog.text
        # A new term folds the whole log, and keeps as little.
        again = SchedulerApp(h.store, parse_pools(POOLS), clock=h.clock)
        await again.start()
        assert len(again._done) == len(again._foreign) == 2
        assert again.tasks.keys() == {"open"}


async def test_the_sweep_puts_back_a_task_memory_dropped_from_the_queue(dsn: str) -> None:
    async with harness(dsn) as h:
        await h.submit("full", spec("8gpu", count=4))
        await h.submit("waits", spec("1gpu"))
        assert (await h.types("waits"))[-1] == "TaskQueued"
        h.app.pools["dev-a100"].dequeue("waits")  # lost from memory, never from the log
        assert await h.app.sweep() == ["waits"]
        assert h.app.view("dev-a100")["queue"]["waiting"] == 1
        await h.finish("full")
        assert (await h.types("waits"))[-1] == "TaskPlaced"


async def test_spot_shrink_preempts_and_requeues_then_abnormal_past_the_limit(dsn: str) -> None:
    async with harness(dsn) as h:
        limits = SpotOptions(max_requeues=1, max_queue_duration_s=3600)
        await h.submit("low", spec("8gpu", pool="dev-spot", priority=0, spot=limits))
        await h.submit("high", spec("8gpu", pool="dev-spot", priority=5, spot=limits))
        shrink = await h.app.change_spot_capacity("dev-spot", remove=1, reason="provider")
        assert shrink is not None and [p.task_id for p in shrink.preempted] == ["low"]
        events = [e.event for e in await h.events("task-low")]
        assert [type(e) for e in events[-4:]] == [
            TaskPreempted,
            TaskRequeued,
            ResourcesReleased,
            TaskQueued,
        ]
        assert "high" in (await h.pool("dev-spot")).allocations

        await h.app.change_spot_capacity("dev-spot", add=["s-new"])
        assert (await h.types("low"))[-1] == "TaskPlaced"

        await h.app.change_spot_capacity("dev-spot", remove=1)
        events = [e.event for e in await h.events("task-low")]
        assert isinstance(events[-2], TaskMarkedAbnormal), events[-3:]
        assert isinstance(events[-1], ResourcesReleased)
        assert "low" not in (await h.pool("dev-spot")).allocations


async def test_spot_task_past_its_max_queue_duration_goes_abnormal(dsn: str) -> None:
    async with harness(dsn) as h:
        limits = SpotOptions(max_queue_duration_s=60)
        await h.submit("a", spec("8gpu", pool="dev-spot"))
        await h.submit("b", spec("8gpu", pool="dev-spot"))
        await h.submit("late", spec("8gpu", pool="dev-spot", spot=limits))
        assert (await h.types("late"))[-1] == "TaskQueued"
        await h.app.tick(T0 + timedelta(seconds=30))
        assert (await h.types("late"))[-1] == "TaskQueued"
        await h.app.tick(T0 + timedelta(seconds=61))
        last = (await h.events("task-late"))[-1].event
        assert isinstance(last, TaskMarkedAbnormal) and "max single queue duration" in last.reason
        assert h.app.view("dev-spot")["queue"]["waiting"] == 0


async def test_reschedule_moves_the_gang_off_a_faulty_node(dsn: str) -> None:
    async with harness(dsn) as h:
        await h.submit("job", spec("8gpu", count=2))
        bad = (await h.pool()).allocations["job"].workers[0].node
        await h.app.mark_node_faulty("dev-a100", bad, "GPU 3 fell off the bus")
        await h.command("job", RequestReschedule("job", "xid 79", faulty_nodes=(bad,)))
        events = [e.event for e in await h.events("task-job")]
        assert [type(e) for e in events[-3:]][1:] == [ResourcesReleased, TaskPlaced]
        placed = events[-1]
        assert isinstance(placed, TaskPlaced) and placed.attempt == 2
        assert bad not in {w.node for w in placed.workers}
        pool = await h.pool()
        assert bad not in pool.allocations["job"].nodes
        assert pool.nodes[bad].free == 8


async def test_reschedule_without_a_healthy_node_fails_the_task(dsn: str) -> None:
    async with harness(dsn) as h:
        await h.submit("job", spec("8gpu", count=4))
        bad = (await h.pool()).allocations["job"].workers[0].node
        await h.app.mark_node_faulty("dev-a100", bad, "ECC errors")
        await h.command("job", RequestReschedule("job", "ecc", faulty_nodes=(bad,)))
        events = [e.event for e in await h.events("task-job")]
        assert [type(e) for e in events[-3:]] == [
            TaskRescheduleFailed,
            TaskFailed,
            ResourcesReleased,
        ]
        failed = events[-2]
        assert isinstance(failed, TaskFailed) and failed.unrecoverable
        assert (await h.pool()).allocations == {}


async def test_admin_cordon_and_remove(dsn: str) -> None:
    from runyard.scheduler.errors import NodeBusy, UnknownNode, UnknownPool

    async with harness(dsn) as h:
        await h.submit("job", spec("8gpu"))
        busy = (await h.pool()).allocations["job"].workers[0].node
        with pytest.raises(NodeBusy):
            await h.app.remove_node("dev-a100", busy)
        with pytest.raises(UnknownNode):
            await h.app.cordon_node("dev-a100", "nope")
        with pytest.raises(UnknownPool):
            await h.app.add_node("nope", "n")
        idle = next(n for n in (await h.pool()).nodes if n != busy)
        await h.app.cordon_node("dev-a100", idle)
        await h.submit("gang", spec("8gpu", count=3))
        assert (await h.types("gang"))[-1] == "TaskQueued"
        await h.app.uncordon_node("dev-a100", idle)
        assert (await h.types("gang"))[-1] == "TaskPlaced"
        await h.app.add_node("dev-a100", "a-extra")
        view = await read_pool_view(h.store.pool, "dev-a100")
        assert view is not None and view["capacity"]["nodes"] == 5


class CommitsThenFails(PostgresEventStore):
    """A store whose next multi-stream append commits, then raises as a connection lost
    before the answer would: the caller cannot tell whether it was written."""

    armed = False

    async def append_many(self, requests: Any) -> Any:
        result = await super().append_many(requests)
        if self.armed:
            self.armed = False
            raise ConnectionResetError("connection lost after the commit")
        return result


async def test_an_append_of_unknown_outcome_is_read_back_before_the_next_decision(
    dsn: str,
) -> None:
    clock = Clock()
    store = await CommitsThenFails.connect(dsn, default_mapper())
    assert isinstance(store, CommitsThenFails)
    app = SchedulerApp(store, parse_pools(POOLS), clock=clock)
    await app.start()
    h = Harness(store, [app], clock)
    try:
        await h.submit("t1", spec("8gpu"))
        assert (await h.pool()).free_gpus == 24
        state = fold(await h.events("task-t1"))
        succeeded = await h.append("t1", [TaskSucceeded(run=state.run, attempt=state.attempt)])
        store.armed = True  # the release commits, its answer is lost
        with pytest.raises(ConnectionResetError):
            await h.deliver(succeeded)
        await h.deliver(succeeded)  # the consumer hands the event over again
        await app.tick()
        released = [e for e in await h.events("pool-dev-a100") if e.type == "WorkersReleased"]
        assert len(released) == 1  # released once, not again
        assert (await h.pool()).free_gpus == 32
        rebuilt = SchedulerApp(store, parse_pools(POOLS), clock=clock, write_views=False)
        await rebuilt.start()
        assert app.view("dev-a100") == rebuilt.view("dev-a100")
        view = await read_pool_view(store.pool, "dev-a100")
        assert view is not None and view["capacity"]["free_gpus"] == 32
        # Memory goes on from the log: the next task is placed on the freed GPUs.
        await h.submit("t2", spec("8gpu", count=4))
        assert (await h.types("t2"))[-1] == "TaskPlaced"
    finally:
        await store.close()


async def test_two_schedulers_racing_on_one_pool_never_double_book(dsn: str) -> None:
    async with harness(dsn, apps=2) as h:
        shapes = ["1gpu", "2gpu", "4gpu", "8gpu"]
        submitted: list[RecordedEvent[Event]] = []
        for n in range(24):
            await h.submit(f"r{n}", spec(shapes[n % 4], count=1 + n % 2), deliver=False)
            submitted += await h.events(f"task-r{n}")

        async def feed(app: SchedulerApp, order: list[RecordedEvent[Event]]) -> None:
            for event in order:
                await app.handle(event)

        await asyncio.gather(feed(h.apps[0], submitted), feed(h.apps[1], submitted[::-1]))
        # Finish some and let both see everything, concurrently again.
        everything = [e async for e in _all_task_events(h)]
        await asyncio.gather(*(feed(app, everything) for app in h.apps))
        for n in range(0, 24, 3):
            state = fold(await h.events(f"task-r{n}"))
            if state.status == "deploying":
                recorded = await h.append(
                    f"r{n}", [TaskSucceeded(run=state.run, attempt=state.attempt)]
                )
                await asyncio.gather(*(app.handle(recorded[0]) for app in h.apps))

        pool = await h.pool()  # folding raises if any GPU was taken twice
        owners: dict[tuple[str, int], str] = {}
        for allocation in pool.allocations.values():
            for worker in allocation.workers:
                for gpu in worker.gpus:
                    assert (worker.node, gpu) not in owners
                    owners[(worker.node, gpu)] = allocation.task_id
        allocated = [
            e.event.task_id
            for e in await h.events("pool-dev-a100")
            if isinstance(e.event, WorkersAllocated)
        ]
        placed = []
        for n in range(24):
            events = [e.event for e in await h.events(f"task-r{n}")]
            placements = [e for e in events if isinstance(e, TaskPlaced)]
            assert len(placements) <= 1, f"r{n} placed twice"
            placed += [f"r{n}"] * len(placements)
        assert sorted(allocated) == sorted(placed), "every WorkersAllocated has its TaskPlaced"
        assert len(placed) >= 8, "the pool was used"


async def _all_task_events(h: Harness) -> Any:
    rows = await h.store.pool.fetch(
        "SELECT DISTINCT stream_id FROM events WHERE stream_id LIKE 'task-%' ORDER BY 1"
    )
    for row in rows:
        for event in await h.events(row["stream_id"]):
            yield event


@pytest.mark.slow
async def test_through_kafka_a_submitted_task_gets_placed(
    dsn: str, kafka: KafkaSettings, tmp_path: Path
) -> None:
    import yaml
    from runyard.relay import OutboxRelay
    from runyard.scheduler.main import run
    from runyard.stack.context import ServiceContext

    (tmp_path / "pools.yaml").write_text(yaml.safe_dump(POOLS))
    ctx = ServiceContext(dsn=dsn, kafka=kafka, data_dir=tmp_path, config_dir=tmp_path)
    store = await PostgresEventStore.connect(dsn, default_mapper())
    relay = OutboxRelay(store, kafka, broker_check_interval=0.2)
    tasks = [asyncio.create_task(relay.run()), asyncio.create_task(run(ctx))]
    try:
        await asyncio.wait_for(relay.ready.wait(), 30)
        h = Harness(store, [], Clock())
        h.clock.now = datetime.now(UTC)
        await h.submit("via-kafka", spec("2gpu"))
        deadline = asyncio.get_running_loop().time() + 60
        while "TaskPlaced" not in await h.types("via-kafka"):
            assert asyncio.get_running_loop().time() < deadline, await h.types("via-kafka")
            await asyncio.sleep(0.1)
        # the placement commits first; the pool's view row commits with the
        # consumer's inbox row right after it
        while (view := await read_pool_view(store.pool, "dev-a100")) is None or view["capacity"][
            "free_gpus"
        ] != 30:
            assert asyncio.get_running_loop().time() < deadline, view
            await asyncio.sleep(0.1)
        # a task that must wait: its queue row is written in the consumer's transaction
        await h.submit("waits-via-kafka", spec("8gpu", count=4))
        while not (entries := await read_queue_entries(store.pool, ["waits-via-kafka"])):
            assert asyncio.get_running_loop().time() < deadline, await h.types("waits-via-kafka")
            await asyncio.sleep(0.1)
        assert entries["waits-via-kafka"]["reason"] == (
            "needs 4 x 8-GPU workers, pool can start 3; first in queue"
        )
        assert await h.types("waits-via-kafka") == ["TaskSubmitted", "TaskQueued"]
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await store.close()


async def test_placement_names_its_cause_and_keeps_the_correlation(dsn: str) -> None:
    """R-62: what the scheduler writes in reaction to a submission carries the
    submission's id as causation and its correlation id."""
    async with harness(dsn) as h:
        await h.submit("t-cause", spec("1gpu"))
        submitted, placed = await h.events("task-t-cause")
        assert placed.type == "TaskPlaced"
        assert placed.metadata.actor == "service:scheduler"
        assert placed.metadata.causation_id == str(submitted.event_id)
        assert placed.metadata.correlation_id == str(submitted.event_id)


async def test_a_task_the_scheduler_reads_from_the_log_is_placed_naming_its_cause(
    dsn: str,
) -> None:
    """R-62 on the paths that do not come through the consumer: a task submitted while
    no scheduler ran (placed by the start's fold of the log), and one whose event never
    reached the consumer (placed by the sweep). Each placement names the submission as
    its cause and keeps its correlation, on the task and on the pool."""
    async with harness(dsn) as h:
        await h.submit("swept", spec("1gpu"), deliver=False)
        assert await h.app.sweep() == []
        h.clock.now += timedelta(seconds=30)
        assert await h.app.sweep() == ["swept"]
        await h.submit("before-start", spec("1gpu"), deliver=False)
        late = SchedulerApp(h.store, parse_pools(POOLS), clock=h.clock)
        await late.start()
        for task_id in ("swept", "before-start"):
            submitted, placed = await h.events(f"task-{task_id}")
            assert placed.type == "TaskPlaced"
            assert placed.metadata.causation_id == str(submitted.event_id), task_id
            assert placed.metadata.correlation_id == str(submitted.event_id), task_id
            allocated = [
                e
                for e in await h.events("pool-dev-a100")
                if e.type == "WorkersAllocated" and getattr(e.event, "task_id", "") == task_id
            ]
            assert [e.metadata.causation_id for e in allocated] == [str(submitted.event_id)]


async def test_api_shows_where_a_task_waits_and_who_stopped_it(dsn: str, tmp_path: Path) -> None:
    """Over HTTP (and gRPC): the task's queue position and reason come from the scheduler's
    read model, through its API, and move as a task ahead leaves; a stop by another member
    of the tenant, or by a tenant admin for a whole group, names who stopped it and in what
    role."""
    import shutil

    import httpx
    from runyard.api.auth import create_token
    from runyard.gateway.app import Gateway
    from runyard.gateway.http import create_app
    from runyard.scheduler.http import http_app

    repo = Path(__file__).resolve().parents[2]
    shutil.copy(repo / "infra/config/catalogue.yaml", tmp_path / "catalogue.yaml")
    async with harness(dsn) as h:
        # the gateway asks the scheduler's HTTP face where queued tasks stand
        scheduler = httpx.ASGITransport(app=http_app(h.store, role=lambda: "active"))
        gateway = await Gateway.connect(
            dsn,
            tmp_path,
            endpoints={"scheduler": "http://scheduler"},
            http=httpx.AsyncClient(transport=scheduler),
        )
        tokens = {
            who: await create_token(gateway.db, "acme", who, role)
            for who, role in [("alice", "member"), ("bob", "member"), ("carol", "tenant_admin")]
        }
        transport = httpx.ASGITransport(app=create_app(gateway))
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as http:

            async def call(who: str, method: str, path: str, **kw: Any) -> Any:
                auth = {"Authorization": f"Bearer {tokens[who]}"}
                answer = await http.request(method, path, headers=auth, **kw)
                assert answer.status_code < 300, answer.json()
                return answer.json()

            async def submit(**changes: Any) -> str:
                body = {"name": "t", "pool": "dev-a100", "worker_spec": "8gpu"}
                body |= {"image": "pytorch:2.3-cuda12", "command": "python train.py"}
                task_id: str = (await call("alice", "POST", "/v1/tasks", json=body | changes))[
                    "task_id"
                ]
                await h.deliver(await h.events(f"task-{task_id}"))
                return task_id

            await submit(worker_count=4, framework="pytorch_ddp")  # takes every GPU
            first, second, third = [await submit() for _ in range(3)]
            shown = await call("alice", "GET", f"/v1/tasks/{third}")
            assert shown["status"] == "queued"
            assert shown["queue"]["position"] == 2 and shown["queue"]["as_of"]
            assert shown["queue"]["reason"] == (
                "needs 1 x 8-GPU worker, pool can start 0; 2 tasks ahead"
            )

            stopped = await call("bob", "POST", f"/v1/tasks/{first}/stop")
            await h.deliver(await h.events(f"task-{first}"))
            assert stopped["status"] == "stopped"
            assert stopped["stop_reason"] == "stopped by bob (member)"
            timeline = await call("alice", "GET", f"/v1/tasks/{first}/events")
            request = next(e for e in timeline if e["type"] == "TaskStopRequested")
            assert request["actor"] == "user:acme/bob"
            assert request["data"] | {"reason": "?"} == {
                "reason": "?",
                "stopped_by": "bob",
                "role": "member",
                "group_id": None,
            }
            assert "owner" not in request["data"]["reason"]

            shown = await call("alice", "GET", f"/v1/tasks/{third}")
            assert shown["queue"]["position"] == 1
            assert shown["queue"]["reason"].endswith("; 1 task ahead")
            listed = await call("alice", "GET", "/v1/tasks", params={"status": "queued"})
            positions = {row["task_id"]: row["queue"]["position"] for row in listed["items"]}
            assert positions == {second: 0, third: 1}
            assert (await h.types(third)).count("TaskQueued") == 1
            by_grpc = await _grpc_positions(gateway, tokens["alice"], third)
            assert by_grpc == (1, {second: 0, third: 1})

            group = await call(
                "alice",
                "POST",
                "/v1/groups",
                json={
                    "template": {
                        "name": "sweep",
                        "pool": "dev-a100",
                        "worker_spec": "1gpu",
                        "image": "pytorch:2.3-cuda12",
                        "command": "python train.py",
                    },
                    "items": [{"name": "a"}, {"name": "b"}],
                },
            )
            await call("carol", "POST", f"/v1/groups/{group['group_id']}/stop")
            for row in group["tasks"]:
                task = await call("alice", "GET", f"/v1/tasks/{row['task_id']}")
                assert task["stop_reason"] == (
                    f"stopped by carol (tenant_admin) with task group {group['group_id']}"
                )
        await gateway.close()


async def _grpc_positions(gateway: Any, token: str, task_id: str) -> tuple[Any, dict[str, Any]]:
    """The queue position of `task_id` by gRPC GetTask, and of every queued task by ListTasks."""

    import grpc
    from runyard.gateway.grpc_gen import tasks_pb2 as pb
    from runyard.gateway.grpc_gen import tasks_pb2_grpc as pb_grpc
    from runyard.gateway.grpc_server import start_server

    server, port = await start_server(gateway, "127.0.0.1", 0)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.TasksStub(channel)
            auth = (("authorization", f"Bearer {token}"),)
            task = await stub.GetTask(pb.GetTaskRequest(task_id=task_id), metadata=auth)
            page = await stub.ListTasks(pb.ListTasksRequest(status="queued"), metadata=auth)
    finally:
        await server.stop(grace=None)
    listed = {item.task_id: item.queue.position for item in page.tasks}
    assert task.HasField("queue") and all(item.HasField("queue") for item in page.tasks)
    return task.queue.position, listed

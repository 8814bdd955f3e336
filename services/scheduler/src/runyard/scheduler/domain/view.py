"""Free GPUs of a pool as one decision sees them: the pool plus the decision's own changes.

Placement, queue planning, reschedule and spot decisions never change the pool
state: they work on a `FreeView` over it, and what they decide becomes events
that the fold applies. A view keeps, for the nodes the decision touched, their
free GPU indexes and their own free-count buckets; untouched nodes are read
from the pool's buckets, top down, skipping touched ones. A view is valid
until the next event is applied to its pool.

`counts` mirrors the pool's bucket sizes with the view's changes, so "how many
workers of these sizes could start" is a sum over 9 numbers (`count_startable`)
and a gang that cannot start is refused without looking at a single node.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from runyard.contracts.pool_events import GPUS_PER_NODE
from runyard.scheduler.domain.pool import NodeStack, PoolState

_LEVELS = range(GPUS_PER_NODE + 1)


def count_startable(counts: Sequence[int], worker_gpus: Iterable[int]) -> int:
    """How many of the workers best fit places on nodes with these free-GPU counts.

    `counts[f]` is the number of nodes with `f` free GPUs. Workers go biggest
    first, each onto the fullest node that still fits it, exactly as
    `FreeView.pick` does with real nodes, so the two always agree.
    """
    free = list(counts)
    placed = 0
    for gpus, workers in _groups(worker_gpus):
        placed += _fill(free, gpus, workers)
    return placed


def _groups(worker_gpus: Iterable[int]) -> list[tuple[int, int]]:
    sizes: dict[int, int] = {}
    for gpus in worker_gpus:
        sizes[gpus] = sizes.get(gpus, 0) + 1
    return sorted(sizes.items(), reverse=True)


def _fill(free: list[int], gpus: int, workers: int) -> int:
    """Best fit for `workers` workers of `gpus` GPUs: a node is filled before the next."""
    left = workers
    for level in range(gpus, len(free)):
        per_node = level // gpus
        full = min(free[level], left // per_node)
        free[level] -= full
        free[level - per_node * gpus] += full
        left -= full * per_node
        if 0 < left < per_node and free[level]:
            free[level] -= 1
            free[level - left * gpus] += 1
            left = 0
        if not left:
            break
    return workers - left


class FreeView:
    """A pool's free GPUs with one decision's takes and give-backs laid over them."""

    __slots__ = ("_avail", "_delta", "_depth", "_touched_levels", "counts", "pool")

    def __init__(self, pool: PoolState) -> None:
        self.pool = pool
        #: Nodes with `f` free GPUs in this view, as `PoolState.bucket_sizes`.
        self.counts = list(pool.bucket_sizes())
        self._avail: dict[str, list[int]] = {}
        self._touched_levels = [NodeStack() for _ in _LEVELS]
        self._depth = [0 for _ in _LEVELS]
        self._delta = 0

    @property
    def free_gpus(self) -> int:
        """Free GPUs on schedulable nodes, in this view."""
        return self.pool.free_gpus + self._delta

    def free(self, name: str) -> int:
        """Free GPUs of a node in this view."""
        avail = self._avail.get(name)
        return len(avail) if avail is not None else self.pool.nodes[name].free

    def startable(self, worker_gpus: Iterable[int]) -> int:
        """How many of these workers could start on schedulable nodes in this view."""
        return count_startable(self.counts, worker_gpus)

    def take(self, name: str, gpus: int) -> tuple[int, ...]:
        """Take up to `gpus` free GPUs of the node, lowest indexes first; returns them."""
        avail = self._touch(name)
        taken = tuple(avail[:gpus])
        self._relevel(name, len(avail), len(avail) - len(taken))
        del avail[: len(taken)]
        return taken

    def give(self, name: str, gpus: Iterable[int]) -> None:
        """Make these GPU indexes of the node free in this view (a release not yet folded)."""
        avail = self._touch(name)
        more = [g for g in gpus if g not in avail]
        self._relevel(name, len(avail), len(avail) + len(more))
        avail.extend(more)
        avail.sort()

    def pick(self, gpus: int, exclude: Collection[str] = ()) -> str | None:
        """Best fit: the fullest schedulable node with at least `gpus` free GPUs."""
        for level in range(gpus, len(self.counts)):
            if self.counts[level]:
                name = self._candidate(level, exclude)
                if name is not None:
                    return name
        return None

    def pick_most_free(self, below: int, exclude: Collection[str] = ()) -> str | None:
        """The schedulable node with the most free GPUs, fewer than `below` but at least 1."""
        for level in range(below - 1, 0, -1):
            if self.counts[level]:
                name = self._candidate(level, exclude)
                if name is not None:
                    return name
        return None

    def _touch(self, name: str) -> list[int]:
        avail = self._avail.get(name)
        if avail is None:
            node = self.pool.nodes[name]
            avail = self._avail[name] = node.free_indexes()
            if node.schedulable:
                self._touched_levels[len(avail)].add(name)
        return avail

    def _relevel(self, name: str, before: int, after: int) -> None:
        if not self.pool.nodes[name].schedulable or before == after:
            return
        self._touched_levels[before].discard(name)
        self._touched_levels[after].add(name)
        self.counts[before] -= 1
        self.counts[after] += 1
        self._delta += after - before

    def _candidate(self, level: int, exclude: Collection[str]) -> str | None:
        """A node with exactly `level` free GPUs in this view that is not excluded."""
        touched = self._touched_levels[level]
        depth = 0
        while (name := touched.from_top(depth)) is not None:
            if name not in exclude:
                return name
            depth += 1
        return self._untouched(level, exclude)

    def _untouched(self, level: int, exclude: Collection[str]) -> str | None:
        bucket = self.pool.bucket(level)
        depth = self._depth[level]
        # Nodes are taken from the top, so touched ones gather there: skip them for good.
        while (name := bucket.from_top(depth)) is not None and name in self._avail:
            depth += 1
        self._depth[level] = depth
        while name is not None and (name in self._avail or name in exclude):
            depth += 1
            name = bucket.from_top(depth)
        return name

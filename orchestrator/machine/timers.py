"""A run's timers (retry backoffs, approval timeouts, sleeps, an agent node's deadline): a heap,
and keys dropped from it in batches.

Dropping a key's timers was a scan and a re-heap of every timer: one per agent item ending in a
fan-out whose items each hold a deadline timer (``@wf.agent(timeout=)``) made 3,000 items take
6.0 s instead of 1.4 s (quadratic). Dropped keys now wait in a set and leave in one pass, the next
time the timers are read; a key scheduled again after its drop leaves first, so it is not lost.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator

from raysaga.node_key import NodeKey

__all__ = ["Timers"]


class Timers:
    def __init__(self) -> None:
        self._heap: list[tuple[float, NodeKey]] = []
        self._dropped: set[NodeKey] = set()

    def _purge(self) -> list[tuple[float, NodeKey]]:
        if self._dropped:
            self._heap = [(t, k) for t, k in self._heap if k not in self._dropped]
            heapq.heapify(self._heap)
            self._dropped.clear()
        return self._heap

    def push(self, when: float, key: NodeKey) -> None:
        if key in self._dropped:
            self._purge()  # its earlier timers go first: this one stays
        heapq.heappush(self._heap, (when, key))

    def drop(self, key: NodeKey) -> None:
        self._dropped.add(key)

    def keep(self, which: Callable[[NodeKey], bool]) -> None:
        """Keep only the timers of the keys ``which`` says."""
        self._heap = [(t, k) for t, k in self._purge() if which(k)]
        heapq.heapify(self._heap)

    def due(self, now: float) -> list[NodeKey]:
        """Timers that fired by ``now``, in time order (taken out)."""
        heap, fired = self._purge(), []
        while heap and heap[0][0] <= now:
            fired.append(heapq.heappop(heap)[1])
        return fired

    def next(self) -> float | None:
        heap = self._purge()
        return heap[0][0] if heap else None

    def __iter__(self) -> Iterator[tuple[float, NodeKey]]:
        return iter(list(self._purge()))

    def __len__(self) -> int:
        return len(self._purge())

"""The rollback plan: which completed nodes to compensate, and in what order.

Pure bookkeeping. A node is compensated only after every compensated node downstream of it
(its dependents, transitively) is done; among the nodes that are free to go, the one that
completed last goes first. Independent compensations may run at the same time. A target may
also name targets to undo before it (``after``): an agent's tool calls are undone one by one,
latest first, and all of them before anything upstream of the agent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import networkx as nx

NodeKey = tuple[str, int]


@dataclass(frozen=True)
class CompensationTarget:
    key: NodeKey
    finished_at: float
    """When the node completed (``inf`` for an effect caught in flight: it is the most recent)."""
    step: str | None = None
    """The DAG step it belongs to, when its key is not the step's own (an agent's tool call)."""
    after: tuple[NodeKey, ...] = ()
    """Targets to compensate before this one, besides those downstream of its step."""

    @property
    def node(self) -> str:
        return self.step or self.key[0]


class RollbackPlan:
    """Ready-set of compensations with step-level counters (O(ancestors) per completion)."""

    def __init__(self, graph: nx.DiGraph, targets: Iterable[CompensationTarget],
                 settled: Iterable[NodeKey] = ()) -> None:
        self._targets = {t.key: t for t in targets}
        self._ancestors = {step: nx.ancestors(graph, step) for step in graph.nodes}
        self._waiting: dict[str, int] = {step: 0 for step in graph.nodes}
        for target in self._targets.values():
            for ancestor in self._ancestors[target.node]:
                self._waiting[ancestor] += 1
        self._blockers: dict[NodeKey, int] = {}  # target -> its open ``after`` targets
        self._unblocks: dict[NodeKey, list[NodeKey]] = {}  # target -> those naming it in ``after``
        for target in self._targets.values():
            before = [k for k in target.after if k in self._targets]
            self._blockers[target.key] = len(before)
            for k in before:
                self._unblocks.setdefault(k, []).append(target.key)
        self._open = set(self._targets)
        self._dispatched: set[NodeKey] = set()
        self.failed: set[NodeKey] = set()
        for key in settled:
            if key in self._open:
                self.complete(key)

    @property
    def targets(self) -> Mapping[NodeKey, CompensationTarget]:
        return self._targets

    def ready(self) -> list[NodeKey]:
        """Compensations free to run now, latest-completed first; each is handed out once."""
        ready = [k for k in self._open if k not in self._dispatched and self._free(k)]
        ready.sort(key=lambda k: (-self._targets[k].finished_at, k))
        self._dispatched.update(ready)
        return ready

    def retry(self, key: NodeKey) -> None:
        """Hand a compensation out again (its attempt failed transiently)."""
        self._dispatched.discard(key)

    def _free(self, key: NodeKey) -> bool:
        return self._waiting[self._targets[key].node] == 0 and self._blockers[key] == 0

    def complete(self, key: NodeKey) -> None:
        self._open.discard(key)
        self._dispatched.discard(key)
        for ancestor in self._ancestors[self._targets[key].node]:
            self._waiting[ancestor] -= 1
        for later in self._unblocks.get(key, ()):
            self._blockers[later] -= 1

    def fail(self, key: NodeKey) -> None:
        """A compensation failed for good: nodes upstream of it stay blocked (never undone first)."""
        self._open.discard(key)
        self._dispatched.discard(key)
        self.failed.add(key)

    def blocked(self) -> list[NodeKey]:
        """Open compensations that can never run because one downstream of them failed."""
        return sorted(k for k in self._open if k not in self._dispatched and not self._free(k))

    def in_progress(self) -> bool:
        return bool(self._dispatched & self._open)

    def settled(self) -> bool:
        """Nothing left that could still run."""
        return not self.in_progress() and not any(self._free(k) for k in self._open)

"""The ready set: a pure function of the DAG and node outcomes, updated in O(1) per completion.

Each step keeps a counter of unfinished upstream steps; a completion decrements its
dependents' counters and a counter reaching zero makes that step ready. A fan-out step,
once ready, is expanded by the driver into one item per element of its upstream list.
"""

from __future__ import annotations

from collections import deque

from raysaga.orchestrator.workflow import Workflow

NodeKey = tuple[str, int]  # (step name, fan-out index or -1)


class Scheduler:
    def __init__(self, workflow: Workflow) -> None:
        self._wf = workflow
        self._waiting_on = {s: len(workflow.steps[s].deps) for s in workflow.order}
        self._items_left: dict[str, int] = {}
        self._held: set[str] = set()  # fan-outs whose policy must decide once all items settled
        self.completed: set[str] = set()
        self.closed: set[str] = set()  # failed or skipped: will never complete
        self._ready: deque[NodeKey] = deque((s, -1) for s in workflow.order if self._waiting_on[s] == 0)

    def pop_ready(self) -> list[NodeKey]:
        ready = list(self._ready)
        self._ready.clear()
        return ready

    def push(self, key: NodeKey) -> None:
        """Put a node back to be dispatched (a retry whose timer fired)."""
        self._ready.append(key)

    def expand(self, step: str, count: int, *, ready: bool = True) -> list[str]:
        """Fan a ready map step out into ``count`` items; a zero-item fan-out completes at once.
        ``ready=False``: the caller issues the items itself (they are not queued here)."""
        self._items_left[step] = count
        if count == 0:
            return self._complete_step(step)
        if self._wf.steps[step].fan_out_policy.partial:
            # A partial-failure fan-out always waits for its policy's decision, failures or not.
            # Held only on a first failure, an all-success fan-out completed without a decision
            # and handed its dependents a plain list instead of the FanOutResult they declare
            # (also after a resume into a RetryFailed round, where no failure was restored).
            self._held.add(step)
        if ready:
            self._ready.extend((step, i) for i in range(count))
        return []

    def complete(self, key: NodeKey) -> list[str]:
        """Record a finished node; return the steps this completed (a fan-out's parent included)."""
        step, index = key
        if step in self.closed or step in self.completed:
            return []
        if index >= 0:
            self._items_left[step] -= 1
            if self._items_left[step] > 0 or step in self._held:
                return []
        return self._complete_step(step)

    def complete_items(self, step: str, count: int) -> list[str]:
        """``complete`` for ``count`` items of ``step`` at once (a chunk of them came back)."""
        if step in self.closed or step in self.completed:
            return []
        left = self._items_left[step] = self._items_left[step] - count
        if left > 0 or step in self._held:
            return []
        return self._complete_step(step)

    def fail_item(self, key: NodeKey) -> bool:
        """An item of a partial-failure fan-out failed for good. True once every item has settled
        (the policy must then decide)."""
        step, _ = key
        self._held.add(step)
        self._items_left[step] -= 1
        return self._items_left[step] == 0

    def decided(self, step: str) -> list[str]:
        """The fan-out's policy said continue: the step completes with its successes."""
        self._held.discard(step)
        return self._complete_step(step)

    def retry_items(self, step: str, indexes: list[int]) -> None:
        """The policy said retry the failed items: they become ready again."""
        self._items_left[step] += len(indexes)
        self._ready.extend((step, i) for i in indexes)

    def _complete_step(self, step: str) -> list[str]:
        self.completed.add(step)
        for child in self._wf.graph.successors(step):
            self._waiting_on[child] -= 1
            if self._waiting_on[child] == 0 and child not in self.closed:
                self._ready.append((child, -1))
        return [step]

    def close(self, step: str) -> list[str]:
        """A step failed for good (non-critical): every step downstream of it is skipped.

        Returns the newly skipped steps, in topological order.
        """
        self.closed.add(step)
        skipped = []
        for child in _descendants_in_order(self._wf, step):
            if child not in self.closed and child not in self.completed:
                self.closed.add(child)
                skipped.append(child)
        return skipped

    def has_ready(self) -> bool:
        return bool(self._ready)

    def awaiting_decision(self, step: str) -> bool:
        return step in self._held and self._items_left.get(step, 0) == 0 and step not in self.completed \
            and step not in self.closed

    def settled(self) -> bool:
        return len(self.completed) + len(self.closed) == len(self._waiting_on)

    def items_left(self, step: str) -> int:
        return self._items_left.get(step, 0)


def _descendants_in_order(workflow: Workflow, step: str) -> list[str]:
    import networkx as nx

    below = nx.descendants(workflow.graph, step)
    return [s for s in workflow.order if s in below]

"""A fan-out's plain items issued together, carried as one unit from the run machine to a Ray
task and back.

A wide fan-out of cheap items is bound by what the driver does per item, not by the items: at
10,000 no-op items the driver's bookkeeping was most of the run. So the items a round makes
ready travel as one ``ItemBlock``: the machine records their attempts, the executor's chunked lane
sends slices of it (one packed ``bytes`` a task, ``wire.pack_items``), and a finished task comes
back as one ``ItemsDone`` the machine absorbs in one call (``RunMachine.absorb_items``). No object
is made per item on the way out, and no handle per item on the way back; when all its items
succeeded, no outcome object either (``AllSucceeded``: their outputs and times as columns).

What is per item stays per item: its attempt count, its row, its place in the ledger of what is in
flight (``Calls.inflight``), so a retry, a cancel or a crash treats a block's item exactly as any
other attempt. Paths that need one call per item (the inline executor, an I/O-bound or timed
step, a step no node can hold) take ``ItemBlock.calls()``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from raysaga.node_key import NodeKey
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import AllSucceeded, NodeCall, NodeOutcome


class ItemBlock:
    """First attempts (or retries) of plain items of one fan-out step, in the order issued."""

    __slots__ = ("_positions", "attempts", "cancelled", "keys", "kwargs", "left", "max_output_bytes", "run_id",
                 "sent_in", "spec", "trace_id")

    def __init__(self, spec: StepSpec, run_id: str, trace_id: str, max_output_bytes: int, keys: list[NodeKey],
                 attempts: list[int], kwargs: list[dict[str, Any]]) -> None:
        self.spec = spec
        self.run_id = run_id
        self.trace_id = trace_id
        self.max_output_bytes = max_output_bytes
        self.keys = keys
        self.attempts = attempts
        self.kwargs = kwargs
        self.left = len(keys)  # items not yet back nor cancelled (the driver's count)
        self.cancelled: set[int] = set()  # positions cancelled: never sent, or their outcome dropped
        self.sent_in: list[Any] = [None] * len(keys)  # position -> the executor's record of its task
        self._positions: dict[NodeKey, int] | None = None

    def __len__(self) -> int:
        return len(self.keys)

    def call(self, position: int) -> NodeCall:
        fields = (self.run_id, self.spec.name, self.keys[position].fan_index, self.attempts[position], self.trace_id,
                  None, False)
        return NodeCall(fields=fields, kwargs=self.kwargs[position], max_output_bytes=self.max_output_bytes)

    def calls(self) -> list[NodeCall]:
        """One call per item, for the paths that send items one by one."""
        return [self.call(position) for position in range(len(self.keys))]

    def position(self, key: NodeKey) -> int | None:
        """Where ``key`` is in the block (a cancel names keys; the map is built at the first)."""
        if self._positions is None:
            self._positions = {k: p for p, k in enumerate(self.keys)}
        return self._positions.get(key)


#: What a block's task brings back: one outcome per item, or the columns of items that all succeeded.
ItemOutcomes = list[NodeOutcome] | AllSucceeded


class ItemsDone(NamedTuple):
    """Items of a block that came back together (one task's), outcomes in the same order."""

    block: ItemBlock
    positions: list[int]
    outcomes: ItemOutcomes

    def keys(self) -> list[NodeKey]:
        keys = self.block.keys
        return [keys[p] for p in self.positions]

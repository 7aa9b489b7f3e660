"""What one activation of the run machine hands its shell: writes to commit and commands to carry out.

The machine never touches the store, the executor or the clock. Each of its operations takes an
input (the time, finished attempts, a signal, rows the shell read) and leaves its decisions here:
``batch`` is committed by the shell as one fenced transaction; the commands are carried out in
the order the shell's loop defines (docs/architecture.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from raysaga.node_key import NodeKey
from raysaga.orchestrator.item_block import ItemBlock
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall
from raysaga.state import Batch


class Dispatch(NamedTuple):
    """Send an attempt to the executor (after the batch's ledger rows are durable). (A named
    tuple: one per item of a fan-out.)"""

    key: NodeKey
    spec: StepSpec
    call: NodeCall


class ItemsDispatch(NamedTuple):
    """Send attempts of plain fan-out items of one step, as one command: a wide fan-out's items
    go to the executor as one block (``Executor.submit_block``, ``item_block``), not one by one."""

    block: ItemBlock

    @property
    def spec(self) -> StepSpec:
        return self.block.spec

    @property
    def keys(self) -> list[NodeKey]:
        return self.block.keys

    @property
    def calls(self) -> list[NodeCall]:
        return self.block.calls()

    def each(self) -> list[Dispatch]:
        return [Dispatch(key, self.spec, call) for key, call in zip(self.keys, self.calls, strict=True)]


Send = Dispatch | ItemsDispatch


@dataclass(frozen=True)
class BuildPrompt:
    """Run an agent node's prompt builder here, in the driver (cheap, pure user code), and hand
    its outcome to ``RunMachine.prompt_built``."""

    key: NodeKey
    spec: StepSpec
    call: NodeCall


@dataclass(frozen=True)
class AdmitTool:
    """Ask the tool's circuit breaker (shared by the fleet) whether a call may go out now; hand
    the answer to ``RunMachine.tool_admitted``."""

    key: NodeKey
    breaker: str
    threshold: int
    cooldown: float


@dataclass(frozen=True)
class MemoryOp:
    """Read, or compare-and-set, a key of the run's shared memory (a write only once the batch
    that led to it is durable); hand the entry to ``RunMachine.memory_done``."""

    key: NodeKey
    name: str  # memory_read | memory_write
    memory_key: str
    value: Any = None
    expected_version: int = 0
    writer: str = ""


@dataclass(frozen=True)
class CheckDecisions:
    """An approval's timeout fired: read the run's pending signals from the store (a decision may
    have arrived since the last heartbeat) and hand them to ``RunMachine.decisions_checked``."""

    key: NodeKey


Query = BuildPrompt | AdmitTool | MemoryOp | CheckDecisions


@dataclass
class Outbox:
    """The machine's pending writes and commands, taken by the shell."""

    now: float = 0.0
    batch: Batch = field(default_factory=Batch)
    dispatch: list[Send] = field(default_factory=list)
    cancel: list[NodeKey] = field(default_factory=list)
    queries: list[Query] = field(default_factory=list)

    def take_batch(self) -> Batch:
        return self.batch.take()

    def take_sends(self) -> list[Send]:
        """The attempts to send, items of a fan-out grouped (the driver's path)."""
        taken, self.dispatch = self.dispatch, []
        return taken

    def take_dispatch(self) -> list[Dispatch]:
        """The attempts to send, one by one."""
        return [one for send in self.take_sends()
                for one in (send.each() if isinstance(send, ItemsDispatch) else (send,))]

    def take_cancel(self) -> list[NodeKey]:
        taken, self.cancel = self.cancel, []
        return taken

    def take_queries(self) -> list[Query]:
        taken, self.queries = self.queries, []
        return taken

"""The state every part of the driver shares, declared once.

``Driver`` is split by concern into parts that each stay small (forward settling, agent
hooks, the core loop); this base declares the fields they read and the few core operations
they call, so each part type-checks on its own. Only ``Driver`` fills them in.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raysaga.orchestrator.executor import Executor, Handle
from raysaga.orchestrator.fanout import FanOutBook
from raysaga.orchestrator.heartbeat import Heartbeat
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.scheduler import NodeKey, Scheduler
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeOutcome
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import Batch, NodeRecord, RunRecord, Store

if TYPE_CHECKING:
    from raysaga.orchestrator.agentloop import AgentNode

#: How long a driver waits for cancelled attempts to stop before it compensates, pauses or ends
#: the run (a force-cancel kills the worker: this is a bound, not a wait one expects to reach).
SETTLE_SECONDS = 30.0


@dataclass
class InFlight:
    handle: Handle
    attempt: int
    started_at: float
    timeout: float | None = None
    recorded: bool = False  # a 'running' row is durable
    deadline: float | None = None  # set once the attempt is sent: a queued one's timeout has not begun

    def deadline_from(self, now: float) -> float | None:
        """The attempt's deadline; its clock starts at ``now`` if it was sent since last asked."""
        if self.deadline is None and self.timeout is not None and self.handle.sent:
            self.deadline = now + self.timeout
        return self.deadline


@dataclass
class Progress:
    """Counters a progress display reads."""

    total: int = 0
    done: int = 0
    failed: int = 0
    listeners: list[Callable[[Progress], None]] = field(default_factory=list)

    def notify(self) -> None:
        for listener in self.listeners:
            listener(self)


class DriverBase:
    wf: Workflow
    store: Store
    executor: Executor
    run_id: str
    options: RunOptions
    clock: Callable[[], float]
    rng: random.Random
    progress: Progress
    specs: dict[str, StepSpec]
    outputs: dict[NodeKey, Any]
    run: RunRecord | None
    _sched: Scheduler
    _fanout: FanOutBook
    _restored: dict[NodeKey, NodeRecord]
    _attempts: dict[NodeKey, int]
    _inflight: dict[NodeKey, InFlight]
    _pending_batch: Batch
    _parents_done: set[str]
    _failure: tuple[str, dict[str, Any]] | None
    _agents: dict[NodeKey, AgentNode]
    _agent_rows: dict[NodeKey, list[NodeRecord]]
    _agents_due: set[NodeKey]
    _pause_reason: str | None
    _tokens: int
    _cost: float
    _hb: Heartbeat | None

    # core operations the parts call; ``Driver`` implements them
    def _flush(self) -> RunRecord | None:
        raise NotImplementedError

    def schedule(self, when: float, key: NodeKey) -> None:
        raise NotImplementedError

    def kwargs(self, step: str, index: int) -> dict[str, Any]:
        raise NotImplementedError

    def _fan_total(self, step: str) -> int:
        raise NotImplementedError

    def _wait_timeout(self) -> float:
        raise NotImplementedError

    def _on_success(self, key: NodeKey, flight: InFlight, outcome: NodeOutcome, batch: Batch) -> None:
        raise NotImplementedError

    def _cancel_inflight(self, batch: Batch, reason: str) -> None:
        raise NotImplementedError

    def _settle_cancelled(self, then: str, timeout: float) -> None:
        raise NotImplementedError

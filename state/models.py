"""Records read from and written to the store, and the run state machine's rules."""

from __future__ import annotations

import copy
from collections.abc import Callable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from raysaga.state import jsoncodec
from raysaga.state.error_record import ErrorInput, ErrorRecord


class RunStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING_HUMAN = "waiting_human"
    WAITING_TIMER = "waiting_timer"
    PAUSED = "paused"
    COMPENSATING = "compensating"
    COMPLETED = "completed"
    FAILED = "failed"
    COMPENSATED = "compensated"
    COMPENSATION_FAILED = "compensation_failed"
    CANCELLED = "cancelled"


#: Automatic processes never move a run out of these.
TERMINAL = frozenset({RunStatus.COMPLETED, RunStatus.COMPENSATED, RunStatus.CANCELLED})
#: Parked for an operator: terminal for drivers, but ``raysaga retry`` may revive them.
PARKED = frozenset({RunStatus.FAILED, RunStatus.COMPENSATION_FAILED})
#: At rest, so ``raysaga prune`` may delete them: running, waiting and compensating runs never are.
PRUNABLE = frozenset(TERMINAL | PARKED)

_WAITING = {RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER, RunStatus.PAUSED}
ALLOWED: dict[RunStatus, frozenset[RunStatus]] = {
    # an operator may pause a submitted run before a worker starts it
    RunStatus.PENDING: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.FAILED, RunStatus.PAUSED}),
    RunStatus.RUNNING: frozenset(
        _WAITING | {RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.COMPENSATING, RunStatus.CANCELLED}
    ),
    # a resting run (no driver) is paused by an operator at once
    RunStatus.WAITING_HUMAN: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.COMPENSATING,
                                        RunStatus.PAUSED}),
    RunStatus.WAITING_TIMER: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.COMPENSATING,
                                        RunStatus.PAUSED}),
    RunStatus.PAUSED: frozenset({RunStatus.RUNNING, RunStatus.CANCELLED, RunStatus.COMPENSATING}),
    RunStatus.COMPENSATING: frozenset({RunStatus.COMPENSATED, RunStatus.COMPENSATION_FAILED}),
    # operator retry revives a parked run; cancel-with-compensation rolls it back
    RunStatus.FAILED: frozenset({RunStatus.RUNNING, RunStatus.COMPENSATING, RunStatus.CANCELLED}),
    RunStatus.COMPENSATION_FAILED: frozenset({RunStatus.COMPENSATING}),
    RunStatus.COMPLETED: frozenset(),
    RunStatus.COMPENSATED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


def can_transition(old: RunStatus, new: RunStatus) -> bool:
    return new in ALLOWED[old]


class NodeStatus(StrEnum):
    PENDING = "pending"  # never written: a node with no row is pending
    RUNNING = "running"
    RETRYING = "retrying"  # failed an attempt, waiting for not_before
    WAITING = "waiting"  # an approval asked (its output holds the request), or a sleep (until not_before)
    COMPLETED = "completed"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"


class EffectStatus(StrEnum):
    PENDING = "pending"  # written before the call: it may be under way, or may have happened
    COMMITTED = "committed"
    FAILED = "failed"
    ABANDONED = "abandoned"
    """Still ``pending`` when its run ended or was parked: the call may or may not have happened,
    and no driver will settle it. Re-issued (an operator's retry), it is reconciled under its key."""


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True)


class RunRecord(_Record):
    run_id: str
    workflow_name: str
    workflow_version: str
    definition_hash: str
    workflow_ref: str | None = None
    status: RunStatus
    status_reason: str | None = None
    version: int
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    fence: int = 0
    event_seq: int = 0
    input: Any = None
    output: Any = None
    error: ErrorRecord | None = None
    input_digest: str | None = None
    """Set when the input is kept as a blob (it was large); ``input`` holds the value regardless."""
    output_digest: str | None = None
    """Set when the output is kept as a blob (it was large); ``output`` holds the value regardless.
    For an output of one entry ``{sink: large}`` (schema 4) the blob holds that entry's value: the
    same bytes as the sink node's blob, so the output is stored once."""
    deadline_at: float | None = None
    retry_budget: int | None = None
    retries_used: int = 0
    tokens_used: int = 0
    cost_used: float = 0.0
    token_budget: int | None = None
    cost_budget: float | None = None
    trace_id: str
    created_at: float
    updated_at: float
    wake_at: float | None = None
    """A run resting without a driver (``waiting_timer``, ``waiting_human``) is due again then: a
    timer fires, an approval times out. Workers claim by it."""
    queue: str | None = None
    """Set by ``submit``: a ``pending`` run that a worker may start."""
    parent_run_id: str | None = None
    """A forked run's parent."""
    forked_from: str | None = None
    """The node label a forked run was forked from."""
    step_hashes: dict[str, str] | None = None
    """Each step's signature hash when the run was created (None: a run recorded before schema 6)."""
    labels: dict[str, str] = Field(default_factory=dict)
    """The run's labels (``RunOptions.labels``); a run recorded before schema 11 has none."""
    max_driver_deaths: int | None = None
    """The run's own ``RunOptions.max_driver_deaths`` (schema 13): its drivers park it after this
    many deaths in a row without progress, whatever their own limit. None: not given (the default),
    or a run recorded before schema 13: the limit of the process driving it applies."""

    @field_validator("labels", mode="before")
    @classmethod
    def _no_labels(cls, value: Any) -> Any:
        return {} if value is None else value  # NULL in the row: no labels (the common case)


class RunSummary(_Record):
    """What ``list`` shows of a run: summary columns only, never its input, output or error, so a
    page of runs costs the same however large their values are.

    ``corrupt`` is set when the row cannot be read as a run (an unknown status, an unreadable
    column): the row is still listed, with what is wrong, and only that run is affected.
    ``status`` is then ``None`` when the stored one is not a run state.
    """

    run_id: str
    workflow_name: str
    workflow_version: str
    status: RunStatus | None
    status_reason: str | None = None
    created_at: float
    updated_at: float
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    corrupt: str | None = None
    _load: Callable[[], RunRecord] | None = PrivateAttr(default=None)
    _record: RunRecord | None = PrivateAttr(default=None)

    def __eq__(self, other: object) -> bool:
        # the fields only: the attached loader (a private attribute) is not part of the value
        if not isinstance(other, RunSummary):
            return NotImplemented
        return self.model_dump() == other.model_dump()

    def __hash__(self) -> int:
        return hash((self.run_id, self.created_at, self.updated_at, self.status))

    @property
    def cursor(self) -> tuple[float, str]:
        """The ``before=`` argument that fetches the page after this row."""
        return (self.created_at, self.run_id)

    def record(self) -> RunRecord:
        """The whole run (input, output, error), read from the store on first use: callers that
        list runs and then want one run's values pay for that run only."""
        if self._record is None:
            if self._load is None:
                raise LookupError(f"summary of run {self.run_id!r} is not attached to a store")
            self._record = self._load()
        return self._record

    @property
    def input(self) -> Any:
        return self.record().input

    @property
    def output(self) -> Any:
        return self.record().output

    @property
    def error(self) -> ErrorRecord | None:
        return self.record().error


class NodeRecord(_Record):
    run_id: str
    node_id: str
    fan_index: int = -1
    status: NodeStatus
    attempt: int = 0
    not_before: float | None = None
    output: Any = None
    output_digest: str | None = None
    error: ErrorRecord | None = None
    started_at: float | None = None
    finished_at: float | None = None
    duration: float | None = None
    origin_run_id: str | None = None
    """Set on a row a fork inherited: the run that executed the node (its effects carry that run's keys)."""

    @property
    def label(self) -> str:
        return node_label(self.node_id, self.fan_index)


def node_label(node_id: str, fan_index: int) -> str:
    return node_id if fan_index < 0 else f"{node_id}[{fan_index}]"


class EffectRecord(_Record):
    idempotency_key: str
    run_id: str
    node_id: str
    fan_index: int = -1
    effect_name: str
    args_digest: str
    status: EffectStatus
    result: Any = None
    external_id: str | None = None
    created_at: float
    updated_at: float


class EventRecord(_Record):
    run_id: str
    seq: int
    at: float
    kind: str
    node_id: str | None = None
    fan_index: int | None = None
    data: Any = None


class SignalKind(StrEnum):
    """What an operator asks of a run's driver."""

    CANCEL = "cancel"
    APPROVE = "approve"
    REJECT = "reject"
    PAUSE = "pause"
    UNPAUSE = "unpause"


class SignalRecord(_Record):
    id: int
    run_id: str
    kind: SignalKind
    node_id: str | None = None
    payload: Any = None
    created_at: float
    consumed_at: float | None = None
    dedup_key: str | None = None


#: The largest ``max_driver_deaths`` a run row holds (an ``INTEGER`` column: 32 bits on
#: PostgreSQL). ``RunOptions`` takes any whole number >= 1, a huge one meaning "never park": a
#: larger one is stored as this, which no run's drivers can die as often as either.
MAX_STORED_DEATHS = 2**31 - 1


class NewRun(BaseModel):
    """What a caller gives to create a run."""

    run_id: str
    workflow_name: str
    workflow_version: str
    definition_hash: str
    workflow_ref: str | None = None
    input: Any = None
    deadline_at: float | None = None
    retry_budget: int | None = None
    token_budget: int | None = None
    cost_budget: float | None = None
    trace_id: str
    queue: str | None = None
    """Submitted to the worker fleet: a worker may claim the run while it is ``pending``."""
    parent_run_id: str | None = None
    forked_from: str | None = None
    step_hashes: dict[str, str] | None = None
    """Each step's signature hash (``raysaga.orchestrator.versions``), to name what changed later."""
    labels: dict[str, str] | None = None
    """The run's labels (checked by the store: ``raysaga.types.check_labels``); None: none, or for a
    fork, its parent's."""
    max_driver_deaths: int | None = Field(default=None, ge=1, le=MAX_STORED_DEATHS)
    """``RunRecord.max_driver_deaths``: None leaves the limit to the process that drives the run."""


class Lease(_Record):
    """A driver's claim on a run. ``fence`` guards every write it makes."""

    run_id: str
    owner: str
    fence: int
    expires_at: float
    ttl: float


class NewEvent(BaseModel):
    kind: str
    node_id: str | None = None
    fan_index: int | None = None
    data: Any = None


class NodeWrite(BaseModel):
    """An upsert of one node's checkpoint."""

    node_id: str
    fan_index: int = -1
    status: NodeStatus
    attempt: int = 0
    not_before: float | None = None
    output: Any = None
    output_digest: str | None = None
    error: ErrorInput = None
    """An ``ErrorRecord``, or a dict made into one."""
    started_at: float | None = None
    finished_at: float | None = None
    duration: float | None = None


class EffectWrite(BaseModel):
    """Insert-once of a ledger row (status pending), or an update of its status."""

    idempotency_key: str
    node_id: str
    fan_index: int = -1
    effect_name: str
    args_digest: str
    status: EffectStatus
    result: Any = None
    external_id: str | None = None


class RunUpdate(BaseModel):
    """A run transition and/or counters to change in the same transaction."""

    status: RunStatus | None = None
    status_reason: str | None = None
    output: Any = None
    set_output: bool = False
    error: ErrorInput = None
    """An ``ErrorRecord``, or a dict made into one (written when ``set_error``)."""
    set_error: bool = False
    retries_delta: int = 0
    tokens_delta: int = 0
    cost_delta: float = 0.0
    token_budget: int | None = None
    cost_budget: float | None = None
    set_budgets: bool = False
    wake_at: float | None = None
    """When a run that rests without a driver is due again (written when ``set_wake``; a status
    change without it clears the time: only a resting run has one)."""
    set_wake: bool = False
    signals_seen: int | None = None
    """A rest's: the newest signal the driver acted on. A decision recorded after it, while the
    driver held the run (so it set no wake), makes the rest due at once (``decided_after``)."""
    release_lease: bool = False
    """The driver lets go of the run in this transaction (its end or a rest): the lease is freed
    with the write that ends or rests the run, not by a second transaction after it."""


class BreakerChange(BaseModel):
    """Count one tool call's outcome on its circuit breaker (``raysaga.state.breakers``), in the
    batch's transaction: the breaker row is read under a lock and written with the new state."""

    name: str
    ok: bool | None
    """None: a permanent failure, no verdict on the dependency's health (``breakers.after_call``)."""
    at: float
    """When the call finished (the driver's clock): a breaker that opens dates its cooldown from it."""
    threshold: int
    cooldown: float


#: A completed plain fan-out item, compactly: ``(node_id, fan_index, attempt, output JSON text or None,
#: output digest or None, started_at, finished_at)``. A wide fan-out writes thousands of these a
#: second; a ``NodeWrite`` each (a validated model) was a tenth of the driver's time per item.
ItemRow = tuple[str, int, int, str | None, str | None, float, float]


class Batch(BaseModel):
    """Everything one driver commit writes, in one transaction (group commit)."""

    nodes: list[NodeWrite] = Field(default_factory=list)
    items: list[ItemRow] = Field(default_factory=list)
    """Completed plain fan-out items (``ItemRow``), upserted like ``nodes``, before them."""
    effects: list[EffectWrite] = Field(default_factory=list)
    events: list[NewEvent] = Field(default_factory=list)
    blobs: dict[str, bytes] = Field(default_factory=dict)
    run: RunUpdate | None = None
    consumed_signals: list[int] = Field(default_factory=list)
    breakers: list[BreakerChange] = Field(default_factory=list)

    def empty(self) -> bool:
        return not (self.nodes or self.items or self.effects or self.events or self.blobs or self.run
                    or self.consumed_signals or self.breakers)

    def node_writes(self) -> list[NodeWrite]:
        """Every node write, the compact item rows made ``NodeWrite`` objects (for readers off the hot path)."""
        return [*(item_write(row) for row in self.items), *self.nodes]

    def take(self) -> Batch:
        """Move everything into a new batch and leave this one empty (same object, for its holders)."""
        taken = copy.copy(self)  # (a shallow copy: ~4 us, where model_construct took ~8, twice per commit)
        self.__dict__.update(nodes=[], items=[], effects=[], events=[], blobs={}, run=None, consumed_signals=[],
                             breakers=[])
        return taken


class RunSnapshot(_Record):
    """A whole run as a resume needs it, read in a constant number of queries."""

    run: RunRecord
    nodes: list[NodeRecord]
    effects: list[EffectRecord]
    signals: list[SignalRecord]


class MemoryEntry(_Record):
    """One key of a run's shared blackboard."""

    key: str
    value: Any = None
    version: int = 0
    writer: str | None = None


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"  # one probe call is out


class BreakerRecord(_Record):
    """A circuit breaker's row, shared by every driver on the store (``raysaga.state.breakers``)."""

    name: str
    state: BreakerState = BreakerState.CLOSED
    failures: int = 0
    opened_at: float | None = None
    version: int = 0


def item_write(row: ItemRow) -> NodeWrite:
    """An ``ItemRow`` as the ``NodeWrite`` it stands for."""
    node_id, fan_index, attempt, output, digest, started, finished = row
    return NodeWrite(node_id=node_id, fan_index=fan_index, status=NodeStatus.COMPLETED, attempt=attempt,
                     output=None if output is None else jsoncodec.loads(output), output_digest=digest,
                     started_at=started, finished_at=finished, duration=finished - started)

"""A test fake of the store's commit for one run: committed ``Batch``es folded into a ``RunSnapshot``.

Not a ``Store``: only what the machine tests need (the edge they are not about). It mimics
``SqlStore.commit`` (``raysaga.state.sql_store``) for the fields the run machine reads back:

- node rows are upserted by ``(node_id, fan_index)``; an upsert replaces every column (status,
  attempt, not_before, output, output_digest, error, started_at, finished_at, duration), the
  last write of a batch winning;
- ledger rows: a ``pending`` write is insert-once (an existing row keeps its status, except a
  ``failed`` one, which goes back to ``pending``); a final write (``committed``/``failed``)
  replaces every column but ``created_at``; pending writes are applied before final ones;
- the run's update: a status change is checked against the run state machine (``can_transition``)
  and bumps ``version``; ``set_output``/``set_error``/``set_budgets`` write their values; the
  retry/token/cost deltas add up; a batch with a run update returns the run record;
- blobs are insert-once by digest; consumed signals get ``consumed_at``;
- every JSON value goes through canonical JSON and back, as it does through the SQL columns.

One addition that is an oracle, not the store's behaviour: a batch written to a run that rests
(terminal, parked or paused) is refused with ``InvariantViolation`` unless it moves the run out
of that state as the state machine allows (a resume). The SQL store checks only transitions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from raysaga.state import (
    Batch,
    EffectRecord,
    EffectStatus,
    MemoryEntry,
    NewEvent,
    NodeRecord,
    RunRecord,
    RunSnapshot,
    RunStatus,
    SignalKind,
    SignalRecord,
    jsoncodec,
)
from raysaga.state.error_record import as_error, stored_error
from raysaga.state.models import PARKED, TERMINAL, can_transition

__all__ = ["AT_REST", "InvariantViolation", "MemoryRun", "json_roundtrip"]

#: Run states after which a driver writes nothing more (short of an operator's resume).
AT_REST = frozenset(TERMINAL | PARKED | {RunStatus.PAUSED, RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER})


class InvariantViolation(AssertionError):
    """One of the invariants the machine tests check was broken (the message says which)."""


def json_roundtrip(value: Any) -> Any:
    """A value as it reads back from a JSON column (None stays SQL NULL)."""
    return None if value is None else jsoncodec.loads(jsoncodec.dumps(value))


class MemoryRun:
    """One run's durable state, as the SQL store would hold it after the same commits."""

    def __init__(self, run: RunRecord) -> None:
        self.run = run
        self.nodes: dict[tuple[str, int], NodeRecord] = {}
        self.effects: dict[str, EffectRecord] = {}
        self.signals: list[SignalRecord] = []
        self.blobs: dict[str, bytes] = {}
        self.memory: dict[str, MemoryEntry] = {}
        self.events: list[NewEvent] = []
        self.commits = 0

    # ------------------------------------------------------------------ the driver's commit

    def commit(self, batch: Batch, now: float) -> RunRecord | None:
        """Apply ``batch`` atomically (it is checked in full before anything is written)."""
        status = self.run.status
        upd = batch.run
        if status in AT_REST and not (upd is not None and upd.status is not None
                                      and can_transition(status, upd.status)):
            raise InvariantViolation(f"a batch was written after the run rested {status.value}: {_describe(batch)}")
        if upd is not None and upd.status is not None and not can_transition(status, upd.status):
            raise InvariantViolation(f"illegal transition {status.value} -> {upd.status.value}")
        self.commits += 1
        changed: RunRecord | None = None
        if upd is not None:
            values: dict[str, Any] = {"updated_at": now}
            if upd.status is not None:
                values.update(status=upd.status, status_reason=upd.status_reason, version=self.run.version + 1)
            if upd.set_output:
                values["output"] = json_roundtrip(upd.output)
            if upd.set_error:
                values["error"] = stored_error(upd.error)
            values["retries_used"] = self.run.retries_used + upd.retries_delta
            values["tokens_used"] = self.run.tokens_used + upd.tokens_delta
            values["cost_used"] = self.run.cost_used + upd.cost_delta
            if upd.set_budgets:
                values.update(token_budget=upd.token_budget, cost_budget=upd.cost_budget)
            self.run = RunRecord.model_validate({**self.run.model_dump(), **values})
            changed = self.run
        for digest, data in batch.blobs.items():
            self.blobs.setdefault(digest, data)
        for n in batch.node_writes():  # in order: a node written twice in one batch ends as its last write
            self.nodes[(n.node_id, n.fan_index)] = NodeRecord(
                run_id=self.run.run_id, node_id=n.node_id, fan_index=n.fan_index, status=n.status, attempt=n.attempt,
                not_before=n.not_before, output=json_roundtrip(n.output), output_digest=n.output_digest,
                error=as_error(stored_error(n.error)), started_at=n.started_at, finished_at=n.finished_at,
                duration=n.duration)
        for e in batch.effects:
            if e.status != EffectStatus.PENDING:
                continue
            row = self.effects.get(e.idempotency_key)
            if row is None:
                self.effects[e.idempotency_key] = EffectRecord(
                    run_id=self.run.run_id, created_at=now, updated_at=now,
                    **{**e.model_dump(), "result": json_roundtrip(e.result)})
            elif row.status in (EffectStatus.FAILED, EffectStatus.ABANDONED):  # a retry: same key
                self.effects[e.idempotency_key] = row.model_copy(update={"status": EffectStatus.PENDING,
                                                                         "updated_at": now})
        for e in batch.effects:
            if e.status == EffectStatus.PENDING:
                continue
            old = self.effects.get(e.idempotency_key)
            self.effects[e.idempotency_key] = EffectRecord(
                run_id=self.run.run_id, created_at=now if old is None else old.created_at, updated_at=now,
                **{**e.model_dump(), "result": json_roundtrip(e.result)})
        self.events.extend(batch.events)
        if upd is not None and upd.status is not None:
            self.events.append(NewEvent(kind="run_" + upd.status.value, data={"reason": upd.status_reason}))
        consumed = set(batch.consumed_signals)
        self.signals = [s.model_copy(update={"consumed_at": now}) if s.id in consumed and s.consumed_at is None else s
                        for s in self.signals]
        return changed

    # ------------------------------------------------------------------ reads

    def snapshot(self) -> RunSnapshot:
        return RunSnapshot(run=self.run, nodes=list(self.nodes.values()), effects=list(self.effects.values()),
                           signals=self.pending_signals())

    def node_rows(self) -> list[NodeRecord]:
        """Every node row, in ``SqlStore.nodes``' order (started first, by start; then by key)."""
        return sorted(self.nodes.values(), key=lambda r: (r.started_at is None, r.started_at or 0.0, r.node_id,
                                                           r.fan_index))

    def load_blobs(self, wanted: Mapping[str, str]) -> dict[str, Any]:
        missing = [d for d in wanted if d not in self.blobs]
        if missing:
            raise InvariantViolation(f"blobs {missing} read before they were committed ({dict(wanted)})")
        return {d: jsoncodec.loads(self.blobs[d]) for d in wanted}

    # ------------------------------------------------------------------ signals, shared memory

    def send_signal(self, kind: SignalKind | str, payload: Any, now: float) -> SignalRecord:
        signal = SignalRecord(id=len(self.signals) + 1, run_id=self.run.run_id, kind=SignalKind(kind),
                              payload=json_roundtrip(payload), created_at=now)
        self.signals.append(signal)
        return signal

    def pending_signals(self) -> list[SignalRecord]:
        return [s for s in self.signals if s.consumed_at is None]

    def memory_get(self, key: str) -> MemoryEntry:
        return self.memory.get(key, MemoryEntry(key=key))

    def memory_cas(self, key: str, value: Any, expected_version: int, writer: str) -> MemoryEntry:
        """``shared_rows.memory_cas``: re-applying the same writer is a no-op success."""
        row = self.memory.get(key)
        current = 0 if row is None else row.version
        if row is not None and row.writer == writer:
            return row
        if current != expected_version:
            return row if row is not None else MemoryEntry(key=key)
        entry = MemoryEntry(key=key, value=json_roundtrip(value), version=current + 1, writer=writer)
        self.memory[key] = entry
        return entry


def _describe(batch: Batch) -> str:
    parts = [f"{n.node_id}[{n.fan_index}]={n.status.value}" for n in batch.node_writes()]
    parts += [f"ledger {e.idempotency_key[:12]}={e.status.value}" for e in batch.effects]
    if batch.run is not None:
        parts.append(f"run={batch.run.model_dump(exclude_defaults=True)}")
    parts += [f"event {e.kind}" for e in batch.events]
    return ", ".join(parts) or "(empty)"

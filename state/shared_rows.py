"""The small records beside a run's checkpoints: its shared memory, the fleet's circuit
breakers, and operator signals.

Each is a short statement or two on its own transaction, except the breaker counts of a
driver's batch, which ``SqlStore.commit`` applies in the batch's transaction
(``count_breaker_outcomes``). ``SqlStore`` delegates here one method to one function.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Engine, and_, case, insert, select, update
from sqlalchemy.exc import IntegrityError

from raysaga.errors import UserError
from raysaga.state.breakers import BreakerPolicy, after_call
from raysaga.state.decoding import reading, records, run_status
from raysaga.state.jsoncodec import printable
from raysaga.state.models import (
    BreakerChange,
    BreakerRecord,
    Lease,
    MemoryEntry,
    RunStatus,
    SignalKind,
    SignalRecord,
)
from raysaga.state.redact import scrub, scrub_text
from raysaga.state.schema import breakers, events, memory, runs, signals
from raysaga.state.statements import fence_guard, insert_for

# ---------------------------------------------------------------- shared memory (blackboard)


def memory_get(reader: Engine, run_id: str, key: str) -> MemoryEntry:
    with reader.connect() as conn, reading(run_id, memory.name):
        row = conn.execute(select(memory).where(memory.c.run_id == run_id, memory.c.key == key)).first()
    if row is None:
        return MemoryEntry(key=key)
    return MemoryEntry(key=key, value=row.value, version=row.version, writer=row.writer)


def memory_cas(engine: Engine, lease: Lease, key: str, value: Any, expected_version: int,
               writer: str) -> MemoryEntry:
    """Write ``key`` if it is still at ``expected_version`` (0: absent); fenced like every driver write.

    Returns the entry as it now stands: ``version == expected_version + 1`` and ``writer`` this
    writer's key on success, else the newer entry that won. Re-applying the same ``writer`` is a
    no-op success (a resumed driver re-issuing a write it already made).
    """
    now = time.time()
    with engine.begin() as conn:
        fence_guard(conn, lease, 0, now)
        with reading(lease.run_id, memory.name):
            row = conn.execute(select(memory).where(memory.c.run_id == lease.run_id, memory.c.key == key)).first()
        current = 0 if row is None else int(row.version)
        if row is not None and row.writer == writer:
            return MemoryEntry(key=key, value=row.value, version=current, writer=writer)
        if current != expected_version:
            return MemoryEntry(key=key, value=None if row is None else row.value, version=current,
                               writer=None if row is None else row.writer)
        values = {"value": value, "version": current + 1, "writer": writer, "updated_at": now}
        if row is None:
            conn.execute(insert(memory).values(run_id=lease.run_id, key=key, **values))
        else:
            conn.execute(update(memory).where(memory.c.run_id == lease.run_id, memory.c.key == key,
                                              memory.c.version == current).values(**values))
        return MemoryEntry(key=key, value=value, version=current + 1, writer=writer)


# ---------------------------------------------------------------- circuit breakers (fleet-wide)


def breaker_get(reader: Engine, name: str) -> BreakerRecord:
    with reader.connect() as conn:
        row = conn.execute(select(breakers).where(breakers.c.name == name)).first()
    return BreakerRecord(name=name) if row is None else _breaker(row)


def breaker_cas(engine: Engine, record: BreakerRecord, expected_version: int) -> bool:
    """Store a breaker's new state if nobody changed it since ``expected_version``."""
    values = _breaker_values(record, expected_version + 1, time.time())
    with engine.begin() as conn:
        if expected_version == 0:
            try:
                with conn.begin_nested():
                    conn.execute(insert(breakers).values(name=record.name, **values))
                return True
            except IntegrityError:
                return False
        result = conn.execute(update(breakers).where(breakers.c.name == record.name,
                                                     breakers.c.version == expected_version).values(**values))
        return result.rowcount == 1


def count_breaker_outcomes(conn: Connection, changes: Sequence[BreakerChange], now: float) -> None:
    """Apply a batch's breaker counts in its transaction: each row is read under a lock (``FOR
    UPDATE`` on PostgreSQL; SQLite write transactions are serialised), moved on by ``after_call``
    once per outcome, in order, and written back (inserted when absent). A count that changes
    nothing (a success on a closed breaker) writes nothing."""
    by_name: dict[str, list[BreakerChange]] = {}
    for change in changes:
        by_name.setdefault(change.name, []).append(change)
    for name in sorted(by_name):  # one lock order in every transaction: two batches never deadlock
        while not _count(conn, name, by_name[name], now):
            pass  # another transaction inserted the row first: count again on its row


def _count(conn: Connection, name: str, changes: list[BreakerChange], now: float) -> bool:
    row = conn.execute(select(breakers).where(breakers.c.name == name).with_for_update()).first()
    record = BreakerRecord(name=name) if row is None else _breaker(row)
    new = record
    for change in changes:
        new = after_call(new, change.ok, change.at, BreakerPolicy(change.threshold, change.cooldown))
    if (new.state, new.failures, new.opened_at) == (record.state, record.failures, record.opened_at):
        return True
    values = _breaker_values(new, record.version + 1, now)
    if row is not None:
        conn.execute(update(breakers).where(breakers.c.name == name).values(**values))
        return True
    # absent: insert, unless a concurrent transaction did first (PostgreSQL waits for it to end)
    inserted = conn.execute(insert_for(conn, breakers).values(name=name, **values)
                            .on_conflict_do_nothing(index_elements=["name"]).returning(breakers.c.name)).first()
    return inserted is not None


def _breaker(row: Any) -> BreakerRecord:
    return BreakerRecord(name=row.name, state=row.state, failures=row.failures, opened_at=row.opened_at,
                         version=row.version)


def _breaker_values(record: BreakerRecord, version: int, now: float) -> dict[str, Any]:
    return {"state": record.state.value, "failures": record.failures, "opened_at": record.opened_at,
            "version": version, "updated_at": now}


# ---------------------------------------------------------------- operator signals


def send_signal(engine: Engine, run_id: str, kind: SignalKind | str, node_id: str | None = None,
                payload: Any = None) -> SignalRecord:
    try:
        kind = SignalKind(kind)
    except ValueError:
        raise UserError(f"signal kind {kind!r} is not one of {', '.join(k.value for k in SignalKind)}") from None
    now = time.time()
    with engine.begin() as conn:
        run_status(conn, run_id)  # RunNotFoundError; the run's values are not read
        row = conn.execute(
            # scrubbed as the run's reason and events made of it are (a cancel's reason may quote a key)
            insert(signals).values(run_id=run_id, kind=kind.value, node_id=node_id, payload=scrub(payload),
                                   created_at=now)
            .returning(*signals.c)
        ).one()
    return SignalRecord.model_validate(row._asdict())


def pending_signals(reader: Engine, run_id: str) -> list[SignalRecord]:
    with reader.connect() as conn, reading(run_id, signals.name):
        rows = conn.execute(select(signals).where(and_(signals.c.run_id == run_id, signals.c.consumed_at.is_(None)))
                            .order_by(signals.c.id)).all()
        return records(SignalRecord, rows)


def consume_signals(conn: Connection, run_id: str, ids: list[int], now: float) -> None:
    conn.execute(update(signals).where(signals.c.id.in_(ids), signals.c.run_id == run_id).values(consumed_at=now))


#: Runs at rest without a driver: a wake says why in the run's reason until a driver takes it up.
_AT_REST = (RunStatus.WAITING_HUMAN.value, RunStatus.WAITING_TIMER.value, RunStatus.PAUSED.value)


def wake(engine: Engine, run_id: str, statuses: list[RunStatus], reason: str, kind: str, data: Any = None) -> bool:
    """Set a resting run's ``wake_at`` to now, with an event, if it is in one of ``statuses``. A run
    at rest without a driver (waiting, paused) says ``reason`` in its ``status_reason`` until a driver
    takes it up: a cancel with rollback asked of a run waiting for a decision left it "waiting for
    a decision on review", and ``status`` showed nothing on its way. A run woken in another state (a
    retried run: running, compensating) keeps its reason, the one its driver goes on with."""
    now = time.time()
    said = printable(scrub_text(f"{reason}: waiting for a driver (a `raysaga worker`, or `raysaga resume "
                                f"{shlex.quote(run_id)}`)")).replace("\x00", "\\x00")  # (as a transition's reason)
    with engine.begin() as conn:
        run_status(conn, run_id)  # RunNotFoundError
        seq = conn.execute(update(runs).where(runs.c.run_id == run_id,
                                              runs.c.status.in_([s.value for s in statuses]))
                           .values(wake_at=now, event_seq=runs.c.event_seq + 1, updated_at=now,
                                   status_reason=case((runs.c.status.in_(_AT_REST), said),
                                                      else_=runs.c.status_reason))
                           .returning(runs.c.event_seq)).scalar_one_or_none()
        if seq is None:
            return False
        conn.execute(insert(events).values(run_id=run_id, seq=seq, at=now, kind=kind,
                                           data=scrub({"reason": reason, **(data or {})})))
    return True

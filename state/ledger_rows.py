"""The effect ledger's rows as a driver's commit writes them (``SqlStore.commit``).

A ``pending`` row is inserted once, before the call: an existing row keeps its key and status,
except that a failed or abandoned effect taken up again becomes pending again (same key), the
row of the run that took it up.
A settled row (``committed``, ``failed``, ``abandoned``) is upserted, keeping when it was first
written and the run that wrote it first.

A key may be another run's: a fork undoes a node it inherited under the key of the run that
executed it, so the parent and its forks share that compensation key. The driver answers a key
committed elsewhere from that row and never calls it (``orchestrator.machine.rollback.Elsewhere``);
here, a committed row is never overwritten by another run's write, and a failed or abandoned row
another run takes up again (its ``pending`` write) becomes that run's: a fork killed during the
call then resumes to its own pending row (reconciling), not to one filed under a sibling that has
stopped, which nothing would ever settle.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, or_

from raysaga.state.models import Batch, EffectStatus
from raysaga.state.schema import effects
from raysaga.state.statements import insert_for

#: The settling upserts, by dialect and updated columns (built once each).
_SETTLES: dict[tuple[str, tuple[str, ...]], Any] = {}


def write_effects(conn: Connection, run_id: str, batch: Batch, now: float) -> None:
    """The batch's effect rows, in its transaction."""
    pending = [e for e in batch.effects if e.status == EffectStatus.PENDING]
    final = [e for e in batch.effects if e.status != EffectStatus.PENDING]
    if pending:
        rows = [{"run_id": run_id, "created_at": now, "updated_at": now, **e.model_dump()} for e in pending]
        stmt = insert_for(conn, effects)
        stmt = stmt.on_conflict_do_update(
            index_elements=["idempotency_key"],
            # taken up again (a retry, or a fork taking up a sibling's undo): the row is the taker's
            # now, so its resume finds its own pending call and its end-of-run marking reaches it
            set_={"status": EffectStatus.PENDING.value, "updated_at": now, "run_id": stmt.excluded.run_id},
            where=or_(effects.c.status == EffectStatus.FAILED.value,
                      effects.c.status == EffectStatus.ABANDONED.value),  # no IN: executemany
        )
        conn.execute(stmt, rows)
    if final:
        rows = [{"run_id": run_id, "created_at": now, "updated_at": now, **e.model_dump()} for e in final]
        _settle(conn, rows)


def _settle(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Insert settled rows, or update the row of the same key: every column but when it was first
    written and by which run; and a committed row only by the run that owns it."""
    # one row per key, the last one written wins: PostgreSQL refuses an INSERT ... ON CONFLICT
    # that would touch the same row twice
    rows = list({r["idempotency_key"]: r for r in rows}.values())
    cols = tuple(c for c in rows[0] if c not in ("idempotency_key", "created_at", "run_id"))
    cache_key = (conn.dialect.name, cols)
    stmt = _SETTLES.get(cache_key)
    if stmt is None:
        base = insert_for(conn, effects)
        stmt = _SETTLES[cache_key] = base.on_conflict_do_update(
            index_elements=["idempotency_key"], set_={c: base.excluded[c] for c in cols},
            where=or_(effects.c.run_id == base.excluded.run_id,
                      effects.c.status != EffectStatus.COMMITTED.value))
    conn.execute(stmt, rows)


__all__ = ["write_effects"]

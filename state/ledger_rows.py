"""The effect ledger's rows as a driver's commit writes them (``SqlStore.commit``).

A ``pending`` row is inserted once, before the call: an existing row keeps its key and status,
except that a failed or abandoned effect an operator retries becomes pending again (same key).
A settled row (``committed``, ``failed``) is upserted, keeping when it was first written.
"""

from __future__ import annotations

from sqlalchemy import Connection, or_

from raysaga.state.models import Batch, EffectStatus
from raysaga.state.schema import effects
from raysaga.state.statements import insert_for, upsert


def write_effects(conn: Connection, run_id: str, batch: Batch, now: float) -> None:
    """The batch's effect rows, in its transaction."""
    pending = [e for e in batch.effects if e.status == EffectStatus.PENDING]
    final = [e for e in batch.effects if e.status != EffectStatus.PENDING]
    if pending:
        rows = [{"run_id": run_id, "created_at": now, "updated_at": now, **e.model_dump()} for e in pending]
        stmt = insert_for(conn, effects)
        stmt = stmt.on_conflict_do_update(
            index_elements=["idempotency_key"],
            set_={"status": EffectStatus.PENDING.value, "updated_at": now},
            where=or_(effects.c.status == EffectStatus.FAILED.value,
                      effects.c.status == EffectStatus.ABANDONED.value),  # no IN: executemany
        )
        conn.execute(stmt, rows)
    if final:
        rows = [{"run_id": run_id, "created_at": now, "updated_at": now, **e.model_dump()} for e in final]
        upsert(conn, effects, rows, ["idempotency_key"], keep=("created_at",))


__all__ = ["write_effects"]

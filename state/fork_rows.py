"""The rows of forked runs and of re-pinned definitions (``SqlStore`` mixes these in).

A fork (``raysaga.orchestrator.fork``) is a new run whose inherited nodes start completed: their
rows are copied from the parent into the new run in the transaction that creates it, each
marked with ``origin_run_id`` (the run that executed the node, so its effects keep that run's
idempotency keys). Outputs kept as blobs are referenced by digest, never copied; the ledger rows
stay with the run that wrote them and are read across (``inherited_effects``).
"""

from __future__ import annotations

import time
from typing import Any

from sqlalchemy import Connection, Engine, and_, insert, select, update
from sqlalchemy.exc import IntegrityError

from raysaga.errors import RunExistsError
from raysaga.state.decoding import reading, records
from raysaga.state.error_record import stored_error
from raysaga.state.models import EffectRecord, Lease, NewRun, NodeRecord, RunRecord, RunStatus
from raysaga.state.redact import scrub
from raysaga.state.schema import effects, events, nodes, runs
from raysaga.state.statements import fence_guard


class ForkRows:
    """Fork and definition-pin methods of ``SqlStore`` (it provides the engines and helpers)."""

    engine: Engine
    reader: Engine

    def _run_value(self, conn: Connection, value: Any, what: str) -> tuple[Any, str | None, str | None]:
        raise NotImplementedError  # SqlStore's

    def get_run(self, run_id: str, *, lenient: bool = False) -> RunRecord:
        raise NotImplementedError  # SqlStore's

    def fork_run(self, new: NewRun, inherited: list[NodeRecord], data: dict[str, Any]) -> RunRecord:
        """Create the run ``new`` (``pending``, ``parent_run_id`` set) with the ``inherited`` rows
        copied into it, in one transaction: a crash leaves the whole fork or nothing."""
        now = time.time()
        values = new.model_dump(exclude={"input"})
        values.update(status=RunStatus.PENDING.value, version=0, fence=0, event_seq=2, retries_used=0,
                      tokens_used=0, cost_used=0.0, created_at=now, updated_at=now)
        rows = [{
            "run_id": new.run_id, "node_id": r.node_id, "fan_index": r.fan_index, "status": r.status.value,
            "attempt": r.attempt, "not_before": None, "output": r.output, "output_digest": r.output_digest,
            "error": scrub(stored_error(r.error)), "started_at": r.started_at, "finished_at": r.finished_at,
            "duration": r.duration, "origin_run_id": r.origin_run_id or new.parent_run_id,
        } for r in inherited]
        try:
            with self.engine.begin() as conn:
                values["input"], values["input_digest"], _ = self._run_value(conn, new.input, "input")
                conn.execute(insert(runs).values(**values))
                conn.execute(insert(events), [
                    {"run_id": new.run_id, "seq": 1, "at": now, "kind": "run_created",
                     "data": scrub({"workflow": new.workflow_name})},
                    {"run_id": new.run_id, "seq": 2, "at": now, "kind": "run_forked", "data": scrub(data)}])
                if rows:
                    conn.execute(insert(nodes), rows)
        except IntegrityError:
            raise RunExistsError(new.run_id) from None
        return self.get_run(new.run_id)

    def inherited_effects(self, run_id: str) -> list[EffectRecord]:
        """The ledger rows of the nodes ``run_id`` inherited (they belong to the runs that executed
        them), oldest first."""
        origin = nodes.alias("origin")
        query = (select(effects).join(origin, and_(effects.c.run_id == origin.c.origin_run_id,
                                                   effects.c.node_id == origin.c.node_id,
                                                   effects.c.fan_index == origin.c.fan_index))
                 .where(origin.c.run_id == run_id, origin.c.origin_run_id.is_not(None))
                 .order_by(effects.c.created_at, effects.c.idempotency_key))
        with self.reader.connect() as conn, reading(run_id, effects.name):
            return records(EffectRecord, conn.execute(query).all())

    def children(self, run_id: str) -> list[dict[str, Any]]:
        """The runs forked from ``run_id``, oldest first: ``run_id``, ``status``, ``forked_from``, ``created_at``."""
        query = (select(runs.c.run_id, runs.c.status, runs.c.forked_from, runs.c.created_at)
                 .where(runs.c.parent_run_id == run_id).order_by(runs.c.created_at, runs.c.run_id))
        with self.reader.connect() as conn:
            return [r._asdict() for r in conn.execute(query).all()]

    def repin_definition(self, lease: Lease, definition_hash: str, step_hashes: dict[str, str],
                         data: dict[str, Any]) -> RunRecord:
        """Pin the run to another definition (a resume allowed to use changed code), fenced by the
        lease, with a ``definition_changed`` event holding ``data`` (what changed)."""
        now = time.time()
        with self.engine.begin() as conn:
            seq = fence_guard(conn, lease, 1, now)
            conn.execute(update(runs).where(runs.c.run_id == lease.run_id, runs.c.fence == lease.fence)
                         .values(definition_hash=definition_hash, step_hashes=step_hashes))
            conn.execute(insert(events).values(run_id=lease.run_id, seq=seq, at=now, kind="definition_changed",
                                               data=scrub(data)))
        return self.get_run(lease.run_id, lenient=True)

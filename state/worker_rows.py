"""The worker fleet's rows (``raysaga_workers``, schema 15): who is alive and what it serves.

Each ``raysaga worker`` writes a row at its start, beats it every ``beat_every`` seconds and
records ``stopped_at`` on a clean exit. A SIGKILLed worker writes nothing more: it is *live* while
its last beat is at most ``LIVE_BEATS`` of its own intervals old, *silent* after. Nothing in a
row is secret (a host name, a pid, workflow names and hashes); a worker's start deletes the rows
silent for ``FORGET_AFTER`` seconds, so the table stays as small as the fleet.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict
from sqlalchemy import Engine, delete, insert, or_, select, update

from raysaga.state.schema import workers

#: A worker is live while its last beat is at most this many of its beat intervals old.
LIVE_BEATS = 3
#: Rows of workers silent (no beat) for longer than this are deleted when a worker registers.
FORGET_AFTER = 7 * 24 * 3600.0
#: Every queue: what a worker that claims submitted runs of any queue records.
ANY_QUEUE = "*"

WorkerState = Literal["live", "stopped", "silent"]


class ServedWorkflow(BaseModel):
    """A workflow a worker drives: runs of this name and definition hash are its."""

    model_config = ConfigDict(frozen=True)

    name: str
    version: str
    definition_hash: str
    #: The same code's hash under the earlier scheme: a run an earlier raysaga recorded under it (no
    #: ``:scheme`` mark among its step hashes) is claimed too (``claims.Served``). None: not recorded.
    legacy_hash: str | None = None


class WorkerRecord(BaseModel):
    """One worker process as its row says (``Client.workers``, ``raysaga workers``)."""

    model_config = ConfigDict(frozen=True)

    worker_id: str
    host: str
    pid: int
    started_at: float
    beat_at: float
    beat_every: float
    stopped_at: float | None = None
    queues: list[str]
    workflows: list[ServedWorkflow]
    slots: int
    busy: int
    raysaga_version: str

    def live_until(self) -> float:
        """When it stops counting as live unless it beats again."""
        return self.beat_at + LIVE_BEATS * self.beat_every

    def state(self, now: float) -> WorkerState:
        """``live`` (beats), ``stopped`` (exited cleanly) or ``silent`` (no beat within the bound:
        killed, frozen, or cut off from the store)."""
        if self.stopped_at is not None:
            return "stopped"
        return "live" if now <= self.live_until() else "silent"

    def serves_queue(self, queue: str | None) -> bool:
        return ANY_QUEUE in self.queues or (queue or "default") in self.queues

    def serves(self, workflow: str, definition_hash: str, queue: str | None, legacy: bool = False) -> bool:
        """Whether its claims take a submitted run of this workflow, definition and queue; ``legacy``:
        the run was recorded by an earlier raysaga (its hash may be the code's earlier-scheme one)."""
        return self.serves_queue(queue) and any(
            w.name == workflow and (w.definition_hash == definition_hash
                                    or (legacy and w.legacy_hash is not None and w.legacy_hash == definition_hash))
            for w in self.workflows)


def _values(record: WorkerRecord) -> dict[str, object]:
    return {**record.model_dump(exclude={"workflows"}), "workflows": [w.model_dump() for w in record.workflows]}


def register(engine: Engine, record: WorkerRecord) -> None:
    """Write the worker's row (again, if a beat found it gone) and forget workers silent for a week."""
    with engine.begin() as conn:
        conn.execute(delete(workers).where(workers.c.beat_at < record.beat_at - FORGET_AFTER))
        conn.execute(delete(workers).where(workers.c.worker_id == record.worker_id))
        conn.execute(insert(workers).values(**_values(record)))


def beat(engine: Engine, worker_id: str, at: float, busy: int) -> bool:
    """Record a beat; False when the row is gone (deleted by hand or by another's clean-up)."""
    with engine.begin() as conn:
        done = conn.execute(update(workers).where(workers.c.worker_id == worker_id)
                            .values(beat_at=at, busy=busy))
    return bool(done.rowcount)


def stop(engine: Engine, worker_id: str, at: float) -> None:
    """Record a clean exit: the row stays (``raysaga workers --all`` shows it), no longer live."""
    with engine.begin() as conn:
        conn.execute(update(workers).where(workers.c.worker_id == worker_id).values(stopped_at=at, beat_at=at,
                                                                                    busy=0))


def listed(engine: Engine, since: float | None = None) -> list[WorkerRecord]:
    """The rows, oldest start first; with ``since``, those that beat or stopped since then."""
    query = select(workers).order_by(workers.c.started_at, workers.c.worker_id)
    if since is not None:
        query = query.where(or_(workers.c.beat_at >= since, workers.c.stopped_at >= since))
    with engine.connect() as conn:
        rows = conn.execute(query).mappings().all()
    return [WorkerRecord.model_validate(dict(row)) for row in rows]


class WorkerRows:
    """``Store``'s worker registry on ``engine`` (mixed into ``SqlStore``)."""

    engine: Engine
    reader: Engine

    def worker_register(self, record: WorkerRecord) -> None:
        register(self.engine, record)

    def worker_beat(self, worker_id: str, at: float, busy: int) -> bool:
        return beat(self.engine, worker_id, at, busy)

    def worker_stop(self, worker_id: str, at: float) -> None:
        stop(self.engine, worker_id, at)

    def workers(self, since: float | None = None) -> list[WorkerRecord]:
        return listed(self.reader, since)

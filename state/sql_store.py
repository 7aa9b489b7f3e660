"""The SQLAlchemy implementation of ``Store`` for SQLite and PostgreSQL."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from sqlalchemy import (
    Column,
    Connection,
    Engine,
    LargeBinary,
    Row,
    Table,
    and_,
    bindparam,
    cast,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, OperationalError

from raysaga.errors import (
    BlobIntegrityError,
    ConcurrencyConflict,
    CorruptRecordError,
    IllegalTransitionError,
    InputTooLargeError,
    LeaseHeldError,
    LeaseLostError,
    RunExistsError,
    RunNotFoundError,
    UserError,
)
from raysaga.state import jsoncodec, migrate
from raysaga.state.engine import make_engine, normalize_url, redact
from raysaga.state.models import (
    PARKED,
    TERMINAL,
    Batch,
    BreakerRecord,
    EffectRecord,
    EffectStatus,
    EventRecord,
    Lease,
    MemoryEntry,
    NewEvent,
    NewRun,
    NodeRecord,
    RunRecord,
    RunSnapshot,
    RunStatus,
    RunSummary,
    SignalRecord,
    can_transition,
)
from raysaga.state.prune import PruneReport
from raysaga.state.prune import prune as prune_runs
from raysaga.state.redact import scrub, scrub_text
from raysaga.state.schema import JsonText, blobs, breakers, effects, events, memory, nodes, runs, signals
from raysaga.state.store import Store

#: A run's input or output whose JSON is larger than this is kept in raysaga_blobs, not in its
#: row (DESIGN: rows stay small; ``list`` and every transition read the row). The default of
#: ``RunOptions.blob_threshold``, which does the same for node outputs.
RUN_VALUE_INLINE_LIMIT = 64 * 1024
#: Default cap on a run's input (canonical JSON bytes); ``RAYSAGA_MAX_INPUT_BYTES`` or
#: ``SqlStore(max_input_bytes=...)`` changes it. A run input is read whole by every resume: large
#: data belongs elsewhere (a path, a URL, an id), with the run holding the reference.
MAX_INPUT_BYTES = 16 * 1024 * 1024
MAX_INPUT_ENV = "RAYSAGA_MAX_INPUT_BYTES"
#: ``list_runs`` pages are at most this long (summary rows only, so this bounds its memory).
MAX_LIST_LIMIT = 100_000


class SqlStore(Store):
    """Store on a SQLAlchemy engine. Creating one migrates the database if needed."""

    def __init__(self, url: str, *, migrate_schema: bool = True,
                 run_value_inline_limit: int = RUN_VALUE_INLINE_LIMIT, max_input_bytes: int | None = None) -> None:
        self.url = normalize_url(url)
        self.run_value_inline_limit = run_value_inline_limit
        self.max_input_bytes = input_cap(max_input_bytes)
        self.engine: Engine = make_engine(self.url)
        # reads on their own engine: on SQLite they then never take the write lock
        self.reader: Engine = make_engine(self.url, for_reads=True) if self.dialect_of(self.url) == "sqlite" \
            else self.engine
        if migrate_schema:
            migrate.upgrade(self.engine)
        else:
            migrate.check_version(migrate.current_version(self.engine))

    def __repr__(self) -> str:
        return f"SqlStore({redact(self.url)!r})"

    @property
    def dialect(self) -> str:
        return self.engine.dialect.name

    @staticmethod
    def dialect_of(url: str) -> str:
        return "sqlite" if url.startswith("sqlite") else "postgresql"

    def close(self) -> None:
        self.engine.dispose()
        if self.reader is not self.engine:
            self.reader.dispose()

    # ---------------------------------------------------------------- runs

    def create_run(self, new: NewRun) -> RunRecord:
        now = time.time()
        values = new.model_dump(exclude={"input"})  # the input is not copied: it may be large
        values.update(status=RunStatus.PENDING.value, version=0, fence=0, event_seq=1, retries_used=0,
                      tokens_used=0, cost_used=0.0, created_at=now, updated_at=now)
        try:
            with self.engine.begin() as conn:
                values["input"], values["input_digest"], _ = self._run_value(conn, new.input, "input")
                conn.execute(insert(runs).values(**values))
                conn.execute(insert(events).values(run_id=new.run_id, seq=1, at=now, kind="run_created",
                                                   data=scrub({"workflow": new.workflow_name})))
        except IntegrityError:
            raise RunExistsError(new.run_id) from None
        return self.get_run(new.run_id)

    def get_run(self, run_id: str, *, lenient: bool = False) -> RunRecord:
        with self.reader.connect() as conn:
            return self._get_run(conn, run_id, lenient=lenient)

    def _get_run(self, conn: Connection, run_id: str, *, lenient: bool = False) -> RunRecord:
        with _reading(run_id, runs.name):
            row = conn.execute(select(runs).where(runs.c.run_id == run_id)).first()
        if row is None:
            raise RunNotFoundError(run_id)
        return self._run_record(conn, row, lenient=lenient)

    def _status(self, conn: Connection, run_id: str) -> RunStatus:
        """The run's status column only (never its input or output, which may be damaged blobs)."""
        row = conn.execute(select(runs.c.status).where(runs.c.run_id == run_id)).first()
        if row is None:
            raise RunNotFoundError(run_id)
        with _reading(run_id, runs.name):
            try:
                return RunStatus(row[0])
            except ValueError:
                raise CorruptRecordError(f"raysaga_runs.status is {_short(row[0])}, not a run state") from None

    def list_runs(self, status: RunStatus | None = None, limit: int = 50, *, workflow: str | None = None,
                  before: tuple[float, str] | None = None) -> list[RunSummary]:
        """Newest first (by created_at, then run_id), at most ``limit``, summary columns only.

        ``before`` is the ``cursor`` of the last row of the previous page (keyset paging: every
        page costs one index range scan however deep). A row that cannot be read is listed with
        ``corrupt`` saying why; the other runs are unaffected.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise UserError(f"list limit {limit!r} is not a whole number from 1 to {MAX_LIST_LIMIT}: "
                            "page with before=summary.cursor for more")
        query = select(*_SUMMARY).order_by(runs.c.created_at.desc(), runs.c.run_id.desc()).limit(limit)
        if status is not None:
            query = query.where(runs.c.status == RunStatus(status).value)
        if workflow is not None:
            query = query.where(runs.c.workflow_name == workflow)
        if before is not None:
            at, after_id = before
            query = query.where(or_(runs.c.created_at < at, and_(runs.c.created_at == at, runs.c.run_id < after_id)))
        with self.reader.connect() as conn:
            try:
                rows = [r._asdict() for r in conn.execute(query).all()]
            except OperationalError as exc:
                if not _undecodable(exc):
                    raise
                # SQLite refuses the whole result when one text column is not UTF-8: read the
                # page again with text columns as bytes, and flag just the rows that hold them
                rows = [_decode_summary(r._asdict()) for r in conn.execute(_as_bytes(query)).all()]
        return [self._summary(values) for values in rows]

    def _summary(self, values: dict[str, Any]) -> RunSummary:
        problem = values.pop("corrupt", None)
        status = values["status"]
        if status not in _STATES:
            problem = problem or f"raysaga_runs.status is {status!r}, not a run state"
            values["status"] = None
        for name in ("created_at", "updated_at"):
            if isinstance(values[name], bool) or not isinstance(values[name], int | float):
                problem = problem or f"raysaga_runs.{name} is {values[name]!r}, not a time"
                values[name] = 0.0
        if values["lease_expires_at"] is not None and not isinstance(values["lease_expires_at"], int | float):
            problem = problem or f"raysaga_runs.lease_expires_at is {values['lease_expires_at']!r}, not a time"
            values["lease_expires_at"] = None
        for name in ("run_id", "workflow_name", "workflow_version"):
            if not isinstance(values[name], str):
                problem = problem or f"raysaga_runs.{name} is {values[name]!r}, not text"
                values[name] = str(values[name])
        for name in ("status_reason", "lease_owner"):
            if values[name] is not None and not isinstance(values[name], str):
                problem = problem or f"raysaga_runs.{name} is {values[name]!r}, not text"
                values[name] = str(values[name])
        summary = RunSummary.model_validate({**values, "corrupt": problem})
        summary._load = functools.partial(self.get_run, summary.run_id)
        return summary

    def _run_value(self, conn: Connection, value: Any, what: str) -> tuple[Any, str | None, str | None]:
        """A run's input or output as (inline value, None, None), or (None, digest, None) once it is
        large; an output ``{key: large}`` is (None, digest of large, key): the sink node's blob of
        the same canonical bytes then holds it once (the digest is the same, the insert a no-op)."""
        if value is None:
            return None, None, None
        if what == "output" and isinstance(value, dict) and len(value) == 1:
            ((key, inner),) = value.items()
            part = jsoncodec.dumps(inner, f"run output[{key!r}]").encode("utf-8")
            if len(part) > self.run_value_inline_limit and len(key) <= 200:
                digest = jsoncodec.digest(part)
                _put_blobs(conn, [{"digest": digest, "size": len(part), "data": part}])
                return None, digest, key
        data = jsoncodec.dumps(value, f"run {what}").encode("utf-8")
        if what == "input" and len(data) > self.max_input_bytes:
            raise InputTooLargeError(
                f"run input is {len(data):,} bytes of JSON, above the cap of {self.max_input_bytes:,} bytes: pass "
                f"a reference (a path, a URL, an id) instead, or raise the cap with {MAX_INPUT_ENV}=BYTES "
                "(or SqlStore(max_input_bytes=...))")
        if len(data) <= self.run_value_inline_limit:
            return value, None, None
        digest = jsoncodec.digest(data)
        _put_blobs(conn, [{"digest": digest, "size": len(data), "data": data}])
        return None, digest, None

    @staticmethod
    def _run_record(conn: Connection, row: Row[Any], *, lenient: bool = False) -> RunRecord:
        """``lenient``: a value whose blob is missing, altered or not JSON reads as None (its
        ``*_digest`` still names it) instead of raising; for status checks and operator commands
        on a damaged run, never for data a step receives."""
        values = row._asdict()
        run_id = values["run_id"]
        output_key = values.pop("output_key", None)
        wanted = {values[f"{name}_digest"]: f"{name} of run {run_id!r}" for name in ("input", "output")
                  if values[f"{name}_digest"]}
        if wanted:
            if lenient:
                found: dict[str, Any] = {}
                for digest, where in wanted.items():
                    with suppress(BlobIntegrityError):
                        found.update(_load_blobs(conn, {digest: where}))
            else:
                found = _load_blobs(conn, wanted)
            for name in ("input", "output"):
                digest = values[f"{name}_digest"]
                if digest:
                    values[name] = found.get(digest)
            if output_key is not None and values["output_digest"]:
                values["output"] = {output_key: values["output"]}
        with _reading(run_id, runs.name):
            return RunRecord.model_validate(values)

    def snapshot(self, run_id: str) -> RunSnapshot:
        with self.reader.connect() as conn:
            run = self._get_run(conn, run_id)
            with _reading(run_id, nodes.name):
                node_rows = _records(NodeRecord, conn.execute(select(nodes).where(nodes.c.run_id == run_id)).all())
            with _reading(run_id, effects.name):
                effect_rows = _records(EffectRecord,
                                       conn.execute(select(effects).where(effects.c.run_id == run_id)).all())
            with _reading(run_id, signals.name):
                signal_rows = _records(SignalRecord, conn.execute(
                    select(signals).where(signals.c.run_id == run_id, signals.c.consumed_at.is_(None))
                    .order_by(signals.c.id)
                ).all())
        return RunSnapshot(run=run, nodes=node_rows, effects=effect_rows, signals=signal_rows)

    def transition(self, run_id: str, expected_version: int, status: RunStatus, *, reason: str | None = None,
                   data: Any = None) -> RunRecord:
        now = time.time()
        with self.engine.begin() as conn:
            with _reading(run_id, runs.name):  # the status and version columns only: never the values
                found = conn.execute(select(runs.c.version).where(runs.c.run_id == run_id)).first()
            if found is None:
                raise RunNotFoundError(run_id)
            current_status = self._status(conn, run_id)
            if found[0] != expected_version:
                raise ConcurrencyConflict(
                    f"run {run_id!r} is at version {found[0]}, not {expected_version}: re-read and retry"
                )
            _check_transition(run_id, current_status, status)
            result = conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id, runs.c.version == expected_version)
                .values(status=status.value, status_reason=None if reason is None else scrub_text(reason),
                        version=runs.c.version + 1,
                        event_seq=runs.c.event_seq + 1, updated_at=now)
                .returning(runs.c.event_seq)
            ).first()
            if result is None:
                raise ConcurrencyConflict(f"run {run_id!r} changed under this transition: re-read and retry")
            conn.execute(insert(events).values(
                run_id=run_id, seq=result[0], at=now, kind="run_" + status.value,
                data=scrub({"from": current_status.value, "reason": reason, **(data or {})}),
            ))
            return self._get_run(conn, run_id, lenient=status in TERMINAL or status in PARKED)

    # ---------------------------------------------------------------- leases

    def claim(self, run_id: str, owner: str, ttl: float, *, take_from: str | None = None) -> Lease:
        now = time.time()
        free = or_(runs.c.lease_owner.is_(None), runs.c.lease_expires_at < now)
        if take_from is not None:  # the caller proved this owner's process gone: one atomic take-over
            free = or_(free, runs.c.lease_owner == take_from)
        with self.engine.begin() as conn:
            row = conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id, free)
                .values(lease_owner=owner, lease_expires_at=now + ttl, fence=runs.c.fence + 1,
                        event_seq=runs.c.event_seq + 1, updated_at=now)
                .returning(runs.c.fence, runs.c.event_seq)
            ).first()
            if row is None:
                current = self._get_run(conn, run_id, lenient=True)  # raises RunNotFoundError
                left = (current.lease_expires_at or now) - now
                raise LeaseHeldError(
                    f"run {run_id!r} is being driven by {current.lease_owner} (lease expires in {left:.1f}s): "
                    "it is live, so this driver backs off; `raysaga status` shows its progress"
                )
            fence, seq = row
            data: dict[str, Any] = {"owner": owner, "fence": fence}
            if take_from is not None:
                data["taken_from"] = take_from
            conn.execute(insert(events).values(run_id=run_id, seq=seq, at=now, kind="lease_claimed", data=data))
        return Lease(run_id=run_id, owner=owner, fence=fence, expires_at=now + ttl, ttl=ttl)

    def renew(self, lease: Lease) -> Lease:
        now = time.time()
        with self.engine.begin() as conn:
            result = conn.execute(
                update(runs)
                .where(runs.c.run_id == lease.run_id, runs.c.fence == lease.fence,
                       runs.c.lease_owner == lease.owner)  # a released lease stays released
                .values(lease_expires_at=now + lease.ttl)
            )
            if result.rowcount != 1:
                raise LeaseLostError(f"run {lease.run_id!r}: fence {lease.fence} is stale; another driver owns it")
        return lease.model_copy(update={"expires_at": now + lease.ttl})

    def release(self, lease: Lease) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                update(runs)
                .where(runs.c.run_id == lease.run_id, runs.c.fence == lease.fence)
                .values(lease_owner=None, lease_expires_at=None)
            )

    # ---------------------------------------------------------------- the driver's commit

    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        now = time.time()
        new_events = batch.events
        if batch.run is not None and batch.run.status is not None:
            # every transition appends its event, in the same transaction
            new_events = [*new_events, NewEvent(kind="run_" + batch.run.status.value,
                                                data={"reason": batch.run.status_reason})]
        run_id = lease.run_id
        with self.engine.begin() as conn:
            sql = _driver_sql(conn.dialect.name)
            # the hot statements run as plain SQL built once per dialect: Core would rebuild,
            # cache-key and look up each of them on every commit (~0.3 ms a commit)
            row = conn.exec_driver_sql(sql.guard, (len(new_events), now, run_id, lease.fence)).first()
            if row is None:
                raise LeaseLostError(
                    f"run {run_id!r}: fence {lease.fence} is stale; another driver took the run, "
                    "this one stops without writing"
                )
            seq_end = int(row[0])
            changed: RunRecord | None = None
            if batch.run is not None:
                changed = self._apply_run_update(conn, lease, batch, now)
            if batch.blobs:
                _put_blobs(conn, [{"digest": d, "size": len(b), "data": b} for d, b in batch.blobs.items()])
            if batch.nodes:
                # executemany runs the statement once per row, in order: a node written twice in
                # one batch ends as its last write (no "ON CONFLICT ... a second time" error)
                conn.exec_driver_sql(sql.nodes, [
                    (run_id, n.node_id, n.fan_index, n.status.value, n.attempt, n.not_before, _json(n.output),
                     n.output_digest, _json(scrub(n.error)), n.started_at, n.finished_at, n.duration)
                    for n in batch.nodes])
            if batch.effects:
                self._write_effects(conn, run_id, batch, now)
            if new_events:
                first = seq_end - len(new_events) + 1
                conn.exec_driver_sql(sql.events, [
                    (run_id, first + i, now, e.kind, e.node_id, e.fan_index, _json(scrub(e.data)))
                    for i, e in enumerate(new_events)])
            if batch.consumed_signals:
                conn.execute(update(signals).where(signals.c.id.in_(batch.consumed_signals),
                                                   signals.c.run_id == run_id).values(consumed_at=now))
            return changed

    def _fence_guard(self, conn: Connection, lease: Lease, n_events: int, now: float) -> int:
        """First statement of every driver transaction: proves the fence and reserves event seqs.

        It also takes the run row's write lock, so a claim by another driver waits for this
        transaction, and any claim that already happened makes it write nothing.
        """
        row = conn.execute(_GUARD, {"g_run": lease.run_id, "g_fence": lease.fence, "g_n": n_events,
                                    "g_now": now}).first()
        if row is None:
            raise LeaseLostError(
                f"run {lease.run_id!r}: fence {lease.fence} is stale; another driver took the run, "
                "this one stops without writing"
            )
        return int(row[0])

    def _apply_run_update(self, conn: Connection, lease: Lease, batch: Batch, now: float) -> RunRecord:
        assert batch.run is not None
        upd = batch.run
        values: dict[str, Any] = {}
        if upd.status is not None:
            _check_transition(lease.run_id, self._status(conn, lease.run_id), upd.status)
            reason = None if upd.status_reason is None else scrub_text(upd.status_reason)
            values.update(status=upd.status.value, status_reason=reason, version=runs.c.version + 1)
        if upd.set_output:
            values["output"], values["output_digest"], values["output_key"] = \
                self._run_value(conn, upd.output, "output")
        if upd.set_error:
            values["error"] = scrub(upd.error)
        if upd.retries_delta:
            values["retries_used"] = runs.c.retries_used + upd.retries_delta
        if upd.tokens_delta:
            values["tokens_used"] = runs.c.tokens_used + upd.tokens_delta
        if upd.cost_delta:
            values["cost_used"] = runs.c.cost_used + upd.cost_delta
        if upd.set_budgets:
            values.update(token_budget=upd.token_budget, cost_budget=upd.cost_budget)
        if values:
            conn.execute(update(runs).where(runs.c.run_id == lease.run_id, runs.c.fence == lease.fence)
                         .values(**values))
        # a run parked or ended may have a damaged value (the reason it is parked): read it leniently
        at_rest = upd.status is not None and (upd.status in TERMINAL or upd.status in PARKED)
        return self._get_run(conn, lease.run_id, lenient=at_rest)

    def _write_effects(self, conn: Connection, run_id: str, batch: Batch, now: float) -> None:
        pending = [e for e in batch.effects if e.status == EffectStatus.PENDING]
        final = [e for e in batch.effects if e.status != EffectStatus.PENDING]
        if pending:
            rows = [{"run_id": run_id, "created_at": now, "updated_at": now, **e.model_dump()} for e in pending]
            # insert-once: an existing row keeps its key and status, except that a failed
            # effect an operator retries becomes pending again (same key)
            stmt = _insert_for(conn, effects)
            stmt = stmt.on_conflict_do_update(
                index_elements=["idempotency_key"],
                set_={"status": EffectStatus.PENDING.value, "updated_at": now},
                where=effects.c.status == EffectStatus.FAILED.value,
            )
            conn.execute(stmt, rows)
        if final:
            rows = [{"run_id": run_id, "created_at": now, "updated_at": now, **e.model_dump()} for e in final]
            _upsert(conn, effects, rows, ["idempotency_key"], keep=("created_at",))

    # ---------------------------------------------------------------- reads

    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """Blob bytes by digest, each checked against its content address (``BlobIntegrityError`` on a
        mismatch); a digest with no blob is absent from the result (``load_blobs`` refuses that)."""
        wanted = list(set(digests))
        if not wanted:
            return {}
        with self.reader.connect() as conn:
            rows = conn.execute(select(blobs.c.digest, blobs.c.data).where(blobs.c.digest.in_(wanted))).all()
        out = {d: bytes(b) for d, b in rows}
        for d, data in out.items():
            _verify(d, data, "")
        return out

    def load_blobs(self, wanted: Mapping[str, str]) -> dict[str, Any]:
        """The JSON values of blobs, by digest; ``wanted`` maps each digest to where it is used (for
        the message). ``BlobIntegrityError`` if one is missing, does not match its digest or is
        not JSON: such data is never returned."""
        if not wanted:
            return {}
        with self.reader.connect() as conn:
            return _load_blobs(conn, wanted)

    def put_blobs(self, blobs_by_digest: dict[str, bytes]) -> None:
        if not blobs_by_digest:
            return
        with self.engine.begin() as conn:
            _put_blobs(conn, [{"digest": d, "size": len(b), "data": b} for d, b in blobs_by_digest.items()])

    def nodes(self, run_id: str) -> list[NodeRecord]:
        with self.reader.connect() as conn, _reading(run_id, nodes.name):
            rows = conn.execute(select(nodes).where(nodes.c.run_id == run_id)
                                .order_by(nodes.c.started_at.is_(None), nodes.c.started_at, nodes.c.node_id,
                                          nodes.c.fan_index)).all()
            return _records(NodeRecord, rows)

    def effects(self, run_id: str) -> list[EffectRecord]:
        with self.reader.connect() as conn, _reading(run_id, effects.name):
            rows = conn.execute(select(effects).where(effects.c.run_id == run_id)
                                .order_by(effects.c.created_at, effects.c.idempotency_key)).all()
            return _records(EffectRecord, rows)

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[EventRecord]:
        query = select(events).where(events.c.run_id == run_id, events.c.seq > after_seq).order_by(events.c.seq)
        if limit is not None:
            query = query.limit(limit)
        with self.reader.connect() as conn, _reading(run_id, events.name):
            return _records(EventRecord, conn.execute(query).all())

    def count_events(self, run_id: str) -> int:
        with self.reader.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(events).where(events.c.run_id == run_id))
                       .scalar_one())

    def prune(self, older_than: float, statuses: Iterable[RunStatus | str] | None = None, batch_size: int = 500,
              dry_run: bool = False) -> PruneReport:
        """Delete finished runs older than ``older_than`` seconds, with their rows and unshared blobs
        (see ``raysaga.state.prune``)."""
        return prune_runs(self, older_than, statuses, batch_size, dry_run)

    # ---------------------------------------------------------------- signals

    def send_signal(self, run_id: str, kind: str, node_id: str | None = None, payload: Any = None) -> SignalRecord:
        now = time.time()
        with self.engine.begin() as conn:
            self._status(conn, run_id)  # RunNotFoundError; the run's values are not read
            row = conn.execute(
                insert(signals).values(run_id=run_id, kind=kind, node_id=node_id, payload=payload, created_at=now)
                .returning(*signals.c)
            ).one()
        return SignalRecord.model_validate(row._asdict())

    def pending_signals(self, run_id: str) -> list[SignalRecord]:
        with self.reader.connect() as conn, _reading(run_id, signals.name):
            rows = conn.execute(select(signals).where(and_(signals.c.run_id == run_id,
                                                           signals.c.consumed_at.is_(None)))
                                .order_by(signals.c.id)).all()
            return _records(SignalRecord, rows)


    # ---------------------------------------------------------------- shared memory (blackboard)

    def memory_get(self, run_id: str, key: str) -> MemoryEntry:
        with self.reader.connect() as conn, _reading(run_id, memory.name):
            row = conn.execute(select(memory).where(memory.c.run_id == run_id, memory.c.key == key)).first()
        if row is None:
            return MemoryEntry(key=key)
        return MemoryEntry(key=key, value=row.value, version=row.version, writer=row.writer)

    def memory_cas(self, lease: Lease, key: str, value: Any, expected_version: int, writer: str) -> MemoryEntry:
        """Write ``key`` if it is still at ``expected_version`` (0: absent); fenced like every driver write.

        Returns the entry as it now stands: ``version == expected_version + 1`` and ``writer`` this
        writer's key on success, else the newer entry that won. Re-applying the same ``writer`` is a
        no-op success (a resumed driver re-issuing a write it already made).
        """
        now = time.time()
        with self.engine.begin() as conn:
            self._fence_guard(conn, lease, 0, now)
            with _reading(lease.run_id, memory.name):
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

    def breaker_get(self, name: str) -> BreakerRecord:
        with self.reader.connect() as conn:
            row = conn.execute(select(breakers).where(breakers.c.name == name)).first()
        if row is None:
            return BreakerRecord(name=name)
        return BreakerRecord(name=name, state=row.state, failures=row.failures, opened_at=row.opened_at,
                             version=row.version)

    def breaker_cas(self, record: BreakerRecord, expected_version: int) -> bool:
        """Store a breaker's new state if nobody changed it since ``expected_version``."""
        now = time.time()
        values = {"state": record.state, "failures": record.failures, "opened_at": record.opened_at,
                  "version": expected_version + 1, "updated_at": now}
        with self.engine.begin() as conn:
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


#: Built once: statement construction costs more than its execution on a hot path.
_GUARD = (update(runs)
          .where(runs.c.run_id == bindparam("g_run"), runs.c.fence == bindparam("g_fence"))
          .values(event_seq=runs.c.event_seq + bindparam("g_n"), updated_at=bindparam("g_now"))
          .returning(runs.c.event_seq))
_UPSERTS: dict[tuple[str, str, tuple[str, ...], tuple[str, ...]], Any] = {}


@dataclass(frozen=True)
class _DriverSql:
    guard: str
    nodes: str
    events: str


_NODE_COLUMNS = ("run_id", "node_id", "fan_index", "status", "attempt", "not_before", "output", "output_digest",
                 "error", "started_at", "finished_at", "duration")
_EVENT_COLUMNS = ("run_id", "seq", "at", "kind", "node_id", "fan_index", "data")
assert tuple(nodes.c.keys()) == _NODE_COLUMNS and tuple(events.c.keys()) == _EVENT_COLUMNS, \
    "the schema changed: update _driver_sql and SqlStore.commit's row tuples"


@functools.cache
def _driver_sql(dialect: str) -> _DriverSql:
    """The driver commit's three hot statements as plain SQL for ``dialect`` (qmark or format params)."""
    mark = "?" if dialect == "sqlite" else "%s"

    def value(column: Column[Any]) -> str:
        # PostgreSQL takes JSON text into a json column only with a cast; SQLite stores it as text
        return f"CAST({mark} AS JSON)" if dialect != "sqlite" and isinstance(column.type, JsonText) else mark

    def insert_sql(table: Table) -> str:
        return (f"INSERT INTO {table.name} ({', '.join(table.c.keys())}) "
                f"VALUES ({', '.join(value(c) for c in table.c)})")

    keys = [c.name for c in nodes.primary_key.columns]
    updates = ", ".join(f"{c.name} = excluded.{c.name}" for c in nodes.c if c.name not in keys)
    return _DriverSql(
        guard=(f"UPDATE {runs.name} SET event_seq = event_seq + {mark}, updated_at = {mark} "
               f"WHERE run_id = {mark} AND fence = {mark} RETURNING event_seq"),
        nodes=f"{insert_sql(nodes)} ON CONFLICT ({', '.join(keys)}) DO UPDATE SET {updates}",
        events=insert_sql(events),
    )


_SUMMARY = (runs.c.run_id, runs.c.workflow_name, runs.c.workflow_version, runs.c.status, runs.c.status_reason,
            runs.c.created_at, runs.c.updated_at, runs.c.lease_owner, runs.c.lease_expires_at)
_TEXT_SUMMARY = ("run_id", "workflow_name", "workflow_version", "status", "status_reason", "lease_owner")
_STATES = frozenset(s.value for s in RunStatus)


def input_cap(given: int | None = None) -> int:
    """The run-input cap in bytes: ``given``, else ``RAYSAGA_MAX_INPUT_BYTES``, else the default."""
    if given is None:
        env = os.environ.get(MAX_INPUT_ENV)
        if not env:
            return MAX_INPUT_BYTES
        try:
            given = int(env)
        except ValueError:
            raise UserError(f"{MAX_INPUT_ENV}={env!r} is not a whole number of bytes") from None
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise UserError(f"max_input_bytes {given!r} must be a positive whole number of bytes")
    return given


@contextmanager
def _reading(run_id: str, table: str) -> Iterator[None]:
    """Turn a stored row that cannot be read back into one ``CorruptRecordError`` naming the run,
    the table and the column: never a pydantic traceback, and never a failure of other runs."""
    advice = (": the row was changed outside raysaga; only this run is affected (restore the row from a "
              "backup, or delete the run's rows)")
    try:
        yield
    except CorruptRecordError as exc:
        if str(exc).startswith("run "):
            raise
        raise CorruptRecordError(f"run {run_id!r}: {exc}{advice}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        column = ".".join(str(p) for p in first["loc"])
        raise CorruptRecordError(f"run {run_id!r}: {table}.{column} is {_short(first.get('input'))}: "
                                 f"{first['msg']}{advice}") from None
    except OperationalError as exc:
        if not _undecodable(exc):
            raise
        raise CorruptRecordError(f"run {run_id!r}: {table} holds text that is not UTF-8 ({exc.orig}){advice}") \
            from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _undecodable(exc: OperationalError) -> bool:
    return "could not decode" in str(exc.orig).lower()


def _as_bytes(query: Any) -> Any:
    """``query`` with its text summary columns read as raw bytes (SQLite: CAST AS BLOB)."""
    cols = [cast(c, LargeBinary).label(c.name) if c.name in _TEXT_SUMMARY else c for c in _SUMMARY]
    return query.with_only_columns(*cols)


def _decode_summary(values: dict[str, Any]) -> dict[str, Any]:
    problem = None
    for name in _TEXT_SUMMARY:
        raw = values[name]
        if isinstance(raw, bytes | bytearray | memoryview):
            try:
                values[name] = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                values[name] = bytes(raw).decode("utf-8", "replace")
                problem = problem or f"raysaga_runs.{name} holds bytes that are not UTF-8 text"
    values["corrupt"] = problem
    return values


def _verify(digest: str, data: bytes, where: str) -> None:
    actual = jsoncodec.digest(data)
    if actual != digest:
        raise BlobIntegrityError(digest, f"does not match its content (the stored bytes hash to {actual})", where)


def _load_blobs(conn: Connection, wanted: Mapping[str, str]) -> dict[str, Any]:
    """Fetch, verify and parse blobs: ``wanted`` maps digest -> where it is used."""
    rows = conn.execute(select(blobs.c.digest, blobs.c.data).where(blobs.c.digest.in_(list(wanted)))).all()
    found = {d: bytes(b) for d, b in rows}
    out: dict[str, Any] = {}
    for d, where in wanted.items():
        data = found.get(d)
        if data is None:
            raise BlobIntegrityError(d, "is missing", where)
        _verify(d, data, where)
        try:
            out[d] = jsoncodec.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BlobIntegrityError(d, f"is not JSON ({exc})", where) from None
    return out


def _json(value: Any) -> str | None:
    """A JSON column's parameter: canonical JSON text, or SQL NULL for None (read back as None either way)."""
    return None if value is None else jsoncodec.dumps(value)


def _check_transition(run_id: str, current: RunStatus, new: RunStatus) -> None:
    if not can_transition(current, new):
        raise IllegalTransitionError(f"run {run_id!r} cannot go from {current.value} to {new.value}")


def _records(model: Any, rows: Sequence[Row[Any]]) -> list[Any]:
    return [model.model_validate(r._asdict()) for r in rows]


def _insert_for(conn: Connection, table: Table) -> Any:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    return sqlite.insert(table)


def _put_blobs(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Write blobs by digest. Insert-once, except that a row whose stored bytes differ from the
    ones written (altered behind raysaga's back: the digest is of the content) is repaired, so a
    tampered blob never poisons later writes of the same content. An intact row is left as is
    (one byte comparison on a conflict). Only bytes that hash to their digest may repair a row:
    a body under another digest never replaces a stored one (it is ignored, insert-once)."""
    right = [r for r in rows if jsoncodec.digest(r["data"]) == r["digest"]]
    wrong = [r for r in rows if r not in right] if len(right) != len(rows) else []
    if right:
        stmt = _BLOB_PUT.get(conn.dialect.name)
        if stmt is None:
            base = _insert_for(conn, blobs)
            stmt = _BLOB_PUT[conn.dialect.name] = base.on_conflict_do_update(
                index_elements=["digest"], set_={"data": base.excluded.data, "size": base.excluded.size},
                where=blobs.c.data != base.excluded.data)
        conn.execute(stmt, right)
    if wrong:
        conn.execute(_insert_for(conn, blobs).on_conflict_do_nothing(index_elements=["digest"]), wrong)


_BLOB_PUT: dict[str, Any] = {}


def _upsert(conn: Connection, table: Table, rows: list[dict[str, Any]], keys: list[str],
            keep: tuple[str, ...] = ()) -> None:
    # one row per key, the last one written wins: PostgreSQL refuses an INSERT ... ON CONFLICT
    # that would touch the same row twice
    rows = list({tuple(r[k] for k in keys): r for r in rows}.values())
    cols = tuple(c for c in rows[0] if c not in keys and c not in keep)
    cache_key = (table.name, conn.dialect.name, tuple(keys), cols)
    stmt = _UPSERTS.get(cache_key)
    if stmt is None:
        base = _insert_for(conn, table)
        stmt = _UPSERTS[cache_key] = base.on_conflict_do_update(
            index_elements=keys, set_={c: base.excluded[c] for c in cols})
    conn.execute(stmt, rows)



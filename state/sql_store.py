"""The SQLAlchemy implementation of ``Store`` for SQLite and PostgreSQL.

``SqlStore`` holds the run's lifecycle (create, transition, lease, the driver's fenced commit)
and its reads. What it builds on has a module each: ``statements`` (SQL built once), ``blob_rows``
(blobs by digest), ``decoding`` (rows back into records, unreadable rows into one clear error),
``run_values`` (a run's input and output inline or as blobs) and ``shared_rows`` (memory,
circuit breakers, signals).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, insert, or_, select, update
from sqlalchemy.exc import OperationalError

from raysaga.errors import (
    ConcurrencyConflict,
    CorruptRecordError,
    IllegalTransitionError,
    LeaseHeldError,
    LeaseLostError,
    RunNotFoundError,
    UserError,
)
from raysaga.state import blob_rows, claims, decisions, jsoncodec, migrate, shared_rows, sqlite_readonly, stats
from raysaga.state.claims import Claim
from raysaga.state.dashboard_reads import DashboardReads
from raysaga.state.decisions import Decision, Verdict, WaitingApproval, decided_after
from raysaga.state.decoding import (
    SUMMARY,
    decode_summary,
    no_such_id,
    reading,
    records,
    run_status,
    status_of,
    summary,
    summary_as_bytes,
    undecodable,
)
from raysaga.state.decoding import reading as _reading  # noqa: F401  # imported from here before the split
from raysaga.state.engine import make_engine, normalize_url, redact, sqlite_path
from raysaga.state.error_record import stored_error
from raysaga.state.fork_rows import ForkRows
from raysaga.state.ledger_rows import write_effects
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
    NodeRecord,
    RunRecord,
    RunSnapshot,
    RunStatus,
    RunSummary,
    SignalKind,
    SignalRecord,
    can_transition,
)
from raysaga.state.node_reads import by_start, node_records
from raysaga.state.pruning import PruneReport
from raysaga.state.pruning import prune as prune_runs
from raysaga.state.rate_limits import RateRows
from raysaga.state.redact import scrub, scrub_text
from raysaga.state.run_creation import RunCreation
from raysaga.state.run_labels import labels_match
from raysaga.state.run_sql import read_records, read_run, run_of, run_params, run_sql, update_run_sql
from raysaga.state.run_values import MAX_INPUT_BYTES, MAX_INPUT_ENV, RUN_VALUE_INLINE_LIMIT, input_cap, store_run_value
from raysaga.state.schema import effects, events, runs, signals
from raysaga.state.statements import (
    HotSql,
    driver_sql,
    hot_transaction,
    json_param,
    sqlite_write,
    stale_fence,
    stored_status,
    write_items,
)
from raysaga.state.store import Store
from raysaga.state.worker_rows import WorkerRows

#: ``list_runs`` pages are at most this long (summary rows only, so this bounds its memory).
MAX_LIST_LIMIT = 100_000


def _reason_text(reason: str | None) -> str | None:
    """A run's ``status_reason`` as stored: secrets scrubbed, NUL written ``\\x00`` (an error's
    message may hold one, and PostgreSQL's text refuses it: the write, the driver and every resume
    failed), a lone surrogate (not UTF-8 anywhere) as its escape, ``\\ud800``."""
    if reason is None:
        return None
    return jsoncodec.printable(scrub_text(reason)).replace("\x00", "\\x00")


class SqlStore(RunCreation, ForkRows, DashboardReads, RateRows, WorkerRows, Store):
    """Store on a SQLAlchemy engine. Creating one migrates the database if needed."""

    def __init__(self, url: str, *, migrate_schema: bool = True,
                 run_value_inline_limit: int = RUN_VALUE_INLINE_LIMIT, max_input_bytes: int | None = None) -> None:
        self.url = normalize_url(url)
        self.run_value_inline_limit = run_value_inline_limit
        self.max_input_bytes = input_cap(max_input_bytes)
        path = sqlite_path(self.url)
        #: Opened to read a SQLite store this process cannot write (a read-only folder or file): its
        #: connections are read-only, and a write raises the store's read-only error (``sqlite_readonly``).
        self.read_only = not migrate_schema and path is not None and sqlite_readonly.unwritable(path) is not None
        self.engine: Engine = make_engine(self.url, read_only=self.read_only, create=not self.read_only)
        # reads on their own engine: on SQLite they then never take the write lock (a read-only one takes none)
        writable_sqlite = self.dialect_of(self.url) == "sqlite" and not self.read_only
        self.reader: Engine = make_engine(self.url, for_reads=True) if writable_sqlite else self.engine
        # commits of plain SQL only skip SQLAlchemy's Connection on SQLite (statements.sqlite_write)
        self._plain_commits = writable_sqlite
        try:
            if migrate_schema:
                migrate.upgrade(self.engine)
            else:
                migrate.check_version(migrate.current_version(self.engine))
        except BaseException:  # (a store too new, another process migrating it): its connections go
            self.close()
            raise

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

    def get_run(self, run_id: str, *, lenient: bool = False) -> RunRecord:
        with self.reader.connect() as conn:
            return self._get_run(conn, run_id, lenient=lenient)

    def _get_run(self, conn: Connection, run_id: str, *, lenient: bool = False) -> RunRecord:
        return read_run(conn, run_id, lenient=lenient)

    def list_runs(self, status: RunStatus | None = None, limit: int = 50, *, workflow: str | None = None,
                  before: tuple[float, str] | None = None, labels: Mapping[str, str] | None = None) -> list[RunSummary]:
        """``Store.list_runs``, newest by (created_at, run_id) first. ``before`` is keyset paging:
        every page costs one index range scan however deep."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIST_LIMIT:
            raise UserError(f"list limit {limit!r} is not a whole number from 1 to {MAX_LIST_LIMIT}: "
                            "page with before=summary.cursor for more")
        query = select(*SUMMARY).order_by(runs.c.created_at.desc(), runs.c.run_id.desc()).limit(limit)
        if status is not None:
            query = query.where(runs.c.status == RunStatus(status).value)
        if workflow is not None:
            try:  # a name no row can hold (NUL on PostgreSQL: a raw DataError; a lone surrogate): no runs
                no_such_id(self.dialect, workflow)
            except RunNotFoundError:
                return []
            query = query.where(runs.c.workflow_name == workflow)
        if labels:
            query = query.where(*labels_match(self.dialect, labels))
        if before is not None:
            at, after_id = before
            query = query.where(or_(runs.c.created_at < at, and_(runs.c.created_at == at, runs.c.run_id < after_id)))
        with self.reader.connect() as conn:
            try:
                rows = [r._asdict() for r in conn.execute(query).all()]
            except OperationalError as exc:
                if not undecodable(exc):
                    raise
                # SQLite refuses the whole result when one text column is not UTF-8: read the
                # page again with text columns as bytes, and flag just the rows that hold them
                rows = [decode_summary(r._asdict()) for r in conn.execute(summary_as_bytes(query)).all()]
        return [self._summary(values) for values in rows]

    def _summary(self, values: dict[str, Any]) -> RunSummary:
        found = summary(values)
        found._load = functools.partial(self.get_run, found.run_id)
        return found

    def _run_value(self, conn: Connection, value: Any, what: str) -> tuple[Any, str | None, str | None]:
        return store_run_value(conn, value, what, inline_limit=self.run_value_inline_limit,
                               max_input_bytes=self.max_input_bytes)

    def snapshot(self, run_id: str) -> RunSnapshot:
        with self.reader.connect() as conn:
            run = self._get_run(conn, run_id)
            sql = run_sql(conn.dialect.name)
            return RunSnapshot(run=run, nodes=node_records(conn, run_id),  # rows and item chunks by key
                               effects=read_records(conn, run_id, effects, sql.effects, EffectRecord),
                               signals=read_records(conn, run_id, signals, sql.signals, SignalRecord))

    def transition(self, run_id: str, expected_version: int, status: RunStatus, *, reason: str | None = None,
                   data: Any = None) -> RunRecord:
        now = time.time()
        with self.engine.begin() as conn:
            # the status and version columns only (never the values), the row locked on PostgreSQL: read
            # apart under READ COMMITTED, the version could predate a concurrent transition whose new
            # status the next read saw (a loser of the race then failed 'running to running' instead
            # of a ConcurrencyConflict); SQLite's BEGIN IMMEDIATE already serialises writers
            no_such_id(conn.dialect.name, run_id)
            query = select(runs.c.version).where(runs.c.run_id == run_id)
            if conn.dialect.name == "postgresql":
                query = query.with_for_update()
            with reading(run_id, runs.name):
                found = conn.execute(query).first()
            if found is None:
                raise RunNotFoundError(run_id)
            current_status = run_status(conn, run_id)
            if found[0] != expected_version:
                raise ConcurrencyConflict(
                    f"run {run_id!r} is at version {found[0]}, not {expected_version}: re-read and retry"
                )
            _check_transition(run_id, current_status, status)
            result = conn.execute(
                update(runs)
                .where(runs.c.run_id == run_id, runs.c.version == expected_version)
                # ``wake_at`` cleared as a driver's commit of a new status clears it: a resting run's
                # timer time stays in its node rows, and a run paused at rest is not due until unpaused
                .values(status=status.value, status_reason=_reason_text(reason), wake_at=None,
                        version=runs.c.version + 1,
                        event_seq=runs.c.event_seq + 1, updated_at=now)
                .returning(runs.c.event_seq)
            ).first()
            if result is None:
                raise ConcurrencyConflict(f"run {run_id!r} changed under this transition: re-read and retry")
            conn.execute(insert(events).values(
                run_id=run_id, seq=result[0], at=now, kind="run_" + status.value,
                data=scrub({"from": current_status.value, "reason": _reason_text(reason), **(data or {})}),
            ))
            return self._get_run(conn, run_id, lenient=status in TERMINAL or status in PARKED)

    # ---------------------------------------------------------------- leases

    def claim(self, run_id: str, owner: str, ttl: float, *, take_from: str | None = None) -> Lease:
        now = time.time()
        with self.engine.begin() as conn:
            sql, hot = run_sql(conn.dialect.name), HotSql(conn)
            before = hot.one(sql.lease_state, (run_id,))
            # free (never taken, released, or expired), or held by an owner the caller proved gone
            params = (owner, now + ttl, now, run_id, now)
            row = hot.one(sql.claim, params) if take_from is None else \
                hot.one(sql.claim_taking, (*params, take_from))  # one atomic take-over
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
            if before is not None:  # died (abandoned_by), or provably alive but silent (taken_from_live)
                data.update(claims.abandonment(before[0], before[1], owner))
            hot.many(driver_sql(conn.dialect.name).events,
                     [(run_id, seq, now, "lease_claimed", None, None, json_param(data))])
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
            HotSql(conn).many(run_sql(conn.dialect.name).release, [(lease.run_id, lease.fence)])

    # ---------------------------------------------------------------- the driver's commit

    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        now = time.time()
        new_events = batch.events
        if batch.run is not None and batch.run.status is not None:
            # every transition appends its event, in the same transaction
            new_events = [*new_events, NewEvent(kind="run_" + batch.run.status.value,
                                                data={"reason": _reason_text(batch.run.status_reason)})]
        run_id = lease.run_id
        upd = batch.run
        updates_run = upd is not None and (upd.status is not None or upd.set_wake or upd.set_output or upd.set_error
                                           or upd.set_budgets or upd.release_lease)  # counters: by the guard
        # a batch of plain SQL only (a step's node and events, counters) on SQLite: no Connection
        plain = self._plain_commits and not (updates_run or batch.blobs or batch.effects or batch.consumed_signals
                                             or batch.breakers)
        with sqlite_write(self.engine) if plain else hot_transaction(self.engine) as hot:
            sql = driver_sql(hot.dialect.name)
            # the hot statements run as plain SQL built once per dialect: Core would rebuild,
            # cache-key and look up each of them on every commit (~0.3 ms a commit)
            if upd is not None and (upd.retries_delta or upd.tokens_delta or upd.cost_delta):
                row = hot.one(sql.counting_guard, (len(new_events), now, upd.retries_delta, upd.tokens_delta,
                                                   upd.cost_delta, run_id, lease.fence))
            else:
                row = hot.one(sql.guard, (len(new_events), now, run_id, lease.fence))
            if row is None:
                raise stale_fence(lease)
            seq_end, run_key = int(row[0]), row[2]  # node rows carry the run's key (schema 8)
            changed: RunRecord | None = None
            if updates_run:
                changed = self._apply_run_update(hot.core(), lease, batch, now, row[1])
            if batch.blobs:
                blob_rows.put(hot.core(), blob_rows.rows_of(batch.blobs))
            if batch.items:  # completed plain items: their output is canonical JSON text already
                write_items(hot, sql, run_id, run_key, batch.items)
            if batch.nodes:
                # executemany runs the statement once per row, in order: a node written twice in
                # one batch ends as its last write (no "ON CONFLICT ... a second time" error)
                hot.many(sql.nodes, [
                    (run_key, n.node_id, n.fan_index, stored_status(n.status), n.attempt, n.not_before,
                     json_param(n.output), n.output_digest, json_param(scrub(stored_error(n.error))), n.started_at,
                     n.finished_at, n.duration)
                    for n in batch.nodes])
            if batch.effects:
                write_effects(hot.core(), run_id, batch, now)
            if upd is not None and upd.status is not None and (upd.status in TERMINAL or upd.status in PARKED):
                # no driver will settle what is still pending: say so (see EffectStatus.ABANDONED)
                hot.many(sql.abandon_effects, [(EffectStatus.ABANDONED.value, now, run_id, EffectStatus.PENDING.value)])
            if new_events:
                first = seq_end - len(new_events) + 1
                hot.many(sql.events, [
                    (run_id, first + i, now, e.kind, e.node_id, e.fan_index, json_param(scrub(e.data)))
                    for i, e in enumerate(new_events)])
            if batch.consumed_signals:
                shared_rows.consume_signals(hot.core(), run_id, batch.consumed_signals, now)
            if batch.breakers:
                shared_rows.count_breaker_outcomes(hot.core(), batch.breakers, now)
            return changed

    def _apply_run_update(self, conn: Connection, lease: Lease, batch: Batch, now: float,
                          status: Any) -> RunRecord | None:
        """The batch's run update; ``status`` is the run's as the fence guard returned it."""
        assert batch.run is not None
        upd = batch.run
        values: dict[str, Any] = {}
        if upd.status is not None:
            _check_transition(lease.run_id, status_of(lease.run_id, status), upd.status)
            # (and version + 1)
            values.update(status=upd.status.value, status_reason=_reason_text(upd.status_reason), wake_at=None)
        elif upd.status_reason is not None:  # the reason of a run resting as it is (a lifted pause: its budget)
            values["status_reason"] = _reason_text(upd.status_reason)
        if upd.set_wake:
            values["wake_at"] = upd.wake_at
            if upd.signals_seen is not None and decided_after(conn, lease.run_id, upd.signals_seen):
                values["wake_at"] = now  # a decision came while this driver held the run: due at once
        if upd.set_output:
            values["output"], values["output_digest"], values["output_key"] = \
                self._run_value(conn, upd.output, "output")
        if upd.set_error:
            values["error"] = scrub(stored_error(upd.error))
        if upd.set_budgets:
            values.update(token_budget=upd.token_budget, cost_budget=upd.cost_budget)
        if upd.release_lease:  # as ``release`` does, in this transaction
            values.update(lease_owner=None, lease_expires_at=None)
        # a run parked or ended may have a damaged value (the reason it is parked): read it leniently
        at_rest = upd.status is not None and (upd.status in TERMINAL or upd.status in PARKED)
        if not values:
            return self._get_run(conn, lease.run_id, lenient=at_rest)
        # the row as updated (RETURNING): no read of its own
        row = HotSql(conn).one(update_run_sql(conn.dialect.name, tuple(values), upd.status is not None),
                               (*run_params(values), lease.run_id, lease.fence))
        try:
            return run_of(conn, lease.run_id, row, lenient=at_rest)
        except CorruptRecordError:  # parked because no driver can read its row: parked all the same
            if at_rest:
                return None
            raise

    # ---------------------------------------------------------------- reads

    def get_blobs(self, digests: Iterable[str]) -> dict[str, bytes]:
        """Blob bytes by digest, each checked against its content address (``BlobIntegrityError`` on a
        mismatch); a digest with no blob is absent from the result (``load_blobs`` refuses that)."""
        wanted = list(set(digests))
        if not wanted:
            return {}
        with self.reader.connect() as conn:
            return blob_rows.read(conn, wanted)

    def load_blobs(self, wanted: Mapping[str, str]) -> dict[str, Any]:
        """The JSON values of blobs, by digest; ``wanted`` maps each digest to where it is used (for
        the message). ``BlobIntegrityError`` if one is missing, does not match its digest or is
        not JSON: such data is never returned."""
        if not wanted:
            return {}
        with self.reader.connect() as conn:
            return blob_rows.load(conn, wanted)

    def put_blobs(self, blobs_by_digest: dict[str, bytes]) -> None:
        if not blobs_by_digest:
            return
        with self.engine.begin() as conn:
            blob_rows.put(conn, blob_rows.rows_of(blobs_by_digest))

    def nodes(self, run_id: str) -> list[NodeRecord]:
        """``Store.nodes``: by start (``node_reads.by_start``), rows and item chunks read by key."""
        with self.reader.connect() as conn:
            return by_start(node_records(conn, run_id))

    def effects(self, run_id: str) -> list[EffectRecord]:
        with self.reader.connect() as conn, reading(run_id, effects.name):
            rows = conn.execute(select(effects).where(effects.c.run_id == run_id)
                                .order_by(effects.c.created_at, effects.c.idempotency_key)).all()
            return records(EffectRecord, rows)

    def events(self, run_id: str, after_seq: int = 0, limit: int | None = None) -> list[EventRecord]:
        query = select(events).where(events.c.run_id == run_id, events.c.seq > after_seq).order_by(events.c.seq)
        if limit is not None:
            query = query.limit(limit)
        with self.reader.connect() as conn, reading(run_id, events.name):
            return records(EventRecord, conn.execute(query).all())

    def count_events(self, run_id: str) -> int:
        with self.reader.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(events).where(events.c.run_id == run_id))
                       .scalar_one())

    def prune(self, older_than: float, statuses: Iterable[RunStatus | str] | None = None, batch_size: int = 500,
              dry_run: bool = False) -> PruneReport:
        """Delete finished runs older than ``older_than`` seconds, with their rows and unshared blobs
        (see ``raysaga.state.pruning``)."""
        return prune_runs(self, older_than, statuses, batch_size, dry_run)

    # ---------------------------------------------------------------- signals, shared memory, breakers

    def send_signal(self, run_id: str, kind: SignalKind | str, node_id: str | None = None,
                    payload: Any = None) -> SignalRecord:
        return shared_rows.send_signal(self.engine, run_id, kind, node_id, payload)

    def pending_signals(self, run_id: str) -> list[SignalRecord]:
        return shared_rows.pending_signals(self.reader, run_id)

    def decide(self, run_id: str, node: str, verdict: Verdict, *, by: str, fan_index: int = -1,
               answer: Any = None, comment: str | None = None, decision_id: str | None = None) -> Decision:
        return decisions.decide(self.engine, run_id, node, verdict, by=by, fan_index=fan_index, answer=answer,
                                comment=comment, decision_id=decision_id)

    def waiting_approvals(self, approver: str | None = None, run_id: str | None = None) -> list[WaitingApproval]:
        return decisions.waiting(self.reader, approver, run_id)

    def claim_next(self, owner: str, ttl: float, workflows: Mapping[str, str | tuple[str, str]], *,
                   limits: Mapping[str, int] | None = None) -> Claim | None:
        return claims.claim_next(self.engine, owner, ttl, workflows, limits=limits)

    def claim_of(self, owner: str, ttl: float) -> Claim | None:
        return claims.claim_of(self.engine, owner, ttl)

    def wake(self, run_id: str, statuses: Iterable[RunStatus], reason: str, kind: str, data: Any = None) -> bool:
        return shared_rows.wake(self.engine, run_id, [RunStatus(s) for s in statuses], reason, kind, data)

    def stats(self, since: float | None = None) -> stats.Stats:
        return stats.compute(self.reader, since)

    def memory_get(self, run_id: str, key: str) -> MemoryEntry:
        return shared_rows.memory_get(self.reader, run_id, key)

    def memory_cas(self, lease: Lease, key: str, value: Any, expected_version: int, writer: str) -> MemoryEntry:
        return shared_rows.memory_cas(self.engine, lease, key, value, expected_version, writer)

    def breaker_get(self, name: str) -> BreakerRecord:
        return shared_rows.breaker_get(self.reader, name)

    def breaker_cas(self, record: BreakerRecord, expected_version: int) -> bool:
        return shared_rows.breaker_cas(self.engine, record, expected_version)


def _check_transition(run_id: str, current: RunStatus, new: RunStatus) -> None:
    if not can_transition(current, new):
        raise IllegalTransitionError(f"run {run_id!r} cannot go from {current.value} to {new.value}")


__all__ = ["MAX_INPUT_BYTES", "MAX_INPUT_ENV", "MAX_LIST_LIMIT", "RUN_VALUE_INLINE_LIMIT", "SqlStore", "input_cap"]

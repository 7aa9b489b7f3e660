"""The durable schema, in one place (SQLAlchemy 2 Core).

Timestamps are float seconds since the epoch: the same on SQLite and PostgreSQL, cheap to
compare in a lease's ``WHERE``. JSON columns hold strict JSON only (see ``jsoncodec``).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    text,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from raysaga.errors import CorruptRecordError, NotJSONableError
from raysaga.state import jsoncodec

#: Bumped by every migration; a database with a higher number is refused.
SCHEMA_VERSION = 15


class JsonText(TypeDecorator[Any]):
    """A JSON column whose text nobody rewrites: PostgreSQL ``json`` (it keeps the text verbatim),
    SQLite ``TEXT``.

    Why not SQLAlchemy's ``JSON`` on SQLite: its declared type ``JSON`` has NUMERIC affinity, so
    SQLite converts a bare number on insert (``12345678901234567891`` comes back as a float,
    ``2.0`` as ``2``, ``1e16`` as an int). TEXT affinity stores the canonical text as given.
    ``where`` (``table.column``) names the column when a stored value is not JSON.
    """

    impl = JSON
    cache_ok = True

    def __init__(self, where: str = "") -> None:
        super().__init__()
        self.where = where

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name == "sqlite":
            return dialect.type_descriptor(Text())
        return dialect.type_descriptor(JSON())

    def process_bind_param(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name != "sqlite":
            return value  # the json type serializes with the engine's serializer (jsoncodec.dumps)
        return None if value is None else jsoncodec.dumps(value, self.where or "value")

    def process_result_value(self, value: Any, dialect: Dialect) -> Any:
        if dialect.name != "sqlite" or value is None:
            return value
        if not isinstance(value, str):
            raise CorruptRecordError(f"{self.where} holds a {type(value).__name__} ({_short(value)}), not JSON text")
        try:
            return jsoncodec.loads(value)
        except (ValueError, NotJSONableError) as exc:
            raise CorruptRecordError(f"{self.where} holds text that is not JSON ({_short(value)}): {exc}") from None


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."

metadata = MetaData()

#: The predicate of the partial index ``ix_raysaga_nodes_waiting`` (schema 14).
WAITING_ROWS = "status = 'waiting'"

schema_info = Table(
    "raysaga_schema",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("version", Integer, nullable=False),
)

runs = Table(
    "raysaga_runs",
    metadata,
    Column("run_id", String(200), primary_key=True),
    Column("workflow_name", String(200), nullable=False),
    Column("workflow_version", String(50), nullable=False),
    Column("definition_hash", String(64), nullable=False),
    # how to import the definition again (MODULE:ATTR), so `raysaga resume RUN` needs nothing else
    Column("workflow_ref", String(500), nullable=True),
    Column("status", String(32), nullable=False),
    Column("status_reason", Text, nullable=True),
    # compare-and-set counter: every transition is UPDATE ... WHERE version = ?
    Column("version", Integer, nullable=False, default=0),
    Column("lease_owner", String(200), nullable=True),
    Column("lease_expires_at", Double, nullable=True),
    # incremented on each claim; every driver write carries AND fence = ?
    Column("fence", Integer, nullable=False, default=0),
    Column("event_seq", BigInteger, nullable=False, default=0),
    Column("input", JsonText, nullable=True),
    Column("output", JsonText, nullable=True),
    Column("error", JsonText, nullable=True),
    # schema 3: an input or output above the store's inline limit lives in raysaga_blobs; the
    # JSON column is then NULL and this names the blob (readers get the value either way)
    Column("input_digest", String(80), nullable=True),
    Column("output_digest", String(80), nullable=True),
    # schema 4: set when the output is {output_key: the value in blob output_digest}: a run's
    # output wraps its sink's, whose blob is then stored once, not again inside a wrapper
    Column("output_key", String(200), nullable=True),
    Column("deadline_at", Double, nullable=True),
    Column("retry_budget", Integer, nullable=True),
    Column("retries_used", Integer, nullable=False, default=0),
    Column("tokens_used", BigInteger, nullable=False, default=0),
    Column("cost_used", Double, nullable=False, default=0.0),
    # schema 2: per-run model budgets (None: unlimited)
    Column("token_budget", BigInteger, nullable=True),
    Column("cost_budget", Double, nullable=True),
    Column("trace_id", String(64), nullable=False),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    # schema 6: when a run resting without a driver is due again (a waiting_timer's timer, a
    # waiting_human's approval timeout); `queue` marks a submitted run a worker may start; a fork's
    # lineage (its parent run and the node it was forked from)
    Column("wake_at", Double, nullable=True),
    Column("queue", String(200), nullable=True),
    Column("parent_run_id", String(200), nullable=True),
    Column("forked_from", String(200), nullable=True),
    # schema 6: the hash of each step's signature when the run was created, so a resume under a
    # changed definition names the steps that changed (raysaga.orchestrator.versions)
    Column("step_hashes", JsonText, nullable=True),
    # schema 8: the run's integer key, unique, assigned when the row is inserted (PostgreSQL: an
    # identity column; SQLite: the trigger ``raysaga_runs_run_key``, max + 1). Node rows carry it
    # instead of the run id: a fan-out item's row is ~24 bytes smaller (migration 0008)
    Column("run_key", BigInteger, nullable=True),
    # schema 11: the run's labels (``RunOptions.labels``, bounded by ``raysaga.types.check_labels``),
    # a JSON object of str -> str; NULL when it has none (most runs, and every run of an older store)
    Column("labels", JsonText, nullable=True),
    # schema 13: the run's ``RunOptions.max_driver_deaths`` when it was given one other than the
    # default; NULL (most runs, every run of an older store): the driving process's limit applies
    Column("max_driver_deaths", Integer, nullable=True),
    Index("ux_raysaga_runs_run_key", "run_key", unique=True),
    # the narrowest of the indexes that start with ``status``: counting runs by status (the
    # dashboard's tabs) scans it whole; without it SQLite scans a wider one (measured in schema 9)
    Index("ix_raysaga_runs_status", "status"),
    Index("ix_raysaga_runs_status_wake", "status", "wake_at"),
    Index("ix_raysaga_runs_parent", "parent_run_id", sqlite_where=text("parent_run_id IS NOT NULL"),
          postgresql_where=text("parent_run_id IS NOT NULL")),
    # schema 4: `list` pages newest first by (created_at, run_id), optionally per status or
    # workflow, without scanning; prune finds old finished runs by (status, updated_at); the
    # partial digest indexes let blob garbage collection prove a blob unreferenced cheaply
    Index("ix_raysaga_runs_created", "created_at", "run_id"),
    Index("ix_raysaga_runs_status_created", "status", "created_at", "run_id"),
    Index("ix_raysaga_runs_workflow_created", "workflow_name", "created_at", "run_id"),
    Index("ix_raysaga_runs_status_updated", "status", "updated_at"),
    Index("ix_raysaga_runs_input_digest", "input_digest", sqlite_where=text("input_digest IS NOT NULL"),
          postgresql_where=text("input_digest IS NOT NULL")),
    Index("ix_raysaga_runs_output_digest", "output_digest", sqlite_where=text("output_digest IS NOT NULL"),
          postgresql_where=text("output_digest IS NOT NULL")),
)

nodes = Table(
    "raysaga_nodes",
    metadata,
    # schema 8: the run's ``run_key``, not its id (plain SQL reads rows with their run id through
    # the view ``raysaga_node_rows``, ``node_rows`` below)
    Column("run_key", BigInteger, ForeignKey("raysaga_runs.run_key", ondelete="CASCADE"), primary_key=True),
    Column("node_id", String(200), primary_key=True),
    # -1 for a plain node (and a fan-out's parent), 0..n-1 for fan-out items
    Column("fan_index", Integer, primary_key=True),
    # schema 9: NULL for ``completed`` (most rows: every finished step and item), 9 bytes less a
    # row on SQLite; the view ``raysaga_node_rows`` reads it back as 'completed'. A row written
    # with the text 'completed' (by hand, or before schema 9 on PostgreSQL) reads the same
    Column("status", String(32), nullable=True),
    Column("attempt", Integer, nullable=False, default=0),
    Column("not_before", Double, nullable=True),
    Column("output", JsonText, nullable=True),
    Column("output_digest", String(80), nullable=True),
    Column("error", JsonText, nullable=True),
    Column("started_at", Double, nullable=True),
    Column("finished_at", Double, nullable=True),
    Column("duration", Double, nullable=True),
    # schema 6: set on a row a fork inherited: the run that executed the node (whose idempotency
    # keys its effects carry); NULL when this run executed it. Last, outside the commit's columns
    Column("origin_run_id", String(200), nullable=True),
    Index("ix_raysaga_nodes_output_digest", "output_digest", sqlite_where=text("output_digest IS NOT NULL"),
          postgresql_where=text("output_digest IS NOT NULL")),
    # schema 14: the waiting rows alone (approvals and sleeps: a handful in a store of millions of
    # completed rows), by run: the approvals inbox (``decisions.waiting``) reads them through it
    # instead of every node row. Its query states this predicate word for word (a literal, not a
    # bound parameter): SQLite and PostgreSQL use a partial index only for a query that implies it
    Index("ix_raysaga_nodes_waiting", "run_key", sqlite_where=text(WAITING_ROWS),
          postgresql_where=text(WAITING_ROWS)),
    # schema 7, SQLite: the rows live in the primary key's b-tree. A rowid table kept the key
    # (run_id, node_id, fan_index) twice, in the table and in its automatic index: ~40 of a
    # fan-out item row's ~130 bytes. The cost: a row above ~1 KB (a 4 KiB page's local payload
    # in an index b-tree) spills to an overflow page, where a rowid table fits ~4 KB in place
    sqlite_with_rowid=False,
)

#: schema 7: a completed fan-out item's compact row stores ``finished_at`` NULL and its ``duration``
#: (``finished - started``; ``started + duration`` gives ``finished`` back to the bit, see
#: ``statements.item_rows``), 8 bytes less a row. The view ``raysaga_node_rows`` derives it:
#: ``COALESCE(finished_at, started_at + duration)``.

#: schema 12: completed plain fan-out items, a run of consecutive indexes per row (the items a Ray
#: task ran together land together): ``items`` is a JSON array whose element ``i`` is item
#: ``first_index + i`` as ``[start, duration, output]``, and its attempt after them when it is
#: not 1; the times in whole ticks of 2**-22 s (``statements.TICKS_PER_SECOND``: exact), ``output``
#: the item's JSON text as a JSON string (exact: nothing re-renders it), or null. One row and one insert for up to
#: ``statements.MAX_CHUNK_ITEMS`` items instead of one each: a 10,000-item fan-out's commits wrote
#: 10,000 rows (a third of its driver's time). Readers never see it: the view ``node_rows`` shows
#: each item as a row of its own, and a row of ``raysaga_nodes`` for the same item wins (a chunk's
#: write deletes the items' older rows, so there is none unless written after it).
item_chunks = Table(
    "raysaga_item_chunks",
    metadata,
    Column("run_key", BigInteger, ForeignKey("raysaga_runs.run_key", ondelete="CASCADE"), primary_key=True),
    Column("node_id", String(200), primary_key=True),
    Column("first_index", Integer, primary_key=True),
    Column("item_count", Integer, nullable=False),
    Column("items", JsonText, nullable=False),
    # as ``raysaga_nodes.origin_run_id``: set on a chunk a fork inherited (the run that executed its
    # items); NULL when this run did. Last, outside the commit's columns
    Column("origin_run_id", String(200), nullable=True),
    sqlite_with_rowid=False,
)

#: Not created from ``metadata``: a migration creates the view (its SQL is there: 0012 made the latest).
views = MetaData()

#: schema 8: node rows as readers see them, by run id: ``raysaga_nodes`` joined to its run
#: (``run_key`` -> ``run_id``), ``finished_at`` derived for compact item rows, (schema 9)
#: ``status`` 'completed' where the table stores NULL, and (schema 12) each item of
#: ``raysaga_item_chunks`` as a row. Readers of node rows read this view (a filter on ``run_id``
#: is one run lookup, then the node key's range), except those for which it expands or searches
#: more than they need: a whole run (``node_reads``: chunks decoded in Python), rows by key
#: (``item_pages``, a decision's node) and rows by status (the inbox's waiting rows,
#: ``decisions.waiting``: the view's ``status`` is an expression no index serves).
node_rows = Table(
    "raysaga_node_rows",
    views,
    Column("run_id", String(200), primary_key=True),
    *(Column(c.name, c.type, primary_key=c.primary_key, nullable=c.nullable and c.name != "status")
      for c in nodes.c if c.name != "run_key"),
)
node_finished = node_rows.c.finished_at
#: ``node_rows``' columns, as readers select them (``finished_at`` derived for compact item rows).
node_columns = tuple(node_rows.c)

effects = Table(
    "raysaga_effects",
    metadata,
    Column("idempotency_key", String(80), primary_key=True),
    Column("run_id", String(200), ForeignKey("raysaga_runs.run_id", ondelete="CASCADE"), nullable=False),
    Column("node_id", String(200), nullable=False),
    Column("fan_index", Integer, nullable=False),
    Column("effect_name", String(200), nullable=False),
    Column("args_digest", String(64), nullable=False),
    Column("status", String(16), nullable=False),  # pending | committed | failed | abandoned
    Column("result", JsonText, nullable=True),
    Column("external_id", String(200), nullable=True),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Index("ix_raysaga_effects_run", "run_id"),
)

events = Table(
    "raysaga_events",
    metadata,
    Column("run_id", String(200), ForeignKey("raysaga_runs.run_id", ondelete="CASCADE"), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("at", Double, nullable=False),
    Column("kind", String(64), nullable=False),
    Column("node_id", String(200), nullable=True),
    Column("fan_index", Integer, nullable=True),
    Column("data", JsonText, nullable=True),
)

blobs = Table(
    "raysaga_blobs",
    metadata,
    Column("digest", String(80), primary_key=True),
    Column("size", BigInteger, nullable=False),
    Column("data", LargeBinary, nullable=False),
)

signals = Table(
    "raysaga_signals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(200), ForeignKey("raysaga_runs.run_id", ondelete="CASCADE"), nullable=False),
    Column("kind", String(32), nullable=False),  # cancel | approve | reject
    Column("node_id", String(200), nullable=True),
    Column("payload", JsonText, nullable=True),
    Column("created_at", Double, nullable=False),
    Column("consumed_at", Double, nullable=True),
    # schema 6: a decision's id (a double click is one decision)
    Column("dedup_key", String(200), nullable=True),
    Index("ix_raysaga_signals_run", "run_id", "consumed_at"),
    Index("ux_raysaga_signals_dedup", "run_id", "dedup_key", unique=True),
)


# schema 2 -------------------------------------------------------------------

memory = Table(
    "raysaga_memory",
    metadata,
    # a per-run blackboard that parallel agents share; every write is a compare-and-set on version
    Column("run_id", String(200), ForeignKey("raysaga_runs.run_id", ondelete="CASCADE"), primary_key=True),
    Column("key", String(200), primary_key=True),
    Column("value", JsonText, nullable=True),
    Column("version", Integer, nullable=False),
    Column("writer", String(120), nullable=True),  # idempotency key of the write that set this version
    Column("updated_at", Double, nullable=False),
)

breakers = Table(
    "raysaga_breakers",
    metadata,
    # one circuit breaker per tool/dependency, shared by every driver on this store
    Column("name", String(200), primary_key=True),
    Column("state", String(16), nullable=False),  # closed | open | half_open
    Column("failures", Integer, nullable=False),
    Column("opened_at", Double, nullable=True),
    Column("version", Integer, nullable=False),
    Column("updated_at", Double, nullable=False),
    # schema 9, SQLite: rows of a few dozen bytes live in the key's b-tree, not in a table plus an
    # automatic index of the name (a page each, even empty)
    sqlite_with_rowid=False,
)

rate_limits = Table(
    "raysaga_rate_limits",
    metadata,
    # one row per declared rate limit (a model provider, a tool), shared by every driver on this
    # store: admissions to it are serialised on this row; a 429's retry-after blocks it for all
    Column("name", String(200), primary_key=True),
    Column("blocked_until", Double, nullable=False),
    Column("version", Integer, nullable=False),
    Column("updated_at", Double, nullable=False),
    sqlite_with_rowid=False,  # schema 9, as raysaga_breakers
)

rate_grants = Table(
    "raysaga_rate_grants",
    metadata,
    # one row per call admitted through a rate limit: it counts from its grant until ``per``
    # seconds after it ended (``ended_at``; NULL while under way, when it also holds a concurrency
    # slot) or, if it never ends (its driver died), after ``expires_at``
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("name", String(200), nullable=False),
    Column("granted_at", Double, nullable=False),
    Column("expires_at", Double, nullable=False),
    Column("ended_at", Double, nullable=True),
    Column("tokens", BigInteger, nullable=False),
    Index("ix_raysaga_rate_grants_name_ended", "name", "ended_at"),
)


# schema 15 ------------------------------------------------------------------

workers = Table(
    "raysaga_workers",
    metadata,
    # one row per ``raysaga worker`` process, so an operator sees the fleet: written at its start,
    # beaten every ``beat_every`` s while it runs, ``stopped_at`` set on a clean exit; a SIGKILLed
    # worker's row simply stops beating. Rows silent for a week are deleted by the next start.
    Column("worker_id", String(200), primary_key=True),  # its owner id (``ownership.new_owner``)
    Column("host", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("started_at", Double, nullable=False),
    Column("beat_at", Double, nullable=False),
    Column("beat_every", Double, nullable=False),
    Column("stopped_at", Double, nullable=True),
    Column("queues", JsonText, nullable=False),  # ["*"]: every queue
    Column("workflows", JsonText, nullable=False),  # [{"name", "version", "definition_hash"}]
    Column("slots", Integer, nullable=False),
    Column("busy", Integer, nullable=False),
    Column("raysaga_version", String(50), nullable=False),
    sqlite_with_rowid=False,  # as raysaga_breakers: a row in the key's b-tree, no index page of its own
)


# every JSON column names itself in a CorruptRecordError
for _table in metadata.tables.values():
    for _column in _table.columns:
        if isinstance(_column.type, JsonText):
            _column.type = JsonText(f"{_table.name}.{_column.name}")
for _column in node_rows.columns:  # named as the table's: the view shows its values
    if isinstance(_column.type, JsonText):
        _column.type = JsonText(f"{nodes.name}.{_column.name}")

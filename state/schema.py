"""The durable schema, in one place (SQLAlchemy 2 Core).

Timestamps are float seconds since the epoch: the same on SQLite and PostgreSQL, cheap to
compare in a lease's ``WHERE``. JSON columns hold strict JSON only (see ``jsoncodec``).
"""

from __future__ import annotations

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
)

#: Bumped by every migration; a database with a higher number is refused.
SCHEMA_VERSION = 3

metadata = MetaData()

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
    Column("input", JSON, nullable=True),
    Column("output", JSON, nullable=True),
    Column("error", JSON, nullable=True),
    # schema 3: an input or output above the store's inline limit lives in raysaga_blobs; the
    # JSON column is then NULL and this names the blob (readers get the value either way)
    Column("input_digest", String(80), nullable=True),
    Column("output_digest", String(80), nullable=True),
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
    Index("ix_raysaga_runs_status", "status"),
)

nodes = Table(
    "raysaga_nodes",
    metadata,
    Column("run_id", String(200), ForeignKey("raysaga_runs.run_id", ondelete="CASCADE"), primary_key=True),
    Column("node_id", String(200), primary_key=True),
    # -1 for a plain node (and a fan-out's parent), 0..n-1 for fan-out items
    Column("fan_index", Integer, primary_key=True),
    Column("status", String(32), nullable=False),
    Column("attempt", Integer, nullable=False, default=0),
    Column("not_before", Double, nullable=True),
    Column("output", JSON, nullable=True),
    Column("output_digest", String(80), nullable=True),
    Column("error", JSON, nullable=True),
    Column("started_at", Double, nullable=True),
    Column("finished_at", Double, nullable=True),
    Column("duration", Double, nullable=True),
)

effects = Table(
    "raysaga_effects",
    metadata,
    Column("idempotency_key", String(80), primary_key=True),
    Column("run_id", String(200), ForeignKey("raysaga_runs.run_id", ondelete="CASCADE"), nullable=False),
    Column("node_id", String(200), nullable=False),
    Column("fan_index", Integer, nullable=False),
    Column("effect_name", String(200), nullable=False),
    Column("args_digest", String(64), nullable=False),
    Column("status", String(16), nullable=False),  # pending | committed | failed
    Column("result", JSON, nullable=True),
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
    Column("data", JSON, nullable=True),
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
    Column("payload", JSON, nullable=True),
    Column("created_at", Double, nullable=False),
    Column("consumed_at", Double, nullable=True),
    Index("ix_raysaga_signals_run", "run_id", "consumed_at"),
)


# schema 2 -------------------------------------------------------------------

memory = Table(
    "raysaga_memory",
    metadata,
    # a per-run blackboard that parallel agents share; every write is a compare-and-set on version
    Column("run_id", String(200), ForeignKey("raysaga_runs.run_id", ondelete="CASCADE"), primary_key=True),
    Column("key", String(200), primary_key=True),
    Column("value", JSON, nullable=True),
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
)

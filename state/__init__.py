"""raysaga.state: the durable store (SQLAlchemy 2; SQLite by default, PostgreSQL for fleets).

Knows nothing of Ray or models: it keeps runs, per-node checkpoints, the effect ledger,
the event log, blobs and signals, and guards every driver write with the run's fence.
"""

from raysaga.state.engine import default_url, redact
from raysaga.state.models import (
    Batch,
    BreakerRecord,
    EffectRecord,
    EffectStatus,
    EffectWrite,
    EventRecord,
    Lease,
    MemoryEntry,
    NewEvent,
    NewRun,
    NodeRecord,
    NodeStatus,
    NodeWrite,
    RunRecord,
    RunSnapshot,
    RunStatus,
    RunUpdate,
    SignalRecord,
    node_label,
)
from raysaga.state.sql_store import SqlStore
from raysaga.state.store import Store


def open_store(url: str | None = None) -> SqlStore:
    """Open (and migrate if needed) the store at ``url``, ``RAYSAGA_DB`` or ``./.raysaga/raysaga.db``."""
    return SqlStore(url or default_url())


__all__ = [
    "Batch",
    "BreakerRecord",
    "EffectRecord",
    "EffectStatus",
    "EffectWrite",
    "EventRecord",
    "Lease",
    "MemoryEntry",
    "NewEvent",
    "NewRun",
    "NodeRecord",
    "NodeStatus",
    "NodeWrite",
    "RunRecord",
    "RunSnapshot",
    "RunStatus",
    "RunUpdate",
    "SignalRecord",
    "SqlStore",
    "Store",
    "default_url",
    "node_label",
    "open_store",
    "redact",
]

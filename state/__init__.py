"""raysaga.state: the durable store (SQLAlchemy 2; SQLite by default, PostgreSQL for fleets).

Knows nothing of Ray or models: it keeps runs, per-node checkpoints, the effect ledger,
the event log, blobs and signals, and guards every driver write with the run's fence.
"""

import typing as _typing

from raysaga._lazy import lazy_exports as _lazy_exports

if _typing.TYPE_CHECKING:  # imported on first use (see _LAZY)
    from raysaga.state.engine import default_url, describe_store
    from raysaga.state.error_record import ErrorRecord
    from raysaga.state.models import (
        Batch,
        BreakerChange,
        BreakerRecord,
        BreakerState,
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
        RunSummary,
        RunUpdate,
        SignalKind,
        SignalRecord,
        node_label,
    )
    from raysaga.state.pruning import PruneReport, prune
    from raysaga.state.sql_store import SqlStore
    from raysaga.state.store import Store
    from raysaga.state.worker_rows import ServedWorkflow, WorkerRecord

#: Where each name lives: ``import raysaga.state.redact`` (the CLI's error printer) or
#: ``raysaga --help`` loads neither SQLAlchemy nor alembic; a name's module is imported on first use.
_LAZY = {
    **dict.fromkeys(("default_url", "describe_store"), "raysaga.state.engine"),
    **dict.fromkeys(("ErrorRecord",), "raysaga.state.error_record"),
    **dict.fromkeys(("Batch", "BreakerChange", "BreakerRecord", "BreakerState", "EffectRecord", "EffectStatus",
                    "EffectWrite", "EventRecord", "Lease", "MemoryEntry", "NewEvent", "NewRun", "NodeRecord",
                    "NodeStatus", "NodeWrite", "RunRecord", "RunSnapshot", "RunStatus", "RunSummary", "RunUpdate",
                    "SignalKind", "SignalRecord", "node_label"), "raysaga.state.models"),
    **dict.fromkeys(("PruneReport", "prune"), "raysaga.state.pruning"),
    **dict.fromkeys(("SqlStore",), "raysaga.state.sql_store"),
    **dict.fromkeys(("Store",), "raysaga.state.store"),
    **dict.fromkeys(("ServedWorkflow", "WorkerRecord"), "raysaga.state.worker_rows"),
}
__getattr__, __dir__ = _lazy_exports(__name__, globals(), _LAZY)


def open_store(url: str | None = None, *, create: bool = True) -> "SqlStore":
    """Open the store at ``url``, else ``default_url()`` (``RAYSAGA_DB``, ``$RAYSAGA_HOME/raysaga.db``
    or ``~/.raysaga/raysaga.db``).

    ``create=True`` (commands that write): create the database file and its folder if missing and
    migrate the schema; an existing SQLite database holding other tables but no raysaga store is
    refused (``StoreUnavailableError``), never given raysaga's tables (PostgreSQL: a shared
    database with other applications' tables is fine).
    ``create=False`` (commands that only read): nothing is created, migrated or written; a missing
    store, a database without raysaga's tables and an older schema are errors that say what to do.
    Either way the store is connected once before this returns, so a store that cannot be opened
    raises ``StoreUnavailableError`` (or ``SchemaVersionError``) here.
    """
    from raysaga.state import migrate
    from raysaga.state.engine import given_url, normalize_url, probe_sqlite_store, refuse_foreign_sqlite
    from raysaga.state.sql_store import SqlStore

    url = normalize_url(given_url(url))
    if create:
        refuse_foreign_sqlite(url)  # another program's SQLite file never gets raysaga's tables
        return SqlStore(url)
    probe_sqlite_store(url)  # a SQLite file that is no raysaga store is refused before an engine touches it
    store = SqlStore(url, migrate_schema=False)
    try:
        migrate.require_current(store.engine)
    except BaseException:
        store.close()
        raise
    return store


__all__ = [
    "Batch",
    "BreakerChange",
    "BreakerRecord",
    "BreakerState",
    "EffectRecord",
    "EffectStatus",
    "EffectWrite",
    "ErrorRecord",
    "EventRecord",
    "Lease",
    "MemoryEntry",
    "NewEvent",
    "NewRun",
    "NodeRecord",
    "NodeStatus",
    "NodeWrite",
    "PruneReport",
    "RunRecord",
    "RunSnapshot",
    "RunStatus",
    "RunSummary",
    "RunUpdate",
    "ServedWorkflow",
    "SignalKind",
    "SignalRecord",
    "SqlStore",
    "Store",
    "WorkerRecord",
    "default_url",
    "describe_store",
    "node_label",
    "open_store",
    "prune",
]

"""Reading a SQLite store this process cannot write: a read-only folder or file (an auditor,
another Unix user, a snapshot mount, a backup copy). Read commands open such a store so.

SQLite in WAL mode reads through two files beside the database: ``-wal`` (commits not yet copied
into the database file) and ``-shm`` (their index). A read-only connection (``mode=ro``) uses them
where they are, or creates them; in a folder it cannot write, with no ``-shm`` there (the last
writer closed cleanly and removed both), it cannot open the store at all. Only then is the file
opened ``immutable=1``: SQLite reads the database file alone, takes no lock and sees no change. That
is right for a store nobody writes meanwhile; a writer active elsewhere at the same time (one allowed
to write the folder) may show such a read a torn view. ``immutable`` ignores a ``-wal``: one holding
frames with no usable ``-shm`` beside it (a copy that took the database and its WAL, not the index)
is refused with the fix, never read stale. Each connection decides anew (the engine pools none), so
``status --watch`` sees a writer that came meanwhile.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event

from raysaga.errors import StoreUnavailableError

#: The bytes of a WAL file's header: a longer one holds frames (commits, perhaps not yet checkpointed).
WAL_HEADER_BYTES = 32
#: An engine's execution option on a read-only engine: its writes must go through SQLAlchemy's
#: ``Connection``, whose ``handle_error`` says why they fail (``statements.HotSql`` wrote past it,
#: and the dashboard's Cancel answered a bare 500 with SQLite's "attempt to write a readonly database").
READ_ONLY = "raysaga_read_only"
#: What a read-only connection that cannot reach the WAL's files fails with (extended codes included).
_CANNOT_OPEN = (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_READONLY)


def sidecars(path: Path) -> tuple[Path, Path]:
    """The ``-wal`` and ``-shm`` files of the SQLite database at ``path``."""
    return path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")


def unwritable(path: Path) -> Path | None:
    """What of the SQLite store at ``path`` this process cannot write: the database, its ``-wal`` or
    ``-shm``, or the folder SQLite must create the missing ones in; None when it can write it all."""
    for part in (path, *sidecars(path)):
        if part.exists() and not os.access(part, os.W_OK):
            return part
    if not all(p.exists() for p in sidecars(path)) and not os.access(path.parent, os.W_OK | os.X_OK):
        return path.parent
    return None


def connect_uri(path: Path, timeout: float) -> str:
    """The URI to read ``path`` through: ``mode=ro``, else (SQLite cannot open the store so: no ``-shm``
    and none can be made) ``mode=ro&immutable=1``; ``StoreUnavailableError`` when ``immutable`` would
    leave out the frames of a ``-wal``."""
    uri = f"{path.as_uri()}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=timeout)
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()
        return uri
    except sqlite3.Error as exc:
        if getattr(exc, "sqlite_errorcode", 0) & 0xFF not in _CANNOT_OPEN:
            return uri  # not about the WAL's files (locked, not a database...): the connection says it
    wal, shm = sidecars(path)
    if wal.exists() and wal.stat().st_size > WAL_HEADER_BYTES:
        raise StoreUnavailableError(
            f"the store {path} cannot be read here: its write-ahead log {wal.name} may hold commits not yet in "
            f"{path.name}, and SQLite reads them only through {shm.name}, which is missing or unreadable and cannot "
            f"be made in the read-only folder {path.parent}; reading without it would show stale runs: copy the "
            f"folder (with {wal.name}) somewhere writable and pass the copy as --db, or make the folder writable")
    return f"{uri}&immutable=1"


def read_only(engine: Engine, path: Path, timeout: float, refusal: Callable[[], Exception]) -> Engine:
    """``engine`` (a SQLite engine on ``path`` that pools no connection), each connection read-only
    (``connect_uri``); a write tried on it raises ``refusal()``, the store's read-only error."""

    @event.listens_for(engine, "do_connect")
    def _read_only_uri(_dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        cargs[:] = [connect_uri(path, timeout)]
        cparams["uri"] = True

    @event.listens_for(engine, "handle_error")
    def _refuse_writes(ctx: Any) -> None:
        if getattr(ctx.original_exception, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_READONLY:
            raise refusal()

    engine.update_execution_options(**{READ_ONLY: True})  # statements.HotSql then writes through the Connection
    return engine

"""Engines that survive ``os.fork()``: a store opened before a fork serves the parent and every child.

After a fork the child holds copies of the parent's pooled connections. On PostgreSQL both
processes then talk over one server session and read each other's replies ("unexpected result
EMPTY_QUERY", "can't change 'autocommit' now", "server closed the connection unexpectedly"),
and a close in the child sends the server a Terminate that ends the parent's session. So, as
SQLAlchemy's pooling docs advise ("Using Connection Pools with Multiprocessing or os.fork()"), the
child gives every engine a new, empty pool at the fork (``os.register_at_fork``,
``Engine.dispose(close=False)``) and opens its own connections. The parent's pools are kept
referenced in the child (``_INHERITED``) and never used nor closed: no collection may finalise a
connection the parent still uses.

SQLite needs one step more, taken at the child's first connection of its own, never inside the
fork (a handle another parent thread was in blocked the child there, store or no store). SQLite
keeps one lock state per file and process (which locks the
process holds, counted over its connections); the child inherits that state without the kernel's
locks behind it (POSIX locks are per process). A connection the child opens beside an inherited
one shares the state, believes the file's shared lock held, and never takes it: the parent's
last close then takes the exclusive lock, checkpoints, and deletes the WAL under the child, whose
later commits go to the deleted file, lost without an error. So the child closes the inherited
SQLite handles, which frees that state; its own connections then lock for real. Closing an idle
handle in the child touches neither the parent's locks nor the file: no transaction to roll back,
and no checkpoint unless the child gets the exclusive lock, that is unless no other process has
the store open. A handle in use or inside a transaction at the fork (another thread of the parent
was in a store call) is left open and untouched: its rollback could rewrite the WAL index the
parent is writing. Fork while no other thread is in a store call (a pre-fork server,
``multiprocessing`` from the main thread): a thread inside SQLite at the fork leaves SQLite's own
mutexes locked in the child, which then hangs at its first SQLite call, whatever is done here.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import weakref
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.pool import ConnectionPoolEntry, Pool

#: The engines of this process that a fork must give a new pool.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()
#: The pool entries of this process's SQLite engines: the handles a forked child closes.
_SQLITE_ENTRIES: weakref.WeakSet[ConnectionPoolEntry] = weakref.WeakSet()
#: In a child: the pools it inherited (and their connections), kept so that nothing finalises them.
_INHERITED: list[Pool] = []


def fork_safe(engine: Engine) -> Engine:
    """``engine``, given a new pool in any child this process forks (see the module docstring)."""
    _ENGINES.add(engine)
    if engine.dialect.name == "sqlite":

        @event.listens_for(engine, "do_connect")
        def _close_inherited_first(*_: Any) -> None:
            _close_inherited()  # (a child's first own connection: the inherited handles go before it opens)

        @event.listens_for(engine, "connect")
        def _remember(_dbapi_conn: Any, entry: ConnectionPoolEntry) -> None:
            _SQLITE_ENTRIES.add(entry)

    return engine


#: In a child: the inherited idle SQLite handles, closed before its first connection of its own.
_TO_CLOSE: list[ConnectionPoolEntry] = []


def _close_inherited() -> None:
    """Close the SQLite handles the child inherited, when it first opens a connection of its own:
    never inside ``os.fork()``, where a handle another parent thread was using (the driver's
    heartbeat) blocked the child for ever on a mutex no thread of its would release, though the
    child never used the store."""
    entries, _TO_CLOSE[:] = list(_TO_CLOSE), []
    for entry in entries:
        handle = entry.dbapi_connection
        # one in use is a call in flight in a thread the child does not have: left alone
        with contextlib.suppress(sqlite3.Error):  # a handle closed already
            if isinstance(handle, sqlite3.Connection) and not entry.in_use and not handle.in_transaction:
                handle.close()


def _in_child() -> None:
    """After a fork, in the child: new pools; the idle inherited SQLite handles noted, to be closed
    at the child's first connection of its own (``_close_inherited``).

    Runs inside ``os.fork()``: it never raises (a failure here would be printed and ignored,
    leaving a pool half replaced), each engine and handle on its own."""
    for engine in list(_ENGINES):
        _INHERITED.append(engine.pool)
        with contextlib.suppress(Exception):  # the engine keeps the inherited pool: nothing better to do here
            engine.dispose(close=False)
    _TO_CLOSE[:] = list(_SQLITE_ENTRIES)  # closed at the child's first own connection, not here
    _SQLITE_ENTRIES.clear()  # the child's own connections register again on connect


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_in_child)

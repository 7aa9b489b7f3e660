"""Engines for the two supported databases, configured for a crash-proof store.

SQLite: WAL journal, ``synchronous=FULL`` (a commit survives power loss, not only a killed
process), a busy timeout, and ``BEGIN IMMEDIATE`` for every write transaction so a
read-then-write never fails midway with "database is locked". Reads use a second engine with
plain (deferred) ``BEGIN``: under WAL they never wait for, nor block, a writer.
PostgreSQL: psycopg 3; plain ``postgresql://`` URLs are mapped to it.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

from raysaga.errors import NotJSONableError, UserError
from raysaga.state import jsoncodec

DEFAULT_DIR = ".raysaga"
DEFAULT_FILE = "raysaga.db"
BUSY_TIMEOUT_MS = 30_000


def default_url() -> str:
    """``RAYSAGA_DB`` when set, else a SQLite file under ``./.raysaga/``."""
    env = os.environ.get("RAYSAGA_DB")
    if env:
        return env
    return f"sqlite:///{Path(DEFAULT_DIR) / DEFAULT_FILE}"


def normalize_url(url: str) -> str:
    """Accept ``postgresql://``/``postgres://`` for psycopg 3 and plain file paths for SQLite."""
    if "://" not in url:
        return f"sqlite:///{url}"
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def redact(url: str) -> str:
    """The URL with any password hidden, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return "<unparseable database URL>"


def _json_serializer(value: Any) -> str:
    return jsoncodec.dumps(value)


def make_engine(url: str, *, for_reads: bool = False) -> Engine:
    """An engine for ``url``. ``for_reads``: on SQLite, transactions start deferred (read-only use)."""
    url = normalize_url(url)
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise UserError(f"database URL {url!r} is not valid: {exc}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _unwrap_json_errors(_sqlite_engine(url, parsed.database, immediate=not for_reads))
    if backend == "postgresql":
        return _unwrap_json_errors(create_engine(
            url,
            json_serializer=_json_serializer,
            json_deserializer=jsoncodec.loads,
            pool_pre_ping=True,
        ))
    raise UserError(f"database {redact(url)} is not supported: use a sqlite:/// file or postgresql:// URL")


def _sqlite_engine(url: str, database: str | None, *, immediate: bool) -> Engine:
    if not database or database == ":memory:":
        raise UserError("an in-memory SQLite database cannot be shared by a driver and its tools: use a file")
    Path(database).expanduser().resolve().parent.mkdir(parents=True, exist_ok=True)
    engine = create_engine(
        url,
        json_serializer=_json_serializer,
        json_deserializer=jsoncodec.loads,
        connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000},
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # let SQLAlchemy, not pysqlite, emit BEGIN, so it can be BEGIN IMMEDIATE
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        _enable_wal(cur)
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql(begin)

    return engine


def _enable_wal(cur: Any) -> None:
    """Switch the file to WAL (a persistent setting, so this changes a file once).

    The switch needs an exclusive lock, and SQLite answers SQLITE_BUSY at once, without calling
    the busy handler, while another connection holds the file (two processes opening one fresh
    database): retry until the busy timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    while True:
        try:
            if cur.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.005)  # SQLite's own busy handler is not called for this pragma


def _unwrap_json_errors(engine: Engine) -> Engine:
    """Raise a value's ``NotJSONableError`` as itself. pysqlite serializes bind parameters before
    executing, and SQLAlchemy wraps what that raises in ``StatementError``; psycopg does not."""

    @event.listens_for(engine, "handle_error")
    def _reraise(ctx: Any) -> None:
        if isinstance(ctx.original_exception, NotJSONableError):
            raise ctx.original_exception

    return engine

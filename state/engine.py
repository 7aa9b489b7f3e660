"""Engines for the two supported databases, configured for a crash-proof store.

SQLite: WAL journal, ``synchronous=FULL`` (a commit survives power loss, not only a killed
process), a busy timeout, and ``BEGIN IMMEDIATE`` for every transaction so a
read-then-write never fails midway with "database is locked".
PostgreSQL: psycopg 3; plain ``postgresql://`` URLs are mapped to it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from raysaga.errors import UserError
from raysaga.state import jsoncodec
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url

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


def make_engine(url: str) -> Engine:
    url = normalize_url(url)
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise UserError(f"database URL {url!r} is not valid: {exc}") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        return _sqlite_engine(url, parsed.database)
    if backend == "postgresql":
        return create_engine(
            url,
            json_serializer=_json_serializer,
            json_deserializer=jsoncodec.loads,
            pool_pre_ping=True,
        )
    raise UserError(f"database {redact(url)} is not supported: use a sqlite:/// file or postgresql:// URL")


def _sqlite_engine(url: str, database: str | None) -> Engine:
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
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=FULL")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")

    return engine

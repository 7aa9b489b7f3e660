"""Engines for the two supported databases, configured for a crash-proof store.

SQLite: WAL journal, ``synchronous=FULL`` (a commit survives power loss, not only a killed
process), a busy timeout, and ``BEGIN IMMEDIATE`` for every write transaction so a
read-then-write never fails midway with "database is locked". Reads use a second engine with
plain (deferred) ``BEGIN``: under WAL they never wait for, nor block, a writer. Every SQLite
connection has ``raysaga_lower`` (``text_match``): ``lower()`` folding as PostgreSQL's does.
PostgreSQL: psycopg 3; plain ``postgresql://`` URLs are mapped to it, with a short connect
timeout so an unreachable server fails in seconds, and a pool a worker sizes to its slots
(``pool_fit.fit_pool``) or ``RAYSAGA_DB_POOL_SIZE`` sets.

A store this process cannot write is read through read-only connections (``sqlite_readonly``).

Every engine hides SQL parameters from its errors (``hide_parameters``): a crash's traceback
must not print a run's input. Errors of opening a store (a file that is not a database, a
directory, a read-only location, an unknown database, role or host, a missing driver) are
translated here into one-line ``StoreUnavailableError``s naming the store and the fix, and a path or URL
is checked first (``url_checks``: a ``~user`` naming no user, PostgreSQL query options). Every engine
may be used across ``os.fork()`` (``engine_fork``): a child gets its own connections.
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url
from sqlalchemy.pool import NullPool

from raysaga.errors import NotJSONableError, StoreUnavailableError, UserError
from raysaga.state import jsoncodec, sqlite_readonly, text_match
from raysaga.state.engine_fork import fork_safe
from raysaga.state.url_checks import check_pg_options, expand_user
from raysaga.state.url_checks import redact as redact  # (imported from here before the split)

#: The folder of the default store under the home directory, when ``RAYSAGA_HOME`` is not set.
DEFAULT_DIR = ".raysaga"
DEFAULT_FILE = "raysaga.db"
BUSY_TIMEOUT_MS = 30_000
#: The page size of a NEW SQLite store (an existing file keeps its own; see docs/storage.md). Every
#: table and index takes at least a page, so a fresh store's ~40 objects cost 40 KiB, not 160 KiB; a
#: WAL commit writes whole pages, so a small commit writes 1 KiB per page it touches, not 4 KiB.
#: The cost: a node row above ~230 bytes (its output, mostly) takes an overflow page of 1 KiB.
NEW_FILE_PAGE_SIZE = 1024
#: Sets another page size for new SQLite stores (512 to 65536, a power of two): 4096 suits node
#: outputs of 200 to 900 bytes (docs/storage.md has the figures).
PAGE_SIZE_ENV = "RAYSAGA_SQLITE_PAGE_SIZE"


def new_file_page_size() -> int:
    """The page size a new SQLite store gets: ``RAYSAGA_SQLITE_PAGE_SIZE``, else ``NEW_FILE_PAGE_SIZE``."""
    env = os.environ.get(PAGE_SIZE_ENV, "").strip()
    if not env:
        return NEW_FILE_PAGE_SIZE
    size = int(env) if env.isascii() and env.isdigit() and len(env) <= 6 else 0  # not '²' (isdigit, not int)
    if not 512 <= size <= 65536 or size & (size - 1):
        raise UserError(f"{PAGE_SIZE_ENV}={env!r} is not a SQLite page size: use a power of two from 512 to 65536 "
                        "in ASCII digits")
    return size
#: Seconds a PostgreSQL connection attempt may take (libpq ``connect_timeout``) unless the URL sets
#: its own: an unreachable server is an error in seconds, not after the TCP timeout.
PG_CONNECT_TIMEOUT_S = 5
#: Sets the connections a process keeps to PostgreSQL (1 to 1000; default 5, a worker's ``fit_pool``),
#: and up to 10 more at a burst.
POOL_SIZE_ENV = "RAYSAGA_DB_POOL_SIZE"


def pool_size_env() -> int | None:
    """``RAYSAGA_DB_POOL_SIZE``, None when unset; ``UserError`` when not 1 to 1000."""
    env = os.environ.get(POOL_SIZE_ENV, "").strip()
    if not env:
        return None
    if not (env.isascii() and env.isdigit() and len(env) <= 4 and 1 <= int(env) <= 1000):
        raise UserError(f"{POOL_SIZE_ENV}={env[:20]!r} is not a number of connections: use 1 to 1000 (each worker slot "
                        "needs 2; keep the sum over processes under the server's max_connections)")
    return int(env)


#: The advice every "there is no store here" message ends with.
WHERE_ADVICE = "check --db / RAYSAGA_DB / RAYSAGA_HOME"


def store_home() -> Path:
    """``$RAYSAGA_HOME``, else ``~/.raysaga``: the folder of the default store (absolute).

    A relative ``RAYSAGA_HOME`` is refused (``StoreUnavailableError``): it would make the default
    store depend on the current folder, and the default store is the same from every folder.
    ``~`` is expanded first, so ``RAYSAGA_HOME=~/ops/raysaga`` is fine."""
    home = os.environ.get("RAYSAGA_HOME")
    folder = expand_user(home, "RAYSAGA_HOME") if home else Path.home() / DEFAULT_DIR
    if home and not folder.is_absolute():
        raise StoreUnavailableError(
            f"RAYSAGA_HOME={home!r} is a relative path, so the default store would change with the current "
            f"folder: set it to an absolute path (such as {os.path.abspath(folder)}), or pass --db")
    return Path(os.path.abspath(folder))


def given_url(url: str | None, what: str = "--db (or RAYSAGA_DB, or store=)") -> str:
    """``url``, else ``default_url()``; an empty one is refused: ``--db "$DB"`` with ``DB`` unset
    silently meant the default store, and a prune or cancel went to the wrong one."""
    if url is not None and not url.strip():
        raise StoreUnavailableError(f"{what} is empty: give a store's URL or path, or leave it out for the "
                                    f"default store ({describe_store()})")
    return url or default_url()


def default_url() -> str:
    """The store used when none is given, the same from every folder: ``RAYSAGA_DB`` (a URL or a
    path) when set, else ``$RAYSAGA_HOME/raysaga.db``, else ``~/.raysaga/raysaga.db``."""
    env = os.environ.get("RAYSAGA_DB")
    if env:
        return normalize_url(env)
    return sqlite_url(store_home() / DEFAULT_FILE)


def describe_store(url: str | None = None) -> str:
    """Where the store at ``url`` (default: ``default_url()``) is, for people: the absolute path
    of a SQLite file, or the URL with its password hidden. Either can be passed back as ``--db``."""
    url = normalize_url(url or default_url())
    path = sqlite_path(url)
    if path is not None:
        return str(path)
    shown = redact(url)
    driver = "postgresql+psycopg://"
    return "postgresql://" + shown[len(driver):] if shown.startswith(driver) else shown


def sqlite_path(url: str) -> Path | None:
    """The absolute path of a SQLite URL's file; None for another backend or an in-memory one."""
    try:
        parsed = make_url(normalize_url(url))
    except Exception:
        return None
    if parsed.get_backend_name() != "sqlite" or not parsed.database or parsed.database == ":memory:":
        return None
    return Path(os.path.abspath(expand_user(parsed.database, url)))


def normalize_url(url: str) -> str:
    """Accept ``postgresql://``/``postgres://`` for psycopg 3 and plain file paths for SQLite
    (a plain path may start with ``~``; it is made absolute, and names that file whatever it holds:
    ``run?1.db`` and ``a%20b.db`` are file names, not a query or an escape). A URL is kept as its
    user wrote it: ``sqlite:///...`` is URL syntax (``%20`` is a space there)."""
    if "://" not in url:
        return sqlite_url(os.path.abspath(expand_user(url)))
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://"):]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://"):]
    return url


def sqlite_url(path: str | Path) -> str:
    """The ``sqlite:///`` URL of the file at ``path``, its characters escaped where a URL would
    read them otherwise (``?`` starts a query, ``%`` an escape, ``#`` a fragment)."""
    return URL.create("sqlite", database=str(path)).render_as_string(hide_password=False)


def _json_serializer(value: Any) -> str:
    return jsoncodec.dumps(value)


def make_engine(url: str, *, for_reads: bool = False, create: bool = True, read_only: bool = False) -> Engine:
    """An engine for ``url``. ``for_reads``: on SQLite, transactions start deferred (read-only use).
    ``create``: a SQLite file's folder is created if missing (else a missing file is an error and
    nothing is created). ``read_only``: a SQLite store this process cannot write, read through
    read-only connections (``sqlite_readonly``). Raises ``StoreUnavailableError`` for what can be told
    before connecting."""
    url = normalize_url(url)
    try:
        parsed = make_url(url)
    except Exception:
        raise UserError("the database URL (--db / RAYSAGA_DB) is not valid: use a file path, "
                        "sqlite:///PATH or postgresql://USER@HOST/DATABASE") from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        engine = fork_safe(_unwrap_json_errors(_sqlite_engine(url, parsed.database, immediate=not for_reads,
                                                              create=create, read_only=read_only)))
        path = sqlite_path(url) if read_only else None
        return engine if path is None else sqlite_readonly.read_only(engine, path, BUSY_TIMEOUT_MS / 1000, lambda: (
            StoreUnavailableError(_explain_sqlite(path, "attempt to write a readonly database"))))
    if backend == "postgresql":
        check_pg_options(parsed)
        connect_args = {} if "connect_timeout" in parsed.query else {"connect_timeout": PG_CONNECT_TIMEOUT_S}
        try:
            engine = create_engine(url, json_serializer=_json_serializer, json_deserializer=jsoncodec.loads,
                                   pool_pre_ping=True, pool_size=pool_size_env() or 5,
                                   max_overflow=10, hide_parameters=True, connect_args=connect_args)
        except (ImportError, sa_exc.NoSuchModuleError):
            raise StoreUnavailableError(_missing_driver(url, parsed.get_driver_name())) from None
        except sa_exc.ArgumentError as exc:  # its hosts and ports (?host=h1:p1&host=h2:p2, or h1,h2&port=p1,p2)
            raise StoreUnavailableError(f"the hosts and ports of the PostgreSQL URL {describe_store(url)} cannot be "
                                        f"read ({str(exc).splitlines()[0][:200]}): fix them") from None
        return fork_safe(_unwrap_json_errors(engine))
    raise UserError(f"database {redact(url)} is not supported: use a sqlite:/// file or postgresql:// URL")


def _missing_driver(url: str, driver: str) -> str:
    """What to do when the PostgreSQL driver ``driver`` that ``url`` asks for cannot be loaded."""
    if driver == "psycopg":
        return (f"cannot open the PostgreSQL store {describe_store(url)}: its driver (psycopg) is not installed: "
                "pip install 'raysaga[postgres]'")
    return (f"cannot open the PostgreSQL store {describe_store(url)}: the URL asks for the driver {driver!r}, which "
            "is not installed here; raysaga uses psycopg 3: write postgresql://... (or postgresql+psycopg://...) "
            "and pip install 'raysaga[postgres]'")


#: An execution option (``engine.execution_options(**{DEFERRED_BEGIN: True})``): on SQLite, that
#: engine's transactions begin deferred even on a write engine, so a read (the schema version)
#: never waits for another connection's write lock; under WAL it reads the last commit.
DEFERRED_BEGIN = "raysaga_deferred_begin"


def _sqlite_engine(url: str, database: str | None, *, immediate: bool, create: bool, read_only: bool) -> Engine:
    if not database or database == ":memory:":
        raise UserError("an in-memory SQLite database cannot be shared by a driver and its tools: use a file")
    path = Path(os.path.abspath(expand_user(database, url)))
    if path.is_dir():
        raise StoreUnavailableError(f"the store {path} is a directory, not a database file: "
                                    f"give a file path, such as {path / DEFAULT_FILE}")
    if not create and not path.is_file():
        raise StoreUnavailableError(f"no raysaga store at {_shown(path)}: nothing has run with this --db yet "
                                    f"({WHERE_ADVICE})")
    if create:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreUnavailableError(f"cannot create the folder of the store {path}: {exc.strerror or exc}: "
                                        "choose another --db / RAYSAGA_HOME, or fix the folder's permissions") from None
    # an absolute path: the same file whatever the current folder of whoever opens it later
    url = make_url(url).set(database=str(path)).render_as_string(hide_password=False)
    page_size = new_file_page_size()
    engine = create_engine(url, json_serializer=_json_serializer, json_deserializer=jsoncodec.loads,
                           hide_parameters=True, poolclass=NullPool if read_only else None,
                           connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # let SQLAlchemy, not pysqlite, emit BEGIN, so it can be BEGIN IMMEDIATE
        dbapi_conn.isolation_level = None
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        if not read_only:  # (a read-only connection writes nothing, the WAL switch included)
            # before the first table and before WAL: then it is the file's for good; on a file
            # that has pages already (any existing store) SQLite ignores it
            cur.execute(f"PRAGMA page_size={page_size}")
            _enable_wal(cur)
            cur.execute("PRAGMA synchronous=FULL")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()
        # lower() as PostgreSQL's, for the dashboard's search (SQLite's folds ASCII only)
        text_match.register(dbapi_conn)

    write_begin = "BEGIN IMMEDIATE" if immediate and not read_only else "BEGIN"

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # on the DBAPI connection: every transaction pays this, and SQLAlchemy's execution
        # context costs more CPU than SQLite's BEGIN (an error is raised as SQLAlchemy's)
        begin = "BEGIN" if conn.get_execution_options().get(DEFERRED_BEGIN) else write_begin
        try:
            conn.connection.driver_connection.execute(begin)
        except sqlite3.Error as exc:
            raise as_sqlalchemy_error(begin, exc, conn.dialect) from exc

    return engine


def as_sqlalchemy_error(statement: str, exc: sqlite3.Error, dialect: Any) -> sa_exc.StatementError:
    """A SQLite error from a statement run on the DBAPI connection, as the SQLAlchemy error
    ``exec_driver_sql`` would have raised (callers, ``is_outage``, tell errors apart by those)."""
    return sa_exc.DBAPIError.instance(statement, None, exc, sqlite3.Error, hide_parameters=True, dialect=dialect)


def _enable_wal(cur: Any) -> None:
    """Switch the file to WAL (persistent: a file changes once). The switch needs an exclusive lock,
    and SQLite answers SQLITE_BUSY at once, without calling the busy handler, while another
    connection holds the file (two processes opening one fresh database): retry until the busy timeout."""
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


@contextmanager
def opening(url: str) -> Iterator[None]:
    """Raise what opening the store at ``url`` fails with as one ``StoreUnavailableError`` that
    names the store and the fix: a file that is not a database, a read-only location, an unknown
    database, role or host, a server that does not answer. Used at the edge (the first connect
    and the migration), never around every store method. Lock contention is left as it is."""
    try:
        yield
    except (sa_exc.DBAPIError, sqlite3.Error) as exc:
        message = str(getattr(exc, "orig", None) or exc).strip()
        denied = isinstance(exc, sa_exc.ProgrammingError) and "permission denied" in message.lower()
        if type(exc) not in _OPENING_ERRORS and not denied:
            raise  # an IntegrityError, another ProgrammingError...: not about reaching the store
        if "locked" in message or "busy" in message.lower():
            raise  # contention, not unavailability: the caller's retry or busy timeout handles it
        raise StoreUnavailableError(explain_open_error(url, message)) from None


_OPENING_ERRORS = (sa_exc.OperationalError, sa_exc.InterfaceError, sa_exc.DatabaseError,
                   sqlite3.OperationalError, sqlite3.DatabaseError)


def explain_open_error(url: str, message: str) -> str:
    """One line for a driver's ``message`` on opening the store at ``url``: what and how to fix it."""
    first = message.splitlines()[0] if message else "unknown error"
    path = sqlite_path(url)
    if path is not None:
        return _explain_sqlite(path, first)
    try:
        parsed = make_url(normalize_url(url))
    except Exception:
        return f"cannot open the store: {first}"
    shown = describe_store(url)
    where = f"{parsed.host or 'localhost'}:{parsed.port or 5432}"
    lowered = message.lower()
    if "does not exist" in lowered and "database" in lowered:
        return (f"the PostgreSQL database {parsed.database!r} does not exist on {where}: create it "
                f"(createdb {parsed.database}) or fix the database in the URL {shown}")
    if "role" in lowered and "does not exist" in lowered:
        return (f"PostgreSQL at {where} has no role {parsed.username!r}: fix the user in the URL {shown} "
                "or create the role")
    if "password authentication failed" in lowered or "no password supplied" in lowered:
        return f"PostgreSQL at {where} refused the credentials of {parsed.username!r}: fix the URL {shown}"
    if "pg_hba.conf" in lowered:
        return (f"PostgreSQL at {where} does not accept this connection (pg_hba.conf): ask its administrator "
                f"to allow {parsed.username!r}, or fix the URL {shown}")
    if "permission denied" in lowered:
        return (f"PostgreSQL user {parsed.username!r} lacks a permission raysaga needs in the database "
                f"{parsed.database!r} ({first}): grant it (the first `raysaga run` or `raysaga db upgrade` "
                f"creates raysaga's tables there), or use another user in the URL {shown}")
    if "resolve host" in lowered or "translate host name" in lowered:
        return f"cannot resolve the PostgreSQL host {parsed.host!r}: fix the host in the URL {shown}"
    if "connection refused" in lowered:
        return (f"cannot reach PostgreSQL at {where} (connection refused): is the server running there? "
                f"Check the host and port of {shown}")
    if any(m in lowered for m in _DROPPED):
        return (f"the connection to PostgreSQL at {where} dropped while opening the store {shown} ({first}): "
                "try again (a server restarting or failing over answers in a moment)")
    if "timeout" in lowered or "timed out" in lowered:
        limit = parsed.query.get("connect_timeout", PG_CONNECT_TIMEOUT_S)
        return (f"cannot reach PostgreSQL at {where}: no answer within {limit} s: is the server up and "
                f"reachable from here? Check the host and port of {shown}")
    return f"cannot open the PostgreSQL store {shown}: {first}"


#: What psycopg says of a connection dropped (terminated, the server gone) or refused for a moment.
_DROPPED = ("terminating connection", "server closed the connection", "connection is closed", "consuming input",
            "connection has been closed", "connection is lost", "connection reset", "the database system is")


def _explain_sqlite(path: Path, first: str) -> str:
    lowered = first.lower()
    if "not a database" in lowered:
        return (f"{path} is not a SQLite database ({first}): point --db at a raysaga store, "
                "or move this file out of the way")
    sidecars = f"{path.name}-wal and {path.name}-shm"
    if "readonly" in lowered or "read-only" in lowered or "unable to open" in lowered:
        for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
            if p.exists() and not os.access(p, os.W_OK):
                return (f"the store {path} is read-only ({p.name} cannot be written): raysaga writes to its "
                        f"store, and SQLite in WAL mode also writes {sidecars} beside it: make them writable")
        if path.parent.is_dir() and not os.access(path.parent, os.W_OK | os.X_OK):
            return (f"the folder {path.parent} of the store {path} is read-only: SQLite in WAL mode creates "
                    f"{sidecars} next to the database: make the folder writable, or choose another --db")
    return f"cannot open the SQLite store {path}: {first}"


def probe_sqlite_store(url: str) -> None:
    """For read-only use: refuse, before any engine touches it (an engine switches the file to
    WAL), a SQLite store that is missing, a directory, not a SQLite database, or a database
    without raysaga's tables. Nothing is created or written. No-op for PostgreSQL."""
    path = sqlite_path(url)
    if path is None:
        return
    if path.is_dir():
        raise StoreUnavailableError(f"the store {path} is a directory, not a database file: "
                                    f"give a file path, such as {path / DEFAULT_FILE}")
    if not path.is_file():
        raise StoreUnavailableError(f"no raysaga store at {_shown(path)}: nothing has run with this --db yet "
                                    f"({WHERE_ADVICE})")
    if not os.access(path, os.R_OK):
        raise StoreUnavailableError(f"cannot read the store {path}: permission denied")
    if path.stat().st_size == 0:
        raise StoreUnavailableError(f"no raysaga store at {_shown(path)}: the file is empty ({WHERE_ADVICE})")
    names = _table_names(path)
    if names == NOT_A_DATABASE:
        raise StoreUnavailableError(_explain_sqlite(path, "file is not a database"))
    if names is not None and "raysaga_schema" not in names:
        raise StoreUnavailableError(f"{path} is a SQLite database but not a raysaga store (it has no "
                                    f"raysaga tables): {WHERE_ADVICE}")


#: What ``_table_names`` answers for a file that is no SQLite database.
NOT_A_DATABASE = frozenset({"<not a database>"})


def _table_names(path: Path) -> frozenset[str] | None:
    """The tables of the SQLite database at ``path`` as SQLite reads it (read-only: nothing is
    created or written), ``NOT_A_DATABASE``, or None when it cannot tell (say, a WAL file in a
    read-only folder: opening it explains).

    Never Python's ``open()`` on the file (these checks read its header that way): closing any file
    descriptor of a database drops every POSIX lock this process holds on it, its SQLite
    connections' included (SQLite's own connections share one descriptor per file and never close
    it under a lock). A process with a store open that opened it once more (``Client(url)`` beside
    ``raysaga.run(store=url)``) lost its locks: another process (``raysaga status``, a worker)
    then checkpointed and deleted the -wal and -shm files under it, and its next commits went to
    the deleted WAL file: lost without an error (or "disk I/O error")."""
    try:
        conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_MS / 1000)
        try:
            return frozenset(r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"))
        finally:
            conn.close()
    except sqlite3.Error as exc:
        return NOT_A_DATABASE if "not a database" in str(exc).lower() else None


def refuse_foreign_sqlite(url: str) -> None:
    """For a store about to be created or migrated: refuse an existing SQLite database that holds
    tables but none of raysaga's (another program's file), before any engine touches it; raysaga
    never adds its tables there. A missing or 0-byte file may become a store. No-op for
    PostgreSQL: a shared database commonly holds other applications' tables beside raysaga_*."""
    path = sqlite_path(url)
    if path is None or not path.is_file() or path.stat().st_size == 0:
        return  # missing or empty: becomes a store
    names = _table_names(path)
    if names is None or names == NOT_A_DATABASE:
        return  # opening it explains
    if names and not names & {"raysaga_schema", "raysaga_runs", "alembic_version"}:
        raise StoreUnavailableError(f"{path} is a SQLite database but not a raysaga store (it holds other "
                                    f"tables: {', '.join(sorted(names)[:5])}): pass another --db ({WHERE_ADVICE})")


def check_writable(url: str) -> None:
    """For a store about to be written: refuse a read-only SQLite file (or its -wal/-shm) now, with
    the fix, rather than at the first write of a run. No-op for PostgreSQL (its server decides)."""
    path = sqlite_path(url)
    if path is None:
        return
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists() and not os.access(p, os.W_OK):
            raise StoreUnavailableError(_explain_sqlite(path, "attempt to write a readonly database"))


def is_outage(exc: BaseException) -> bool:
    """Whether ``exc`` says the store could not be reached or answer for a moment (a server
    restarting, a dropped connection, a pool out of connections, a locked SQLite file, a server
    refusing writes: SQLSTATE 25006, a failover's standby), so that the same work may be tried
    again once it answers; not a constraint, a type or a programming error."""
    return (isinstance(exc, (StoreUnavailableError, sa_exc.OperationalError, sa_exc.InterfaceError,
                             sa_exc.TimeoutError, sqlite3.OperationalError))
            or getattr(getattr(exc, "orig", None), "sqlstate", None) == "25006")


def outage_cause(exc: BaseException, limit: int = 200) -> str:
    """What an outage error (``is_outage``) says, on one line, its driver's own message first and
    any password scrubbed: the cause shown beside "resume once the store answers"."""
    text = " ".join(str(getattr(exc, "orig", None) or exc).split()) or type(exc).__name__
    text = re.sub(r" ?\(Background on this error at: \S+\)", "", text)  # SQLAlchemy's own (a pool timeout)
    return _shown(text if len(text) <= limit else text[:limit - 1] + "…")


def _shown(path: object) -> str:
    """A store's path in an error: a mistyped URL read as a path (``postgresql:/app:PW@db/x``) keeps
    no password (``scrub_text``: the CLI scrubs its errors, the Python API's are raised as built)."""
    from raysaga.state.redact import scrub_text

    return scrub_text(str(path))

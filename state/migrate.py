"""Schema migrations (alembic), applied on first use, and the refuse-newer check.

These are the store's first connections, so what opening it fails with (not a database, a
read-only file, an unknown PostgreSQL database...) is translated here, by ``engine.opening``,
into a one-line ``StoreUnavailableError``.
"""

from __future__ import annotations

import functools
import re
import sqlite3
import threading
import time
from pathlib import Path

from sqlalchemy import Connection, Engine, inspect, select, text
from sqlalchemy import exc as sa_exc

from raysaga.errors import SchemaVersionError, StoreUnavailableError
from raysaga.state import sqlite_readonly
from raysaga.state.engine import DEFERRED_BEGIN, WHERE_ADVICE, check_writable, describe_store, opening, sqlite_path
from raysaga.state.schema import SCHEMA_VERSION, schema_info

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
ALEMBIC_TABLE = "alembic_version"
_REVISION = re.compile(r"^revision\s*=\s*[\"']([^\"']+)[\"']", re.MULTILINE)


def _url(engine: Engine) -> str:
    return engine.url.render_as_string(hide_password=True)


def _reads(engine: Engine) -> Engine:
    """``engine`` for reading only: on SQLite a write engine's transactions begin IMMEDIATE, which
    waits for another process's write lock (a migration holds it for as long as it runs); a deferred
    read under WAL never waits."""
    return engine.execution_options(**{DEFERRED_BEGIN: True})


def current_version(engine: Engine) -> int | None:
    """The schema version recorded in the database, or None for an empty database."""
    engine = _reads(engine)
    with opening(_url(engine)):
        if not inspect(engine).has_table(schema_info.name):
            return None
        with engine.connect() as conn:
            return conn.execute(select(schema_info.c.version).where(schema_info.c.id == 1)).scalar_one_or_none()


@functools.cache
def known_revisions() -> frozenset[str]:
    """Every alembic revision this raysaga ships, read from the scripts' ``revision = "..."`` lines:
    importing alembic costs ~0.4 s, which every read command would pay just to open a store."""
    found = (_REVISION.search(path.read_text(encoding="utf-8"))
             for path in (MIGRATIONS_DIR / "versions").glob("v*.py"))
    return frozenset(match.group(1) for match in found if match)


def check_revisions(engine: Engine) -> None:
    """Refuse a database whose alembic revision this raysaga does not know (a newer raysaga
    migrated it): alembic itself would fail with "Can't locate revision"."""
    engine = _reads(engine)
    with opening(_url(engine)):
        if not inspect(engine).has_table(ALEMBIC_TABLE):
            return
        with engine.connect() as conn:
            found = [r[0] for r in conn.execute(text(f"SELECT version_num FROM {ALEMBIC_TABLE}"))]
    unknown = sorted(set(found) - known_revisions())
    if unknown:
        raise SchemaVersionError(
            f"the store {describe_store(_url(engine))} is at migration {unknown[0]!r}, which this raysaga "
            f"does not know (it knows up to schema version {SCHEMA_VERSION}): a newer raysaga wrote it: "
            "upgrade raysaga (pip install -U raysaga) before using it")


def require_current(engine: Engine) -> int:
    """For read-only use (nothing is created or migrated): the schema version, which must be this
    raysaga's; an empty database, an older or a newer schema is an error that says what to do."""
    found = current_version(engine)
    where = describe_store(_url(engine))
    if found is None:
        raise StoreUnavailableError(f"no raysaga store at {where}: the database has no raysaga tables, "
                                    f"nothing has run with this --db yet ({WHERE_ADVICE})")
    check_version(found)
    check_revisions(engine)
    path = sqlite_path(_url(engine))
    locked = sqlite_readonly.unwritable(path) if path is not None and found < SCHEMA_VERSION else None
    if locked is not None:  # read-only: it cannot be migrated here, and `db upgrade` would fail
        raise SchemaVersionError(
            f"the store {where} has schema version {found}, older than this raysaga's ({SCHEMA_VERSION}), and "
            f"cannot be migrated here: {locked} is read-only. Read it with the raysaga that wrote it, or copy its "
            "folder somewhere writable and run `raysaga db upgrade --db COPY` on the copy")
    if found < SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the store {where} has schema version {found}, older than this raysaga's ({SCHEMA_VERSION}): "
            f"run `raysaga db upgrade --db {where}` (or any `raysaga run` on it) to migrate it")
    return found


def check_version(found: int | None) -> None:
    if found is not None and found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the database has schema version {found}, newer than this raysaga understands "
            f"({SCHEMA_VERSION}): upgrade raysaga (pip install -U raysaga) before using it"
        )


#: Held while alembic migrates a database in this process (see ``upgrade``).
_MIGRATING = threading.Lock()


def upgrade(engine: Engine, *, force: bool = False) -> int:
    """Bring the database to this raysaga's schema; return the version now in force. An existing
    store that runs are being driven on now (by an older raysaga: this one cannot drive it before
    it is migrated) is refused unless ``force`` (``_refuse_live_drivers``)."""
    found = current_version(engine)
    check_version(found)
    check_revisions(engine)
    check_writable(_url(engine))
    if found == SCHEMA_VERSION:
        return found
    with _MIGRATING:  # alembic's `context` and `op` are module globals: one migration per process at once
        if current_version(engine) == SCHEMA_VERSION:  # another thread migrated it meanwhile
            return SCHEMA_VERSION
        _migrate(engine, force=force or found is None)
        if found is None:
            _compact_new_file(engine)
    found = current_version(engine)
    check_version(found)
    return found or 0


#: Seconds opening a SQLite store waits for another process that is migrating it (holding its write
#: lock: a big store's migration rebuilds tables) before giving up with ``StoreUnavailableError``.
MIGRATION_WAIT_S = 600.0


def _migrate(engine: Engine, *, force: bool = False) -> None:
    """Migrate to head in one transaction. Two processes migrating one database at once: the
    second waits, then finds it done (PostgreSQL: an advisory lock; SQLite: the write lock, waited
    for past the busy timeout while another process migrates, up to ``MIGRATION_WAIT_S``)."""
    deadline = time.monotonic() + MIGRATION_WAIT_S
    while True:
        try:
            with opening(_url(engine)), engine.begin() as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(text("SELECT pg_advisory_xact_lock(7355608)"))
                if _version_in(conn) == SCHEMA_VERSION:
                    return  # another process migrated it while this one waited for the lock: its own
                    # drivers may hold leases by now, and they are no older raysaga
                if not force:  # (in the migration's transaction: on SQLite no lease is taken meanwhile;
                    _refuse_live_drivers(conn, _url(engine))  # on PostgreSQL the table lock sees to it)
                upgrade_to(conn, "head")
            return
        except sa_exc.OperationalError as exc:
            # SQLite's busy timeout ran out (the transaction rolled back: trying again is safe)
            if engine.dialect.name != "sqlite" or "locked" not in str(exc.orig):
                raise
        if _migrated_meanwhile(engine, deadline):
            return


def _version_in(conn: Connection) -> int | None:
    """The schema version as this transaction sees it (None: no raysaga tables yet)."""
    if not inspect(conn).has_table(schema_info.name):
        return None
    return conn.execute(select(schema_info.c.version).where(schema_info.c.id == 1)).scalar_one_or_none()


def _refuse_live_drivers(conn: Connection, url: str) -> None:
    """Refuse to migrate a store whose runs hold a live lease: their drivers run an older raysaga
    (this one cannot drive the store before it is migrated), and a migration that rebuilds tables
    under them crashed them mid-step with a raw SQL error ("no column named run_id"). Said with
    the runs and owners, and the two ways on."""
    if not inspect(conn).has_table("raysaga_runs"):
        return
    if conn.dialect.name == "postgresql":  # no lease taken or renewed between this look and the migration
        conn.execute(text("LOCK TABLE raysaga_runs IN SHARE ROW EXCLUSIVE MODE"))
    live = conn.execute(text("SELECT run_id, lease_owner FROM raysaga_runs WHERE lease_owner IS NOT NULL "
                             "AND lease_expires_at > :now ORDER BY run_id"), {"now": time.time()}).all()
    if not live:
        return
    where = describe_store(url)
    named = ", ".join(f"{run} by {owner}" for run, owner in live[:5]) + (" ..." if len(live) > 5 else "")
    raise SchemaVersionError(
        f"the store {where} needs migrating to schema version {SCHEMA_VERSION}, and {len(live)} run(s) are being "
        f"driven on it now by an older raysaga ({named}): migrating it under them would crash them mid-step. Stop "
        f"those workers and drivers first (SIGTERM hands their runs back), then `raysaga db upgrade --db {where}`; "
        f"or `raysaga db upgrade --force --db {where}` (their steps in flight are lost and run again when this "
        "raysaga resumes the runs; no committed effect is repeated). Idle older workers hold no lease and are not "
        "seen: stop every older worker before upgrading")


def _migrated_meanwhile(engine: Engine, deadline: float) -> bool:
    """After a wait for SQLite's write lock ran out: whether another process brought the store to
    this schema (or a newer one: ``upgrade`` refuses that) meanwhile; past ``deadline``, a
    ``StoreUnavailableError`` saying who holds it up."""
    found = current_version(engine)
    if found is not None and found >= SCHEMA_VERSION:
        return True
    if time.monotonic() >= deadline:
        where = describe_store(_url(engine))
        raise StoreUnavailableError(
            f"another process is migrating the store {where} (or holds its write lock): waited "
            f"{MIGRATION_WAIT_S:.0f} s for it to finish; try again once it has (`raysaga db upgrade --db {where}` "
            f"migrates it to schema version {SCHEMA_VERSION})")
    return False


def _compact_new_file(engine: Engine) -> None:
    """A SQLite store just created: give back the pages its migrations freed. Migrations rebuild
    tables (schemas 7 to 9), so a new file held ~6 free pages of the tables they replaced, which
    nothing would reuse soon. ``VACUUM`` of an empty store takes milliseconds; it runs outside a
    transaction, and waits (busy timeout) for a writer that got in first. Only an optimisation: a
    store too busy to compact (another process already writing runs) is used as it is."""
    if engine.dialect.name != "sqlite":
        return
    pooled = engine.raw_connection()
    try:
        raw = pooled.driver_connection
        assert isinstance(raw, sqlite3.Connection)
        if raw.execute("PRAGMA freelist_count").fetchone()[0]:
            raw.execute("VACUUM")
    except sqlite3.OperationalError as exc:
        if "locked" not in str(exc) and "busy" not in str(exc):
            raise
    finally:
        pooled.close()


def upgrade_to(conn: Connection, revision: str) -> None:
    """Run raysaga's alembic migrations on ``conn`` up to ``revision`` (the tests also make
    databases of an older schema with it)."""
    from alembic import command  # alembic loads in ~0.4 s: only when migrating
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = conn
    command.upgrade(cfg, revision)

"""Opening the store: one clear error per way it can fail, read-only opens that never create or
migrate anything, a default store that is the same from every folder, and errors that never carry
SQL parameters.

Real SQLite files, a real PostgreSQL server (``pg_base_url``) where the case needs one, real
sockets for unreachable servers, and subprocesses where a case needs a process of its own (a
missing driver; a process that obeys file permissions although the suite runs as root).
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import traceback
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import event, insert, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError

from raysaga.errors import SchemaVersionError, StoreUnavailableError
from raysaga.state import NewRun, SqlStore, describe_store, open_store
from raysaga.state.engine import PG_CONNECT_TIMEOUT_S, default_url, make_engine
from raysaga.state.schema import SCHEMA_VERSION, runs, schema_info
from tests.support.postgres import drop_pg_database, make_pg_database, pg_admin


def new_run(run_id: str, value: object = None) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                  trace_id=uuid.uuid4().hex, input=value)


def one_line(exc: BaseException) -> str:
    message = str(exc)
    assert "\n" not in message and "Traceback" not in message, message
    return message


def tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def pg_server(pg_base_url: str) -> tuple[str, str]:
    """(a URL of the test server with no database, the server's ``host:port``)."""
    parsed = make_url(pg_base_url)
    return pg_base_url.rpartition("/")[0], f"{parsed.host}:{parsed.port or 5432}"


@pytest.fixture
def fresh_pg(pg_base_url: str) -> Iterator[str]:
    url = make_pg_database(pg_base_url)
    yield url
    drop_pg_database(pg_base_url, url)


@pytest.fixture(params=["sqlite", "postgres"])
def own_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A database of this test's own (these tests rewrite its schema rows): a new SQLite file, or
    a PostgreSQL database created for the test and dropped after it."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'raysaga.db'}"
    return str(request.getfixturevalue("fresh_pg"))


# ------------------------------------------------------------------ SQLite: what is at --db


@pytest.mark.parametrize("create", [True, False])
def test_a_file_that_is_not_a_database_is_a_one_line_error(tmp_path: Path, create: bool) -> None:
    bogus = tmp_path / "notes.db"
    content = b"these are my notes, not a database\n" * 40
    bogus.write_bytes(content)
    with pytest.raises(StoreUnavailableError) as exc:
        open_store(str(bogus), create=create)
    message = one_line(exc.value)
    assert str(bogus) in message and "not a SQLite database" in message
    assert bogus.read_bytes() == content
    assert tree(tmp_path) == ["notes.db"]


@pytest.mark.parametrize("create", [True, False])
def test_a_directory_as_the_store_is_a_one_line_error(tmp_path: Path, create: bool) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    with pytest.raises(StoreUnavailableError) as exc:
        open_store(f"sqlite:///{folder}", create=create)
    message = one_line(exc.value)
    assert f"{folder} is a directory" in message and str(folder / "raysaga.db") in message
    assert tree(tmp_path) == ["runs"]


def _permission_obeying(cmd: list[str]) -> list[str]:
    """``cmd`` run so that file permissions apply to it: as is for a user, and for root without
    the capabilities that let root write anything (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH)."""
    if os.geteuid() != 0:
        return cmd
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root and setpriv is not installed: cannot make permissions apply")
    wrapped = [setpriv, "--bounding-set=-dac_override,-dac_read_search"]
    probe = subprocess.run([*wrapped, "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot drop root's file capabilities here: {probe.stderr.decode().strip()}")
    return [*wrapped, *cmd]


READ_ONLY_OPEN = textwrap.dedent("""
    import sys
    from raysaga.errors import StoreUnavailableError
    from raysaga.state import open_store
    try:
        store = open_store(sys.argv[1], create=sys.argv[2] == "create")
    except StoreUnavailableError as exc:
        print("ERROR", exc)
    else:
        print("OPENED", len(store.list_runs()))
        store.close()
""")


def _open_obeying_permissions(url: str, create: bool) -> str:
    proc = subprocess.run(_permission_obeying([sys.executable, "-c", READ_ONLY_OPEN, url,
                                               "create" if create else "read"]),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout.strip()


def test_a_read_only_store_file_is_refused_for_writing_and_readable_for_reading(tmp_path: Path) -> None:
    db = tmp_path / "raysaga.db"
    store = open_store(str(db))
    store.create_run(new_run("kept"))
    store.close()
    db.chmod(0o444)
    try:
        out = _open_obeying_permissions(str(db), create=True)
        assert out.startswith("ERROR"), out
        assert f"the store {db} is read-only" in out and "raysaga.db-wal and raysaga.db-shm" in out
        # a read command needs no write access to the file itself
        assert _open_obeying_permissions(str(db), create=False) == "OPENED 1"
    finally:
        db.chmod(0o644)


@pytest.mark.parametrize("create", [True, False])
def test_a_store_in_a_read_only_folder_says_wal_needs_to_write_beside_it(tmp_path: Path, create: bool) -> None:
    folder = tmp_path / "ro"
    db = folder / "raysaga.db"
    open_store(str(db)).close()  # closing the last connection removes -wal and -shm
    assert tree(folder) == ["raysaga.db"]
    folder.chmod(0o555)
    try:
        out = _open_obeying_permissions(str(db), create=create)
    finally:
        folder.chmod(0o755)
    if not create:  # a read opens it read-only (state/sqlite_readonly.py, stop 49): nothing to write
        assert out == "OPENED 0", out
        return
    assert out.startswith("ERROR"), out
    assert f"the folder {folder} of the store {db} is read-only" in out
    assert "raysaga.db-wal and raysaga.db-shm" in out


# ------------------------------------------------------------------ PostgreSQL: what the URL names


@pytest.mark.parametrize("create", [True, False])
def test_an_unknown_postgres_database_is_named_with_the_fix(pg_server: tuple[str, str], create: bool) -> None:
    server, where = pg_server
    name = "raysaga_missing_" + uuid.uuid4().hex[:8]
    with pytest.raises(StoreUnavailableError) as exc:
        open_store(f"{server}/{name}", create=create)
    message = one_line(exc.value)
    assert f"the PostgreSQL database {name!r} does not exist on {where}" in message
    assert f"createdb {name}" in message


def test_an_unknown_postgres_role_is_named_and_the_password_hidden(pg_server: tuple[str, str]) -> None:
    _, where = pg_server
    host, port = where.rsplit(":", 1)
    role = "raysaga_nobody_" + uuid.uuid4().hex[:8]
    with pytest.raises(StoreUnavailableError) as exc:
        open_store(f"postgresql://{role}:hunter2secret@{host}:{port}/test")
    message = one_line(exc.value)
    assert f"has no role {role!r}" in message
    assert "hunter2secret" not in message and "***" in message


def test_a_postgres_user_without_create_rights_is_told_what_to_grant(pg_base_url: str, fresh_pg: str) -> None:
    """PostgreSQL 15+ lets no ordinary user create tables in ``public``: the first open (which
    creates raysaga's tables) says so instead of a ProgrammingError traceback."""
    role = "raysaga_t_user_" + uuid.uuid4().hex[:8]
    pg_admin(pg_base_url, f'CREATE ROLE "{role}" LOGIN')
    pg_admin(fresh_pg, f'REVOKE CREATE ON SCHEMA public FROM PUBLIC, "{role}"')
    try:
        parsed = make_url(fresh_pg)
        with pytest.raises(StoreUnavailableError) as exc:
            open_store(parsed.set(username=role).render_as_string(hide_password=False))
        message = one_line(exc.value)
        assert f"PostgreSQL user {role!r} lacks a permission" in message and "permission denied" in message
    finally:
        drop_pg_database(pg_base_url, fresh_pg)
        pg_admin(pg_base_url, f'DROP ROLE IF EXISTS "{role}"')


def test_an_unresolvable_postgres_host_is_a_one_line_error() -> None:
    started = time.monotonic()
    with pytest.raises(StoreUnavailableError) as exc:
        open_store("postgresql://raysaga@no-such-host.invalid:5432/raysaga")
    assert "cannot resolve the PostgreSQL host 'no-such-host.invalid'" in one_line(exc.value)
    assert time.monotonic() - started < 30


def test_a_postgres_port_nobody_listens_on_is_refused_at_once() -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nobody listens there now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(StoreUnavailableError) as exc:
        open_store(f"postgresql://raysaga@127.0.0.1:{port}/raysaga")
    assert f"cannot reach PostgreSQL at 127.0.0.1:{port} (connection refused)" in one_line(exc.value)


def test_a_postgres_server_that_never_answers_fails_within_the_connect_timeout() -> None:
    """A host that takes the connection and says nothing (a firewall, a hung server): the
    connect timeout ends it in seconds, where the driver alone would wait for minutes."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever accepts nor replies
        port = silent.getsockname()[1]
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError) as exc:
            open_store(f"postgresql://raysaga@127.0.0.1:{port}/raysaga")
        elapsed = time.monotonic() - started
    message = one_line(exc.value)
    assert f"cannot reach PostgreSQL at 127.0.0.1:{port}: no answer within {PG_CONNECT_TIMEOUT_S} s" in message
    # libpq may try a second time without SSL: at most two timeouts
    assert elapsed < 2 * PG_CONNECT_TIMEOUT_S + 5, elapsed


MISSING_DRIVER = textwrap.dedent("""
    import sys
    sys.modules["psycopg"] = None  # as if raysaga[postgres] were not installed: import psycopg fails
    from raysaga.errors import StoreUnavailableError
    from raysaga.state import open_store
    try:
        open_store("postgresql://raysaga:topsecret@db.example:5432/raysaga")
    except StoreUnavailableError as exc:
        print(exc)
""")


def test_a_missing_postgres_driver_says_which_extra_to_install() -> None:
    proc = subprocess.run([sys.executable, "-c", MISSING_DRIVER], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    message = proc.stdout.strip()
    assert "psycopg" in message and "pip install 'raysaga[postgres]'" in message
    assert "postgresql://raysaga:***@db.example:5432/raysaga" in message and "topsecret" not in message


# ------------------------------------------------------------------ schema versions


def test_a_migration_a_newer_raysaga_wrote_is_refused_with_upgrade_advice(own_url: str) -> None:
    """alembic_version names a revision this raysaga does not ship. Whatever raysaga_schema says
    (here: an old version, so the upgrade would run alembic), this is refused, not a traceback
    from alembic's "Can't locate revision", and nothing is changed."""
    store = SqlStore(own_url)
    store.create_run(new_run("kept"))
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = 'f00d9999'"))
        conn.execute(update(schema_info).values(version=1))
    store.close()

    for create in (True, False):
        with pytest.raises(SchemaVersionError) as exc:
            open_store(own_url, create=create)
        message = one_line(exc.value)
        assert "'f00d9999'" in message and "upgrade raysaga" in message

    engine = make_engine(own_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == ["f00d9999"]
            assert conn.execute(select(schema_info.c.version)).scalars().all() == [1]
            assert conn.execute(select(runs.c.run_id)).scalars().all() == ["kept"]
    finally:
        engine.dispose()


def test_read_only_open_of_an_older_schema_says_upgrade_and_migrates_nothing(own_url: str) -> None:
    store = SqlStore(own_url)
    with store.engine.begin() as conn:
        conn.execute(update(schema_info).values(version=SCHEMA_VERSION - 1))
        revision = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    store.close()

    with pytest.raises(SchemaVersionError) as exc:
        open_store(own_url, create=False)
    message = one_line(exc.value)
    assert f"schema version {SCHEMA_VERSION - 1}" in message and "raysaga db upgrade" in message

    engine = make_engine(own_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(select(schema_info.c.version)).scalar_one() == SCHEMA_VERSION - 1
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == revision
    finally:
        engine.dispose()


# ------------------------------------------------------------------ read commands create nothing


def test_read_only_open_of_a_missing_store_creates_no_folder_and_no_file(tmp_path: Path) -> None:
    typo = tmp_path / "typo" / "nested" / "raysaga.db"
    with pytest.raises(StoreUnavailableError) as exc:
        open_store(str(typo), create=False)
    message = one_line(exc.value)
    assert f"no raysaga store at {typo}" in message and "RAYSAGA_HOME" in message
    assert tree(tmp_path) == []

    (tmp_path / "here").mkdir()
    with pytest.raises(StoreUnavailableError):
        open_store(f"sqlite:///{tmp_path / 'here' / 'raysaga.db'}", create=False)
    assert tree(tmp_path) == ["here"]


def test_read_only_open_of_an_empty_file_or_a_foreign_sqlite_database_changes_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "empty.db"
    empty.touch()
    with pytest.raises(StoreUnavailableError) as exc:
        open_store(str(empty), create=False)
    assert "no raysaga store" in one_line(exc.value)
    assert empty.stat().st_size == 0

    foreign = tmp_path / "other.sqlite"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    before = foreign.read_bytes()
    with pytest.raises(StoreUnavailableError) as exc:
        open_store(str(foreign), create=False)
    assert "not a raysaga store" in one_line(exc.value)
    assert foreign.read_bytes() == before  # not even switched to WAL
    assert tree(tmp_path) == ["empty.db", "other.sqlite"]


def test_read_only_open_of_an_empty_postgres_database_creates_no_table(fresh_pg: str) -> None:
    with pytest.raises(StoreUnavailableError) as exc:
        open_store(fresh_pg, create=False)
    assert "no raysaga store" in one_line(exc.value)
    engine = make_engine(fresh_pg)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'")).scalar() == 0
    finally:
        engine.dispose()


def test_read_only_open_reads_an_existing_store_without_writing(own_url: str) -> None:
    writer = open_store(own_url)
    writer.create_run(new_run("r1"))
    writer.close()
    reader = open_store(own_url, create=False)
    statements: list[str] = []
    event.listen(reader.engine, "before_cursor_execute", lambda _c, _cur, statement, *_a: statements.append(statement))
    try:
        assert [r.run_id for r in reader.list_runs()] == ["r1"]
        assert reader.get_run("r1").status.value == "pending"
    finally:
        reader.close()
    assert not [s for s in statements if s.lstrip().split(None, 1)[0].upper() in {"CREATE", "ALTER", "INSERT",
                                                                                  "UPDATE", "DELETE"}]


# ------------------------------------------------------------------ the default store


def test_the_default_store_is_the_same_from_every_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RAYSAGA_DB", raising=False)
    monkeypatch.delenv("RAYSAGA_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    seen = set()
    for folder in ("a", "b/c"):
        (tmp_path / folder).mkdir(parents=True)
        monkeypatch.chdir(tmp_path / folder)
        seen.add((default_url(), describe_store()))
    assert seen == {(f"sqlite:///{tmp_path / 'home' / '.raysaga' / 'raysaga.db'}",
                     str(tmp_path / "home" / ".raysaga" / "raysaga.db"))}

    store = open_store()
    store.create_run(new_run("in-home"))
    store.close()
    assert tree(tmp_path / "home") == [".raysaga", ".raysaga/raysaga.db"]
    assert tree(tmp_path / "b") == ["c"]  # nothing in the current folder


def test_raysaga_home_and_raysaga_db_choose_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAYSAGA_DB", raising=False)
    # A relative RAYSAGA_HOME is refused: resolved against the current folder it made the default
    # store change from folder to folder (it used to be taken from where it was set).
    monkeypatch.setenv("RAYSAGA_HOME", "state")
    with pytest.raises(StoreUnavailableError, match="RAYSAGA_HOME='state' is a relative path"):
        describe_store()
    assert not (tmp_path / "state").exists()
    monkeypatch.setenv("RAYSAGA_HOME", str(tmp_path / "state"))
    assert describe_store() == str(tmp_path / "state" / "raysaga.db")
    monkeypatch.setenv("RAYSAGA_DB", "elsewhere/mine.db")  # a plain path
    assert describe_store() == str(tmp_path / "elsewhere" / "mine.db")
    assert default_url() == f"sqlite:///{tmp_path / 'elsewhere' / 'mine.db'}"
    monkeypatch.setenv("RAYSAGA_DB", "postgresql://ops:s3cret-pw@db.internal:5432/raysaga")
    assert describe_store() == "postgresql://ops:***@db.internal:5432/raysaga"
    assert describe_store(f"sqlite:///{tmp_path / 'x.db'}") == str(tmp_path / "x.db")


# ------------------------------------------------------------------ no SQL parameters in errors


def test_database_errors_never_carry_sql_parameters(own_url: str) -> None:
    canary = "canary-" + uuid.uuid4().hex
    store = SqlStore(own_url)
    try:
        store.create_run(new_run("dup", {"card": canary}))
        row = {"run_id": "dup", "workflow_name": "wf", "workflow_version": "1", "definition_hash": "d" * 64,
               "status": "pending", "version": 0, "fence": 0, "event_seq": 1, "input": {"card": canary},
               "retries_used": 0, "tokens_used": 0, "cost_used": 0.0, "trace_id": canary,
               "created_at": 1.0, "updated_at": 1.0}
        for engine in {store.engine, store.reader}:
            with pytest.raises(IntegrityError) as exc, engine.begin() as conn:
                conn.execute(insert(runs).values(**row))
            shown = "".join(traceback.format_exception(exc.value))
            assert canary not in shown
    finally:
        store.close()

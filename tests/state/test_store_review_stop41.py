"""Review stop 41 of the store's handling: what the entry points open they close, a plain file path
names that file, a migration in another process is waited for, and a foreign driver is named.

- ``raysaga.run`` / ``create_run`` / ``resume`` / ``cancel`` / ``retry`` / ``fork`` given a URL (or
  None) opened a store and never closed it: each call kept a PostgreSQL connection (two file
  descriptors on SQLite) until a full garbage collection, SQLAlchemy's engines being in reference
  cycles; with ``ulimit -n 64`` the 29th SQLite run failed. A ``Store`` passed in stays open.
- A plain path holding ``?``, ``%`` or ``#`` was put into ``sqlite:///`` unescaped, so SQLAlchemy
  read a query, an escape or a fragment in it: ``run?1.db`` opened ``run``, ``a%20b.db`` ``a b.db``.
- Opening an older-schema SQLite store while another process holds its write lock (migrating it)
  failed after the busy timeout with a raw ``database is locked``; it now waits, up to
  ``migrate.MIGRATION_WAIT_S``, then says in one line that another process is migrating the store.
- ``postgresql+psycopg2://`` was answered "its driver (psycopg) is not installed".

Nothing here sleeps to synchronise: the lock's holder acts from inside the opener's retry.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection

import raysaga
from raysaga import RetryPolicy, RunStatus, Workflow
from raysaga.errors import StoreUnavailableError
from raysaga.state import SqlStore, describe_store, migrate, open_store
from raysaga.state import engine as store_engine
from raysaga.state.engine import default_url, make_engine, normalize_url, sqlite_path
from raysaga.state.schema import SCHEMA_VERSION
from tests.support.cli import invoke
from tests.support.old_schema import migrate_to

flow = Workflow("stop41_closes")


@flow.step
def first(input: Any) -> int:
    return 1


@flow.step
def second(first: int) -> int:
    return first + 1


fails = Workflow("stop41_fails")


@fails.step(retry=RetryPolicy(max_attempts=1))
def boom(input: Any) -> None:
    raise ValueError("no")


# ---------------------------------------------------------------- entry points close their store


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _backends(request: pytest.FixtureRequest, url: str) -> int:
    """Connections to the store's own PostgreSQL database (0 for SQLite)."""
    if not url.startswith("postgres"):
        return 0
    import psycopg

    base = str(request.getfixturevalue("pg_base_url")).replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                           (url.rpartition("/")[2],)).fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def _no_gc() -> Iterator[None]:
    """A leak must not hide behind a collection that happened to run meanwhile."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _every_entry_point(url: str) -> list[RunStatus]:
    """Each public entry point that opens the store at ``url``, once; the statuses they return."""
    done = raysaga.run(flow, {"n": 1}, store=url, executor="inline")
    pending = raysaga.create_run(flow, {"n": 2}, store=url)
    resumed = raysaga.resume(flow, pending.run_id, store=url, executor="inline")
    cancelled = raysaga.cancel(raysaga.create_run(flow, {"n": 3}, store=url).run_id, store=url, executor="inline")
    forked = raysaga.fork(flow, done.run_id, from_node="second", store=url, executor="inline")
    failed = raysaga.run(fails, None, store=url, executor="inline")
    retried = raysaga.retry(fails, failed.run_id, store=url, executor="inline")
    # the records stay usable once the store they came from is closed
    assert done.output == {"second": 2} and forked.output == {"second": 2}, (done.output, forked.output)
    return [done.status, pending.status, resumed.status, cancelled.status, forked.status, failed.status,
            retried.status]


def test_entry_points_given_a_url_close_the_store_they_open(own_store_url: str,
                                                            request: pytest.FixtureRequest) -> None:
    url = own_store_url
    _every_entry_point(url)  # imports, the template's first open and the like, before counting
    with _no_gc():
        fds, backends = _fds(), _backends(request, url)
        for _ in range(3):
            statuses = _every_entry_point(url)
        grown_fds, grown_backends = _fds() - fds, _backends(request, url) - backends
    assert statuses == [RunStatus.COMPLETED, RunStatus.PENDING, RunStatus.COMPLETED, RunStatus.CANCELLED,
                        RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.FAILED], statuses
    # 21 calls that each opened a store: left open, 21 connections (42 descriptors on SQLite). A
    # PostgreSQL backend ends a moment after its client hangs up: the last one may still be listed.
    assert grown_fds <= 0 and grown_backends <= 1, \
        f"after 21 calls: {grown_fds} file descriptors and {grown_backends} PostgreSQL connections more"


def test_a_store_passed_in_stays_open_for_its_owner(store_url: str) -> None:
    store = open_store(store_url)
    try:
        done = raysaga.run(flow, {"n": 4}, store=store, executor="inline")
        forked = raysaga.fork(flow, done.run_id, from_node="second", store=store, executor="inline")
        assert raysaga.cancel(forked.run_id, store=store).status == RunStatus.COMPLETED
        assert store.get_run(forked.run_id).output == {"second": 2}  # still connected: the caller's
    finally:
        store.close()


# ---------------------------------------------------------------- plain paths are file names


@pytest.mark.parametrize("name", ["run?1.db", "a%20b.db", "hash#x.db", "q%3Fx.db"])
def test_a_plain_path_opens_the_file_it_names(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    assert sqlite_path(str(path)) == path and describe_store(str(path)) == str(path)
    store = open_store(str(path))
    try:
        store.list_runs(limit=1)
    finally:
        store.close()
    assert path.is_file(), sorted(p.name for p in tmp_path.iterdir())
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(("-wal", "-shm"))) == [name]
    again = open_store(normalize_url(str(path)), create=False)  # the URL names the same file
    try:
        assert again.list_runs(limit=1) == []
    finally:
        again.close()


def test_a_sqlite_url_keeps_url_syntax(tmp_path: Path) -> None:
    """A user who writes a URL means URL syntax: ``%20`` is a space there."""
    url = f"sqlite:///{tmp_path}/a%20b.db"
    assert normalize_url(url) == url and sqlite_path(url) == tmp_path / "a b.db"


def test_version_and_db_name_a_default_store_whose_folder_holds_a_question_mark(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    home = tmp_path / "h?1%41"
    monkeypatch.setenv("RAYSAGA_HOME", str(home))
    monkeypatch.delenv("RAYSAGA_DB", raising=False)
    assert sqlite_path(default_url()) == home / "raysaga.db"
    code, out, _ = invoke("--version", env={"RAYSAGA_HOME": str(home)})
    assert code == 0 and f"store: {home / 'raysaga.db'}" in out, out
    open_store(str(tmp_path / "x?y.db")).close()
    code, out, err = invoke("list", "--db", str(tmp_path / "x?y.db"))
    assert code == 0 and str(tmp_path / "x?y.db") in out + err, (out, err)
    assert not (tmp_path / "x").exists()


# ---------------------------------------------------------------- a migration in another process


@pytest.fixture
def locked_old_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Connection]]:
    """A schema-13 SQLite store whose write lock another connection holds (``BEGIN IMMEDIATE``), as
    a process migrating it does; SQLite's busy timeout shortened to 50 ms so a wait runs out fast."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate_to(url, "0013")
    monkeypatch.setattr(store_engine, "BUSY_TIMEOUT_MS", 50)
    holder_engine = make_engine(url)
    holder = holder_engine.connect()
    holder.begin()  # BEGIN IMMEDIATE: the write lock, held until the test lets go
    try:
        yield url, holder
    finally:
        holder.close()
        holder_engine.dispose()


def _version(url: str) -> int | None:
    path = sqlite_path(url)
    assert path is not None
    conn = sqlite3.connect(path)
    try:
        row = conn.execute("SELECT version FROM raysaga_schema WHERE id = 1").fetchone()
        return None if row is None else int(row[0])
    finally:
        conn.close()


def _on_retry(monkeypatch: pytest.MonkeyPatch, act: Any) -> list[int]:
    """Call ``act()`` when the opener's wait for the write lock first runs out; count the retries."""
    retries: list[int] = []
    real = getattr(migrate, "_migrated_meanwhile", None)

    def retry(engine: Any, deadline: float) -> bool:
        retries.append(1)
        if len(retries) == 1:
            act()
        assert real is not None
        return bool(real(engine, deadline))

    # raising=False: the code before the fix had no such step (it failed on the first lock wait)
    monkeypatch.setattr(migrate, "_migrated_meanwhile", retry, raising=False)
    return retries


def test_opening_waits_for_the_holder_of_the_lock_then_migrates(locked_old_store: tuple[str, Connection],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    url, holder = locked_old_store
    retries = _on_retry(monkeypatch, holder.rollback)  # the other process lets go, having migrated nothing
    store = SqlStore(url)
    try:
        assert retries == [1] and migrate.current_version(store.engine) == SCHEMA_VERSION
    finally:
        store.close()


def test_opening_finds_the_store_migrated_by_the_process_it_waited_for(
        locked_old_store: tuple[str, Connection], monkeypatch: pytest.MonkeyPatch) -> None:
    url, holder = locked_old_store

    def other_process_migrates() -> None:
        migrate.upgrade_to(holder, "head")
        holder.commit()

    retries = _on_retry(monkeypatch, other_process_migrates)
    store = SqlStore(url)
    try:
        assert retries == [1] and _version(url) == SCHEMA_VERSION
        assert store.list_runs(limit=1) == []
    finally:
        store.close()


def test_opening_gives_up_in_one_line_naming_the_migrating_process(locked_old_store: tuple[str, Connection],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    url, _holder = locked_old_store
    monkeypatch.setattr(migrate, "MIGRATION_WAIT_S", 0.2, raising=False)
    with pytest.raises(StoreUnavailableError) as caught:
        SqlStore(url)
    message = str(caught.value)
    assert "another process is migrating the store" in message and str(sqlite_path(url)) in message, message
    assert len(message.splitlines()) == 1 and _version(url) == 13


# ---------------------------------------------------------------- the driver a URL asks for


@pytest.mark.parametrize("driver", ["psycopg2", "pg8000"])
def test_a_url_for_another_postgresql_driver_names_it(driver: str) -> None:
    if importlib.util.find_spec(driver) is not None:
        pytest.skip(f"{driver} is installed here")
    with pytest.raises(StoreUnavailableError) as caught:
        open_store(f"postgresql+{driver}://u:secret@127.0.0.1:1/db")
    message = str(caught.value)
    assert f"'{driver}'" in message and "psycopg 3" in message and "postgresql://" in message, message
    assert "secret" not in message


# ---------------------------------------------------------------------- what the first fixes left (lead)


def test_replay_given_a_url_closes_the_store_it_opens(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'replay.db'}"
    wf = Workflow("stop41_replay_closes")
    wf.step()(first)
    wf.step()(second)
    run_id = raysaga.run(wf, 1, store=url, executor="inline").run_id
    raysaga.replay(wf, run_id, store=url)  # imports and the like, before counting
    with _no_gc():
        fds = _fds()
        for _ in range(5):
            assert all(n.verdict == "same" for n in raysaga.replay(wf, run_id, store=url).nodes)
        assert _fds() == fds


def test_a_store_too_new_for_this_code_lets_go_of_its_connections(tmp_path: Path) -> None:
    path = tmp_path / "newer.db"
    SqlStore(f"sqlite:///{path}").close()
    with sqlite3.connect(path) as conn:  # a store a newer raysaga migrated
        conn.execute("UPDATE alembic_version SET version_num = 'v9999_from_the_future'")
    with pytest.raises(Exception, match=r"newer|v9999"):  # imports and the like, before counting
        SqlStore(f"sqlite:///{path}")
    with _no_gc():
        fds = _fds()
        for _ in range(3):
            with pytest.raises(Exception, match=r"newer|v9999"):
                SqlStore(f"sqlite:///{path}")
        assert _fds() == fds


def test_launch_names_a_sqlite_store_with_a_question_mark_in_its_path(tmp_path: Path) -> None:
    from raysaga.orchestrator.launch import cluster_db_url

    path = tmp_path / "run?1.db"
    SqlStore(str(path)).close()
    assert sqlite_path(cluster_db_url(str(path))) == path


def test_a_mistyped_postgresql_url_read_as_a_path_is_not_echoed_with_its_password() -> None:
    """``postgresql:/`` (one slash lost) reads as a relative file path: the Python API's error
    named that "path", password and all (the CLI scrubs its own errors; this one is raised as built)."""
    with pytest.raises(StoreUnavailableError) as caught:
        open_store("postgresql:/app:S3cretPw99xyz@db/x", create=False)
    assert "S3cretPw99xyz" not in str(caught.value) and "no raysaga store at" in str(caught.value)

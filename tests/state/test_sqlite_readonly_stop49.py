"""Stop 49: how a SQLite store its reader cannot write is opened (``state.sqlite_readonly``).

``mode=ro`` whenever SQLite can open the store so (it reads the -wal's commits through the -shm);
``immutable=1`` only when it cannot (no -shm, and none can be made in the folder); each connection
decides anew, so a reader open before a writer came sees the writer's commits; and a write through
a store opened to read raises the store's read-only error, not SQLite's. Every store is made
read-only for real with ``chattr +i`` (``tests.support.frozen_store``).
"""

from __future__ import annotations

import gc
import shutil
import sqlite3
import time
from pathlib import Path

import pytest

import raysaga
from raysaga.errors import StoreUnavailableError
from raysaga.state import open_store, sqlite_readonly
from raysaga.state.engine import sqlite_url
from tests.support.frozen_store import frozen, runs_in_file_alone, sidecars, wf


def _run(url: str, run_id: str) -> None:
    record = raysaga.run(wf, 2, store=url, executor="inline", run_id=run_id)
    assert record.status.value == "completed"
    gc.collect()  # (a process's exit closes what the run left to the collector)


def _runs(url: str) -> list[str]:
    store = open_store(url, create=False)
    try:
        return sorted(r.run_id for r in store.list_runs())
    finally:
        store.close()


def test_mode_ro_when_sqlite_can_open_the_store_so_immutable_only_when_it_cannot(tmp_path: Path) -> None:
    db = tmp_path / "ro" / "s.db"
    url = sqlite_url(db)
    _run(url, "r1")
    assert sidecars(db) == []
    with frozen(db.parent):
        assert sqlite_readonly.unwritable(db) == db.parent
        assert sqlite_readonly.connect_uri(db, 1.0) == f"{db.as_uri()}?mode=ro&immutable=1"
    snapshot = tmp_path / "snapshot"  # a killed writer's files: its -wal and -shm beside the database
    snapshot.mkdir()
    holder = sqlite3.connect(db)  # (they stay while another connection has the store open)
    try:
        holder.execute("SELECT count(*) FROM raysaga_runs").fetchone()
        for name in ("s.db", "s.db-wal", "s.db-shm"):
            shutil.copy(db.with_name(name), snapshot / name)
    finally:
        holder.close()
    copy = snapshot / "s.db"
    with frozen(snapshot, *snapshot.iterdir()):  # (no connection has them mapped: chattr +i on a -shm a
        assert sqlite_readonly.unwritable(copy) == copy  # connection maps writable makes its next write SIGBUS)
        assert sqlite_readonly.connect_uri(copy, 1.0) == f"{copy.as_uri()}?mode=ro"
        assert _runs(sqlite_url(copy)) == ["r1"]
    assert sqlite_readonly.unwritable(db) is None  # a writable store: opened as ever
    store = open_store(url, create=False)
    try:
        assert store.read_only is False and store.reader is not store.engine
    finally:
        store.close()


def test_each_connection_decides_anew_so_a_later_writers_commits_are_read(tmp_path: Path) -> None:
    """A reader opened on a folder nobody wrote (``immutable``), then a writer allowed to write the
    folder adds a run and keeps the store open (its commit in the -wal): the reader's next read goes
    through ``mode=ro`` and sees it. A pooled ``immutable`` connection would show the old runs."""
    db = tmp_path / "ro" / "s.db"
    url = sqlite_url(db)
    _run(url, "r1")
    reader = None
    try:
        with frozen(db.parent):
            reader = open_store(url, create=False)
            assert reader.read_only and [r.run_id for r in reader.list_runs()] == ["r1"]
            assert sqlite_readonly.connect_uri(db, 1.0).endswith("immutable=1")
        holder = sqlite3.connect(db)  # the writer's process still has the store open
        try:
            holder.execute("SELECT count(*) FROM raysaga_runs").fetchone()
            _run(url, "r2")
            assert runs_in_file_alone(db) == 1  # r2 is in the -wal only: an immutable read leaves it out
            with frozen(db.parent):  # (not its -wal nor -shm: the writer maps the -shm to write it)
                assert sorted(r.run_id for r in reader.list_runs()) == ["r1", "r2"]
                assert reader.get_run("r2").status.value == "completed"
        finally:
            holder.close()
    finally:
        if reader is not None:
            reader.close()


def test_a_write_through_a_store_opened_to_read_raises_the_read_only_error(tmp_path: Path) -> None:
    db = tmp_path / "ro" / "s.db"
    url = sqlite_url(db)
    _run(url, "r1")
    with frozen(db.parent):
        assert _runs(url) == ["r1"]
        with pytest.raises(StoreUnavailableError, match=f"the folder {db.parent} of the store {db} is read-only"):
            raysaga.prune(url, older_than=0, now=time.time() + 60)  # (opens its store as a read does)
        with pytest.raises(StoreUnavailableError, match="is read-only"):
            open_store(url)  # a command that writes: refused at once, as before
    assert _runs(url) == ["r1"]  # nothing was pruned

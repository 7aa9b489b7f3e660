"""Stop 46 (a review of a worker fleet on one SQLite file): a command with no run of its own
(``submit``, ``approve``...) that met the file's write lock held by another process past the busy
timeout printed ``error: OperationalError: (sqlite3.OperationalError) database is locked`` and
"run with --debug": it named neither the store's state nor whether anything was recorded, which is
what decides whether to try again."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from raysaga.state import SqlStore, engine
from tests.support.cli import invoke

FLOW = "tests.support.fleet_flows:short"


def test_a_submit_meeting_a_held_write_lock_says_so_and_that_nothing_was_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "raysaga.db"
    url = f"sqlite:///{path}"
    SqlStore(url).close()  # migrated
    monkeypatch.setattr(engine, "BUSY_TIMEOUT_MS", 300)  # (30 s in production: the same path, sooner)
    value = json.dumps({"n": 1, "services": "http://127.0.0.1:9", "trace": str(tmp_path / "t")})
    holder = sqlite3.connect(path, isolation_level=None)  # another process's long transaction, say a backup
    try:
        holder.execute("BEGIN IMMEDIATE")
        code, out, err = invoke("submit", FLOW, "--input", value, "--run-id", "s-1", "--db", url)
        assert code == 2 and out == "", (out, err)
        assert err.startswith("store busy: database is locked: another process held the SQLite file's "
                              "write lock for over 0.3 s"), err
        assert "nothing was committed; try it again once the store answers" in err, err
        assert len(err.strip().splitlines()) == 1 and "OperationalError" not in err, err
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    store = SqlStore(url)
    try:
        assert [r.run_id for r in store.list_runs()] == []  # as said: nothing recorded
    finally:
        store.close()
    code, out, err = invoke("submit", FLOW, "--input", value, "--run-id", "s-1", "--db", url)
    assert (code, out.strip()) == (0, "s-1"), err  # tried again once the store answers

"""Stop 49 (a new user's review): a SQLite store in a folder its reader cannot write (an auditor,
another Unix user, a snapshot mount, a backup copy) could not be read: ``raysaga list`` and
``status`` failed with ``the folder ... is read-only: SQLite in WAL mode creates s.db-wal ...``,
though the docs said a read-only store can still be read and those commands only read. They now
read it through read-only connections; the commands that write still refuse it, and a store whose
``-wal`` holds commits SQLite cannot reach from there is refused, never shown stale.

Every store here is made read-only for real with ``chattr +i`` (``tests.support.frozen_store``).
"""

from __future__ import annotations

import gc
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.support.cli import invoke, one_line_error
from tests.support.frozen_store import FLOW, frozen, runs_in_file_alone, sidecars
from tests.support.old_schema import migrate_to

READ_ONLY_FOLDER = "is read-only: SQLite in WAL mode creates"


def _run(db: Path, run_id: str, value: int = 3) -> None:
    code, out, err = invoke("run", FLOW, "--input", str(value), "--db", str(db), "--executor", "inline",
                            "--run-id", run_id)
    assert code == 0, (out, err)
    gc.collect()  # engines the in-process run left to the collector close (a process's exit closes them)


def _listed(db: Path) -> list[str]:
    code, out, err = invoke("list", "--db", str(db), "--json")
    assert code == 0, err
    return [row["run_id"] for row in json.loads(out)]


@pytest.mark.parametrize("files_too", [False, True], ids=["folder", "folder-and-file"])
def test_the_read_commands_read_a_store_in_a_read_only_folder(tmp_path: Path, files_too: bool) -> None:
    db = tmp_path / "ro" / "s.db"
    _run(db, "r1")
    assert sidecars(db) == []  # the writer closed cleanly: no -wal/-shm to read through, none can be made
    with frozen(db.parent, *([db] if files_too else [])):
        assert _listed(db) == ["r1"]
        code, out, err = invoke("list", "--db", str(db))
        assert code == 0 and "r1" in out and "completed" in out, err
        code, out, err = invoke("status", "r1", "--db", str(db))
        assert code == 0 and "run r1 (frozen_store_stop49 v1): completed" in out, (out, err)
        assert 'output: {"double": 6}' in out, out
        code, out, err = invoke("status", "r1", "--db", str(db), "--json")
        assert code == 0, err
        assert (json.loads(out)["status"], json.loads(out)["output"]) == ("completed", {"double": 6}), out
        code, out, err = invoke("status", "r1", "--db", str(db), "--watch")  # a run at rest: shown once
        assert code == 0 and "completed" in out, err
        code, out, err = invoke("events", "r1", "--db", str(db))
        assert code == 0 and json.loads(out.splitlines()[0])["kind"] == "run_created", err
        code, out, err = invoke("stats", "--db", str(db))
        assert code == 0 and "runs: completed 1" in out, err
        code, out, err = invoke("inbox", "--db", str(db))
        assert code == 0, err
        code, out, err = invoke("replay", "r1", "--db", str(db), "--workflow", FLOW)
        assert code == 0 and "0 of 1 nodes differ" in out, (out, err)
        assert sorted(p.name for p in db.parent.iterdir()) == ["s.db"]  # nothing written beside it


def test_the_dashboard_serves_a_store_in_a_read_only_folder(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from raysaga.orchestrator import cli_store
    from raysaga.orchestrator.dashboard.server import build

    db = tmp_path / "ro" / "s.db"
    _run(db, "r1")
    code, _, err = invoke("submit", FLOW, "--input", "1", "--db", str(db), "--run-id", "p1")
    assert code == 0, err  # a pending run the page's Cancel button could act on
    gc.collect()
    with frozen(db.parent):
        store = cli_store.open_for_reads(str(db))  # as `raysaga dashboard --db` opens it
        try:
            app, guard = build(store)
            client = TestClient(app, base_url="http://127.0.0.1")
            answer = client.get("/api/runs")
            assert answer.status_code == 200 and [r["run_id"] for r in answer.json()["runs"]] == ["p1", "r1"], \
                answer.text
            answer = client.get("/api/runs/r1")
            assert answer.status_code == 200 and '"completed"' in answer.text, answer.text
            # an action needs a write: refused saying why (it was a bare 500 "Internal Server Error")
            answer = client.post("/api/runs/p1/actions/cancel", json={"confirm": True, "by": "ann"},
                                 headers={"X-Raysaga-CSRF": guard.csrf})
            assert answer.status_code == 503, answer.text
            assert f"the folder {db.parent} of the store {db} {READ_ONLY_FOLDER}" in answer.json()["error"]
        finally:
            store.close()
    assert _listed(db) == ["p1", "r1"] and invoke("status", "p1", "--db", str(db), "--json")[1].count('"pending"')


def test_the_commands_that_write_still_refuse_it(tmp_path: Path) -> None:
    db = tmp_path / "ro" / "s.db"
    _run(db, "r1")
    code, _, err = invoke("submit", FLOW, "--input", "1", "--db", str(db), "--run-id", "p1")
    assert code == 0, err  # a pending run a cancel could act on
    gc.collect()
    assert sidecars(db) == []
    with frozen(db.parent):
        for argv in (["run", FLOW, "--input", "1", "--executor", "inline", "--run-id", "r2"],
                     ["cancel", "p1"], ["resume", "p1", "--executor", "inline"], ["prune", "--older-than", "1s"],
                     ["db", "upgrade"]):
            code, _, err = invoke(*argv, "--db", str(db))
            one_line_error(code, err, f"the folder {db.parent} of the store {db} {READ_ONLY_FOLDER}")
        assert _listed(db) == ["p1", "r1"]  # and nothing changed


def test_a_wal_with_its_index_is_read_in_full(tmp_path: Path) -> None:
    """A writer killed, or a snapshot taken while it ran: the -wal holds commits not yet in the
    database file, and its -shm is there. Read through them (``mode=ro``), all runs show."""
    copy = _copy(_snapshot_with_commits_in_its_wal(tmp_path), tmp_path / "copy", "s.db", "s.db-wal", "s.db-shm")
    with frozen(copy.parent, *copy.parent.iterdir()):
        assert _listed(copy) == ["r2", "r1"]
        code, out, err = invoke("status", "r2", "--db", str(copy))
        assert code == 0 and "completed" in out, err


def test_a_wal_without_its_index_is_refused_never_read_stale(tmp_path: Path) -> None:
    """A backup that copied the database and its -wal but not the -shm: SQLite can read the WAL's
    commits only through a -shm, which cannot be made in a read-only folder, and ``immutable`` would
    leave them out (r2 would be missing, r1 shown as it was). Refused, with the fix."""
    copy = _copy(_snapshot_with_commits_in_its_wal(tmp_path), tmp_path / "copy", "s.db", "s.db-wal")
    assert runs_in_file_alone(copy) == 1  # r2 is in the -wal only: a read without it is stale
    with frozen(copy.parent):
        for argv in (["list"], ["status", "r1"], ["status", "r2", "--json"]):
            code, out, err = invoke(*argv, "--db", str(copy))
            one_line_error(code, err, f"the store {copy} cannot be read here: its write-ahead log s.db-wal may hold "
                                      "commits not yet in s.db")
            assert "copy the folder (with s.db-wal) somewhere writable" in err and out == "", err
    shutil.copytree(copy.parent, tmp_path / "writable")  # the fix: a writable copy reads in full
    assert _listed(tmp_path / "writable" / "s.db") == ["r2", "r1"]


def test_an_older_store_that_cannot_be_written_says_it_cannot_be_migrated(tmp_path: Path) -> None:
    db = tmp_path / "ro" / "s.db"
    db.parent.mkdir()
    migrate_to(f"sqlite:///{db}", "0014")
    assert sidecars(db) == []
    with frozen(db.parent):
        code, _, err = invoke("list", "--db", str(db))
        one_line_error(code, err, "older than this raysaga's")
        assert f"cannot be migrated here: {db.parent} is read-only" in err, err
        assert "raysaga db upgrade --db COPY" in err, err


def _snapshot_with_commits_in_its_wal(tmp_path: Path) -> Path:
    """A folder holding a store's s.db, s.db-wal and s.db-shm copied while its run r2 was committed
    in the -wal only (another connection kept the store open, so the writer's close did not
    checkpoint): a killed writer's files, or a snapshot taken while it ran."""
    source = tmp_path / "live" / "s.db"
    _run(source, "r1")
    snapshot = tmp_path / "snapshot"
    snapshot.mkdir()
    holder = sqlite3.connect(source)  # another reader of the store
    try:
        holder.execute("SELECT count(*) FROM raysaga_runs").fetchone()
        _run(source, "r2", 4)
        assert runs_in_file_alone(source) == 1, "r2 was checkpointed: the test needs it in the -wal only"
        for name in ("s.db", "s.db-wal", "s.db-shm"):
            shutil.copy(source.with_name(name), snapshot / name)
    finally:
        holder.close()
    return snapshot


def _copy(snapshot: Path, to: Path, *names: str) -> Path:
    """``names`` of ``snapshot`` copied into the new folder ``to``; the copy's database file."""
    to.mkdir()
    for name in names:
        shutil.copy(snapshot / name, to / name)
    return to / "s.db"

"""Damaged blobs: a non-JSON blob parks the run; a tampered blob is repaired by the next write of
the same content; a run whose input blob is damaged is still parked and cancellable.

Real SQLite and PostgreSQL; the damage is done with plain SQL, behind raysaga's back.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

import raysaga
from raysaga import Permanent, Workflow
from raysaga.errors import BlobIntegrityError
from raysaga.state import RunStatus, SqlStore, jsoncodec

BIG = ["x" * 1000 for _ in range(100)]  # ~100 KB of JSON: kept as a blob (node output and run input)


@pytest.fixture(autouse=True)
def _unique_big(monkeypatch: pytest.MonkeyPatch) -> None:
    """The PostgreSQL database is shared by the session: content (so digests) unique to each test."""
    monkeypatch.setitem(globals(), "BIG", [uuid.uuid4().hex, *["x" * 1000 for _ in range(100)]])
    monkeypatch.setitem(globals(), "R", uuid.uuid4().hex[:8] + "-")  # and run ids


R = uuid.uuid4().hex[:8] + "-"


def flow(fail: dict[str, bool]) -> Workflow:
    wf = Workflow("blob_damage")

    value = BIG

    @wf.step()
    def big() -> list[str]:
        return value

    @wf.step()
    def after(big: list[str]) -> int:
        if fail["now"]:
            raise Permanent("failing on purpose")
        return len(big)

    return wf


def input_flow() -> Workflow:
    wf = Workflow("blob_damage_input")

    @wf.step()
    def only(input: list[str]) -> int:
        return len(input)

    return wf


def replace_blob(store: SqlStore, digest: str, data: bytes) -> str:
    """Give the blob ``digest`` the bytes ``data`` under their own (right) digest, and point every
    row that used it there: a consistent content address holding bytes that are not JSON."""
    new = jsoncodec.digest(data)
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE raysaga_blobs SET data = :d, size = :s, digest = :n WHERE digest = :g"),
                     {"d": data, "s": len(data), "n": new, "g": digest})
        conn.execute(text("UPDATE raysaga_nodes SET output_digest = :n WHERE output_digest = :g"),
                     {"n": new, "g": digest})
    return new


def tamper(store: SqlStore, digest: str, data: bytes = b'["tampered"]') -> None:
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE raysaga_blobs SET data = :d WHERE digest = :g"), {"d": data, "g": digest})


def stored(store: SqlStore, digest: str) -> bytes:
    with store.engine.connect() as conn:
        return bytes(conn.execute(text("SELECT data FROM raysaga_blobs WHERE digest = :g"), {"g": digest}).scalar_one())


@pytest.mark.parametrize("data", [b"\xff\xfe not utf-8", b"{not json", b""])
def test_a_blob_that_is_not_json_parks_the_run(store: SqlStore, data: bytes) -> None:
    fail = {"now": True}
    wf = flow(fail)
    assert raysaga.run(wf, store=store, run_id=R + "r", executor="inline").status == RunStatus.FAILED
    digest = next(n.output_digest for n in store.nodes(R + "r") if n.node_id == "big")
    assert digest is not None
    bad = replace_blob(store, digest, data)
    fail["now"] = False

    run = raysaga.retry(wf, R + "r", store=store, executor="inline")  # no UnicodeDecodeError/JSONDecodeError

    assert run.status == RunStatus.FAILED
    assert bad in (run.status_reason or "") and "is not JSON" in (run.status_reason or "")
    assert run.error is not None
    assert run.error["type"] == "BlobIntegrityError" and run.error["digest"] == bad
    assert store.get_run(run.run_id, lenient=True).lease_owner is None
    assert [e.data["digest"] for e in store.events(R + "r") if e.kind == "blob_integrity_error"] == [bad]
    assert "after" not in {n.node_id for n in store.nodes(R + "r") if n.status.value == "completed"}


def test_a_tampered_blob_is_repaired_by_the_next_write_of_its_content(store: SqlStore) -> None:
    data = jsoncodec.dumps(BIG).encode()
    digest = jsoncodec.digest(data)
    store.put_blobs({digest: data})
    tamper(store, digest)
    with pytest.raises(BlobIntegrityError):
        store.load_blobs({digest: "test"})
    store.put_blobs({digest: data})  # the same content again: the row is repaired, not kept
    assert stored(store, digest) == data
    assert store.load_blobs({digest: "test"}) == {digest: BIG}


def test_a_new_run_with_a_tampered_input_blob_writes_it_again(store: SqlStore) -> None:
    wf = input_flow()
    first = raysaga.run(wf, BIG, store=store, run_id=R + "r1", executor="inline")
    assert first.status == RunStatus.COMPLETED and first.input_digest is not None
    tamper(store, first.input_digest)

    second = raysaga.run(wf, BIG, store=store, run_id=R + "r2", executor="inline")

    assert second.status == RunStatus.COMPLETED and second.output == {"only": len(BIG)}
    assert second.input_digest == first.input_digest
    assert store.get_run(R + "r1").input == BIG  # the first run's input is whole again too


def test_a_node_output_repairs_a_tampered_blob_of_the_same_value(store: SqlStore) -> None:
    fail = {"now": False}
    wf = flow(fail)
    assert raysaga.run(wf, store=store, run_id=R + "r1", executor="inline").status == RunStatus.COMPLETED
    digest = next(n.output_digest for n in store.nodes(R + "r1") if n.node_id == "big")
    assert digest is not None
    tamper(store, digest)
    assert raysaga.run(wf, store=store, run_id=R + "r2", executor="inline").status == RunStatus.COMPLETED
    assert store.load_blobs({digest: "test"}) == {digest: BIG}


def test_a_run_whose_input_blob_is_tampered_is_parked_and_cancellable(store: SqlStore, store_url: str,
                                                                     tmp_path: Path) -> None:
    wf = input_flow()
    record = raysaga.create_run(wf, BIG, store=store, run_id=R + "r1")
    assert record.input_digest is not None
    tamper(store, record.input_digest)

    run = raysaga.resume(wf, R + "r1", store=store, executor="inline")  # parks it, no BlobIntegrityError

    assert run.status == RunStatus.FAILED and record.input_digest in (run.status_reason or "")
    assert store.get_run(run.run_id, lenient=True).lease_owner is None
    assert store.get_run(R + "r1", lenient=True).status == RunStatus.FAILED

    # a second, still pending run with a damaged input: cancel ends it (nothing reads its input)
    raysaga.create_run(wf, [*BIG, "y"], store=store, run_id=R + "r2")
    digest2 = store.get_run(R + "r2").input_digest
    assert digest2 is not None
    tamper(store, digest2)
    assert raysaga.cancel(R + "r2", store=store).status == RunStatus.CANCELLED
    assert store.get_run(R + "r2", lenient=True).status == RunStatus.CANCELLED
    assert raysaga.cancel(R + "r2", store=store).status == RunStatus.CANCELLED  # and again: a no-op


def test_raysaga_cancel_ends_a_run_whose_input_blob_is_tampered(store: SqlStore, store_url: str,
                                                                tmp_path: Path) -> None:
    raysaga.create_run(input_flow(), BIG, store=store, run_id=R + "r2")
    digest2 = store.get_run(R + "r2").input_digest
    assert digest2 is not None
    tamper(store, digest2)
    done = subprocess.run([sys.executable, "-m", "raysaga", "cancel", R + "r2", "--db", store_url],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "RAYSAGA_FAULTS"})
    assert "Traceback" not in done.stderr, done.stderr
    assert store.get_run(R + "r2", lenient=True).status == RunStatus.CANCELLED, done.stderr


@pytest.mark.parametrize("how", ["completed", "failed", "cancelled"])
def test_resume_of_a_run_at_rest_changes_nothing(store: SqlStore, how: str) -> None:
    fail = {"now": how == "failed"}
    wf = flow(fail)
    if how == "cancelled":
        raysaga.create_run(wf, store=store, run_id=R + "r")
        raysaga.cancel(R + "r", store=store)
    else:
        raysaga.run(wf, store=store, run_id=R + "r", executor="inline")
    before = store.get_run(R + "r")
    n_events = store.count_events(R + "r")
    fail["now"] = False
    after = raysaga.resume(wf, R + "r", store=store, executor="inline")
    assert after.status == before.status == RunStatus(how)
    now = store.get_run(R + "r")
    assert (now.fence, now.updated_at, now.version, now.lease_owner) == \
        (before.fence, before.updated_at, before.version, None)
    assert store.count_events(R + "r") == n_events


def test_run_with_an_existing_id_and_a_null_input_is_refused(store: SqlStore) -> None:
    from raysaga.errors import UserError
    from raysaga.orchestrator.runner import NO_INPUT

    wf = Workflow("null_input")

    @wf.step()
    def only(input: list[int] | None) -> int:
        return len(input or [])

    raysaga.create_run(wf, [1, 2], store=store, run_id=R + "r")
    with pytest.raises(UserError, match="different input"):
        raysaga.run(wf, None, store=store, run_id=R + "r", executor="inline")  # JSON null is an input
    assert store.get_run(R + "r").status == RunStatus.PENDING
    assert raysaga.run(wf, store=store, run_id=R + "r", executor="inline").output == {"only": 2}  # no input
    assert raysaga.run(wf, NO_INPUT, store=store, run_id=R + "r", executor="inline").status == RunStatus.COMPLETED


@pytest.mark.parametrize("command", [["cancel", "x"], ["resume", "x"], ["retry", "x"],
                                     ["prune", "--older-than", "1d"]])
def test_write_commands_never_add_raysaga_tables_to_another_programs_sqlite_file(tmp_path: Path,
                                                                                 command: list[str]) -> None:
    import sqlite3

    from raysaga.errors import StoreUnavailableError
    from raysaga.state import open_store

    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE foo (x)")
    conn.close()

    def tables() -> set[str]:
        with sqlite3.connect(other) as c:
            found = {r[0] for r in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        c.close()
        return found

    done = subprocess.run([sys.executable, "-m", "raysaga", *command, "--db", str(other)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert tables() == {"foo"}
    with pytest.raises(StoreUnavailableError, match="not a raysaga store"):
        open_store(str(other))
    assert tables() == {"foo"}
    empty = tmp_path / "empty.db"
    empty.touch()
    open_store(str(empty)).close()  # a 0-byte (or missing) file may still become a store
    assert "raysaga_runs" in {r[0] for r in sqlite3.connect(empty).execute("SELECT name FROM sqlite_master")}

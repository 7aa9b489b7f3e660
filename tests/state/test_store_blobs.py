"""Blobs are checked against their content address on every read; a run input is capped; a large
run output is stored once.

A blob whose bytes were replaced (by valid-but-different JSON, by garbage) or deleted never
reaches a caller: ``BlobIntegrityError`` names the digest, what is wrong and where it is used.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import delete, func, select, update

from raysaga.errors import BlobIntegrityError, InputTooLargeError, UserError
from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, RunStatus, RunUpdate, SqlStore, jsoncodec
from raysaga.state.schema import blobs, runs


def new_run(run_id: str, value: Any = None) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                  trace_id=uuid.uuid4().hex, input=value)


def big_value(tag: str) -> dict[str, Any]:
    return {"tag": tag, "text": "é" * 40_000}  # 80 KB: above the 64 KiB inline limit


TAMPER = {
    "different-json": lambda data: jsoncodec.dumps({"tag": "forged"}).encode(),
    "garbage": lambda data: b"\xff\xfe not json at all \x00",
    "deleted": None,
}


def tamper(store: SqlStore, digest: str, how: str) -> None:
    with store.engine.begin() as conn:
        change = TAMPER[how]
        if change is None:
            conn.execute(delete(blobs).where(blobs.c.digest == digest))
        else:
            data = bytes(conn.execute(select(blobs.c.data).where(blobs.c.digest == digest)).scalar_one())
            conn.execute(update(blobs).where(blobs.c.digest == digest).values(data=change(data)))


@pytest.mark.parametrize("how", list(TAMPER))
def test_a_tampered_run_input_blob_is_refused_by_every_reader(store: SqlStore, how: str) -> None:
    run_id = f"blob-{uuid.uuid4().hex[:10]}"
    record = store.create_run(new_run(run_id, big_value(run_id)))
    digest = record.input_digest
    assert digest is not None
    tamper(store, digest, how)
    for read in (lambda: store.get_run(run_id), lambda: store.snapshot(run_id),
                 lambda: store.load_blobs({digest: "the test"}),
                 lambda: next(r for r in store.list_runs(limit=1000) if r.run_id == run_id).input):
        with pytest.raises(BlobIntegrityError) as exc:
            read()
        assert exc.value.digest == digest and digest in str(exc.value)
    assert store.list_runs(limit=1000)  # the list itself reads no blob: still works
    with pytest.raises(BlobIntegrityError) as exc:
        store.get_run(run_id)
    assert f"input of run {run_id!r}" in str(exc.value)
    assert {"deleted": "missing", "garbage": "does not match", "different-json": "does not match"}[how] \
        in str(exc.value)


@pytest.mark.parametrize("how", ["different-json", "garbage"])
def test_get_blobs_refuses_bytes_that_do_not_match_their_digest(store: SqlStore, how: str) -> None:
    data = jsoncodec.dumps({"node": uuid.uuid4().hex}).encode()
    digest = jsoncodec.digest(data)
    store.put_blobs({digest: data})
    assert store.get_blobs([digest]) == {digest: data}
    tamper(store, digest, how)
    with pytest.raises(BlobIntegrityError) as exc:
        store.get_blobs([digest])
    assert exc.value.digest == digest and "does not match" in exc.value.problem


def test_load_blobs_refuses_missing_and_non_json_blobs(store: SqlStore) -> None:
    missing = jsoncodec.digest(uuid.uuid4().bytes)
    with pytest.raises(BlobIntegrityError) as exc:
        store.load_blobs({missing: "output of node pay"})
    assert (exc.value.digest, exc.value.problem, exc.value.where) == (missing, "is missing", "output of node pay")
    assert "output of node pay" in str(exc.value)
    not_json = b"\x00\x01 binary " + uuid.uuid4().bytes  # its digest is right, but it is no JSON
    store.put_blobs({jsoncodec.digest(not_json): not_json})
    with pytest.raises(BlobIntegrityError) as exc:
        store.load_blobs({jsoncodec.digest(not_json): "output of node pay"})
    assert "not JSON" in exc.value.problem
    good = jsoncodec.dumps([1, 2.0, "x"]).encode()
    store.put_blobs({jsoncodec.digest(good): good})
    assert store.load_blobs({jsoncodec.digest(good): "w"}) == {jsoncodec.digest(good): [1, 2.0, "x"]}


def test_a_tampered_run_output_blob_is_refused(store: SqlStore) -> None:
    run_id = f"out-{uuid.uuid4().hex[:10]}"
    store.create_run(new_run(run_id, {"n": 1}))
    lease = store.claim(run_id, "driver", 30.0)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
    done = store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED, output=big_value(run_id),
                                                   set_output=True)))
    assert done is not None and done.output_digest is not None
    tamper(store, done.output_digest, "different-json")
    with pytest.raises(BlobIntegrityError) as exc:
        store.get_run(run_id)
    assert f"output of run {run_id!r}" in str(exc.value)


# ---------------------------------------------------------------------- the input cap


def test_run_input_above_the_cap_is_refused_naming_size_cap_and_fix(store_url: str) -> None:
    store = SqlStore(store_url, max_input_bytes=1000)
    try:
        run_id = f"cap-{uuid.uuid4().hex[:10]}"
        with pytest.raises(InputTooLargeError) as exc:
            store.create_run(new_run(run_id, {"text": "x" * 2000}))
        message = str(exc.value)
        assert "2,011 bytes" in message and "1,000 bytes" in message and "RAYSAGA_MAX_INPUT_BYTES" in message
        assert run_id not in {r.run_id for r in store.list_runs(limit=1000)}  # nothing written
        assert store.create_run(new_run(run_id, {"text": "x" * 900})).input == {"text": "x" * 900}
    finally:
        store.close()


def test_input_cap_defaults_to_16_mib_and_reads_the_environment(sqlite_url: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    store = SqlStore(sqlite_url)
    assert store.max_input_bytes == 16 * 1024 * 1024
    store.close()
    monkeypatch.setenv("RAYSAGA_MAX_INPUT_BYTES", "5000")
    store = SqlStore(sqlite_url)
    try:
        assert store.max_input_bytes == 5000
        with pytest.raises(InputTooLargeError):
            store.create_run(new_run("big", "y" * 6000))
    finally:
        store.close()
    for wrong in ("lots", "\u0665\u0660\u0660\u0660", "+5000", "5_000", "0", "000"):  # int() reads 3 as 5000, 2 as 0
        monkeypatch.setenv("RAYSAGA_MAX_INPUT_BYTES", wrong)
        with pytest.raises(UserError, match="RAYSAGA_MAX_INPUT_BYTES"):
            SqlStore(sqlite_url)


def test_a_17_mib_input_is_refused_by_default(sqlite_url: str) -> None:
    store = SqlStore(sqlite_url)
    try:
        with pytest.raises(InputTooLargeError):
            store.create_run(new_run("huge", {"text": "z" * (17 * 1024 * 1024)}))
    finally:
        store.close()


# ---------------------------------------------------------------------- a large output stored once


def blob_rows(store: SqlStore) -> tuple[int, int]:
    with store.engine.connect() as conn:
        count, size = conn.execute(select(func.count(), func.coalesce(func.sum(blobs.c.size), 0))).one()
    return int(count), int(size)


def test_a_large_sink_output_is_stored_once(sqlite_url: str) -> None:
    """The run's output is ``{sink: value}``: it used to be a second blob holding the same 15 MiB
    as the sink node's. Now the run row names the node's blob and wraps it on read."""
    import raysaga
    from raysaga import Workflow

    wf = Workflow("big-output")

    @wf.step()
    def make(input: int) -> dict[str, str]:
        return {"text": "q" * input}

    size = 15 * 1024 * 1024
    record = raysaga.run(wf, size, store=sqlite_url, executor="inline")
    assert record.status == RunStatus.COMPLETED and record.output == {"make": {"text": "q" * size}}
    store = SqlStore(sqlite_url)
    try:
        count, total = blob_rows(store)
        assert count == 1 and size < total < size + 100, (count, total)
        again = store.get_run(record.run_id)
        assert again.output == {"make": {"text": "q" * size}}
        node = store.nodes(record.run_id)[0]
        assert node.output_digest is not None and node.status == NodeStatus.COMPLETED
    finally:
        store.close()


def test_run_output_wrapping_a_node_blob_is_verified(store: SqlStore) -> None:
    """The wrapped form reads the node's blob: tampering with it is refused like any blob."""
    run_id = f"wrap-{uuid.uuid4().hex[:10]}"
    store.create_run(new_run(run_id, 1))
    lease = store.claim(run_id, "driver", 30.0)
    value = big_value(run_id)
    data = jsoncodec.dumps(value).encode()
    digest = jsoncodec.digest(data)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING), blobs={digest: data},
                              nodes=[NodeWrite(node_id="sink", status=NodeStatus.COMPLETED, output_digest=digest)]))
    before = blob_rows(store)[0]
    done = store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPLETED, output={"sink": value},
                                                   set_output=True)))
    assert done is not None and done.output == {"sink": value}
    assert blob_rows(store)[0] == before  # no second copy
    with store.engine.connect() as conn:
        assert conn.execute(select(runs.c.output).where(runs.c.run_id == run_id)).scalar_one() is None
    assert store.get_run(run_id).output == {"sink": value}
    tamper(store, digest, "garbage")
    with pytest.raises(BlobIntegrityError):
        store.get_run(run_id)

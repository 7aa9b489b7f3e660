"""Values that cannot be stored as strict JSON, outputs too large, unknown runs, bad input.

Every case runs the real driver (inline executor) on each store (``store_url``: a SQLite file,
and PostgreSQL when configured; the PostgreSQL database is shared by the session, so counts
are compared before and after) and checks the store:
a bad value fails its node permanently with an error naming the step, and nothing else is
written in its place; earlier checkpoints stand.
"""

from __future__ import annotations

import math
import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import func, select

import raysaga
from raysaga import (
    InvalidInputError,
    RetryPolicy,
    RunNotFoundError,
    RunOptions,
    RunStatus,
    StepContext,
    Workflow,
)
from raysaga.state import NodeStatus, SqlStore, jsoncodec
from raysaga.state.schema import blobs, runs


class Reading(BaseModel):
    value: float


class Opaque:
    def __repr__(self) -> str:
        return "<Opaque>"


BAD_OUTPUTS: dict[str, Any] = {
    "set": {1, 2, 3},
    "frozenset": frozenset({"a"}),
    "object": Opaque(),
    "bytes": b"raw",
    "nan": math.nan,
    "inf": math.inf,
    "lone-surrogate": "abc\ud800def",
    "surrogate-key": {"\udfff": 1},
    "nested-set": {"items": [1, {2}]},
    "int-key": {1: "one"},
    "model-with-nan": Reading(value=math.nan),
}


def _node(store: SqlStore, run_id: str, node: str, fan_index: int = -1) -> Any:
    return next(n for n in store.nodes(run_id) if n.node_id == node and n.fan_index == fan_index)


def _blob_count(url: str) -> int:
    store = SqlStore(url)
    try:
        with store.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(blobs)).scalar_one())
    finally:
        store.close()


def _run_count(url: str) -> int:
    store = SqlStore(url)
    try:
        return len(store.list_runs(limit=100_000))
    finally:
        store.close()


@pytest.mark.parametrize("bad", BAD_OUTPUTS.values(), ids=list(BAD_OUTPUTS))
def test_non_json_output_fails_the_node_permanently(store_url: str, bad: Any) -> None:
    calls: list[int] = []
    wf = Workflow("bad-output")

    @wf.step()
    def first(input: int) -> dict[str, int]:
        return {"n": input}

    @wf.step(retry=RetryPolicy(max_attempts=4, base=0.01, cap=0.01))
    def produce(ctx: StepContext, first: dict[str, int]):  # type: ignore[no-untyped-def]
        calls.append(ctx.attempt)
        return bad

    @wf.step()
    def consume(produce: Any) -> int:
        raise AssertionError("must never run")

    blobs_before = _blob_count(store_url)
    record = raysaga.run(wf, 7, store=store_url, executor="inline")
    assert calls == [1], "a value that is not JSON is permanent: never retried"
    assert record.status == RunStatus.FAILED
    assert "'produce'" in (record.status_reason or "")
    store = SqlStore(store_url)
    node = _node(store, record.run_id, "produce")
    assert (node.status, node.attempt) == (NodeStatus.FAILED, 1)
    assert node.output is None and node.output_digest is None
    assert node.error["type"] == "NotJSONableError"
    assert node.error["transient"] is False
    assert "output of step 'produce'" in node.error["message"]
    # the earlier checkpoint is intact, nothing downstream was written, no blob appeared
    before = _node(store, record.run_id, "first")
    assert (before.status, before.output, before.attempt) == (NodeStatus.COMPLETED, {"n": 7}, 1)
    assert {n.node_id for n in store.nodes(record.run_id)} == {"first", "produce"}
    assert _blob_count(store_url) == blobs_before
    assert store.effects(record.run_id) == []
    assert [e.node_id for e in store.events(record.run_id) if e.kind == "node_completed"] == ["first"]
    store.close()


def test_exception_message_with_a_lone_surrogate_fails_the_run_cleanly(store_url: str) -> None:
    """The error record itself must be storable: a bad message must not crash the driver."""
    wf = Workflow("bad-message")

    @wf.step()
    def first(input: int) -> int:
        return input

    @wf.step()
    def explode(first: int) -> int:
        raise ValueError("cannot parse \ud800 in the reply")

    record = raysaga.run(wf, 1, store=store_url, executor="inline")
    assert record.status == RunStatus.FAILED
    store = SqlStore(store_url)
    node = _node(store, record.run_id, "explode")
    assert node.status == NodeStatus.FAILED
    assert node.error["type"] == "ValueError" and "cannot parse" in node.error["message"]
    jsoncodec.dumps(node.error)  # what was stored is strict JSON
    store.close()


def test_output_above_max_output_bytes_is_a_clear_permanent_error(store_url: str) -> None:
    calls: list[int] = []
    wf = Workflow("too-big")

    @wf.step()
    def fetch(input: int) -> str:
        calls.append(1)
        return "x" * input

    blobs_before = _blob_count(store_url)
    record = raysaga.run(wf, 5000, store=store_url, executor="inline",
                         options=RunOptions(max_output_bytes=1000))
    assert calls == [1]
    assert record.status == RunStatus.FAILED
    store = SqlStore(store_url)
    node = _node(store, record.run_id, "fetch")
    assert (node.status, node.attempt, node.output) == (NodeStatus.FAILED, 1, None)
    message = node.error["message"]
    assert "'fetch'" in message and "5002 bytes" in message and "1000" in message, message
    assert "max_output_bytes" in message
    assert _blob_count(store_url) == blobs_before
    store.close()


def test_output_at_the_cap_is_accepted(store_url: str) -> None:
    wf = Workflow("at-cap")

    @wf.step()
    def fetch(input: int) -> str:
        return "x" * input

    # 998 characters + 2 quotes = exactly 1000 bytes of JSON
    record = raysaga.run(wf, 998, store=store_url, executor="inline", options=RunOptions(max_output_bytes=1000))
    assert record.status == RunStatus.COMPLETED


class Page(BaseModel):
    title: str
    body: str


def test_large_output_goes_to_the_blob_store_and_flows_downstream(store_url: str) -> None:
    calls = {"fetch": 0, "summarise": 0}
    state = {"fail": True}
    wf = Workflow("blobs")

    @wf.step()
    def fetch(input: int) -> Page:
        calls["fetch"] += 1
        return Page(title="t", body="é" * input)

    @wf.step()
    def small(input: int) -> int:
        return input

    @wf.step()
    def summarise(fetch: Page, small: int) -> dict[str, int]:
        calls["summarise"] += 1
        if state["fail"]:
            raise raysaga.Permanent("summariser misconfigured")
        return {"chars": len(fetch.body), "small": small}

    options = RunOptions(blob_threshold=1024)
    blobs_before = _blob_count(store_url)
    first = raysaga.run(wf, 3000, store=store_url, executor="inline", options=options)
    assert first.status == RunStatus.FAILED and calls == {"fetch": 1, "summarise": 1}

    store = SqlStore(store_url)
    node = _node(store, first.run_id, "fetch")
    assert node.status == NodeStatus.COMPLETED
    assert node.output is None and node.output_digest is not None
    expected = jsoncodec.dumps({"title": "t", "body": "é" * 3000}).encode("utf-8")
    assert len(expected) > 1024
    assert node.output_digest == jsoncodec.digest(expected)
    assert store.get_blobs([node.output_digest]) == {node.output_digest: expected}
    assert _blob_count(store_url) == blobs_before + 1
    below = _node(store, first.run_id, "small")
    assert below.output == 3000 and below.output_digest is None  # small outputs stay in the row

    # a new driver reads the blob back: the completed step is not re-run
    state["fail"] = False
    second = raysaga.retry(wf, first.run_id, store=store, executor="inline", options=options)
    assert second.status == RunStatus.COMPLETED
    assert second.output == {"summarise": {"chars": 3000, "small": 3000}}
    assert calls == {"fetch": 1, "summarise": 2}
    assert _blob_count(store_url) == blobs_before + 1
    store.close()


def test_large_fan_out_items_go_to_blobs_and_are_collected(store_url: str) -> None:
    wf = Workflow("blob-fanout")

    @wf.step()
    def plan(input: int) -> list[int]:
        return list(range(input))

    @wf.map("plan")
    def expand(plan: int) -> str:
        return str(plan) * 600

    @wf.step()
    def total(expand: list[str]) -> int:
        return sum(len(x) for x in expand)

    blobs_before = _blob_count(store_url)
    record = raysaga.run(wf, 3, store=store_url, executor="inline", options=RunOptions(blob_threshold=500))
    assert record.status == RunStatus.COMPLETED
    assert record.output == {"total": 1800}
    store = SqlStore(store_url)
    items = [_node(store, record.run_id, "expand", i) for i in range(3)]
    assert all(i.output is None and i.output_digest for i in items)
    digests = {i.output_digest for i in items}
    assert len(digests) == 3 and set(store.get_blobs(digests)) == digests
    assert _blob_count(store_url) <= blobs_before + 3  # content-addressed: an equal blob is shared
    store.close()


def test_a_large_run_input_and_output_are_blobs_and_read_back_whole(store_url: str) -> None:
    """The run row keeps neither a 200 KB input nor the sink's 400 KB output (both blobs), and
    every reader still gets the values: the driver's steps, the returned record, a later resume."""
    wf = Workflow("big-run")

    @wf.step()
    def echo(input: dict[str, str]) -> dict[str, str]:
        return {"twice": input["text"] * 2}

    text = "ü" * 100_000  # 200 KB of UTF-8
    record = raysaga.run(wf, {"text": text}, store=store_url, executor="inline")
    assert record.status == RunStatus.COMPLETED
    assert record.input == {"text": text} and record.output == {"echo": {"twice": text * 2}}
    assert record.input_digest is not None and record.output_digest is not None
    store = SqlStore(store_url)
    try:
        with store.engine.connect() as conn:
            row = conn.execute(select(runs.c.input, runs.c.output, func.length(runs.c.input_digest))
                               .where(runs.c.run_id == record.run_id)).one()
        assert row[0] is None and row[1] is None and row[2] < 100  # the row holds digests only
        assert set(store.get_blobs([record.input_digest, record.output_digest])) == {
            record.input_digest, record.output_digest}
    finally:
        store.close()
    again = raysaga.resume(wf, record.run_id, store=store_url, executor="inline")
    assert again.output == record.output and again.input == record.input


def test_resume_of_an_unknown_run_names_it(store_url: str) -> None:
    wf = Workflow("any")

    @wf.step()
    def a(input: int) -> int:
        return input

    SqlStore(store_url).close()  # an existing, migrated, empty store
    run_id = f"no-such-run-{uuid.uuid4().hex[:8]}"
    with pytest.raises(RunNotFoundError) as info:
        raysaga.resume(wf, run_id, store=store_url, executor="inline")
    assert f"'{run_id}'" in str(info.value)
    assert info.value.run_id == run_id


@pytest.mark.parametrize("bad", [math.nan, {"amount": math.nan}, [1, math.inf]], ids=["nan", "dict", "list"])
def test_nan_input_is_refused_before_any_run_row(store_url: str, bad: Any) -> None:
    wf = Workflow("nan-input")

    @wf.step()
    def a(input: Any) -> int:
        raise AssertionError("must never run")

    run_id = f"nan-run-{uuid.uuid4().hex[:8]}"
    runs_before = _run_count(store_url)
    with pytest.raises(InvalidInputError, match=r"nan|inf"):
        raysaga.run(wf, bad, store=store_url, executor="inline", run_id=run_id)
    assert _run_count(store_url) == runs_before
    store = SqlStore(store_url)
    with pytest.raises(RunNotFoundError):
        store.get_run(run_id)
    store.close()


class Order(BaseModel):
    sku: str
    qty: int


def test_input_not_matching_the_model_is_refused_before_any_run_row(store_url: str) -> None:
    wf = Workflow("typed-input")

    @wf.step()
    def a(input: Order) -> int:
        return input.qty

    runs_before = _run_count(store_url)
    with pytest.raises(InvalidInputError, match="Order"):
        raysaga.run(wf, {"sku": "A"}, store=store_url, executor="inline")
    assert _run_count(store_url) == runs_before
    store = SqlStore(store_url)
    record = raysaga.run(wf, {"sku": "A", "qty": 4}, store=store, executor="inline")
    assert record.status == RunStatus.COMPLETED and record.output == {"a": 4}
    store.close()

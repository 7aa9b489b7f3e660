"""A fan-out's plain items are written as compact rows (``Batch.items``) carrying the worker's
JSON text, and a batch of nothing but completed items may wait a few milliseconds for the next
ones (``commit_pacing``). The rows must read back exactly as the general path wrote them, and
nothing else may ever wait."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga.orchestrator.commit_pacing import CommitPacer
from raysaga.state import (
    Batch,
    EffectStatus,
    EffectWrite,
    NewEvent,
    NodeStatus,
    NodeWrite,
    RunStatus,
    RunUpdate,
    SqlStore,
)

wf = raysaga.Workflow("item_rows")
BIG = "x" * 70_000  # above the blob threshold: stored by digest


@wf.step()
def plan(input: int) -> list[int]:
    return list(range(input))


@wf.step(map_over="plan")
def shape(plan: int) -> Any:
    """Outputs of every JSON kind, and one too big to stay in its row."""
    kinds: list[Any] = [None, plan, -plan / 4, f"é{plan}\u2603", {"b": [plan, None], "a": True}, [], BIG]
    return kinds[plan % len(kinds)]


@wf.step()
def echo(shape: list[Any]) -> int:
    return len(shape)


def expected(i: int) -> Any:
    return [None, i, -i / 4, f"é{i}\u2603", {"b": [i, None], "a": True}, [], BIG][i % 7]


def test_item_rows_read_back_as_the_values_the_items_returned(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'run.db'}")
    try:
        run = raysaga.run(wf, 21, store=store, executor="inline")
        assert run.status == RunStatus.COMPLETED and run.output == {"echo": 21}
        rows = {n.fan_index: n for n in store.nodes(run.run_id) if n.node_id == "shape" and n.fan_index >= 0}
        digests = {i: n.output_digest for i, n in rows.items() if n.output_digest}
        blobs = store.load_blobs({d: f"item {i}" for i, d in digests.items()})
    finally:
        store.close()
    assert sorted(rows) == list(range(21))
    for i, row in rows.items():
        assert row.status == NodeStatus.COMPLETED and row.attempt == 1 and row.error is None
        assert row.started_at is not None and row.finished_at is not None
        assert row.duration == pytest.approx(row.finished_at - row.started_at)
        if i % 7 == 6:  # the big one: by digest, not inline
            assert row.output is None and blobs[digests[i]] == BIG
        else:
            assert row.output_digest is None and row.output == expected(i)


def test_item_rows_on_postgresql_read_back_the_same(pg_url: str) -> None:
    store = SqlStore(pg_url)
    try:
        run = raysaga.run(wf, 14, store=store, executor="inline")
        assert run.status == RunStatus.COMPLETED
        rows = {n.fan_index: n for n in store.nodes(run.run_id) if n.node_id == "shape" and n.fan_index >= 0}
    finally:
        store.close()
    assert all(rows[i].output == expected(i) for i in range(14) if i % 7 != 6)


def completed_items(*indexes: int) -> Batch:
    batch = Batch()
    batch.items.extend(("shape", i, 1, None, None, 1.0, 2.0) for i in indexes)
    batch.events.append(NewEvent(kind="items_completed", node_id="shape", data={"ranges": [[i, i] for i in indexes]}))
    return batch


def test_only_completed_items_wait_and_never_past_the_window() -> None:
    pacer = CommitPacer(window=0.02, max_rows=100)
    batch, shell = completed_items(0, 1), Batch()
    assert pacer.may_wait(batch, shell, now=10.0)
    batch.items.append(("shape", 2, 1, None, None, 1.0, 2.0))
    assert pacer.may_wait(batch, shell, now=10.019)
    assert pacer.deadline() == pytest.approx(10.02)
    assert not pacer.may_wait(batch, shell, now=10.021)  # its time is up
    pacer.committed()
    assert pacer.deadline() is None and pacer.may_wait(completed_items(3), shell, now=11.0)


@pytest.mark.parametrize("other", ["failed row", "running row", "plain node", "agent turn", "effect", "run update",
                                   "event", "shell event", "too many"])
def test_anything_but_completed_items_is_committed_at_once(other: str) -> None:
    pacer = CommitPacer(window=0.02, max_rows=100)
    batch, shell = completed_items(0), Batch()
    assert pacer.may_wait(batch, shell, now=1.0)  # it has been looked at: what comes next counts too
    if other == "failed row":
        batch.nodes.append(NodeWrite(node_id="shape", fan_index=1, status=NodeStatus.FAILED, error={"message": "x"}))
    elif other == "running row":
        batch.nodes.append(NodeWrite(node_id="shape", fan_index=1, status=NodeStatus.RUNNING, attempt=1))
    elif other == "plain node":
        batch.nodes.append(NodeWrite(node_id="plan", status=NodeStatus.COMPLETED, attempt=1))
    elif other == "agent turn":  # a fanned-out agent's answered turn: durable before its tools run
        batch.nodes.append(NodeWrite(node_id="research@1", fan_index=3, status=NodeStatus.COMPLETED, attempt=1))
    elif other == "effect":
        batch.effects.append(EffectWrite(idempotency_key="k", node_id="pay", effect_name="pay", args_digest="d",
                                         status=EffectStatus.PENDING))
    elif other == "run update":
        batch.run = RunUpdate(status=RunStatus.COMPLETED)
    elif other == "event":
        batch.events.append(NewEvent(kind="fanout_decision", node_id="shape", data={}))
    elif other == "shell event":
        shell.events.append(NewEvent(kind="lease_taken_over", data={}))
    else:
        batch.items.extend(("shape", i, 1, None, None, 1.0, 2.0) for i in range(1, 100))
    assert not pacer.may_wait(batch, shell, now=1.001)

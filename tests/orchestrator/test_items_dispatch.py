"""A plain fan-out's items leave the run machine as one command (``ItemsDispatch``), and the
executors take them in one call (``submit_items``): what a wide fan-out's driver no longer pays
per item. Items that need more than a call (an effect's ledger row, a 'running' row first, a
restored row to settle) still go one by one, and a stop or a failure treats grouped items as it
treats any other attempt.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Workflow
from raysaga.node_key import NodeKey
from raysaga.orchestrator.executor import InlineExecutor, RayExecutor
from raysaga.orchestrator.machine.outbox import Dispatch, ItemsDispatch
from raysaga.orchestrator.machine.run import RunMachine
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.task import NodeOutcome
from raysaga.state import NodeStatus, RunStatus, SqlStore

wf = Workflow("items_dispatch")


@wf.step
def plan(input: int) -> list[int]:
    return list(range(input))


@wf.map("plan")
def double(plan: int) -> int:
    return plan * 2


@wf.map("plan", effect=True)
def charge(plan: int) -> str:
    return f"charged {plan}"


@wf.step
def total(double: list[int], charge: list[str]) -> int:
    return sum(double) + len(charge)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    opened = SqlStore(f"sqlite:///{tmp_path / 'r.db'}")
    yield opened
    opened.close()


def _machine(store: SqlStore, n: int) -> tuple[RunMachine, str]:
    record = raysaga.create_run(wf, n, store=store)
    snap = store.snapshot(record.run_id)
    m = RunMachine(wf, snap.run, RunOptions(), random.Random(0))
    m.restore(snap, {}, {})
    return m, record.run_id


def _plan_done(m: RunMachine, n: int) -> None:
    m.advance(time.time())
    [sent] = m.out.take_sends()
    assert isinstance(sent, Dispatch) and sent.key == NodeKey("plan")
    now = time.time()
    m.absorb([(NodeKey("plan"), NodeOutcome(ok=True, output_json=str(list(range(n))), started_at=now,
                                            finished_at=now))], now)
    m.out.take_batch()


def test_a_plain_fan_out_s_items_leave_as_one_command(store: SqlStore) -> None:
    m, run_id = _machine(store, 5)
    _plan_done(m, 5)
    m.advance(time.time())
    sends = m.out.take_sends()
    grouped = [s for s in sends if isinstance(s, ItemsDispatch)]
    single = [s for s in sends if isinstance(s, Dispatch)]
    assert [g.spec.name for g in grouped] == ["double"]
    [items] = grouped
    assert items.keys == [NodeKey("double", i) for i in range(5)]
    assert [c.fields for c in items.calls] == [
        (run_id, "double", i, 1, m.calls.trace_id, None, False) for i in range(5)]
    assert [c.kwargs for c in items.calls] == [{"plan": i} for i in range(5)]
    # an effect's items each need a ledger row and a key: one by one, as before
    assert [s.key for s in single] == [NodeKey("charge", i) for i in range(5)]
    assert all(s.call.idempotency_key for s in single)
    assert {k for k in m.calls.inflight if k.step == "double"} == set(items.keys)
    assert all(m.calls.attempts[k] == 1 for k in items.keys)


def test_grouped_items_expand_for_a_reader_of_single_commands(store: SqlStore) -> None:
    m, _ = _machine(store, 3)
    _plan_done(m, 3)
    m.advance(time.time())
    each = m.out.take_dispatch()
    assert all(isinstance(d, Dispatch) for d in each)
    assert sorted(d.key for d in each if d.key.step == "double") == [NodeKey("double", i) for i in range(3)]


def test_a_failure_in_the_round_records_grouped_items_as_never_sent(store: SqlStore) -> None:
    """Prepared in the round a failure stops the run: a grouped item is 'cancelled, not sent'
    like any other, and leaves nothing in flight."""
    m, _ = _machine(store, 3)
    _plan_done(m, 3)
    m.forward.failure = ("somewhere", {"type": "Boom"})  # as a restored failure settled in this round sets it
    m.advance(time.time())
    assert m.out.take_sends() == []
    rows = {(n.node_id, n.fan_index): n for n in m.out.batch.node_writes()}
    assert all(rows[("double", i)].status == NodeStatus.CANCELLED for i in range(3))
    assert not [k for k in m.calls.inflight if k.step == "double"]


@pytest.mark.parametrize("executor", ["inline", "ray"])
def test_a_fan_out_completes_through_the_grouped_path(executor: str, store: SqlStore, request: pytest.FixtureRequest,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    ex: Any = InlineExecutor() if executor == "inline" else RayExecutor(address=request.getfixturevalue("ray_session"))
    calls: list[tuple[str, int]] = []
    blocks: list[tuple[str, int, bool]] = []
    original, original_block = type(ex).submit_items, type(ex).submit_block

    def spy(self: Any, spec: Any, items: list[Any]) -> Any:
        calls.append((spec.name, len(items)))
        return original(self, spec, items)

    def spy_block(self: Any, block: Any) -> bool:
        taken: bool = original_block(self, block)
        blocks.append((block.spec.name, len(block), taken))
        return taken

    monkeypatch.setattr(type(ex), "submit_items", spy)
    monkeypatch.setattr(type(ex), "submit_block", spy_block)
    record = raysaga.run(wf, 200, store=store, executor=ex)
    assert record.status == RunStatus.COMPLETED, record.error
    assert record.output == {"total": sum(i * 2 for i in range(200)) + 200}
    nodes = {(n.node_id, n.fan_index): n for n in store.nodes(record.run_id)}
    assert all(nodes[("double", i)].status == NodeStatus.COMPLETED for i in range(200))
    if executor == "ray":
        assert blocks == [("double", 200, True)]  # the step's 200 items taken as one block
        assert calls == []  # and not one by one
    else:
        assert calls == [] and blocks == []  # inline: each item runs at its own submit, a stop is seen between them

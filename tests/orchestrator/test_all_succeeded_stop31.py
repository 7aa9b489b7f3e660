"""A fan-out's chunk whose items all succeeded comes back as columns (``item_block.AllSucceeded``):
packed so by the worker (``wire.run_packed``), absorbed column by column (``Calls.all_succeeded``).
What the run machine writes from it must be what the item-by-item path writes from the same
outcomes: the same rows, event ranges, outputs and counts; and anything that path treats apart
(an item cancelled meanwhile, one being drained, an output big enough for a blob) goes back to it.
"""

from __future__ import annotations

import pickle  # noqa: TID251 - the wire format: what the driver sends its Ray workers
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Workflow
from raysaga.node_key import NodeKey
from raysaga.orchestrator import wire
from raysaga.orchestrator.item_block import ItemBlock, ItemsDone
from raysaga.orchestrator.machine.outbox import Dispatch, ItemsDispatch
from raysaga.orchestrator.machine.run import RunMachine
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.ray_lanes import Lane, uncancelled
from raysaga.orchestrator.task import AllSucceeded, Aside, NodeCall, NodeOutcome, execute, execute_items
from raysaga.state import SqlStore

cloudpickle = pytest.importorskip("ray.cloudpickle")

wf = Workflow("all_succeeded")


@wf.step
def plan(input: int) -> list[int]:
    return list(range(input))


@wf.map("plan")
def shape(plan: int) -> Any:
    if plan == 3:
        raise ValueError("three is refused")
    return None if plan % 2 else {"n": plan}


@wf.step
def total(shape: list[Any]) -> int:
    return len(shape)


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    wire._specs.clear()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    opened = SqlStore(f"sqlite:///{tmp_path / 'r.db'}")
    yield opened
    opened.close()


def _issued(store: SqlStore, n: int) -> tuple[RunMachine, ItemBlock]:
    """A machine whose plan returned ``n`` items, the fan-out issued as one block."""
    record = raysaga.create_run(wf, n, store=store)
    snap = store.snapshot(record.run_id)
    m = RunMachine(wf, snap.run, RunOptions(), random.Random(0))
    m.restore(snap, {}, {})
    m.advance(time.time())
    [sent] = m.out.take_sends()
    assert isinstance(sent, Dispatch)
    now = time.time()
    m.absorb([(NodeKey("plan"), NodeOutcome(True, str(list(range(n))), None, False, now, now))], now)
    m.out.take_batch()
    m.advance(time.time())
    [items] = [s for s in m.out.take_sends() if isinstance(s, ItemsDispatch)]
    m.out.take_batch()  # the expansion's writes: what follows is the absorption's alone
    return m, items.block


def _outcomes(texts: list[str]) -> AllSucceeded:
    start = 1_790_000_000.0
    return AllSucceeded(texts, [start + i / 1024 for i in range(len(texts))],
                        [start + (i + 1) / 1024 for i in range(len(texts))])


def _written(m: RunMachine) -> tuple[Any, ...]:
    batch = m.out.take_batch()
    outputs = {k: v for k, v in m.forward.outputs.items() if k.step == "shape"}
    return (batch.items, [(e.kind, e.node_id, e.data) for e in batch.events],
            [(n.node_id, n.fan_index, n.status) for n in batch.nodes], outputs,
            sorted(k for k in m.calls.inflight if k.step == "shape"), m.forward.counts.done)


def _both_ways(store: SqlStore, n: int, texts: list[str], then: Any = None) -> tuple[Any, Any]:
    """The same outcomes absorbed as columns and one by one, by two machines in the same state."""
    written = []
    for as_columns in (True, False):
        m, block = _issued(store, n)
        if then is not None:
            then(m)
        done = _outcomes(texts)
        positions = list(range(len(texts)))
        back = ItemsDone(block, positions, done if as_columns else done.outcomes())
        m.absorb_items(back.keys(), back.outcomes, time.time())
        written.append(_written(m))
    return written[0], written[1]


def test_columns_write_what_the_item_by_item_path_writes(store: SqlStore) -> None:
    texts = ['{"n":0}', "null", '{"n":2}', "null", '{"n":4}']
    columns, one_by_one = _both_ways(store, 5, texts)
    assert columns == one_by_one
    rows, events, _, outputs, inflight, _ = columns
    assert [row[1] for row in rows] == [0, 1, 2, 3, 4] and inflight == []
    assert [row[3] for row in rows] == ['{"n":0}', None, '{"n":2}', None, '{"n":4}']  # null as no output
    assert events == [("items_completed", "shape", {"ranges": [[0, 4]]}),
                      ("node_completed", "shape", {"fanout": True})]  # its last item: the step is done
    assert outputs[NodeKey("shape", 2)] == {"n": 2} and outputs[NodeKey("shape", 1)] is None


def test_a_chunk_of_nulls_and_part_of_a_fan_out(store: SqlStore) -> None:
    columns, one_by_one = _both_ways(store, 8, ["null"] * 3)
    assert columns == one_by_one
    assert columns[4] == [NodeKey("shape", i) for i in range(3, 8)]  # the rest still out


@pytest.mark.parametrize("case", ["cancelled", "draining", "blob"])
def test_what_the_item_path_treats_apart_goes_back_to_it(store: SqlStore, case: str) -> None:
    texts = ["null"] * 4
    if case == "blob":
        texts[2] = '"' + "x" * 600_000 + '"'  # above the blob threshold: kept as a blob, not in a row

    def then(m: RunMachine) -> None:
        if case == "cancelled":  # cancelled while the round was absorbed: no longer in flight
            m.calls.inflight.pop(NodeKey("shape", 1))
        elif case == "draining":
            m.calls.draining.add(NodeKey("shape", 2))

    columns, one_by_one = _both_ways(store, 4, texts, then)
    assert columns == one_by_one
    m, _ = _issued(store, 4)
    then(m)
    assert m.calls.all_succeeded([NodeKey("shape", i) for i in range(4)], _outcomes(texts)) is None
    assert sorted(k.fan_index for k in m.calls.inflight if k.step == "shape") == \
        ([0, 2, 3] if case == "cancelled" else [0, 1, 2, 3])  # nothing taken before it said no


def test_a_worker_packs_columns_only_when_every_item_succeeded(store: SqlStore) -> None:
    _, block = _issued(store, 6)
    packer = wire.SpecPacker()
    good = wire.unpack_items(wire.run_packed(packer.pack_items(block, [0, 1, 2])))
    assert isinstance(good, AllSucceeded)
    assert list(good.texts) == ['{"n":0}', "null", '{"n":2}']
    assert all(s <= f for s, f in zip(good.started, good.finished, strict=True))
    mixed = wire.unpack_items(wire.run_packed(packer.pack_items(block, [2, 3, 4])))
    assert isinstance(mixed, list)
    assert [o.ok for o in mixed] == [True, False, True]
    assert mixed[1].error is not None and mixed[1].error["type"] == "ValueError"
    # the one-by-one reading of the columns is what the worker would have sent one by one
    assert [(o.ok, o.output_json) for o in wire.unpack_outcomes(wire.run_packed(packer.pack_items(block, [0, 1])))] \
        == [(True, '{"n":0}'), (True, "null")]
    assert isinstance(pickle.loads(wire.run_packed(packer.pack_items(block, [0]))), tuple)


def test_a_cancel_drops_its_item_from_the_columns(store: SqlStore) -> None:
    _, block = _issued(store, 4)
    done = _outcomes(["null", '{"n":2}', "null", "null"])
    block.cancelled.update({0, 3})
    kept = uncancelled(ItemsDone(block, [0, 1, 2, 3], done))
    assert kept is not None and kept.positions == [1, 2]
    assert isinstance(kept.outcomes, AllSucceeded)
    assert kept.outcomes.outcomes() == [done.outcomes()[1], done.outcomes()[2]]
    block.cancelled.update({1, 2})
    assert uncancelled(ItemsDone(block, [0, 1, 2, 3], done)) is None


def test_a_chunked_lane_sends_one_item_per_cpu_until_one_is_measured() -> None:
    lane = Lane(limit=8, chunked=True, probes=2)
    assert lane.room() == 2 and lane.chunk_size(0.01, 64) == 1
    lane.measured(_outcomes(["null"] * 2))
    assert lane.room() == 8 and lane.chunk_size(0.01, 64) == 10  # 1/1024 s an item: ~10 ms a chunk
    assert Lane(limit=4, chunked=False, probes=2).room() == 4  # the timed lane is not probed


odd = Workflow("execute_items_cases")


@odd.step
def cases(input: int) -> list[int]:
    return list(range(input))


@odd.map("cases")
def case(cases: int) -> Any:
    """One kind of outcome per item: every branch ``execute`` has, for ``execute_items`` to match."""
    kind = cases % 8
    if kind == 1:
        return None
    if kind == 2:
        raise ConnectionError("flaky")  # transient
    if kind == 3:
        raise raysaga.Permanent("no")
    if kind == 4:
        return {1, 2}  # not JSON
    if kind == 5:
        return "x" * 5000  # above the test's cap
    if kind == 6:
        raise SystemExit(3)  # on a worker: a permanent failure, never the worker's end
    if kind == 7:
        return Aside([cases], {"seen": cases})
    return {"n": cases}


def _calls_of(block: ItemBlock) -> Any:
    def call(index: int, attempt: int, kwargs: dict[str, Any]) -> NodeCall:
        return NodeCall(fields=(block.run_id, block.spec.name, index, attempt, block.trace_id, None, False),
                        kwargs=kwargs, max_output_bytes=1000)
    return call


def _strip(error: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if error is None else {k: v for k, v in error.items() if k != "traceback"}


def _same_outcome(a: NodeOutcome, b: NodeOutcome) -> None:
    assert (a.ok, a.output_json, a.transient, a.aside) == (b.ok, b.output_json, b.transient, b.aside)
    assert _strip(a.error) == _strip(b.error)
    assert a.started_at <= a.finished_at


def test_execute_items_is_execute_for_each_item(store: SqlStore) -> None:
    record = raysaga.create_run(odd, 16, store=store)
    snap = store.snapshot(record.run_id)
    m = RunMachine(odd, snap.run, RunOptions(), random.Random(0))
    m.restore(snap, {}, {})
    m.advance(time.time())
    m.out.take_sends()
    now = time.time()
    m.absorb([(NodeKey("cases"), NodeOutcome(True, str(list(range(16))), None, False, now, now))], now)
    m.advance(time.time())
    [items] = [s for s in m.out.take_sends() if isinstance(s, ItemsDispatch)]
    block, call = items.block, _calls_of(items.block)
    rows = [(block.keys[p].fan_index, block.attempts[p], block.kwargs[p]) for p in range(len(block))]
    got = execute_items(block.spec, rows, 1000, call)
    assert isinstance(got, list)  # some failed: one outcome each
    want = [execute(block.spec, call(*row), on_worker=True) for row in rows]
    for a, b in zip(got, want, strict=True):
        _same_outcome(a, b)
    assert [o.ok for o in got[:8]] == [True, True, False, False, False, False, False, True]
    assert got[5].error is not None and "above the cap of 1000" in got[5].error["message"]
    assert got[6].error is not None and "SystemExit(3)" in got[6].error["message"]
    # the items that simply succeeded, alone, come back as columns with the same outputs
    plain = [row for row in rows if row[0] % 8 in (0, 1)]
    columns = execute_items(block.spec, plain, 1000, call)
    assert isinstance(columns, AllSucceeded)
    assert list(columns.texts) == [execute(block.spec, call(*row), on_worker=True).output_json for row in plain]

"""Review of stop 31's fan-out columns (``task.execute_items``, ``wire.run_packed``/``unpack_items``,
``Calls.all_succeeded``, ``item_events.add_items``), attacked end to end on the session's local Ray
cluster with real SQLite files: whatever comes back as columns or falls back to the item path,
the store must hold what the inline executor (one item at a time, no columns) writes for the same
run. The inline run is the oracle; the columns path is counted so a test proves it was taken.
"""

from __future__ import annotations

import os
import random
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import BEST_EFFORT, Permanent, RetryPolicy, RunOptions, RunStatus, StepContext, Workflow
from raysaga.node_key import NodeKey
from raysaga.orchestrator.executor import RayExecutor
from raysaga.orchestrator.machine.calls import Calls
from raysaga.orchestrator.machine.outbox import Dispatch, ItemsDispatch
from raysaga.orchestrator.machine.run import RunMachine
from raysaga.orchestrator.task import AllSucceeded, NodeOutcome
from raysaga.state import SqlStore, item_events
from raysaga.state.item_events import add_item, add_items

cloudpickle = pytest.importorskip("ray.cloudpickle")

#: A run's options: small caps so a test's outputs cross them cheaply.
CAPS = RunOptions(blob_threshold=4096, max_output_bytes=40_000)
#: A key's shape ``redact`` masks (sk-ant-...): it must never reach the store in an error.
FAKE_KEY = "sk-ant-" + "Q" * 30

wf = Workflow("review_stop32_items")


@wf.step
def plan(input: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"n": n, "kind": kind, "dir": input["dir"]} for n, kind in enumerate(input["kinds"])]


def _first_time(where: str, n: int) -> bool:
    """True the first time item ``n`` asks, in any process (an O_EXCL marker file)."""
    try:
        os.close(os.open(os.path.join(where, f"flaky-{n}"), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def _behave(plan: dict[str, Any]) -> Any:
    n, kind = plan["n"], plan["kind"]
    if kind == "flaky" and _first_time(plan["dir"], n):
        raise ConnectionError(f"item {n}: flaky the first time")  # transient: retried, same key
    if kind == "big":
        return {"n": n, "pad": "b" * 6000}  # above the blob threshold: a blob, by digest
    if kind == "huge":
        return "h" * 50_000  # above max_output_bytes: a permanent failure
    if kind == "set":
        return {n}  # not JSON: a permanent failure
    if kind == "null":
        return None
    if kind == "secret":
        raise Permanent(f"item {n} refused with key {FAKE_KEY}")
    if kind == "float":
        return n / 3  # a float's shortest text
    return {"n": n}


@wf.map("plan", retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01), policy=BEST_EFFORT)
def work(plan: dict[str, Any]) -> Any:
    return _behave(plan)


ctxwf = Workflow("review_stop32_ctx_items")


@ctxwf.step
def plan2(input: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"n": n, "kind": kind, "dir": input["dir"]} for n, kind in enumerate(input["kinds"])]


@ctxwf.map("plan2", retry=RetryPolicy(max_attempts=3, base=0.01, cap=0.01), policy=BEST_EFFORT)
def ctxwork(plan2: dict[str, Any], ctx: StepContext) -> Any:
    value = _behave(plan2)
    return {"v": value, "index": ctx.fan_index, "attempt": ctx.attempt, "node": ctx.node_id}


plain = Workflow("review_stop32_plain")


@plain.step
def items(input: list[int]) -> list[int]:
    return input


@plain.map("items")
def square(items: int) -> int:
    return items * items


@plain.step
def gather(square: list[int]) -> list[int]:
    return square


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


@pytest.fixture
def columns_taken(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each ``Calls.all_succeeded`` call in this process: True when the columns were written."""
    seen: list[bool] = []
    original = Calls.all_succeeded

    def counting(self: Calls, keys: list[NodeKey], done: AllSucceeded) -> list[Any] | None:
        out = original(self, keys, done)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(Calls, "all_succeeded", counting)
    return seen


@pytest.fixture
def ray_ex(ray_session: str) -> Iterator[RayExecutor]:
    ex = RayExecutor(address=ray_session)
    yield ex


def _rows(store: SqlStore, run_id: str, step: str) -> list[tuple[Any, ...]]:
    """Each item of ``step``: (index, status, attempt, output, blob's value, error type, error message)."""
    out = []
    for n in sorted((n for n in store.nodes(run_id) if n.node_id == step and n.fan_index >= 0),
                    key=lambda n: n.fan_index):
        blob = store.load_blobs({n.output_digest: "test"})[n.output_digest] if n.output_digest else None
        error = None if n.error is None else (n.error.as_dict().get("type"), n.error.as_dict().get("message")
                                              or n.error.as_dict().get("reason"))
        out.append((n.fan_index, n.status.value, n.attempt, n.output, blob, error))
    return out


def _completed_indexes(store: SqlStore, run_id: str, step: str) -> list[int]:
    return [i for e in store.events(run_id) if e.kind == item_events.KIND and e.node_id == step
            for i in item_events.item_indexes(e.data)]


def _kinds() -> list[str]:
    """300 items, the odd ones in the middle of where 64-item chunks land once the lane is measured."""
    kinds = ["ok"] * 300
    for n, kind in {100: "flaky", 101: "null", 102: "flaky", 150: "big", 151: "huge", 152: "set", 153: "ok",
                    200: "secret", 201: "float", 250: "null", 299: "flaky"}.items():
        kinds[n] = kind
    return kinds


@pytest.mark.parametrize("flow, step", [(wf, "work"), (ctxwf, "ctxwork")], ids=["plain", "ctx"])
def test_a_chunk_with_odd_items_writes_what_inline_writes(tmp_path: Path, ray_ex: RayExecutor,
                                                          columns_taken: list[bool], flow: Workflow,
                                                          step: str) -> None:
    kinds = _kinds()
    written = {}
    for kind in ("inline", "ray"):
        where = tmp_path / kind
        where.mkdir()
        store = SqlStore(f"sqlite:///{where / 'r.db'}")
        try:
            record = raysaga.run(flow, {"kinds": kinds, "dir": str(where)}, store=store,
                                 executor="inline" if kind == "inline" else ray_ex, options=CAPS)
            assert record.status == RunStatus.COMPLETED, record.status_reason
            written[kind] = _rows(store, record.run_id, step)
            done = _completed_indexes(store, record.run_id, step)
            # every completed plain item is named once by the items_completed ranges (the ctx step's
            # items and the blob one by node_completed events instead)
            assert len(done) == len(set(done))
            events = store.events(record.run_id)
            assert FAKE_KEY not in repr([e.data for e in events])
            assert FAKE_KEY not in repr([n.error for n in store.nodes(record.run_id)])
        finally:
            store.close()
    assert written["ray"] == written["inline"]
    rows = {row[0]: row for row in written["ray"]}
    assert [rows[n][2] for n in (100, 102, 299)] == [2, 2, 2]  # retried, same item, attempt 2
    assert rows[150][4] is not None and rows[150][3] is None  # kept as a blob
    assert rows[151][1] == "failed" and rows[152][1] == "failed" and rows[200][1] == "failed"
    assert rows[153][1] == "completed" and rows[201][1] == "completed"
    assert rows[200][5] is not None and "[redacted]" in rows[200][5][1]
    if step == "work":
        assert any(columns_taken), "no chunk came back as columns: the attack missed the path"


@pytest.mark.parametrize("values", [[], [7], [3, 3, 3], [2] * 200], ids=["none", "one", "dupes", "many_dupes"])
def test_zero_one_and_duplicate_items(tmp_path: Path, ray_ex: RayExecutor, values: list[int]) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        record = raysaga.run(plain, values, store=store, executor=ray_ex)
        assert record.status == RunStatus.COMPLETED
        assert record.output == {"gather": [v * v for v in values]}
        rows = _rows(store, record.run_id, "square")
        assert [(r[0], r[1], r[2], r[3]) for r in rows] == [(i, "completed", 1, v * v) for i, v in enumerate(values)]
        assert sorted(_completed_indexes(store, record.run_id, "square")) == list(range(len(values)))
    finally:
        store.close()


ff = Workflow("review_stop32_fail_fast")


@ff.step
def fplan(input: int) -> list[int]:
    return list(range(input))


@ff.map("fplan", retry=RetryPolicy(max_attempts=1))
def fwork(fplan: int) -> int:
    if fplan == 150:
        raise Permanent("150 refuses")
    return fplan


def test_fail_fast_mid_flight_records_each_item_once(tmp_path: Path, ray_ex: RayExecutor) -> None:
    """A failure in the middle of a wide fan-out (policy ALL) fails the step; chunks that come back
    after it are dropped or recorded, each item at most once, and never a completed row for 150."""
    store = SqlStore(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        record = raysaga.run(ff, 400, store=store, executor=ray_ex)
        assert record.status == RunStatus.FAILED
        rows = _rows(store, record.run_id, "fwork")
        assert len({r[0] for r in rows}) == len(rows)
        by_index = {r[0]: r for r in rows}
        assert by_index[150][1] == "failed"
        assert all(r[3] == r[0] for r in rows if r[1] == "completed")
        done = _completed_indexes(store, record.run_id, "fwork")
        assert len(done) == len(set(done)) and 150 not in done
        assert set(done) == {r[0] for r in rows if r[1] == "completed"}
    finally:
        store.close()


# ------------------------------------------------------------ the machine, without Ray


def _issued(store: SqlStore, n: int) -> tuple[RunMachine, list[NodeKey], str]:
    record = raysaga.create_run(plain, list(range(n)), store=store)
    snap = store.snapshot(record.run_id)
    m = RunMachine(plain, snap.run, RunOptions(), random.Random(0))
    m.restore(snap, {}, {})
    m.advance(time.time())
    [sent] = m.out.take_sends()
    assert isinstance(sent, Dispatch)
    now = time.time()
    m.absorb([(NodeKey("items"), NodeOutcome(True, str(list(range(n))), None, False, now, now))], now)
    m.out.take_batch()
    m.advance(time.time())
    [block] = [s for s in m.out.take_sends() if isinstance(s, ItemsDispatch)]
    m.out.take_batch()
    return m, block.block.keys, record.run_id


@pytest.mark.parametrize("base", [1_790_000_000.0, 999_999_999.0, 0.0], ids=["tick_grid", "before_2004", "zero"])
def test_columns_with_times_off_the_tick_grid_read_back_exactly(store: SqlStore, base: float) -> None:
    """A worker's times go into the rows as they came, through the columns path and a real commit:
    whole ticks (any epoch time from 2004 to 2038) in a chunk, others (a clock before 2004, or
    one that said 0) in rows of their own; all read back to the bit (SQLite and PostgreSQL)."""
    m, keys, run_id = _issued(store, 6)
    started = [base + 1 / 3, base + 0.1, base + 2.0, base + 2.5, base + 1e-7, base + 7 / 11]
    finished = [s + 0.3 for s in started]
    if base < 2.0**30:
        assert not all((t * 4194304.0).is_integer() for t in started + finished)  # off the grid indeed
    done = AllSucceeded([str(i * i) for i in range(6)], started, finished)
    m.absorb_items(keys, done, time.time())
    batch = m.out.take_batch()
    assert len(batch.items) == 6
    lease = store.claim(run_id, "review", 30.0)
    store.commit(lease, batch)
    nodes = {n.fan_index: n for n in store.nodes(run_id) if n.node_id == "square"}
    assert [(nodes[i].started_at, nodes[i].finished_at, nodes[i].output) for i in range(6)] == \
        [(started[i], finished[i], i * i) for i in range(6)]


@pytest.mark.parametrize("indexes", [[5, 6, 7], [5, 7, 6], [3], [9, 10, 12, 13], [0, 2, 1, 3], [4, 4, 5]])
def test_add_items_is_add_item_for_each(indexes: list[int]) -> None:
    for before in ([], [[0, 3]], [[0, 4]], [[10, 11]], [[2, 2], [8, 8]]):
        one, many = [list(r) for r in before], [list(r) for r in before]
        for i in indexes:
            add_item(one, i)
        add_items(many, indexes)
        assert many == one


#: A secret only the driver's process knows (registered there, as a ``Secret`` input's value is):
#: a Ray worker's own scrub cannot mask it, so the store's write boundary must.
DRIVER_SECRET = "rv32-driver-only-" + "w" * 12

leaky = Workflow("review_stop32_leaky_items")


@leaky.step
def lplan(input: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"n": n, "dir": input["dir"], "secret": input["secret"]} for n in range(input["count"])]


@leaky.map("lplan", retry=RetryPolicy(max_attempts=2, base=0.01, cap=0.01), policy=BEST_EFFORT)
def lwork(lplan: dict[str, Any]) -> int:
    n = int(lplan["n"])
    if n == 120:
        raise Permanent(f"refused: {lplan['secret']}")
    if n == 121 and _first_time(lplan["dir"], n):
        raise ConnectionError(f"flaky with {lplan['secret']}")
    return n


def _leaky_run(tmp_path: Path, ray_ex: RayExecutor) -> tuple[SqlStore, str]:
    from raysaga.state.redact import register_secret

    register_secret(DRIVER_SECRET)
    store = SqlStore(f"sqlite:///{tmp_path / 'r.db'}")
    # (the secret reaches the steps through the plan's output, as any value a step computes)
    record = raysaga.run(leaky, {"count": 300, "dir": str(tmp_path), "secret": DRIVER_SECRET}, store=store,
                         executor=ray_ex)
    assert record.status == RunStatus.COMPLETED
    return store, record.run_id


def test_a_driver_registered_secret_in_a_chunk_s_failure_is_scrubbed_from_rows_and_events(
        tmp_path: Path, ray_ex: RayExecutor) -> None:
    store, run_id = _leaky_run(tmp_path, ray_ex)
    try:
        rows = {r[0]: r for r in _rows(store, run_id, "lwork")}
        assert rows[120][1] == "failed" and rows[121][2] == 2
        errors = repr([r[5] for r in rows.values()]) + repr([e.data for e in store.events(run_id)])
        assert DRIVER_SECRET not in errors and "[redacted]" in errors
    finally:
        store.close()


def test_a_driver_registered_secret_in_a_failure_stays_out_of_the_fan_out_result(
        tmp_path: Path, ray_ex: RayExecutor) -> None:
    """A partial fan-out's result (its step's row, the run's output, what its dependents get)
    lists its failed items' messages: a failure's message, scrubbed wherever else it is stored."""
    store, run_id = _leaky_run(tmp_path, ray_ex)
    try:
        [parent] = [n for n in store.nodes(run_id) if n.node_id == "lwork" and n.fan_index < 0]
        messages = [f["message"] for f in parent.output["failures"]]
        assert len(messages) == 1 and "refused" in messages[0]
        assert DRIVER_SECRET not in repr(parent.output), parent.output["failures"]
        assert DRIVER_SECRET not in repr(store.get_run(run_id).output)
    finally:
        store.close()


#: For ``tests.support.crash_driver --flows tests.orchestrator.test_review_stop32_items``: a driver process to kill.
FLOWS = {"items": wf}


def test_a_driver_killed_after_a_chunk_s_commit_resumes_to_the_uninterrupted_rows(
        tmp_path: Path, ray_address: str, ray_ex: RayExecutor) -> None:
    """SIGKILL of a Ray driver right after the commit holding item 180 (columns, group commits,
    a flaky item retried, failures mid-chunk), then a resume on Ray: every item ends as in an
    uninterrupted inline run, and no item is named completed twice."""
    from tests.support import crash_driver as harness

    kinds = ["ok"] * 300
    for n, kind in {100: "flaky", 101: "null", 152: "set", 200: "secret", 201: "float", 250: "flaky"}.items():
        kinds[n] = kind
    golden_dir, killed_dir = tmp_path / "golden", tmp_path / "killed"
    golden_dir.mkdir()
    killed_dir.mkdir()
    golden_store = SqlStore(f"sqlite:///{golden_dir / 'r.db'}")
    try:
        golden = raysaga.run(wf, {"kinds": kinds, "dir": str(golden_dir)}, store=golden_store, executor="inline")
        want = [(r[0], r[1], r[3], r[5]) for r in _rows(golden_store, golden.run_id, "work")]
    finally:
        golden_store.close()
    url = f"sqlite:///{killed_dir / 'r.db'}"
    killed = harness.run_driver("items", url, "rv-killed", executor="ray", run_input={"kinds": kinds,
                                "dir": str(killed_dir)}, faults="after_commit:work[180]",
                                flows="tests.orchestrator.test_review_stop32_items", timeout=300)
    assert killed.returncode == -9, killed.describe()
    store = SqlStore(url)
    try:
        before = {n.fan_index for n in store.nodes("rv-killed")
                  if n.node_id == "work" and n.status.value == "completed"}
        assert 180 in before and len(before) < 300  # killed mid fan-out, after 180's commit
        done = raysaga.resume(wf, "rv-killed", store=store, executor=ray_ex)
        assert done.status == RunStatus.COMPLETED, done.status_reason
        got = [(r[0], r[1], r[3], r[5]) for r in _rows(store, "rv-killed", "work")]
        assert got == want
        named = _completed_indexes(store, "rv-killed", "work")
        assert len(named) == len(set(named))
    finally:
        store.close()

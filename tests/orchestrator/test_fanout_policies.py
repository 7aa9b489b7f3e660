"""Fan-out partial-failure policies: every policy on a fan-out of 20 items where k fail for good.

``ALL`` (the default) fails the step on the first item failure; every other policy collects
the failures, decides once all items settled, records the decision (a ``fanout_decision``
event) and obeys it: continue hands dependents a ``FanOutResult``, retry_failed dispatches
the failed items again, fail fails the step, compensate rolls the run back.

Most runs use the inline executor (steps run in this process, so module-level lists see what
the steps, compensations and dependents received); one runs on the session's Ray cluster to
see in-flight siblings cancelled; the crash tests SIGKILL a real driver process mid fan-out
(``RAYSAGA_FAULTS``) and resume it. ``store_url`` tests also run on PostgreSQL when configured.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from collections.abc import Set
from functools import partial
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import (
    ALL,
    BEST_EFFORT,
    Compensate,
    Continue,
    Fail,
    FanOutResult,
    Permanent,
    RetryFailed,
    RunStatus,
    StepContext,
    Workflow,
    min_success_ratio,
    on_partial_failure,
    quorum,
)
from raysaga.sagas import Decision, FanOutPolicy
from raysaga.state import EventRecord, NodeRecord, NodeStatus, SqlStore
from tests.support import crash_driver as harness  # its wait_until and process_gone
from tests.support.files import import_file

N = 20

CALLS: list[tuple[int, int, str | None]] = []  # (item index, attempt, idempotency key) per item call
UNDONE: list[tuple[str, int, str | None]] = []  # (step, index, idempotency key) per compensation
RECEIVED: list[Any] = []  # what the dependent 'gather' received
SEEN: list[FanOutResult] = []  # what an on_partial_failure function was shown


@pytest.fixture(autouse=True)
def _fresh_logs() -> None:
    for log in (CALLS, UNDONE, RECEIVED, SEEN):
        log.clear()


def _flow(name: str, *, policy: FanOutPolicy | None = None, failing: Set[int] = frozenset(),
          first_round_only: Set[int] = frozenset(), critical: bool = True, compensate: bool = False,
          via_step: bool = False) -> Workflow:
    """plan → item (20 effect items, ``failing`` raise Permanent) → gather; plus an independent 'side'."""
    wf = Workflow(name)

    def undo_plan(ctx: StepContext, output: list[int]) -> None:
        UNDONE.append(("plan", -1, ctx.idempotency_key))

    @wf.step(effect=compensate, compensate=undo_plan if compensate else None)
    def plan(input: int) -> list[int]:
        return list(range(input))

    def undo_item(ctx: StepContext, plan: int, output: dict[str, int]) -> None:
        assert output == {"i": plan, "sq": plan * plan}  # the compensation sees what its item produced
        UNDONE.append(("item", plan, ctx.idempotency_key))

    def item(ctx: StepContext, plan: int) -> dict[str, int]:
        CALLS.append((plan, ctx.attempt, ctx.idempotency_key))
        if plan in failing:
            raise Permanent(f"item {plan} refused")
        if plan in first_round_only and sum(c[0] == plan for c in CALLS) == 1:
            raise Permanent(f"item {plan} refused")
        return {"i": plan, "sq": plan * plan}

    options: dict[str, Any] = {"policy": policy, "critical": critical, "effect": True,
                               "compensate": undo_item if compensate else None}
    if via_step:
        wf.step(map_over="plan", **options)(item)
    else:
        wf.map("plan", **options)(item)

    if policy is None or policy is ALL:
        @wf.step()
        def gather(item: list[dict[str, int]]) -> dict[str, Any]:
            RECEIVED.append(item)
            return {"n": len(item)}
    else:
        @wf.step(name="gather")
        def gather_result(item: FanOutResult) -> dict[str, Any]:
            RECEIVED.append(item)
            return {"ok": [s.index for s in item.successes], "failed": [f.index for f in item.failures],
                    "round": item.round}

    @wf.step()
    def side(plan: list[int]) -> int:
        return len(plan)

    return wf


def _run(wf: Workflow, url: str) -> raysaga.RunRecord:
    return raysaga.run(wf, N, store=url, executor="inline")


def _facts(url: str, run_id: str) -> tuple[dict[str, NodeRecord], list[EventRecord]]:
    store = SqlStore(url)
    try:
        return {n.label: n for n in store.nodes(run_id)}, store.events(run_id)
    finally:
        store.close()


def _decisions(events: list[EventRecord]) -> list[dict[str, Any]]:
    return [e.data for e in events if e.kind == "fanout_decision"]


def _ok(failing: set[int]) -> list[int]:
    return [i for i in range(N) if i not in failing]


def _check_items(nodes: dict[str, NodeRecord], failing: set[int]) -> None:
    for i in range(N):
        node = nodes[f"item[{i}]"]
        if i in failing:
            assert node.status == NodeStatus.FAILED, node
            assert node.error is not None
            assert (node.error["type"], node.error["message"]) == ("Permanent", f"item {i} refused")
        else:
            assert (node.status, node.output) == (NodeStatus.COMPLETED, {"i": i, "sq": i * i}), node


def _check_result(result: Any, failing: set[int], *, round: int = 1) -> None:
    """A FanOutResult: successes (index + output) in index order, failures annotated."""
    assert isinstance(result, FanOutResult)
    assert (result.total, result.round) == (N, round)
    assert [(s.index, s.output) for s in result.successes] == [(i, {"i": i, "sq": i * i}) for i in _ok(failing)]
    assert [(f.index, f.error_type, f.message, f.attempts) for f in result.failures] == [
        (i, "Permanent", f"item {i} refused", 1) for i in sorted(failing)]


def _check_decision(data: dict[str, Any], verdict: str, *, failing: set[int], kind: str, round: int = 1,
                    reason: str | None = None) -> None:
    assert data["verdict"] == verdict, data
    assert data["round"] == round
    assert data["successes"] == N - len(failing)
    assert data["failures"] == sorted(failing)
    assert data["policy"]["kind"] == kind
    if reason is not None:
        assert data["reason"] == reason


def _check_continued(record: raysaga.RunRecord, nodes: dict[str, NodeRecord], failing: set[int],
                     round: int = 1) -> None:
    """The step completed with its successes; the dependent got the FanOutResult."""
    assert record.status == RunStatus.COMPLETED, record.status_reason
    [got] = RECEIVED
    _check_result(got, failing, round=round)
    assert record.output == {"gather": {"ok": _ok(failing), "failed": sorted(failing), "round": round},
                             "side": N}
    parent = nodes["item"]
    assert (parent.status, parent.attempt) == (NodeStatus.COMPLETED, round)
    assert parent.output == got.model_dump(mode="json")  # durable: a resume hands dependents the same
    assert nodes["gather"].status == NodeStatus.COMPLETED


def _check_step_failed(record: raysaga.RunRecord, nodes: dict[str, NodeRecord], reason: str,
                       verdict: str = "fail") -> None:
    """The policy failed the critical step: the run failed, the dependent never ran."""
    assert record.status == RunStatus.FAILED, record.status_reason
    assert record.status_reason == f"critical step 'item' failed: {reason}"
    assert record.error is not None
    assert record.error["node"] == "item"
    parent = nodes["item"]
    assert parent.status == NodeStatus.FAILED
    assert parent.error == {"type": "FanOutPolicy", "message": reason, "verdict": verdict}
    assert RECEIVED == [] and "gather" not in nodes


# ---------------------------------------------------------------------------- ALL


@pytest.mark.parametrize("compensate", [False, True], ids=["plain", "compensable"])
def test_all_one_failed_item_fails_the_critical_step(store_url: str, compensate: bool) -> None:
    wf = _flow("all-one", failing={7}, compensate=compensate)
    record = _run(wf, store_url)
    nodes, events = _facts(store_url, record.run_id)

    assert record.error is not None
    assert record.error["node"] == "item[7]" and record.error["message"] == "item 7 refused"
    assert (record.status_reason or "").startswith("critical step 'item[7]' failed: item 7 refused")
    _check_items(nodes, {7})  # inline: the siblings had already run
    assert nodes["item"].status == NodeStatus.FAILED
    assert RECEIVED == [] and "gather" not in nodes
    assert _decisions(events) == []  # ALL asks no policy
    if compensate:  # rolled back: every completed item, then the plan upstream of them
        assert record.status == RunStatus.COMPENSATED
        items = [index for step, index, _ in UNDONE if step == "item"]
        assert sorted(items) == _ok({7})
        assert [step for step, _, _ in UNDONE] == ["item"] * (N - 1) + ["plan"]
    else:
        assert record.status == RunStatus.FAILED
        assert UNDONE == []


@pytest.fixture
def _pickle_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


BLOCK_LIMIT = 60.0


@pytest.mark.ray
@pytest.mark.usefixtures("_pickle_by_value")
def test_all_failed_item_on_ray_cancels_the_in_flight_siblings(ray_session: str, sqlite_url: str,
                                                               tmp_path: Path) -> None:
    wf = Workflow("all-ray")

    @wf.step()
    def plan(input: dict[str, str]) -> list[int]:
        return list(range(N))

    @wf.map("plan")
    def item(input: dict[str, str], plan: int) -> int:
        folder = Path(input["dir"])
        if plan == 0:  # fails once a sibling is surely running on another worker
            deadline = time.monotonic() + BLOCK_LIMIT / 4
            while not (running := sorted(folder.glob("started-*"))) and time.monotonic() < deadline:
                time.sleep(0.02)
            (folder / "running-at-failure").write_text(" ".join(p.read_text() for p in running))
            raise Permanent("item 0 refused")
        pid_file = (folder / f"started-{plan}")  # written whole, then renamed: a reader never sees it empty
        pid_file.with_name(f".{pid_file.name}").write_text(str(os.getpid()))
        os.replace(pid_file.with_name(f".{pid_file.name}"), pid_file)
        deadline = time.monotonic() + BLOCK_LIMIT
        while not (folder / "gate").exists():  # the workload: blocks until the gate opens
            if time.monotonic() > deadline:
                raise Permanent("the gate never opened")
            time.sleep(0.02)
        return plan

    @wf.step()
    def gather(item: list[int]) -> int:
        return len(item)

    began = time.monotonic()
    try:
        record = raysaga.run(wf, {"dir": str(tmp_path)}, store=sqlite_url, executor="ray", address=ray_session)
        took = time.monotonic() - began
        assert record.status == RunStatus.FAILED, record.status_reason
        assert record.error is not None
        assert record.error["node"] == "item[0]"
        assert took < BLOCK_LIMIT / 2  # it did not wait for the blocked siblings
        nodes, _ = _facts(sqlite_url, record.run_id)
        assert nodes["item[0]"].status == NodeStatus.FAILED
        assert nodes["item"].status == NodeStatus.FAILED
        assert {nodes[f"item[{i}]"].status for i in range(1, N)} == {NodeStatus.CANCELLED}
        assert "gather" not in nodes
        # Every sibling that started on a Ray worker was stopped there (force-cancel ends the
        # worker), including one Ray started in the instant of the cancel: Ray 2.60 can lose a
        # force-cancel that races the task's dispatch, and the driver cancels again until each
        # task is seen to end, before it records the run failed. A lost cancel left that worker
        # blocked on the gate, which opens only once this check is done.
        running = [int(pid) for pid in (tmp_path / "running-at-failure").read_text().split()]
        assert running, "no sibling was running when item 0 failed: the test saw no in-flight item"
        started = {int(p.read_text()) for p in tmp_path.glob("started-*")}
        assert set(running) <= started
        for pid in started:
            harness.wait_until(partial(harness.process_gone, pid), timeout=30.0,
                               what=f"the Ray worker {pid} of a cancelled item to exit")
    finally:
        (tmp_path / "gate").write_text("open")  # lets any straggler finish: the cluster is shared


# ---------------------------------------------------------------------------- quorum, ratio, best effort

FOUR = {3, 8, 11, 19}
FIVE = {0, 3, 8, 11, 19}


@pytest.mark.parametrize(("failing", "met"), [(FOUR, True), (FIVE, False)], ids=["met", "not-met"])
def test_quorum(sqlite_url: str, failing: set[int], met: bool) -> None:
    wf = _flow("quorum", policy=quorum(16), failing=failing)
    record = _run(wf, sqlite_url)
    nodes, events = _facts(sqlite_url, record.run_id)
    _check_items(nodes, failing)
    [decision] = _decisions(events)
    assert decision["policy"]["quorum"] == 16
    n_ok = N - len(failing)
    if met:
        reason = f"quorum met: {n_ok} of 20 succeeded, 16 needed"
        _check_decision(decision, "continue", failing=failing, kind="quorum", reason=reason)
        _check_continued(record, nodes, failing)
    else:
        reason = f"quorum not met: {n_ok} of 20 succeeded, 16 needed"
        _check_decision(decision, "fail", failing=failing, kind="quorum", reason=reason)
        _check_step_failed(record, nodes, reason)
    assert len(CALLS) == N  # every item ran once: a permanent failure is not retried


def test_quorum_not_met_rolls_back_the_successful_items(store_url: str) -> None:
    wf = _flow("quorum-undo", policy=quorum(16), failing=FIVE, compensate=True)
    record = _run(wf, store_url)
    nodes, events = _facts(store_url, record.run_id)
    assert record.status == RunStatus.COMPENSATED, record.status_reason
    assert "quorum not met: 15 of 20 succeeded, 16 needed" in (record.status_reason or "")
    [decision] = _decisions(events)
    _check_decision(decision, "fail", failing=FIVE, kind="quorum")
    # each successful item compensated exactly once, with its own key + ':compensate'; the plan last
    item_keys = {index: key for index, _, key in CALLS}
    undone = [(index, key) for step, index, key in UNDONE if step == "item"]
    assert Counter(index for index, _ in undone) == Counter(_ok(FIVE))
    assert all(key == f"{item_keys[index]}:compensate" for index, key in undone)
    assert [step for step, _, _ in UNDONE] == ["item"] * 15 + ["plan"]
    for i in range(N):
        comp = nodes.get(f"item:compensate[{i}]")
        if i in FIVE:
            assert comp is None  # a failed item took no effect: nothing to undo
        else:
            assert comp is not None and comp.status == NodeStatus.COMPLETED
    started = [e.data for e in events if e.kind == "rollback_started"]
    assert started == [{"reason": "critical step 'item' failed: quorum not met: 15 of 20 succeeded, 16 needed",
                        "targets": 16}]
    assert RECEIVED == []


@pytest.mark.parametrize(("failing", "met"), [(FOUR, True), (FIVE, False)], ids=["met", "not-met"])
def test_min_success_ratio(sqlite_url: str, failing: set[int], met: bool) -> None:
    # 16/20 = 0.80 meets 0.8 exactly; 15/20 = 0.75 does not
    wf = _flow("ratio", policy=min_success_ratio(0.8), failing=failing, via_step=True)
    record = _run(wf, sqlite_url)
    nodes, events = _facts(sqlite_url, record.run_id)
    _check_items(nodes, failing)
    [decision] = _decisions(events)
    assert decision["policy"]["min_ratio"] == 0.8
    if met:
        _check_decision(decision, "continue", failing=failing, kind="ratio")
        assert "ratio 0.80 >= 0.8" in decision["reason"]
        _check_continued(record, nodes, failing)
    else:
        _check_decision(decision, "fail", failing=failing, kind="ratio")
        assert "ratio 0.75 < 0.8" in decision["reason"]
        _check_step_failed(record, nodes, decision["reason"])


def test_best_effort_goes_on_with_a_single_success(sqlite_url: str) -> None:
    failing = set(range(N)) - {12}
    wf = _flow("best-effort", policy=BEST_EFFORT, failing=failing)
    record = _run(wf, sqlite_url)
    nodes, events = _facts(sqlite_url, record.run_id)
    _check_items(nodes, failing)
    [decision] = _decisions(events)
    _check_decision(decision, "continue", failing=failing, kind="best_effort",
                    reason="1 of 20 items succeeded (best effort)")
    _check_continued(record, nodes, failing)


def test_a_partial_fan_out_without_failures_still_decides(sqlite_url: str) -> None:
    """No item failed: the policy is still asked, and dependents still get a FanOutResult."""
    wf = _flow("no-failures", policy=quorum(20))
    record = _run(wf, sqlite_url)
    nodes, events = _facts(sqlite_url, record.run_id)
    [decision] = _decisions(events)
    _check_decision(decision, "continue", failing=set(), kind="quorum")
    _check_continued(record, nodes, set())


# ---------------------------------------------------------------------------- on_partial_failure


def _shown(reason: str, verdict: Any) -> Any:
    def decide(result: FanOutResult) -> Decision:
        SEEN.append(result)
        return verdict(reason)  # type: ignore[no-any-return]

    return decide


@pytest.mark.parametrize("verdict", ["continue", "fail", "compensate"])
def test_on_partial_failure_verdicts(sqlite_url: str, verdict: str) -> None:
    failing = {2, 5}
    make = {"continue": Continue, "fail": Fail, "compensate": Compensate}[verdict]
    reason = f"the function says {verdict}"
    # 'compensate' rolls back even a non-critical step; the other verdicts run on a critical one
    wf = _flow(f"decide-{verdict}", policy=on_partial_failure(_shown(reason, make)), failing=failing,
               critical=verdict != "compensate", compensate=verdict == "compensate")
    record = _run(wf, sqlite_url)
    nodes, events = _facts(sqlite_url, record.run_id)
    _check_items(nodes, failing)
    [shown] = SEEN  # asked once, after every item settled
    _check_result(shown, failing)
    [decision] = _decisions(events)
    _check_decision(decision, verdict, failing=failing, kind="decide", reason=reason)
    assert decision["policy"]["decide"].endswith("decide")
    if verdict == "continue":
        _check_continued(record, nodes, failing)
        assert RECEIVED[0] == shown
    elif verdict == "fail":
        _check_step_failed(record, nodes, reason)
    else:
        assert record.status == RunStatus.COMPENSATED, record.status_reason
        assert reason in (record.status_reason or "")
        assert nodes["item"].error is not None
        assert nodes["item"].status == NodeStatus.FAILED and nodes["item"].error["verdict"] == "compensate"
        assert sorted(index for step, index, _ in UNDONE if step == "item") == _ok(failing)
        assert UNDONE[-1][0] == "plan"
        assert RECEIVED == [] and "gather" not in nodes


def test_on_partial_failure_that_raises_fails_the_step_naming_the_exception(sqlite_url: str) -> None:
    def decide(result: FanOutResult) -> Decision:
        raise LookupError("no rule for 2 failures")

    wf = _flow("decide-raises", policy=on_partial_failure(decide), failing={2, 5})
    record = _run(wf, sqlite_url)
    nodes, events = _facts(sqlite_url, record.run_id)
    reason = "on_partial_failure raised LookupError: no rule for 2 failures"
    [decision] = _decisions(events)
    _check_decision(decision, "fail", failing={2, 5}, kind="decide", reason=reason)
    _check_step_failed(record, nodes, reason)


@pytest.mark.parametrize("persistent", [False, True], ids=["fail-once", "fail-always"])
def test_retry_failed_dispatches_the_failed_items_again(store_url: str, persistent: bool) -> None:
    def decide(result: FanOutResult) -> Decision:
        SEEN.append(result)
        if len(SEEN) > 5:  # keeps a broken round count from retrying forever
            return Fail("runaway retries")
        if result.failures and result.round < 3:
            return RetryFailed(f"round {result.round}: again")
        return Continue("settled")

    again = {4, 9}
    wf = _flow("retry-failed", policy=on_partial_failure(decide), failing=again if persistent else set(),
               first_round_only=set() if persistent else again)
    record = _run(wf, store_url)
    nodes, events = _facts(store_url, record.run_id)
    rounds = 3 if persistent else 2
    left = again if persistent else set()
    summary = [(d["verdict"], d["round"], d["failures"], d["successes"]) for d in _decisions(events)]
    expected = [("retry_failed", r, [4, 9], 18) for r in range(1, rounds)] + \
        [("continue", rounds, sorted(left), N - len(left))]
    assert summary == expected
    assert [s.round for s in SEEN] == list(range(1, rounds + 1))
    _check_continued(record, nodes, left, round=rounds)
    _check_items(nodes, left)
    # only the failed items ran again, each round as a first attempt, always with the same key
    calls = Counter(index for index, _, _ in CALLS)
    assert calls == Counter({i: rounds if i in again else 1 for i in range(N)})
    for i in again:
        assert {(attempt, key) for index, attempt, key in CALLS if index == i} == \
            {(1, CALLS[i][2])}  # the first call of item i is CALLS[i] (round 1 runs in index order)


# ---------------------------------------------------------------------------- crash and resume

CRASH_FLOW = '''
from pathlib import Path

from raysaga import (Continue, FanOutResult, Permanent, RetryFailed, RetryPolicy, StepContext, Transient,
                     Workflow, on_partial_failure, quorum)

N = 20
FAST = RetryPolicy(max_attempts=3, base=0.01, cap=0.02)


def _decide(result):
    if result.failures and result.round == 1:
        return RetryFailed("try the failed items again")
    return Continue(f"{len(result.successes)} succeeded in round {result.round}")


def _build(name, policy):
    wf = Workflow(name)

    @wf.step()
    def plan(input: dict) -> list[int]:
        return list(range(N))

    @wf.map("plan", policy=policy, retry=FAST, effect=True)
    def item(ctx: StepContext, input: dict, plan: int) -> dict:
        if plan in input["flaky"] and ctx.attempt == 1:
            raise Transient(f"item {plan} blipped")
        if plan in input["failing"]:
            raise Permanent(f"item {plan} refused")
        marker = Path(input["dir"]) / f"seen-{plan}"
        if plan in input["first_round_only"] and not marker.exists():
            marker.write_text("round 1")
            raise Permanent(f"item {plan} refused")
        return {"i": plan, "sq": plan * plan}

    @wf.step()
    def gather(item: FanOutResult) -> dict:
        return item.model_dump(mode="json")

    return wf


quorum_flow = _build("crash-quorum", quorum(15))
retry_flow = _build("crash-retry", on_partial_failure(_decide))
'''

CRASH_DRIVER = '''
import json
import sys

# the flow module was written next to this script, whose folder Python puts first on sys.path
import {module} as flows

import raysaga

raysaga.run(getattr(flows, sys.argv[2]), json.loads(sys.argv[5]), store=sys.argv[3], run_id=sys.argv[4],
            executor="inline", options=raysaga.RunOptions(lease_ttl=0.6))
print("NOT KILLED")
'''

CRASHES = {
    # items 10-19 blip once (retried after a short backoff), 3 and 12 fail for good: the first
    # commit naming item[3] holds items 0-9 and the retries of 10-19, no decision yet
    "quorum": ("quorum_flow", {"flaky": list(range(10, N)), "failing": [3, 12], "first_round_only": []}),
    # 3 and 7 fail in round 1 only: the first commit naming item[3] holds the RetryFailed decision
    "retry": ("retry_flow", {"flaky": [], "failing": [], "first_round_only": [3, 7]}),
}



def _rows(store: SqlStore, run_id: str) -> dict[str, tuple[Any, ...]]:
    return {n.label: (n.status, n.output, n.attempt) for n in store.nodes(run_id)}


@pytest.mark.parametrize("case", sorted(CRASHES))
def test_crash_mid_fan_out_then_resume_decides_like_an_uninterrupted_run(tmp_path: Path, case: str) -> None:
    flow_name, spec = CRASHES[case]
    module = f"fanout_crash_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(CRASH_FLOW)
    (tmp_path / "driver.py").write_text(textwrap.dedent(CRASH_DRIVER.format(module=module)))
    wf = getattr(import_file(tmp_path / f"{module}.py", module), flow_name)
    for name in ("clean", "crash"):
        (tmp_path / name).mkdir()

    clean_url, crash_url = f"sqlite:///{tmp_path / 'clean.db'}", f"sqlite:///{tmp_path / 'crash.db'}"
    clean = raysaga.run(wf, {**spec, "dir": str(tmp_path / "clean")}, store=clean_url, run_id="r",
                        executor="inline")
    assert clean.status == RunStatus.COMPLETED, clean.status_reason

    crash_input = json.dumps({**spec, "dir": str(tmp_path / "crash")})
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path), flow_name, crash_url, "r",
                           crash_input], env={**os.environ, "RAYSAGA_FAULTS": "after_commit:item[3]"},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr)

    store = SqlStore(crash_url)
    try:
        rows = _rows(store, "r")
        decided = _decisions(store.events("r"))
        if case == "quorum":  # killed with some items done, the rest waiting to retry, nothing decided
            assert decided == []
            assert {rows[f"item[{i}]"][0] for i in range(10) if i != 3} == {NodeStatus.COMPLETED}
            assert rows["item[3]"][0] == NodeStatus.FAILED
            assert {rows[f"item[{i}]"][0] for i in range(10, N)} == {NodeStatus.RETRYING}
            assert "item" not in rows
        else:  # killed right after the RetryFailed decision: round 2 is durable, its items not yet run
            assert [(d["verdict"], d["round"]) for d in decided] == [("retry_failed", 1)]
            assert rows["item"][0] == NodeStatus.RUNNING and rows["item"][2] == 2
            assert rows["item[3]"][0] == rows["item[7]"][0] == NodeStatus.PENDING
        run = harness.wait_until(lambda: r if (r := store.get_run("r")).lease_expires_at is not None
                                 and r.lease_expires_at < time.time() else None, timeout=30.0,
                                 what="the dead driver's lease to expire")
        assert run.status == RunStatus.RUNNING

        resumed = raysaga.resume(wf, "r", store=store, executor="inline")
        assert resumed.status == RunStatus.COMPLETED, resumed.status_reason
        assert resumed.output == clean.output
        clean_store = SqlStore(clean_url)
        try:
            assert _decisions(store.events("r")) == _decisions(clean_store.events("r"))
            assert _rows(store, "r") == _rows(clean_store, "r")
            ledger = {(e.node_id, e.fan_index): e.status.value for e in store.effects("r")}
            assert ledger == {(e.node_id, e.fan_index): e.status.value for e in clean_store.effects("r")}
        finally:
            clean_store.close()
    finally:
        store.close()

    output = resumed.output["gather"]
    if case == "quorum":
        assert [(f["index"], f["attempts"]) for f in output["failures"]] == [(3, 1), (12, 2)]
        assert output["round"] == 1 and len(output["successes"]) == 18
    else:
        assert output["failures"] == [] and output["round"] == 2 and len(output["successes"]) == N

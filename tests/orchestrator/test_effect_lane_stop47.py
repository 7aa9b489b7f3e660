"""An effect step's fan-out items wait in a lane of the Ray executor, one a task, at most as many
in flight as a plain lane (4 a CPU). Sent all at once, every item was "handed to Ray (it may
have started)" when a sibling failed, and each was compensated: 19 refunds for 0 charges. Items
still in the lane when the run stops were never sent: no call, no compensation (docs/guarantees.md).
Since stop 48 the run machine issues at most the executor's effect window of them at once
(``machine.effect_window``): the rest have no ledger row at all, so nothing of theirs is in doubt.
Checked on the session's local Ray cluster; what ran is read from files the calls leave."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Permanent, RetryPolicy, RunStatus, StepContext, Workflow
from raysaga.orchestrator.executor import RayExecutor
from raysaga.state import SqlStore

cloudpickle = pytest.importorskip("ray.cloudpickle")

#: Seconds an item other than the first waits for a file nobody writes (it is cancelled long before).
HELD = 120.0

wf = Workflow("fixray_effect_lane")


@wf.step
def plan(input: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"n": n, "dir": input["dir"]} for n in range(input["count"])]


def _mark(where: str, name: str) -> None:
    Path(where, name).touch()


def refund(ctx: StepContext, plan: dict[str, Any], output: Any) -> None:
    _mark(plan["dir"], f"undo-{plan['n']}")


@wf.map("plan", effect=True, compensate=refund, retry=RetryPolicy(max_attempts=1))
def charge(ctx: StepContext, plan: dict[str, Any]) -> int:
    n = int(plan["n"])
    _mark(plan["dir"], f"try-{n}")
    if n == 0:
        raise Permanent("card 0 declined")  # the fan-out fails: the run compensates
    never = Path(plan["dir"], "never")  # held until the run cancels it (nobody writes this file)
    deadline = time.monotonic() + HELD
    while not never.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return n


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _marked(where: Path, prefix: str) -> set[int]:
    return {int(name.split("-")[1]) for name in os.listdir(where) if name.startswith(prefix)}


def test_effect_items_never_sent_are_never_compensated(tmp_path: Path, ray_session: str) -> None:
    count = 40
    store = SqlStore(f"sqlite:///{tmp_path / 'r.db'}")
    try:
        record = raysaga.run(wf, {"count": count, "dir": str(tmp_path)}, store=store,
                             executor=RayExecutor(address=ray_session))
        assert record.status in (RunStatus.COMPENSATED, RunStatus.FAILED), record.status_reason
        nodes = [n for n in store.nodes(record.run_id) if n.node_id == "charge"]
        effects = [e for e in store.effects(record.run_id) if e.node_id == "charge"]
    finally:
        store.close()
    undone, tried = _marked(tmp_path, "undo-"), _marked(tmp_path, "try-")
    import ray

    cpus = int(ray.cluster_resources()["CPU"])  # type: ignore[no-untyped-call]
    in_flight = RayExecutor.LANE_TASKS_PER_CPU * cpus  # the effect lane's tasks, as a plain lane's
    assert in_flight < count - 1
    # only items handed to Ray may be undone: at most the lane's tasks in flight, never the rest
    assert len(undone) <= in_flight, f"{len(undone)} refunds for {len(tried)} calls started: {sorted(undone)}"
    # the items past the effect window were never issued (``EffectWindow``): no ledger row, so no key
    # in doubt; or, issued, they waited in the lane and their rows say "not sent"
    not_sent = {n.fan_index for n in nodes if n.error and "not sent" in str(n.error.get("reason") or n.error)}
    never_issued = set(range(count)) - {e.fan_index for e in effects}
    # (the failed item's slot may be refilled once before its failure is absorbed)
    assert len(not_sent | never_issued) >= count - 1 - in_flight, [(n.fan_index, n.status, n.error) for n in nodes]
    assert len(effects) <= in_flight + 1, f"{len(effects)} ledger rows: only issued items have one"
    assert not (not_sent | never_issued) & (undone | tried)  # never called, never undone
    committed = {e.fan_index for e in effects if e.status.value == "committed"}
    assert not committed & not_sent

"""An agent's effect tools are undone by a rollback: each call that took effect, once, latest first,
and before anything upstream of the agent (``tool(compensate=...)``).

The flow (``tests.support.agent_undo_flows``): ``reserve`` -> agent ``buyer`` (charges c1 and sends an
email, then charges c2 and is refused for a declined card) -> ``ship`` fails. In process (inline
executor, SQLite) for the order and arguments; in killed driver processes for exactly-once.
"""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RunStatus, StepContext
from raysaga.agents import tool
from raysaga.errors import WorkflowDefinitionError
from raysaga.state import EffectStatus, NodeStatus, SqlStore
from tests.support import agent_undo_flows as flows
from tests.support import crash_driver as harness

RUN_ID = "undo-1"


@pytest.fixture
def log(tmp_path: Path) -> Path:
    return tmp_path / "provider.log"


def _keys(entries: list[dict[str, Any]], kind: str) -> list[str]:
    return [e["key"] for e in entries if e["kind"] == kind]


def test_rollback_refunds_each_charge_latest_first_then_the_reservation(sqlite_url: str, log: Path) -> None:
    record = raysaga.run(flows.undo, {"log": str(log)}, store=sqlite_url, executor="inline", run_id=RUN_ID)
    assert record.status == RunStatus.COMPENSATED, record.status_reason
    entries = flows.read_log(log)
    assert [(e["kind"], e.get("card")) for e in entries] == [
        ("reserve", None), ("charge", "c1"), ("email", None), ("charge", "c2"),
        # ship failed: the refunds, latest charge first (the declined card took no effect and
        # the email has no undo), then the step upstream of the agent
        ("refund", "c2"), ("refund", "c1"), ("unreserve", None)]
    charges, refunds = _keys(entries, "charge"), _keys(entries, "refund")
    assert refunds == [f"{charges[1]}:compensate", f"{charges[0]}:compensate"]
    # the undo got the tool's own arguments and its result, decoded
    c2 = next(e for e in entries if e["kind"] == "refund" and e["card"] == "c2")
    assert (c2["amount"], c2["charge"]) == (7, {"charge_id": "ch_c2", "amount": 7})

    store = SqlStore(sqlite_url)
    try:
        nodes = {n.label: n for n in store.nodes(RUN_ID)}
        ledger = {e.idempotency_key: e for e in store.effects(RUN_ID)}
    finally:
        store.close()
    assert nodes["buyer@0.0:compensate"].status == NodeStatus.COMPLETED
    assert nodes["buyer@1.0:compensate"].status == NodeStatus.COMPLETED
    assert "buyer@0.1:compensate" not in nodes and "buyer@1.1:compensate" not in nodes
    assert {ledger[k].status for k in refunds} == {EffectStatus.COMMITTED}
    assert ledger[refunds[0]].effect_name == "tool:charge:compensate"
    assert (record.status_reason or "").startswith("critical step 'ship' failed"), record.status_reason


def test_compensate_needs_an_effect_and_parameters_it_can_be_given() -> None:
    def undo(ctx: StepContext, output: Any, card: str) -> None: ...

    with pytest.raises(WorkflowDefinitionError, match=r"tool 'pay': compensate= needs effect=True"):
        @tool(compensate=undo)
        def pay(card: str) -> str:
            return card

    def wrong(output: Any, cardd: str) -> None: ...

    with pytest.raises(WorkflowDefinitionError, match=r"takes \['cardd'\].*\['card'\], 'output' and 'ctx'"):
        @tool(effect=True, compensate=wrong)
        def pay2(card: str) -> str:
            return card


@pytest.mark.parametrize(("point", "label"), [
    ("after_pending", "buyer@1.0:compensate"),    # the refund of c2 is pending, not called
    ("before_commit", "buyer@1.0:compensate"),    # it returned; its result is not durable
    ("after_commit", "buyer@1.0:compensate"),     # durable; the next refund not started
    ("before_commit", "buyer@0.0:compensate"),
    ("before_commit", "reserve:compensate"),
])
def test_a_kill_during_the_undo_of_tool_calls_resumes_and_undoes_each_once(
        point: str, label: str, tmp_path: Path, log: Path) -> None:
    db = f"sqlite:///{tmp_path / 'run.db'}"
    killed = harness.run_driver("undo", db, RUN_ID, flows=flows.__name__, any_state_ok=True,
                                lease_ttl=0.5, faults=f"{point}:{label}", run_input={"log": str(log)})
    assert killed.returncode == -signal.SIGKILL, killed.describe()
    store = SqlStore(db)
    try:
        assert harness.wait_lease_expired(store, RUN_ID).status == RunStatus.COMPENSATING
    finally:
        store.close()
    resumed = harness.run_driver("undo", db, RUN_ID, flows=flows.__name__, any_state_ok=True,
                                 lease_ttl=0.5, resume=True, run_input={"log": str(log)})
    assert resumed.returncode == 0, resumed.describe()
    assert resumed.result is not None and resumed.result["status"] == "compensated", resumed.describe()

    entries = flows.read_log(log)
    charges = _keys(entries, "charge")
    raw = Counter(_keys(entries, "refund") + _keys(entries, "unreserve"))
    wanted = {f"{charges[1]}:compensate", f"{charges[0]}:compensate", _keys(entries, "reserve")[0] + ":compensate"}
    assert set(raw) == wanted  # each undo under its own key, and no other
    assert len(charges) == len(set(charges)) == 2  # the killed driver's charges were not run again
    # across the crash the order held: c2's refund, c1's refund, then the reservation
    undone = [e["key"] for e in entries if e["kind"] in ("refund", "unreserve")]
    assert list(dict.fromkeys(undone)) == [f"{charges[1]}:compensate", f"{charges[0]}:compensate",
                                           _keys(entries, "reserve")[0] + ":compensate"]
    # a key was called twice only where the kill fell between its call and its commit
    expected_twice = {entry for entry in raw if point == "before_commit" and _label_of(entry, charges) == label}
    assert {k for k, n in raw.items() if n > 1} == expected_twice
    assert all(n <= 2 for n in raw.values())


def _label_of(undo_key: str, charges: list[str]) -> str:
    if undo_key == f"{charges[1]}:compensate":
        return "buyer@1.0:compensate"
    if undo_key == f"{charges[0]}:compensate":
        return "buyer@0.0:compensate"
    return "reserve:compensate"


@pytest.mark.ray
def test_the_undo_of_tool_calls_runs_on_ray_as_inline(ray_address: str, tmp_path: Path, log: Path) -> None:
    done = harness.run_driver("undo", f"sqlite:///{tmp_path / 'ray.db'}", RUN_ID, flows=flows.__name__,
                              any_state_ok=True, executor="ray", run_input={"log": str(log)})
    assert done.returncode == 0 and done.result is not None, done.describe()
    assert done.result["status"] == "compensated", done.describe()
    entries = flows.read_log(log)
    assert [(e["kind"], e.get("card")) for e in entries] == [
        ("reserve", None), ("charge", "c1"), ("email", None), ("charge", "c2"),
        ("refund", "c2"), ("refund", "c1"), ("unreserve", None)]

"""The rollback's pure core (``RollbackPlan`` + ``sagas/rollback.py``) driven by hypothesis: random
DAGs, random completion orders, compensations that fail for good, and crashes that rebuild the
plan from the compensation rows written so far. No Ray, no database, no threads.

Checked: a compensation is handed out only when every target downstream of it is undone; one that
completed is never handed out again, across crashes; the outcome after any crashes equals the
uninterrupted one.
"""

from __future__ import annotations

import networkx as nx
from hypothesis import given, settings
from hypothesis import strategies as st

from raysaga.sagas.plan import CompensationTarget, NodeKey, RollbackPlan
from raysaga.sagas.rollback import compensation_rows, restore_rollback, rollback_outcome
from raysaga.state import NodeRecord, NodeStatus, RunStatus


@st.composite
def dags(draw: st.DrawFn) -> tuple[nx.DiGraph, list[CompensationTarget], set[NodeKey]]:
    n = draw(st.integers(1, 7))
    steps = [f"s{i}" for i in range(n)]
    graph = nx.DiGraph()
    graph.add_nodes_from(steps)
    for j in range(n):
        for i in range(j):
            if draw(st.booleans()):
                graph.add_edge(steps[i], steps[j])
    chosen = draw(st.lists(st.sampled_from(steps), unique=True, min_size=1))
    times = draw(st.lists(st.floats(0, 100), min_size=len(chosen), max_size=len(chosen), unique=True))
    targets = [CompensationTarget((s, -1), t) for s, t in zip(chosen, times, strict=True)]
    doomed = set(draw(st.lists(st.sampled_from([t.key for t in targets]), unique=True)))
    return graph, targets, doomed


def rollback(graph: nx.DiGraph, targets: list[CompensationTarget], doomed: set[NodeKey],
             data: st.DataObject | None) -> tuple[RunStatus, list[NodeKey], list[NodeKey]]:
    """Run the plan to the end; with ``data``, in a random order with random crashes."""
    rows: dict[NodeKey, NodeRecord] = {}  # the compensation rows committed so far
    by_key = {t.key: t for t in targets}

    def restore() -> tuple[RollbackPlan, dict[NodeKey, object]]:
        node_rows = list(rows.values())
        restored = restore_rollback(compensation_rows(node_rows), by_key)
        plan = RollbackPlan(graph, targets, restored.settled)
        for key in restored.failed:
            plan.fail(key)
        return plan, dict(restored.failed)

    plan, errors = restore()
    inflight: list[NodeKey] = []
    handed: set[NodeKey] = set()
    while True:
        for key in plan.ready():
            assert key not in {k for k, r in rows.items() if r.status == NodeStatus.COMPLETED}, "undone twice"
            step = by_key[key].node
            for other in targets:  # everything downstream of it is undone already
                if other.node in nx.descendants(graph, step):
                    assert rows.get(other.key) is not None and rows[other.key].status == NodeStatus.COMPLETED
            inflight.append(key)
            handed.add(key)
        if not inflight:
            break
        if data is not None and data.draw(st.integers(0, 9)) == 9:  # crash: what is in flight is lost
            inflight.clear()
            plan, errors = restore()
            continue
        i = data.draw(st.integers(0, len(inflight) - 1)) if data is not None else 0
        key = inflight.pop(i)
        status = NodeStatus.FAILED if key in doomed else NodeStatus.COMPLETED
        error = {"type": "Refused"} if key in doomed else None
        rows[key] = NodeRecord.model_validate({"run_id": "r", "node_id": f"{key[0]}:compensate",
                                               "fan_index": key[1], "status": status, "attempt": 1,
                                               "error": error})
        if key in doomed:
            plan.fail(key)
            errors[key] = error
        else:
            plan.complete(key)
    assert plan.settled()
    outcome = rollback_outcome("failed", plan, errors, None)
    assert outcome.status in (RunStatus.COMPENSATED, RunStatus.COMPENSATION_FAILED)
    return outcome.status, sorted(plan.failed), plan.blocked()


@settings(max_examples=300, deadline=None)
@given(dags(), st.data())
def test_resume_equals_uninterrupted_and_order_holds(case: tuple[nx.DiGraph, list[CompensationTarget],
                                                                  set[NodeKey]], data: st.DataObject) -> None:
    graph, targets, doomed = case
    assert rollback(graph, targets, doomed, data) == rollback(graph, targets, doomed, None)

"""``RollbackPlan`` on its own: the order it hands compensations out in, with ``after`` chains
(an agent's tool calls) inside the DAG's reverse order."""

from __future__ import annotations

import networkx as nx

from raysaga.sagas.plan import CompensationTarget, RollbackPlan

# a -> agent -> d : the agent's three tool calls t0, t1, t2 (in call order) undo latest first,
# after d (downstream of the agent) and before a (upstream)
GRAPH = nx.DiGraph([("a", "agent"), ("agent", "d")])
T0, T1, T2 = ("agent@0.0", -1), ("agent@1.0", -1), ("agent@1.1", -1)


def _targets() -> list[CompensationTarget]:
    return [
        CompensationTarget(("a", -1), 1.0),
        CompensationTarget(T0, 2.0, step="agent", after=(T1,)),
        CompensationTarget(T1, 3.0, step="agent", after=(T2,)),
        CompensationTarget(T2, 4.0, step="agent"),
        CompensationTarget(("d", -1), 5.0),
    ]


def _drain(plan: RollbackPlan) -> list[tuple[str, int]]:
    order = []
    while batch := plan.ready():
        assert len(batch) == 1, batch  # this graph is a chain: one at a time
        order += batch
        plan.complete(batch[0])
    return order


def test_tool_calls_are_undone_one_by_one_latest_first_between_the_dag_neighbours() -> None:
    plan = RollbackPlan(GRAPH, _targets())
    assert _drain(plan) == [("d", -1), T2, T1, T0, ("a", -1)]
    assert plan.settled() and plan.blocked() == []


def test_a_failed_tool_undo_blocks_the_earlier_calls_and_the_upstream_steps() -> None:
    plan = RollbackPlan(GRAPH, _targets())
    assert plan.ready() == [("d", -1)]
    plan.complete(("d", -1))
    assert plan.ready() == [T2]
    plan.fail(T2)
    assert plan.ready() == []
    assert plan.settled()
    assert plan.blocked() == [("a", -1), T0, T1]


def test_a_resumed_plan_skips_what_was_undone_and_goes_on_from_there() -> None:
    plan = RollbackPlan(GRAPH, _targets(), settled=[("d", -1), T2])
    assert _drain(plan) == [T1, T0, ("a", -1)]

"""The rollback's decisions on their own: node rows in, targets, restored progress and outcome out.

No store, no executor: the rows are built by hand (the crash sweeps check the same rules end to end).
"""

from __future__ import annotations

import math

import networkx as nx

from raysaga.sagas.plan import CompensationTarget, RollbackPlan
from raysaga.sagas.rollback import compensation_rows, effect_time, restore_rollback, rollback_outcome, step_targets
from raysaga.state import NodeRecord, NodeStatus, RunStatus


def row(node: str, status: NodeStatus, index: int = -1, **fields: object) -> NodeRecord:
    return NodeRecord.model_validate({"run_id": "r", "node_id": node, "fan_index": index, "status": status,
                                      "attempt": fields.pop("attempt", 1), **fields})


def test_effect_time_orders_completed_by_finish_and_unknown_last() -> None:
    assert effect_time(row("a", NodeStatus.COMPLETED, finished_at=5.0)) == 5.0
    for status in (NodeStatus.RUNNING, NodeStatus.CANCELLED, NodeStatus.RETRYING):
        assert effect_time(row("a", status)) == math.inf
    assert effect_time(row("a", NodeStatus.FAILED, error={"transient": True})) == math.inf
    assert effect_time(row("a", NodeStatus.FAILED, error={"transient": False})) is None
    assert effect_time(row("a", NodeStatus.PENDING)) is None


def test_step_targets_skip_a_fan_outs_parent_compensations_and_steps_without_undo() -> None:
    rows = [row("pay", NodeStatus.COMPLETED, finished_at=1.0), row("fan", NodeStatus.COMPLETED),
            row("fan", NodeStatus.COMPLETED, 0, finished_at=2.0), row("fan", NodeStatus.RUNNING, 1),
            row("plain", NodeStatus.COMPLETED), row("pay:compensate", NodeStatus.COMPLETED)]
    targets = {t.key: t.finished_at for t, _ in step_targets(rows, {"pay": False, "fan": True})}
    assert targets == {("pay", -1): 1.0, ("fan", 0): 2.0, ("fan", 1): math.inf}


def test_restore_keeps_settled_failed_backoff_and_attempts_of_wanted_compensations_only() -> None:
    rows = [row("a:compensate", NodeStatus.COMPLETED, attempt=2), row("b:compensate", NodeStatus.FAILED,
            error={"type": "X"}, attempt=3), row("c:compensate", NodeStatus.RETRYING, not_before=9.0),
            row("gone:compensate", NodeStatus.COMPLETED)]
    comp = compensation_rows(rows)
    assert set(comp) == {("a", -1), ("b", -1), ("c", -1), ("gone", -1)}
    restored = restore_rollback(comp, [("a", -1), ("b", -1), ("c", -1)])
    assert restored.settled == [("a", -1)]
    assert restored.failed == {("b", -1): {"type": "X"}}
    assert restored.not_before == {("c", -1): 9.0}
    assert restored.attempts == {("a", -1): 2, ("b", -1): 3, ("c", -1): 1}


def test_outcome_compensated_or_parked_naming_failed_and_blocked() -> None:
    graph = nx.DiGraph([("a", "b")])
    plan = RollbackPlan(graph, [CompensationTarget(("a", -1), 1.0), CompensationTarget(("b", -1), 2.0)])
    assert plan.ready() == [("b", -1)]
    plan.complete(("b", -1))
    assert plan.ready() == [("a", -1)]
    plan.complete(("a", -1))
    done = rollback_outcome("step b failed", plan, {}, {"type": "Boom"})
    assert done.status == RunStatus.COMPENSATED and done.error == {"type": "Boom"} and not done.set_error

    plan = RollbackPlan(graph, [CompensationTarget(("a", -1), 1.0), CompensationTarget(("b", -1), 2.0)])
    plan.ready()
    plan.fail(("b", -1))
    cause = {"node": "b", "type": "Cause"}  # the run's error when the rollback started (an ErrorRecord)
    parked = rollback_outcome("step b failed", plan, {("b", -1): {"type": "Refused"}}, cause)
    assert parked.status == RunStatus.COMPENSATION_FAILED and parked.set_error
    assert parked.error == {"failed_compensations": [{"node": "b", "type": "Refused"}],
                            "blocked_compensations": ["a"], "cause": cause}
    # a retried rollback reports the original cause, not the earlier report
    again = rollback_outcome("r", RollbackPlan(graph, []), {}, parked.error)
    assert again.status == RunStatus.COMPENSATED and again.error == cause and again.set_error

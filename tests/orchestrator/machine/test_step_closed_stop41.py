"""A fan-out step that failed (non-critical: the run goes on) is not retried behind its back.

Found in review (stop 41): an item whose attempt was in flight when its step failed, or which was
waiting out a retry's backoff then, was sent again after the step had failed and its dependents
were skipped. For an effect that is a charge nothing compensates. The shell's invariant
(``MachineShell._check_step_open``) catches it; these pin the two orders down, deterministically.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from raysaga.node_key import NodeKey
from raysaga.state import Batch, EffectStatus, NodeStatus, RunStatus
from tests.orchestrator.machine.memory_run import MemoryRun
from tests.orchestrator.machine.model_world import Fate, FateWorld, Plan, StepPlan, build_workflow, human, new_fold
from tests.orchestrator.machine.shell import MachineShell


class Ordered:
    """Attempts finish one at a time, in the order of ``labels`` (any other after them)."""

    def __init__(self, *labels: str) -> None:
        self.labels = labels

    def pick(self, inflight: Sequence[NodeKey], now: float, timer: float | None) -> list[NodeKey]:
        rank = {label: i for i, label in enumerate(self.labels)}
        return [min(inflight, key=lambda k: rank.get(k.label, len(rank)))]

    def crash(self, when: str, commit_no: int, batch: Batch) -> bool:
        return False

    def overlap(self) -> bool:
        return False

    def signals(self, moment: str, fold: MemoryRun, now: float) -> list[dict[str, Any]]:
        return []


#: plan -> charge (a non-critical effect fan-out over 2 items, 3 attempts each) -> ship
PLAN = Plan(steps=(StepPlan("s0", items=2),
                   StepPlan("s1", deps=("s0",), map_over="s0", effect=True, critical=False, max_attempts=3),
                   StepPlan("s2", deps=("s1",))), backoff=0.5, fail_rate=0)
#: item 0 is declined for good; item 1 fails once transiently, then would succeed
FATES = {"s1[0]": Fate(0, "permanent"), "s1[1]": Fate(1, "ok")}


def _drive(*order: str) -> MachineShell:
    wf = build_workflow(PLAN)
    world = FateWorld(PLAN, lambda strategy: Fate(0, "ok"))
    world.fates.update(FATES)
    shell = MachineShell(wf, new_fold(wf, PLAN), world, Ordered(*order), decide=human(PLAN))
    record = shell.run()  # the shell raises InvariantViolation at a send after the step failed
    assert record.status == RunStatus.COMPLETED  # s1 is non-critical: the run goes on without it
    return shell


def _sent(shell: MachineShell, label: str) -> int:
    return sum(1 for _, sent, _ in shell.journal.dispatched if sent == label)


def _item_1(shell: MachineShell) -> tuple[NodeStatus, EffectStatus]:
    row = shell.fold.nodes[("s1", 1)]
    (ledger,) = [e for e in shell.fold.effects.values() if e.node_id == "s1" and e.fan_index == 1]
    return row.status, ledger.status


def test_an_item_in_flight_when_its_step_fails_is_not_retried_after_its_transient_failure() -> None:
    shell = _drive("s1[0]", "s1[1]")  # item 0 fails the step while item 1's first attempt is out
    assert shell.fold.nodes[("s1", -1)].status == NodeStatus.FAILED
    assert shell.fold.nodes[("s2", -1)].status == NodeStatus.SKIPPED
    assert _sent(shell, "s1[1]") == 1
    status, ledger = _item_1(shell)
    assert status == NodeStatus.FAILED
    assert shell.fold.nodes[("s1", 1)].error is not None
    assert shell.fold.nodes[("s1", 1)].error.reason == "not retried: its step failed"
    assert ledger == EffectStatus.ABANDONED  # it may have taken effect: settled, never pending for ever


def test_an_item_waiting_out_a_backoff_when_its_step_fails_is_not_retried() -> None:
    shell = _drive("s1[1]", "s1[0]")  # item 1 fails transiently first (a backoff), then item 0 for good
    assert shell.fold.nodes[("s1", -1)].status == NodeStatus.FAILED
    assert _sent(shell, "s1[1]") == 1
    status, ledger = _item_1(shell)
    assert status == NodeStatus.CANCELLED  # "not retried: its step failed", not 'retrying' for ever
    assert ledger == EffectStatus.ABANDONED


def test_a_quorum_out_of_reach_fails_its_step_without_waiting_for_the_rest() -> None:
    """quorum(2) of 3 items: once 2 failed, no outcome of the third can meet it. The step fails at
    once and the third is stopped (``FanOutPolicy.unreachable``), instead of being paid for."""
    plan = Plan(steps=(StepPlan("s0", items=3),
                       StepPlan("s1", deps=("s0",), map_over="s0", policy="quorum", critical=False, max_attempts=1),
                       StepPlan("s2", deps=("s1",))), fail_rate=0)
    wf = build_workflow(plan)
    world = FateWorld(plan, lambda strategy: Fate(0, "ok"))
    world.fates.update({"s1[0]": Fate(0, "permanent"), "s1[1]": Fate(0, "permanent")})
    shell = MachineShell(wf, new_fold(wf, plan), world, Ordered("s1[0]", "s1[1]"), decide=human(plan))
    assert shell.run().status == RunStatus.COMPLETED
    assert shell.fold.nodes[("s1", -1)].status == NodeStatus.FAILED
    assert shell.fold.nodes[("s1", 2)].status == NodeStatus.CANCELLED  # stopped, not run to its end
    (decision,) = [e for e in shell.fold.events if e.kind == "fanout_decision"]
    assert decision.data["verdict"] == "fail" and "out of reach" in decision.data["reason"]
    assert shell.fold.nodes[("s2", -1)].status == NodeStatus.SKIPPED

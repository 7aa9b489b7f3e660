"""What a fork inherits (``raysaga.orchestrator.fork.inherited_rows``), as a pure function of the
parent's rows: no store, no driver."""

from __future__ import annotations

from typing import Any

import pytest

from raysaga import BEST_EFFORT, StepContext, Workflow
from raysaga.errors import ForkError
from raysaga.orchestrator.fork import inherited_rows, merge_patch, parse_node
from raysaga.state import NodeRecord, NodeStatus

C, F = NodeStatus.COMPLETED, NodeStatus.FAILED


def _flow() -> Workflow:
    wf = Workflow("rules")

    def undo(ctx: StepContext, output: Any) -> None: ...

    @wf.step()
    def plan(input: int) -> list[int]:
        return list(range(input))

    @wf.map("plan", policy=BEST_EFFORT, compensate=undo)
    def work(plan: int) -> int:
        return plan

    @wf.step()
    def side(input: int) -> int:
        return input

    @wf.step()
    def join(work: Any, side: int) -> int:
        return side

    return wf


def _rows(*rows: tuple[str, int, NodeStatus]) -> list[NodeRecord]:
    return [NodeRecord(run_id="p", node_id=n, fan_index=i, status=s) for n, i, s in rows]


PARENT = _rows(("plan", -1, C), ("work", -1, C), ("work", 0, C), ("work", 1, F), ("work", 2, C), ("side", -1, C),
               ("join", -1, C))


def _labels(rows: list[NodeRecord]) -> list[str]:
    return sorted(r.label for r in rows)


def test_everything_but_the_node_and_what_is_downstream() -> None:
    assert _labels(inherited_rows(_flow(), PARENT, parse_node("join"))) == \
        ["plan", "side", "work", "work[0]", "work[1]", "work[2]"]  # a partial fan-out is whole with its failed item
    assert _labels(inherited_rows(_flow(), PARENT, parse_node("side"))) == \
        ["plan", "work", "work[0]", "work[1]", "work[2]"]


def test_an_item_keeps_its_siblings_not_its_parent() -> None:
    assert _labels(inherited_rows(_flow(), PARENT, parse_node("work[2]"))) == ["plan", "side", "work[0]", "work[1]"]


def test_an_undone_item_expands_its_fan_out_again() -> None:
    undone = [*PARENT, *_rows(("work:compensate", 2, C))]
    assert _labels(inherited_rows(_flow(), undone, parse_node("join"))) == ["plan", "side", "work[0]"]


def test_a_changed_step_runs_again_with_what_is_downstream() -> None:
    assert _labels(inherited_rows(_flow(), PARENT, parse_node("join"), changed={"plan"})) == ["side"]


def test_an_input_change_reruns_what_reads_it_only_if_it_has_an_effect_or_an_undo() -> None:
    assert _labels(inherited_rows(_flow(), PARENT, parse_node("join"), input_changed=True)) == \
        ["plan", "side", "work", "work[0]", "work[1]", "work[2]"]  # plan and side read the input: no effect, kept


def test_labels_and_patches() -> None:
    assert parse_node("research@2[1]") == ("research", 1, 2, None, False)
    with pytest.raises(ForkError, match="not a node label"):
        parse_node("a[b]")
    assert merge_patch({"a": 1, "b": {"c": 2, "d": 3}}, {"b": {"c": None, "e": 4}, "f": 5}) == \
        {"a": 1, "b": {"d": 3, "e": 4}, "f": 5}
    assert merge_patch({"a": 1}, [1]) == [1]

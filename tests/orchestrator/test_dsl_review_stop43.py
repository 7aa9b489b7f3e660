"""Stop 43, a definition error the reviewer found at run time: a step reading a fan-out whose
policy is partial (``BEST_EFFORT``, a quorum) as ``list[str]``. Such a fan-out always hands its
readers a ``FanOutResult``, even when every item succeeds; every item ran (and charged) first,
then the reader failed for good and the run rolled back, told to "declare the type that step
returns". It is now refused when the workflow is defined, naming the reader and what to write."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel

from raysaga import BEST_EFFORT, FanOutResult, StepContext, Workflow, WorkflowDefinitionError, quorum
from raysaga.sagas import ALL, FanOutPolicy


def reader_of(policy: FanOutPolicy, annotation: Any) -> Workflow:
    wf = Workflow("partial43", version="1")

    @wf.step()
    def plan() -> list[str]:
        return ["a", "b"]

    @wf.step(map_over="plan", policy=policy)
    def research(plan: str) -> str:
        return plan.upper()

    def write(research: Any) -> str:
        return "done"

    write.__annotations__["research"] = annotation
    wf.step()(write)
    return wf


@pytest.mark.parametrize("policy", [BEST_EFFORT, quorum(1)], ids=["best_effort", "quorum"])
def test_a_list_reader_of_a_partial_fan_out_is_a_definition_error(policy: FanOutPolicy) -> None:
    with pytest.raises(WorkflowDefinitionError) as err:
        reader_of(policy, list[str]).validate()
    message = str(err.value)
    assert "step 'write' reads 'research' as list[str]" in message, message
    assert "hands 'write' a raysaga.FanOutResult" in message and "annotate the parameter FanOutResult" in message


class Summary(BaseModel):
    """A user's own model of some of a FanOutResult's fields: it reads one (the second review)."""

    total: int
    successes: list[Any] = []


@dataclass
class SummaryDC:
    total: int
    successes: list[Any] = field(default_factory=list)


@pytest.mark.parametrize("annotation", [FanOutResult, dict, dict[str, Any], Any, FanOutResult | None, Summary,
                                        SummaryDC, list[str] | FanOutResult])
def test_readers_that_can_read_a_fan_out_result_are_accepted(annotation: Any) -> None:
    reader_of(BEST_EFFORT, annotation).validate()


def test_a_list_reader_of_an_all_fan_out_is_accepted() -> None:
    reader_of(ALL, list[str]).validate()


def test_a_compensation_reading_a_partial_fan_out_as_a_list_is_a_definition_error() -> None:
    """Its rollback failed (``compensation_failed``): the compensation reads the step's parameters."""
    for register in ("compensate=", "@compensation"):
        wf = Workflow("partial43c", version="1")

        @wf.step()
        def plan() -> list[str]:
            return ["a", "b"]

        @wf.step(map_over="plan", policy=BEST_EFFORT)
        def research(plan: str) -> str:
            return plan.upper()

        def undo(ctx: StepContext, output: int, research: list[str]) -> None:
            return None

        def charge(research: FanOutResult) -> int:
            return len(research.outputs)

        if register == "compensate=":
            wf.step(compensate=undo)(charge)
        else:
            wf.step()(charge)
            wf.compensation("charge")(undo)
        with pytest.raises(WorkflowDefinitionError, match=r"the compensation 'undo' of step 'charge' reads "
                                                          r"'research' as list\[str\]"):
            wf.validate()

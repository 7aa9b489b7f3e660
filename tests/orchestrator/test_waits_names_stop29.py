"""Stop 29: ``approvers=`` and ``escalate_to=`` read through ``raysaga.types.str_tuple`` (the
check every ``after=`` takes) instead of a copy of it. What the copy missed: a value that is no
iterable at all (``approvers=5``, ``escalate_to=None``) escaped as Python's bare ``TypeError:
'int' object is not iterable``, naming neither the approval nor the option; now it is a
``WorkflowDefinitionError`` that names both and shows the form. A str is still refused (a list of
people is never one name), and so is a blank name."""

from __future__ import annotations

from typing import Any

import pytest

from raysaga import Workflow, WorkflowDefinitionError


def ask() -> str:
    return "ok?"


EXAMPLE = 'e.g. {}=["alice", "bob"]'
ESCALATE = {"timeout": 5, "on_timeout": "escalate"}


@pytest.mark.parametrize(("options", "message"), [
    ({"approvers": 5}, f"approval 'ask': approvers= takes names, {EXAMPLE.format('approvers')}, got 5"),
    ({"approvers": [5, "bob"]}, f"approvers= takes names, {EXAMPLE.format('approvers')}, got [5, 'bob']"),
    ({**ESCALATE, "escalate_to": None}, f"escalate_to= takes names, {EXAMPLE.format('escalate_to')}, got None"),
    ({"approvers": "alice"}, "approvers= takes a list of names, not one str ('alice'): write ['alice']"),
    ({**ESCALATE, "escalate_to": "boss"}, "escalate_to= takes a list of names, not one str"),
    ({"approvers": ["alice", "  "]}, "approval 'ask': approvers= holds ['  ']: names are non-empty str"),
    ({"approvers": ["alice", ""]}, "approval 'ask': approvers= holds ['']: names are non-empty str"),
])
def test_a_bad_list_of_names_is_a_definition_error_naming_the_option(options: dict[str, Any], message: str) -> None:
    wf = Workflow("names_stop29")
    with pytest.raises(WorkflowDefinitionError) as refused:
        wf.approval(**options)(ask)
    assert message in str(refused.value), str(refused.value)


def test_any_iterable_of_names_is_taken_as_given() -> None:
    wf = Workflow("names_ok_stop29")

    @wf.step()
    def first() -> int:
        return 1

    wf.approval(approvers=(n for n in ["alice", "bob"]), quorum=2, timeout=5, on_timeout="escalate",
                escalate_to={"boss": 1}, after=["first"])(ask)
    options = wf.steps["ask"].options["approval"]
    assert (options.approvers, options.escalate_to) == (("alice", "bob"), ("boss",))

"""One helper (``raysaga.types.str_tuple``) turns "a name, or an iterable of names" into a tuple
for ``@wf.step(after=...)`` and ``@tool(key=...)``: a str is one name (never its characters), and
anything else that is not names is refused with one message shape naming the step or tool."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from raysaga import Workflow
from raysaga.agents import tool
from raysaga.errors import UserError, WorkflowDefinitionError
from raysaga.types import str_tuple


def _after(after: Any) -> tuple[str, ...]:
    wf = Workflow("names_stop28")

    @wf.step()
    def plan() -> int:
        return 1

    @wf.step()
    def check() -> int:
        return 2

    @wf.step(after=after)
    def work() -> int:
        return 3

    return wf.steps["work"].deps


def _key(key: Any) -> tuple[str, ...] | None:
    def order(order_id: str, line: int) -> str:
        """Place an order."""
        return order_id

    return tool(order, effect=True, key=key).key


@pytest.mark.parametrize(("given", "expected"), [
    ("plan", ("plan",)), (["plan", "check"], ("plan", "check")), (("check",), ("check",)),
    ((n for n in ["plan"]), ("plan",)), ([], ()),
])
def test_after_takes_one_name_or_several(given: Any, expected: tuple[str, ...]) -> None:
    assert _after(given) == expected


@pytest.mark.parametrize(("given", "expected"), [
    ("order_id", ("order_id",)), (["order_id", "line"], ("order_id", "line")), (("line",), ("line",)),
])
def test_a_tool_key_takes_one_argument_name_or_several(given: Any, expected: tuple[str, ...]) -> None:
    assert _key(given) == expected


@pytest.mark.parametrize("bad", [5, [1], ["plan", None], b"plan", object()])
@pytest.mark.parametrize(("check", "says"), [
    (_after, "step 'work': after= takes step names, e.g. after=[\"reserve\"], got "),
    (_key, "tool 'order': key= takes argument names, e.g. key=(\"order_id\",), got "),
])
def test_what_is_not_names_is_refused_naming_the_step_or_tool(check: Callable[[Any], Any], says: str,
                                                              bad: Any) -> None:
    with pytest.raises(WorkflowDefinitionError) as refused:
        check(bad)
    assert str(refused.value) == says + repr(bad)


def test_str_tuple_takes_the_error_to_raise() -> None:
    assert str_tuple("a", "x", "opt", "('a',)") == ("a",)
    with pytest.raises(UserError, match=r"^where: opt= takes labels, e\.g\. opt=\['a'\], got 3$"):
        str_tuple(3, "where", "opt", "['a']", takes="labels", error=UserError)

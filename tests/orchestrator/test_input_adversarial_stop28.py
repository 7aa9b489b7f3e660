"""Third adversarial round, a run's input holding NaN through the Python API (``run`` and ``fork``).

``raysaga.run(wf, {"x": float("nan")})`` on a workflow whose input is a ``dict`` completed with
input ``{"x": None}``; ``raysaga.fork(..., input_patch={"x": nan})`` the same. ``check_input``
refuses NaN (``NotJSONableError``), then tries the type's own JSON form for types such as
``Secret``: pydantic's ``dump_python(mode="json")`` wrote NaN as null, and that passed (now the
fallback refuses a non-finite float first: ``jsoncodec.refuse_non_finite``). A bare
NaN, or one in a pydantic model's field, is refused (round 2); the CLI's ``--input`` is strict.
``fork`` now checks its ``input_patch`` as strict JSON itself (``orchestrator/fork.py``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

import raysaga
from raysaga import Workflow
from raysaga.errors import InvalidInputError
from raysaga.state import RunStatus

wf = Workflow("stop28_nan_input")


@wf.step()
def first(input: dict[str, Any]) -> dict[str, Any]:
    return input


@wf.step()
def second(first: dict[str, Any]) -> str:
    return "done"


@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_dict_input_holding_nan_is_refused_not_stored_as_null(sqlite_url: str, value: float) -> None:
    with pytest.raises(InvalidInputError, match="JSON has no NaN or infinity"):
        raysaga.run(wf, {"x": value}, store=sqlite_url, executor="inline")


def test_a_fork_input_patch_holding_nan_is_refused_not_stored_as_null(sqlite_url: str) -> None:
    assert raysaga.run(wf, {"x": 1}, store=sqlite_url, run_id="p", executor="inline").status == RunStatus.COMPLETED
    with pytest.raises(InvalidInputError, match="JSON has no NaN or infinity"):
        raysaga.fork(wf, "p", from_node="second", input_patch={"x": math.nan}, store=sqlite_url, executor="inline")

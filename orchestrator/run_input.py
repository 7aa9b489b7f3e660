"""A run's input: the type its steps declare for ``input``, and the check a new run's input passes."""

from __future__ import annotations

from typing import Any, Protocol

from pydantic import ValidationError

from raysaga.errors import InvalidInputError, NotJSONableError, WorkflowDefinitionError
from raysaga.orchestrator.input_errors import mismatch
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.orchestrator.validation import json_type_problem
from raysaga.state import jsoncodec
from raysaga.state.json_form import adapter_json, needs_read_back, read_back_problem


class Workflow(Protocol):
    """What of a workflow its input depends on (``raysaga.orchestrator.workflow.Workflow``)."""

    name: str
    steps: dict[str, StepSpec]


def input_type(wf: Workflow) -> Any:
    """The annotation of the ``input`` parameters (they must agree), or Any."""
    types = {spec.param_types[spec.input_param] for spec in wf.steps.values()
             if spec.input_param and spec.param_types.get(spec.input_param) is not Any}
    if len(types) > 1:
        raise WorkflowDefinitionError(
            f"workflow {wf.name!r}: steps annotate 'input' with different types {sorted(map(str, types))}: "
            "use one input type")
    return types.pop() if types else Any


def check_input(wf: Workflow, value: Any) -> Any:
    """Validate a run input against the declared input type; return its JSON form."""
    tp = input_type(wf)
    if tp is not Any:
        problem = json_type_problem(tp)
        if problem:
            raise WorkflowDefinitionError(f"workflow {wf.name!r}: input type {tp} is not JSON-able ({problem})")
        try:
            value = type_adapter(tp).validate_python(value)
        except ValidationError as exc:
            raise InvalidInputError(mismatch(wf.name, tp, exc)) from None
    try:
        form = jsoncodec.to_jsonable(value, "input")
    except NotJSONableError as exc:
        if tp is Any:
            raise InvalidInputError(str(exc)) from None
        return _own_form(tp, value, exc)
    if tp is not Any and needs_read_back(tp):  # read back as the steps will: an alias, a union, an Any field
        problem = read_back_problem(tp, value, form, "input")
        if problem:
            raise InvalidInputError(f"workflow {wf.name!r}: the run input is not kept by its JSON form: {problem}")
    return form


def _own_form(tp: Any, value: Any, exc: NotJSONableError) -> Any:
    """The JSON form of an input whose declared type makes one (a bare ``Secret``, ``list[Secret]``...),
    if it reads back as the value; else ``InvalidInputError`` with ``exc``'s words. Pydantic's JSON
    dump of ``dict[str, Any]`` made ``{1: 'one'}`` ``{'1': 'one'}``, a set a list, bytes a str, a
    datetime a str: each accepted, where the same value untyped was refused."""
    try:  # (pydantic's JSON mode would write a NaN as null)
        jsoncodec.refuse_non_finite(value, "input")
    except NotJSONableError as non_finite:
        raise InvalidInputError(str(non_finite)) from None
    try:
        form = jsoncodec.to_jsonable(adapter_json(tp, value), "input")
        kept = read_back_problem(tp, value, form, "input") is None
    except Exception:
        kept = False
    if not kept:
        raise InvalidInputError(str(exc)) from None
    return form

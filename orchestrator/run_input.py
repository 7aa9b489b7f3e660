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
        return jsoncodec.to_jsonable(value, "input")
    except NotJSONableError as exc:
        if tp is not Any:
            try:  # a type with its own JSON form (a bare ``Secret``, ``list[Secret]``...), which
                jsoncodec.refuse_non_finite(value, "input")  # would write a NaN as null
            except NotJSONableError as non_finite:
                raise InvalidInputError(str(non_finite)) from None
            try:
                return jsoncodec.to_jsonable(type_adapter(tp).dump_python(value, mode="json"), "input")
            except Exception:
                pass
        raise InvalidInputError(str(exc)) from None

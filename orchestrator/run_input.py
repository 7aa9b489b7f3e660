"""A run's input: the type its steps declare for ``input``, and the check a new run's input passes."""

from __future__ import annotations

import json
from typing import Any, Protocol

from pydantic import ValidationError

from raysaga.errors import InvalidInputError, NotJSONableError, WorkflowDefinitionError
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.orchestrator.validation import json_type_problem
from raysaga.state import jsoncodec
from raysaga.state.redact import scrub_text

#: Problems a mismatch names (then "and N more"), and the characters shown of each part of one.
MAX_PROBLEMS = 20
MAX_GOT = 60
MAX_WHERE = 100
MAX_MSG = 200


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


def mismatch(workflow: str, tp: Any, exc: ValidationError) -> str:
    """``input does not match Order of workflow 'w': sku: Input should be a valid string (got 5)``:
    one short form for ``run``, ``submit``, ``fork`` and the Python API. pydantic's own error list
    repeats each bad value whole (a fork's 100 KB patch made a 100 KB line): here every part is cut."""
    return f"input does not match {getattr(tp, '__name__', tp)} of workflow {workflow!r}: {problems(exc)}"


def problems(exc: ValidationError) -> str:
    """pydantic's errors as ``field: problem (got value)`` joined by "; ", at most ``MAX_PROBLEMS``."""
    errors = exc.errors(include_url=False)
    shown = []
    for e in errors[:MAX_PROBLEMS]:
        where = _cut(".".join(str(p) for p in e.get("loc", ())), MAX_WHERE) or "(the input)"
        got = e.get("input")
        value = _preview(got) if got is not None and e.get("type") != "missing" else ""
        shown.append(f"{where}: {_cut(str(e.get('msg', 'invalid')), MAX_MSG)}" + (f" (got {value})" if value else ""))
    if len(errors) > MAX_PROBLEMS:
        shown.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return "; ".join(shown)


def _preview(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (ValueError, TypeError, RecursionError):  # a circular value, an odd object
        text = object.__repr__(value)
    return _cut(scrub_text(text[: MAX_GOT * 4]), MAX_GOT)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

"""A run's input: the type its steps declare for ``input``, and the check a new run's input passes."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from typing import Any, Protocol

from pydantic import ValidationError
from pydantic.fields import FieldInfo

from raysaga.errors import InvalidInputError, NotJSONableError, WorkflowDefinitionError
from raysaga.orchestrator.input_errors import mismatch, type_name
from raysaga.orchestrator.input_keys import message as unknown_message
from raysaga.orchestrator.input_keys import unknown_keys
from raysaga.orchestrator.output_types import read_back_needed
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.orchestrator.validation import json_type_problem
from raysaga.state import jsoncodec
from raysaga.state.json_form import adapter_json, read_back_problem


class Workflow(Protocol):
    """What of a workflow its input depends on (``raysaga.orchestrator.workflow.Workflow``)."""

    name: str
    steps: dict[str, StepSpec]


def input_type(wf: Workflow) -> Any:
    """The annotation of the ``input`` parameters (they must agree), or Any."""
    kinds = _input_kinds(wf.steps)
    if len(kinds) > 1:
        raise WorkflowDefinitionError(f"workflow {wf.name!r}: {_disagree(kinds)}")
    return kinds[0][0] if kinds else Any


def input_problems(steps: Mapping[str, StepSpec]) -> list[str]:
    """What ``Workflow.validate`` reports of the run's input, which ``run`` and ``create_run`` refuse
    (``input_type``, ``check_input``): steps declaring different types for it, a type with no JSON form."""
    kinds = _input_kinds(steps)
    if len(kinds) > 1:
        return [_disagree(kinds)]
    problem = json_type_problem(kinds[0][0]) if kinds else None
    if kinds and problem:
        return [f"{_steps(kinds[0][1])} declare{'s' if len(kinds[0][1]) == 1 else ''} the run's input as "
                f"{type_name(kinds[0][0])}, which is not JSON-able ({problem}): declare a pydantic model, dict, "
                "list, str, int, float, bool or None (a run's input is stored as JSON)"]
    return []


def _input_kinds(steps: Mapping[str, StepSpec]) -> list[tuple[Any, list[str]]]:
    """Each type the steps declare for ``input`` (not Any), with the steps declaring it."""
    kinds: list[tuple[Any, list[str]]] = []
    for spec in steps.values():
        tp = spec.param_types.get(spec.input_param, Any) if spec.input_param else Any
        if tp is Any:
            continue
        for known, names in kinds:
            if same_type(known, tp):
                names.append(spec.name)
                break
        else:
            kinds.append((tp, [spec.name]))
    return kinds


def _disagree(kinds: list[tuple[Any, list[str]]]) -> str:
    declared = "; ".join(f"{type_name(tp)} ({_steps(names)})" for tp, names in kinds)
    return f"steps annotate 'input' with different types: {declared}: use one input type"


def _steps(names: list[str]) -> str:
    return f"step {names[0]!r}" if len(names) == 1 else f"steps {', '.join(map(repr, names))}"


def same_type(a: Any, b: Any) -> bool:
    """Whether annotations ``a`` and ``b`` declare one type: equal, or alike part by part, where
    a ``Field(gt=0)`` written twice is two objects that never compare equal (``Annotated`` keeps it)."""
    try:
        if a == b:
            return True
    except Exception:  # an __eq__ of user code that raises: compared below
        pass
    args_a, args_b = typing.get_args(a), typing.get_args(b)
    if not args_a or len(args_a) != len(args_b) or typing.get_origin(a) != typing.get_origin(b):
        return isinstance(a, FieldInfo) and isinstance(b, FieldInfo) and repr(a) == repr(b)
    return all(same_type(x, y) for x, y in zip(args_a, args_b, strict=True))


def check_input(wf: Workflow, value: Any, *, stored: bool = False) -> Any:
    """Validate a run input against the declared input type; return its JSON form. A key an object
    of it does not declare, which pydantic would drop, is refused (``input_keys``). ``stored``: an
    input as the store keeps it (a fork's parent's; one an older raysaga accepted), read as the steps
    read it (by field name or alias) with no key refused: the stored form holds field names and a
    model's computed fields, and what an older raysaga accepted is not refused afterwards."""
    tp = input_type(wf)
    given = value
    if tp is not Any:
        problem = json_type_problem(tp)
        if problem:
            raise WorkflowDefinitionError(f"workflow {wf.name!r}: input type {tp} is not JSON-able ({problem})")
        try:
            value = type_adapter(tp).validate_python(value, by_alias=True, by_name=True) if stored \
                else type_adapter(tp).validate_python(value)
        except ValidationError as exc:
            raise InvalidInputError(mismatch(wf.name, tp, exc)) from None
        unknown = [] if stored else unknown_keys(tp, given, value)
        if unknown:  # pydantic dropped them: a misspelt field kept its default
            raise InvalidInputError(unknown_message(wf.name, tp, unknown))
    try:
        form = jsoncodec.to_jsonable(value, "input")
    except NotJSONableError as exc:
        if tp is Any:
            raise InvalidInputError(str(exc)) from None
        return _own_form(tp, value, exc)
    if tp is not Any and read_back_needed(tp):  # read back as the steps will: an alias, a union, an Any field
        problem = read_back_problem(tp, value, form, "input")
        if problem and given is not value:  # a validator that is not idempotent ("7" into "id-7", read again
            try:  # "id-id-7"): the form of the input as given may read back as the validated one; then that
                given_form = jsoncodec.to_jsonable(given, "input")
                if read_back_problem(tp, value, given_form, "input") is None:
                    return given_form
            except NotJSONableError:
                pass
        if problem:
            raise InvalidInputError(f"workflow {wf.name!r}: the run input is not kept by its JSON form: {problem}")
    return form


def check_patched(wf: Workflow, parent_input: Any, patched: Any) -> Any:
    """``check_input(stored=True)`` of a fork's patched input, refusing a key the patch brings that
    the type does not declare: a misspelt ``--input-patch`` key (``{"amout": 5}``) was dropped and the
    fork ran on its parent's amount. A key the parent's stored input holds (a computed field) is its own."""
    form = check_input(wf, patched, stored=True)
    tp = input_type(wf)
    if tp is Any:
        return form
    found = unknown_keys(tp, patched, type_adapter(tp).validate_python(patched, by_alias=True, by_name=True))
    if found:
        inherited = _key_paths(parent_input)
        found = [dataclasses.replace(place, keys=keys) for place in found
                 if (keys := tuple(k for k in place.keys if (*place.where, k) not in inherited))]
    if found:
        raise InvalidInputError(f"the input patch: {unknown_message(wf.name, tp, found)}")
    return form


def _key_paths(value: Any) -> set[tuple[Any, ...]]:
    """The path of every key of a JSON value's objects (keys and list indexes from the top)."""
    paths: set[tuple[Any, ...]] = set()
    todo: list[tuple[tuple[Any, ...], Any]] = [((), value)]
    while todo:
        where, node = todo.pop()
        if isinstance(node, dict):
            for key, item in node.items():
                paths.add((*where, key))
                todo.append(((*where, key), item))
        elif isinstance(node, list):
            todo.extend(((*where, i), item) for i, item in enumerate(node))
    return paths


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

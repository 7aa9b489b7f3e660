"""A step's return value checked against its declared return type, where it is made.

Why: a step declared ``-> Charge`` that returned ``{"amount": "lots"}`` was stored as it came,
and the error surfaced later, as raw pydantic text, in whichever step read it first (or in the
step's own compensation, which then failed for good): the blame on the wrong step, the run's
store holding a value its own contract refuses. Checked here, the step that returned it fails,
permanently (running it again returns the same), naming itself and the type.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from raysaga.errors import InputTypeError, OutputTypeError
from raysaga.orchestrator.input_errors import problems, type_name
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.state import jsoncodec
from raysaga.state.json_form import needs_read_back, read_back_problem
from raysaga.types import COMPENSATE_SUFFIX, is_compensation

#: Types a value of exactly that type already is (nothing to validate).
EXACT = frozenset({int, str, float, bool, dict, list, type(None)})


def input_type_error(step: str, param: str, declared: Any, exc: ValidationError) -> InputTypeError:
    """``InputTypeError`` (``raysaga.errors``) for step ``step``, whose parameter ``param`` could
    not read its value as ``declared``: it names where the value came from and the fix."""
    if param == "input":
        source = "the run's input"
    elif param == "output" and is_compensation(step):  # an undo's ``output`` is its step's
        source = f"the output of step {step.removesuffix(COMPENSATE_SUFFIX)!r}"
    else:
        source = f"the output of step {param!r}"
    return InputTypeError(f"step {step!r} cannot read {source} as {type_name(declared)} ({problems(exc)}): "
                          "declare the type that step returns, or resume the run with the definition it "
                          "started under")


def check_output_type(returns: Any, value: Any, label: str) -> Any:
    """Raise ``OutputTypeError`` (``raysaga.errors``) naming step ``label`` if ``value`` is not a
    ``returns``; return it as one (what its JSON form must read back as: ``check_json_form``).

    Lax, as reading it back is (``workflow.coerce``): a dict a declared model validates, an int
    for a float; what passes here is what every reader of the output will accept (the caller lets
    None through unchecked: every reader takes it, for any declared type)."""
    if type(value) is returns and returns in EXACT:
        return value
    if isinstance(returns, type) and issubclass(returns, BaseModel) and isinstance(value, returns):
        return value
    if isinstance(returns, typing.TypeVar):
        return value
    try:
        adapter = type_adapter(returns)
    except Exception:  # an annotation pydantic cannot build a validator for: nothing to check with
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        shown = repr(value)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        raise OutputTypeError(
            f"step {label!r} returned {shown}, which is not its declared return type {type_name(returns)} "
            f"({problems(exc)}): return a value of that type, or change the annotation") from None


def check_json_form(returns: Any, made: Any, text: str, label: str, declared: bool = True) -> None:
    """Raise ``OutputTypeError`` naming step ``label`` if ``text``, the JSON form of its output
    ``made`` (a ``returns``), reads back as ``returns`` as another value: a union of models read as
    another member, an ``Any`` field's set or datetime as a list or a str, a ``SecretStr`` as its
    mask. Downstream steps (and the step's compensation) read that form, not the object returned;
    failing here blames the step that made it, before anything reads it. Only for types whose
    form can differ (``json_form.needs_read_back``, cached per type): plain JSON types pay nothing.
    ``declared=False``: ``returns`` is the type of an undeclared output, which its reader reads as a
    dict unless it declares the type: a form that type cannot read at all is not refused here."""
    if not read_back_needed(returns):
        return
    try:
        problem = read_back_problem(returns, made, jsoncodec.loads(text), "output", unreadable=declared)
    except Exception:  # an annotation pydantic cannot build a validator for: nothing to read back with
        return
    if problem:
        raise OutputTypeError(f"step {label!r} returned a value its stored JSON form does not keep: {problem}")


def read_back_needed(tp: Any) -> bool:
    """``json_form.needs_read_back``, True for an annotation it cannot hash (``Annotated[int, {"doc": 1}]``,
    a dict in its metadata: looked at, it would raise ``TypeError``): its metadata may hold a validator."""
    try:
        return needs_read_back(tp)
    except TypeError:
        return True

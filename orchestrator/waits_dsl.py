"""Declaring nodes that wait: a human approval and a durable sleep (``Workflow.approval``,
``Workflow.sleep``).

Both wait without holding anything: when nothing else in the run can progress, the driver
records the run ``waiting_human`` or ``waiting_timer`` and exits; a worker (or ``raysaga resume``)
takes the run up when a decision arrives or the time comes. What they ask and until when is in
their node's row, so a decision is checked by any process with no workflow code
(``raysaga.state.decisions``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from raysaga.errors import NotJSONableError, WorkflowDefinitionError
from raysaga.orchestrator.dsl_checks import check_common, step_where
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.state import jsoncodec
from raysaga.state.json_form import adapter_json
from raysaga.types import Approval, check_number, str_tuple

R = TypeVar("R")
#: The workflow's own spec builder and registration (``Workflow._make_spec``, ``Workflow._add``):
#: handed in, so this module does not import the workflow that imports it.
MakeSpec = Callable[..., StepSpec]
AddSpec = Callable[[StepSpec], None]
OnTimeout = Literal["reject", "default", "escalate"]
_ON_TIMEOUT = ("reject", "default", "escalate")


@dataclass(frozen=True)
class ApprovalOptions:
    """How an approval node decides (kept in its spec's ``options["approval"]``)."""

    approvers: tuple[str, ...] | None
    quorum: int
    answer_schema: dict[str, Any] | None
    answer_type: Any
    timeout: float | None
    on_timeout: OnTimeout
    default: Any
    escalate_to: tuple[str, ...]


def approval(make_spec: MakeSpec, add: AddSpec, *, name: str | None, after: Iterable[str],
             approvers: Iterable[str] | None,
             quorum: int, answer: Any, timeout: float | None, on_timeout: OnTimeout, default: Any,
             escalate_to: Iterable[str], critical: bool, on_failure: str, map_over: str | None
             ) -> Callable[[Callable[..., R]], Callable[..., R]]:
    def decorate(func: Callable[..., R]) -> Callable[..., R]:
        where = step_where(func, name)
        upstream = check_common(where, name=name, after=after, critical=critical, retry=None, timeout=None,
                                map_over=map_over)
        options = _options(where, approvers=approvers, quorum=quorum, answer=answer, timeout=timeout,
                           on_timeout=on_timeout, default=default, escalate_to=escalate_to)
        spec = make_spec(func, name=name, after=upstream, critical=critical, effect=False, effect_name=None,
                         retry=None, timeout=None, compensate=None, reconcile=None, map_over=map_over,
                         on_failure=on_failure)
        add(dataclasses.replace(spec, kind="approval", output_type=Approval, options={"approval": options}))
        return func

    return decorate


def sleep(make_spec: MakeSpec, add: AddSpec, name: str, *, seconds: float, after: Iterable[str]) -> None:
    check_number(f"sleep {name!r}", "seconds", seconds, minimum=0, allowed="a finite number of seconds >= 0")
    upstream = check_common(name, name=name, after=after, critical=True, retry=None, timeout=None, map_over=None)
    if not upstream:
        raise WorkflowDefinitionError(f"sleep {name!r} waits after something: give after=[...] the steps it follows")

    def slept() -> None:  # never called: the run machine settles a sleep node by its timer
        return None

    spec = make_spec(slept, name=name, after=upstream, critical=True, effect=False, effect_name=None,
                     retry=None, timeout=None, compensate=None, reconcile=None, map_over=None)
    add(dataclasses.replace(spec, kind="sleep", output_type=Any, options={"seconds": float(seconds)}))


def _options(where: str, *, approvers: Iterable[str] | None, quorum: int, answer: Any, timeout: float | None,
             on_timeout: str, default: Any, escalate_to: Iterable[str]) -> ApprovalOptions:
    names = None if approvers is None else _names(where, "approvers", approvers)
    if names is not None and not names:
        raise WorkflowDefinitionError(f"approval {where!r}: approvers= is empty, so nobody could decide: "
                                      "name at least one, or leave it out to let anyone decide")
    check_number(f"approval {where!r}", "quorum", quorum, minimum=1, integer=True, allowed="a whole number >= 1")
    distinct = None if names is None else tuple(dict.fromkeys(names))
    if distinct is not None and quorum > len(distinct):  # a quorum counts distinct people: a name twice is one
        twice = sorted({n for n in names or () if (names or ()).count(n) > 1})
        raise WorkflowDefinitionError(f"approval {where!r}: quorum={quorum} needs more approvers than the "
                                      f"{len(distinct)} named ({', '.join(distinct)})"
                                      + (f"; named more than once: {', '.join(twice)}" if twice else ""))
    check_number(f"approval {where!r}", "timeout", timeout, minimum=0, strict=True, optional=True,
                 allowed="None or a finite number of seconds > 0")
    if on_timeout not in _ON_TIMEOUT:
        raise WorkflowDefinitionError(f"approval {where!r}: on_timeout={on_timeout!r} is not one of "
                                      f"{', '.join(_ON_TIMEOUT)}")
    escalation = _names(where, "escalate_to", escalate_to)
    if on_timeout == "escalate" and (not escalation or timeout is None):
        raise WorkflowDefinitionError(f"approval {where!r}: on_timeout='escalate' needs timeout= and "
                                      "escalate_to=[...] (who decides once the first approvers did not)")
    schema = None
    if answer is not None:
        try:
            schema = _closed(type_adapter(answer).json_schema())
        except Exception as exc:
            raise WorkflowDefinitionError(f"approval {where!r}: answer={answer!r} has no JSON Schema "
                                          f"({exc}): use a pydantic model or a JSON type") from None
    if on_timeout == "default":
        if default is None:
            raise WorkflowDefinitionError(f"approval {where!r}: on_timeout='default' needs default= (the answer "
                                          "a timeout approves with)")
        if answer is not None:
            try:
                # by alias (``json_form.adapter_json``), as approvers answer and the next step reads it
                default = adapter_json(answer, type_adapter(answer).validate_python(default))
            except Exception as exc:
                raise WorkflowDefinitionError(f"approval {where!r}: default= does not fit answer= ({exc})") from None
        try:  # it becomes the node's output when the timeout answers: a set, NaN... failed then, or became null
            jsoncodec.to_jsonable(default, "default=")
        except (NotJSONableError, RecursionError) as exc:
            raise WorkflowDefinitionError(f"approval {where!r}: {exc}") from None
    return ApprovalOptions(approvers=names, quorum=quorum, answer_schema=schema, answer_type=answer,
                           timeout=timeout, on_timeout=on_timeout,  # type: ignore[arg-type]  # checked above
                           default=default, escalate_to=escalation)


#: Keywords whose value is one subschema, or a list or a map of them (what ``_closed`` walks).
_ONE = ("items", "additionalProperties", "not", "if", "then", "else", "contains", "propertyNames")
_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_MAP = ("properties", "$defs", "definitions", "patternProperties")


def _closed(schema: Any) -> Any:
    """``answer=``'s schema with every object of named fields closed (``additionalProperties:
    false``) unless it says otherwise (a model of ``extra="allow"``). The model drops a key it does
    not know, so an approver's ``{"amout": 7}`` was accepted and the field kept its old value; the
    store, holding only the schema, now refuses the unknown key and names it."""
    if isinstance(schema, dict):
        schema = {k: _closed_part(k, v) for k, v in schema.items()}
        if schema.get("type") == "object" and isinstance(schema.get("properties"), dict) \
                and "additionalProperties" not in schema and "patternProperties" not in schema:
            schema["additionalProperties"] = False
    return schema


def _closed_part(key: str, value: Any) -> Any:
    if key in _ONE:
        return _closed(value)
    if key in _MANY and isinstance(value, list):
        return [_closed(v) for v in value]
    if key in _MAP and isinstance(value, dict):
        return {k: _closed(v) for k, v in value.items()}
    return value


def _names(where: str, option: str, values: Iterable[str]) -> tuple[str, ...]:
    """``approvers=`` / ``escalate_to=`` as a tuple of non-blank names (``str_tuple``: an iterable
    of str, else the option named with an example). A str is refused, where ``str_tuple`` takes it
    as one name: a list of people written as one name is a mistake more often than not."""
    if isinstance(values, str):
        raise WorkflowDefinitionError(f"approval {where!r}: {option}= takes a list of names, not one str "
                                      f"({values!r}): write [{values!r}]")
    names = str_tuple(values, f"approval {where!r}", option, '["alice", "bob"]')
    blank = [v for v in names if not v.strip()]
    if blank:
        raise WorkflowDefinitionError(f"approval {where!r}: {option}= holds {blank!r}: names are non-empty str")
    return names

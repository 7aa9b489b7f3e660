"""The DSL's argument checks: every option ``@wf.step``, ``@wf.map``, ``@wf.agent`` and
``@wf.compensation`` take is checked where it is given, so a typo or a value of the wrong kind is
a ``WorkflowDefinitionError`` naming the step and the fix, never a bare ``TypeError`` later."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from raysaga.errors import WorkflowDefinitionError
from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.input_errors import type_name
from raysaga.orchestrator.options import RetryPolicy
from raysaga.orchestrator.resources import PLACEMENT_OPTIONS
from raysaga.orchestrator.run_input import input_problems
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.sagas.policy import FanOutResult
from raysaga.types import RateLimit, StepFailed, check_text, checked_options, str_tuple, unknown_option_message

F = TypeVar("F", bound=Callable[..., Any])


def unknown_option(kind: str) -> Callable[[str, list[str], list[str]], WorkflowDefinitionError]:
    """The error for options ``@wf.<kind>`` does not have, naming the step they were given to."""

    def error(where: str, unknown: list[str], options: list[str]) -> WorkflowDefinitionError:
        if kind == "agent":
            if "effect" in unknown:
                return WorkflowDefinitionError(
                    f"agent {where!r}: an agent node is not an effect itself: declare effect=True on its tools")
            placed = sorted(set(unknown) & set(PLACEMENT_OPTIONS))
            if placed:
                return WorkflowDefinitionError(
                    f"agent {where!r}: {placed} do not apply to an agent node: its model and tool calls run in "
                    "the executor's I/O pool (see docs/execution.md)")
        if kind == "map" and "local" in unknown:
            return WorkflowDefinitionError(
                f"step {where!r}: local=True does not apply to a fan-out's items: they run on Ray, in chunks. "
                "Declare local=True on the glue around it instead (the planner it maps over, the join)")
        return WorkflowDefinitionError(unknown_option_message(f"step {where!r}", unknown, options))

    return error


def plain_options(what: str) -> Callable[[F], F]:
    """Guard a call that names no step (``Workflow(...)``, ``@wf.compensation(...)``): a typo or
    arguments that do not fit are a ``WorkflowDefinitionError`` at once."""

    def guard(fn: F) -> F:
        return checked_options(
            fn, what=what, misfit=WorkflowDefinitionError,
            unknown=lambda where, strays, options: WorkflowDefinitionError(
                unknown_option_message(where, strays, options)))

    return guard


def decorator_options(kind: str) -> Callable[[F], F]:
    """Guard ``Workflow.<kind>``: a typo in its options, or arguments that do not fit it, is a
    ``WorkflowDefinitionError`` (naming the decorated step), not a bare ``TypeError``."""

    def guard(method: F) -> F:
        return checked_options(method, what=f"Workflow.{kind}()", unknown=unknown_option(kind),
                               misfit=WorkflowDefinitionError, decorator_factory=True,
                               fn_param="fn" if kind == "step" else None)

    return guard


def step_where(func: Any, name: Any) -> str:
    """How an argument check names the step: its ``name=``, else the function's name."""
    return str(name or getattr(func, "__name__", None) or repr(func))


def check_flag(where: str, option: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise WorkflowDefinitionError(f"step {where!r}: {option}= takes True or False, got {value!r}")


def check_optional_name(where: str, option: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise WorkflowDefinitionError(f"step {where!r}: {option}= takes a step name (a str), got {value!r}")


def check_common(where: str, *, name: Any, after: Any, critical: Any, retry: Any, timeout: Any,
                  map_over: Any) -> tuple[str, ...]:
    """Check the options every node kind takes; return ``after`` as a tuple of step names."""
    check_optional_name(where, "name", name)
    check_optional_name(where, "map_over", map_over)
    check_flag(where, "critical", critical)
    if retry is not None and not isinstance(retry, RetryPolicy):
        raise WorkflowDefinitionError(
            f"step {where!r}: retry= takes a RetryPolicy, e.g. retry=RetryPolicy(max_attempts=5), got {retry!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                or not math.isfinite(timeout) or timeout <= 0):
        raise WorkflowDefinitionError(
            f"step {where!r}: timeout must be a finite number of seconds > 0, got {timeout!r}")
    return str_tuple(after, f"step {where!r}", "after", '["reserve"]', takes="step names")


#: A run row's ``workflow_version`` column holds this many characters.
MAX_VERSION = 50


def checked_version(workflow: str, version: Any) -> str:
    """``version`` as the run rows store it: 1 to ``MAX_VERSION`` printable characters. Unchecked, a
    NUL or a longer version ran on SQLite and failed every run on PostgreSQL inside the database
    driver (a lone surrogate failed on both), long after the workflow was declared."""
    if version is None:
        raise WorkflowDefinitionError(f"workflow {workflow!r}: version=None: give a version "
                                      "(e.g. version=\"2\" or version=\"2026-05-01\"), or leave the default \"1\"")
    return check_text(str(version), f"workflow {workflow!r}: version", MAX_VERSION, error=lambda problem:
                      WorkflowDefinitionError(f"{problem} (e.g. version=\"2\" or version=\"2026-05-01\")"))


def rate_limit_problems(steps: Mapping[str, StepSpec]) -> list[str]:
    """Rate limits that share a name but not a rule: limits with one name are one limit, and the
    store counts each call by its caller's own rule, so two rules undid each other (a window of
    1 s pruned the grants a window of 60 s still counted). One problem per name, naming both."""
    first: dict[str, tuple[RateLimit, str]] = {}
    problems = []
    for spec in steps.values():
        declared = [(f"step {spec.name!r}", spec.rate_limit)]
        agent = spec.options.get("agent") if spec.kind == "agent" else None
        if agent is not None:
            declared.append((f"agent {agent.name!r} (its model calls, step {spec.name!r})", agent.rate_limit))
            declared += [(f"tool {t.name!r} of agent {agent.name!r} (step {spec.name!r})", t.rate_limit)
                         for t in agent.tools]
        for where, limit in declared:
            if limit is None:
                continue
            seen = first.setdefault(limit.name, (limit, where))
            if seen[0] != limit and seen[1] != "":
                problems.append(f"rate limit {limit.name!r} has two rules: {seen[0]!r} for {seen[1]} and {limit!r} "
                                f"for {where}; limits with one name are one limit: declare one RateLimit and share "
                                "it, or give the other its own name")
                first[limit.name] = (seen[0], "")  # said once
    return problems


def pass_problems(steps: Mapping[str, StepSpec]) -> list[str]:
    """A step reading a non-critical ``on_failure="pass"`` step with a type that cannot read the
    ``StepFailed`` record it receives when that step fails: it failed then, for good, with an
    ``InputTypeError`` telling the user to "declare the type that step returns" (they had)."""
    found = []
    for spec in steps.values():
        for dep in spec.param_deps:
            source = steps.get(dep)
            tp = spec.param_types.get(dep, Any)
            if source is None or source.on_failure != "pass" or tp is Any or spec.map_over == dep:
                continue
            record = StepFailed(step=dep, error_type="Permanent", message="")
            try:
                read = type_adapter(tp).validate_python(record.model_dump())
            except Exception:  # ValidationError, or an annotation pydantic cannot read with
                read = None
            if not isinstance(read, StepFailed | dict):
                name = getattr(tp, "__name__", None) or str(tp).replace("typing.", "")
                found.append(f"step {spec.name!r} reads {dep!r} as {name}, but {dep!r} has on_failure='pass': when "
                             f"it fails, {spec.name!r} receives a raysaga.types.StepFailed record instead; annotate "
                             f"the parameter {name} | StepFailed (from raysaga.types import StepFailed)")
    return found


def partial_problems(steps: Mapping[str, StepSpec],
                     compensations: Mapping[str, Callable[..., Any]] | None = None) -> list[str]:
    """A step (or its compensation) reading a fan-out whose policy is partial (``BEST_EFFORT``, a
    quorum, a decision function) with a type that cannot read the ``FanOutResult`` such a fan-out
    always hands on, even when every item succeeded: every item ran (and charged) first, then the
    reader failed for good and the run rolled back (a compensation's rollback failed), with advice
    to "declare the type that step returns". A type that reads it (the user's own model of some of
    its fields, a dataclass, a mapping) is fine, as at run time."""
    sample = FanOutResult(total=0).model_dump()
    found = []
    for spec in steps.values():
        readers = [(spec.name, spec.param_types, f"step {spec.name!r}")]
        undo = (compensations or {}).get(spec.name) or spec.compensate
        if undo is not None:
            readers.append((spec.name, _hints(undo), f"the compensation {getattr(undo, '__name__', '?')!r} "
                                                      f"of step {spec.name!r}"))
        for name, types, who in readers:
            for dep in spec.param_deps:
                source = steps.get(dep)
                tp = types.get(dep, Any)
                if (source is None or source.map_over is None or not source.fan_out_policy.partial or tp is Any
                        or spec.map_over == dep):
                    continue
                try:
                    type_adapter(tp).validate_python(sample)
                    continue
                except Exception:  # ValidationError, or an annotation pydantic cannot read with
                    pass
                shown = str(tp).replace("typing.", "") if getattr(tp, "__args__", None) else \
                    getattr(tp, "__name__", str(tp))
                found.append(f"{who} reads {dep!r} as {shown}, but {dep!r} is a fan-out with a partial policy "
                             f"({source.fan_out_policy.kind}): it hands {name!r} a raysaga.FanOutResult (successes "
                             f"and annotated failures), which {shown} cannot read; annotate the parameter "
                             "FanOutResult (from raysaga import FanOutResult) and read .outputs, or use the ALL "
                             "policy")
    return found


def _hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """A compensation's parameter types (none when its annotations cannot be resolved: it is then
    read untyped, as at run time)."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:  # a forward reference to a name the module does not have, a non-function
        return {}


def dataflow_problems(steps: Mapping[str, StepSpec], compensations: Mapping[str, Callable[..., Any]]) -> list[str]:
    """What ``Workflow.validate`` checks beyond the graph: rate limits, what readers receive, the run's
    input (what ``run`` and ``create_run`` refuse: ``run_input``)."""
    return [*rate_limit_problems(steps), *input_problems(steps), *unreadable_problems(steps, compensations),
            *pass_problems(steps), *partial_problems(steps, compensations)]


def unreadable_problems(steps: Mapping[str, StepSpec], compensations: Mapping[str, Callable[..., Any]]) -> list[str]:
    """A parameter (of a step or its compensation) annotated with a type pydantic cannot read a value
    as (a plain class): it was accepted, and the step failed when it ran, after the effects upstream
    of it, with pydantic's internal advice to set ``arbitrary_types_allowed``. Each type tried once
    (``type_adapter`` keeps what it builds for the run); the run's input is ``input_problems``'."""
    tried: dict[int, str | None] = {}
    found = []
    for spec in steps.values():
        readers = [(f"step {spec.name!r}", {p: spec.param_types.get(p, Any) for p in spec.param_deps})]
        undo = compensations.get(spec.name) or spec.compensate
        if undo is not None:
            hints = _hints(undo)
            readers.append((f"the compensation {getattr(undo, '__name__', '?')!r} of step {spec.name!r}",
                            {p: tp for p, tp in hints.items() if p not in ("return", "ctx")
                             and tp is not StepContext}))  # (its input too: read as declared, in a rollback)
        for who, types in readers:
            for param, tp in types.items():
                if tp is Any:
                    continue
                if id(tp) not in tried:
                    tried[id(tp)] = _unreadable(tp)
                if tried[id(tp)]:
                    found.append(f"{who}: parameter {param!r} is annotated {type_name(tp)}, {tried[id(tp)]}")
    return found


def _unreadable(tp: Any) -> str | None:
    """Why pydantic cannot read a value as ``tp`` (and the fix), or None."""
    try:
        type_adapter(tp)
        return None
    except Exception as exc:  # PydanticSchemaGenerationError, or any error building the validator
        plain = _plain_class(tp)
        if plain is not None:
            return (f"which pydantic cannot read a value as: {plain.__name__} is a plain class; make it a pydantic "
                    f"model (class {plain.__name__}(BaseModel)), a dataclass or a TypedDict, or leave the parameter "
                    "unannotated (it receives the JSON value: a dict, a list...)")
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        return (f"which pydantic cannot read a value as ({first[:200]}): annotate it with a pydantic model, a "
                "dataclass, a TypedDict or a JSON type, or leave it unannotated")


def _plain_class(tp: Any) -> type | None:
    """The class in ``tp`` (itself, or in its arguments) that pydantic has no validator for."""
    for arg in typing.get_args(tp):
        found = _plain_class(arg) if not isinstance(arg, list | tuple) else None
        if found is not None:
            return found
    if isinstance(tp, type) and not typing.get_args(tp) and not _structured(tp):
        try:
            type_adapter(tp)
        except Exception:  # this class is the one
            return tp
    return None


def _structured(tp: type) -> bool:
    """A TypedDict, dataclass or NamedTuple: no plain class, whatever pydantic says of it (a
    ``typing.TypedDict`` on Python < 3.12 wants ``typing_extensions``': its own message says so)."""
    return typing.is_typeddict(tp) or dataclasses.is_dataclass(tp) or (issubclass(tp, tuple) and hasattr(tp, "_fields"))

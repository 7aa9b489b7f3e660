"""Definition-time checks of a workflow's DAG (networkx) and its steps' contracts."""

from __future__ import annotations

import enum
import inspect
import types
import typing
from typing import Any

import networkx as nx
from pydantic import BaseModel

from raysaga.errors import WorkflowDefinitionError
from raysaga.orchestrator.secrets import Secret
from raysaga.orchestrator.spec import StepSpec
from raysaga.types import NAME_RE, NAME_RULE, WORKFLOW_NAME_RE, check_name

_SCALARS = (str, int, float, bool, type(None))

__all__ = ["NAME_RE", "NAME_RULE", "WORKFLOW_NAME_RE", "build_graph", "check_name", "compensation_target_problem",
           "json_type_problem", "validate"]

def build_graph(steps: dict[str, StepSpec]) -> nx.DiGraph:
    graph = nx.DiGraph()
    for name in steps:
        graph.add_node(name)
    for spec in steps.values():
        for dep in spec.deps:
            graph.add_edge(dep, spec.name)
    return graph


#: Parameter names that never mean a step's output: a step so named was accepted, and a dependent
#: declaring the parameter silently received the run input (or the context) instead of its output.
RESERVED_PARAMS = {"input": "run input", "ctx": "StepContext"}


def validate(workflow_name: str, steps: dict[str, StepSpec], compensations: dict[str, Any],
             problems: list[str] | None = None) -> nx.DiGraph:
    """Raise one ``WorkflowDefinitionError`` listing every problem (``problems``: those found
    before), each naming its culprit and fix."""
    problems = list(problems or [])
    if not steps:
        problems.append("it has no steps: decorate at least one function with @workflow.step")
    for name in [*steps, *compensations]:
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            problems.append(f"step name {name!r} is not valid: use {NAME_RULE}")
        elif name in RESERVED_PARAMS and name in steps:
            problems.append(f"step name {name!r} is reserved: a parameter named {name!r} receives the "
                            f"{RESERVED_PARAMS[name]}, so no step could read this step's output; rename it")
    for spec in steps.values():
        for dep in spec.deps:
            if dep == spec.name:
                problems.append(f"step {spec.name!r} depends on itself: remove {dep!r} from its parameters/after=")
            elif dep not in steps:
                problems.append(_unknown_dep(spec, dep, [n for n in steps if n != spec.name]))
        if spec.map_over is not None and spec.map_over not in spec.param_deps:
            problems.append(f"step {spec.name!r} maps over {spec.map_over!r}, which is not one of its parameters")
        bad = json_type_problem(spec.output_type)
        if bad:
            problems.append(
                f"step {spec.name!r} returns {_type_name(spec.output_type)}, which is not JSON-able ({bad}): "
                "return a pydantic model, dict, list, str, int, float, bool or None"
            )
    for target, fn in compensations.items():
        if target not in steps:
            problems.append(f"a compensation is registered for unknown step {target!r}: "
                            f"known steps are {sorted(steps)}")
        elif steps[target].compensate is not None:
            problems.append(f"step {target!r} has two compensations (compensate= and @compensation): keep one")
        else:
            problems.extend(compensation_problems(steps[target], fn))
    for spec in steps.values():
        if spec.compensate is not None:
            problems.extend(compensation_problems(spec, spec.compensate))
    graph = build_graph({k: v for k, v in steps.items()})
    graph.remove_edges_from(list(nx.selfloop_edges(graph)))
    try:
        cycle = nx.find_cycle(graph)
    except nx.NetworkXNoCycle:
        cycle = None
    if cycle:
        path = " -> ".join([edge[0] for edge in cycle] + [cycle[0][0]])
        problems.append(f"it has a cycle {path}: a workflow must be a DAG; break one of these dependencies")
    if problems:
        raise WorkflowDefinitionError(
            f"workflow {workflow_name!r} is invalid:\n" + "\n".join(f"  - {p}" for p in problems)
        )
    return graph


def _unknown_dep(spec: StepSpec, dep: str, known: list[str]) -> str:
    """What is wrong with a dependency on no step: where it was declared (a parameter, or
    ``after=``), the fix that fits, and the step it may have meant."""
    import difflib  # only on this error path

    close = difflib.get_close_matches(dep, known, n=1)
    guess = f"; did you mean {close[0]!r}?" if close else ""
    if dep in spec.param_deps:
        return (f"step {spec.name!r} depends on unknown step {dep!r} (its parameter {dep!r}{guess}): define a step "
                f"named {dep!r} or rename the parameter (use 'input' for the run input, 'ctx' for the context)")
    after = [d for d in spec.deps if d not in spec.param_deps]
    return (f"step {spec.name!r} depends on unknown step {dep!r} (from after={after}{guess}): "
            f"define a step named {dep!r} or fix after= (the steps are {sorted(known)})")


def compensation_target_problem(workflow_name: str, given: Any, steps: dict[str, StepSpec]) -> str:
    """Why ``@wf.compensation(given)`` is wrong when ``given`` is not a step's name: used bare, it
    got the compensation itself; given the step's function, it wants that step's name."""
    fn_name = getattr(given, "__name__", None)
    named = [n for n, spec in steps.items() if spec.fn is given or n == fn_name] if callable(given) else []
    usage = f"@{workflow_name}.compensation takes the name of the step it undoes"
    if named:
        return f"{usage}, not the step's function: @{workflow_name}.compensation({named[0]!r})"
    if callable(given) and isinstance(fn_name, str):
        return (f"{usage}, e.g. @{workflow_name}.compensation('charge') above def {fn_name}(...): used bare, "
                f"it was given the function {fn_name!r} itself")
    return f"{usage}, e.g. @{workflow_name}.compensation('charge'), got {given!r}"


#: What a compensation may ask for by parameter name, besides the step's own parameters.
COMPENSATION_PARAMS = frozenset({"ctx", "input", "output"})


def compensation_problems(spec: StepSpec, fn: Any) -> list[str]:
    """A compensation takes ``ctx``, ``input``, ``output`` (the step's committed output, or None
    if the step's outcome is unknown) and any of the step's own parameters, by name."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return [f"the compensation of step {spec.name!r} is not a function"]
    allowed = COMPENSATION_PARAMS | set(spec.param_deps) | ({spec.input_param} if spec.input_param else set())
    return [
        f"compensation {getattr(fn, '__name__', fn)!r} of step {spec.name!r} takes parameter {name!r}, which "
        f"nothing provides: use ctx, input, output or one of the step's parameters {sorted(spec.param_deps)}"
        for name, p in params.items()
        if name not in allowed and p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)
    ]


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")  # type: ignore[return-value]


def json_type_problem(tp: Any) -> str | None:
    """Why an annotated type cannot round-trip through JSON, or None if it can."""
    if tp is None or tp is Any or tp is typing.Any or tp in _SCALARS:
        return None
    if isinstance(tp, typing.TypeVar):
        return None
    if isinstance(tp, typing.NewType):  # (``UserId = NewType("UserId", int)``: a value of its supertype)
        return json_type_problem(tp.__supertype__)
    origin = typing.get_origin(tp)
    if origin is None:
        if isinstance(tp, type):
            if issubclass(tp, BaseModel | Secret):
                return None
            if issubclass(tp, enum.Enum) and issubclass(tp, str | int):  # (a StrEnum, an IntEnum: by value)
                return None
            if tp in (list, dict, tuple):
                return None
            if _is_typeddict(tp):
                return None
            return f"{tp.__name__} has no JSON form"
        return f"{tp!r} is not a type"
    args = typing.get_args(tp)
    if origin is typing.Literal:
        return None if all(isinstance(a, _SCALARS) for a in args) else "a Literal of non-JSON values"
    if origin is typing.Annotated:
        return json_type_problem(args[0])
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            problem = json_type_problem(arg)
            if problem:
                return problem
        return None
    if origin in (list, tuple):
        for arg in args:
            if arg is Ellipsis:
                continue
            problem = json_type_problem(arg)
            if problem:
                return problem
        return None
    if origin is dict:
        key, value = args or (str, Any)
        if key is not str:
            return "dict keys must be str in JSON"
        return json_type_problem(value)
    if origin in (set, frozenset):
        return "sets have no order and no JSON form; use a list"
    return f"{origin.__name__ if isinstance(origin, type) else origin} has no JSON form"


def _is_typeddict(tp: type) -> bool:
    return isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__annotations__") and hasattr(
        tp, "__total__"
    )

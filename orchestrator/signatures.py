"""How a step's (or a compensation's) parameters bind: which receive another step's output, the
run's input, the context; and which function shapes cannot be a step at all.

Why here, at definition: each refused shape used to be accepted and to fail only when a run
reached it: a generator step half-run before ``Task got bad yield``, a positional-only parameter
as a ``TypeError`` (raysaga passes inputs by name), a second context parameter as a missing
argument; a compensation's, half-way through a rollback, with the run stuck ``compensating``.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from raysaga.errors import WorkflowDefinitionError
from raysaga.orchestrator.context import StepContext

if TYPE_CHECKING:
    from raysaga.orchestrator.spec import StepSpec

INPUT_PARAM = "input"
CTX_PARAM = "ctx"


@dataclass
class Binding:
    """A function's parameters as the DSL reads them."""

    hints: dict[str, Any]
    param_deps: list[str] = field(default_factory=list)
    input_param: str | None = None
    ctx_param: str | None = None
    param_types: dict[str, Any] = field(default_factory=dict)
    optional: dict[str, Any] = field(default_factory=dict)
    """Parameters with a default named after no step (yet): each is a dependency if the workflow
    has a step of that name once it is complete (``Workflow.validate``), whatever the order in
    which the steps were declared; else the function's default."""


def bind(step_name: str, func: Any, steps: typing.Container[str], what: str | None = None) -> Binding:
    """Read ``func``'s parameters for step ``step_name``; ``steps`` are those declared so far.
    Raises ``WorkflowDefinitionError`` naming ``what`` (the step, or a compensation and its step),
    the parameter and the fix."""
    what = what or f"step {step_name!r}"
    shape = shape_problem(func)
    if shape:
        raise WorkflowDefinitionError(f"{what} {shape}")
    hints = type_hints(func, what)
    binding = Binding(hints)
    for pname, param in inspect.signature(func).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise WorkflowDefinitionError(f"{what}: *args/**kwargs are not supported; name each input")
        if param.kind is param.POSITIONAL_ONLY:
            raise WorkflowDefinitionError(
                f"{what}: parameter {pname!r} is positional-only (before '/'): raysaga passes every input "
                "by name; remove the '/'")
        annotation = hints.get(pname, Any)
        if annotation is StepContext or pname == CTX_PARAM:
            if binding.ctx_param is not None:
                raise WorkflowDefinitionError(
                    f"{what} takes the context twice ({binding.ctx_param!r} and {pname!r}): keep one")
            binding.ctx_param = pname
        elif pname == INPUT_PARAM:
            binding.input_param = pname
            binding.param_types[pname] = annotation
        elif pname == step_name:
            raise WorkflowDefinitionError(f"{what} depends on itself (parameter {pname!r}): rename the parameter")
        elif param.default is not inspect.Parameter.empty and pname not in steps:
            binding.optional[pname] = annotation
        else:
            binding.param_deps.append(pname)
            binding.param_types[pname] = annotation
    return binding


def type_hints(func: Any, what: str) -> dict[str, Any]:
    """``func``'s annotations resolved, ``Annotated`` metadata kept: a ``Field(gt=0)`` or an
    ``AfterValidator`` on a parameter or the return type is part of its contract (stripped, a step
    declared ``input: Annotated[int, Field(gt=0)]`` was run with -5). Raises
    ``WorkflowDefinitionError`` naming ``what`` when a name cannot be resolved, with the fix."""
    try:
        return typing.get_type_hints(func, include_extras=True)
    except NameError as exc:  # (a str annotation, or any under ``from __future__ import annotations``)
        name = getattr(exc, "name", None) or "it"
        raise WorkflowDefinitionError(
            f"{what}: its annotations cannot be resolved: {exc}: an annotation written as text (as every one is "
            f"under `from __future__ import annotations`) is looked up in the module's globals; define {name} "
            "before the step, at module level (not inside a function), or drop `from __future__ import "
            "annotations`") from None
    except Exception as exc:
        raise WorkflowDefinitionError(f"{what}: its annotations cannot be resolved: {exc}") from None


def shape_problem(func: Any) -> str | None:
    """Why ``func`` cannot be run as a step (it must return its output), or None."""
    if isinstance(func, type):
        return (f"is the class {func.__name__!r}: raysaga calls a step and stores what it returns; decorate a "
                "function (def) that builds and returns the value")
    if inspect.isasyncgenfunction(func) or inspect.isgeneratorfunction(func):
        return ("is a generator (it yields): raysaga stores the one value a step returns; return a list "
                "instead (a fan-out: map_over= over a step returning the list)")
    if not (inspect.isfunction(func) or inspect.ismethod(func)):
        return (f"is a {type(func).__name__} object ({func!r}), not a function: raysaga reads a step's inputs "
                "and types from its own signature; wrap it in a def that calls it")
    return None


def late_dependencies(steps: dict[str, StepSpec]) -> dict[str, StepSpec]:
    """``steps`` with each optional parameter named after a step made a dependency: the DAG is
    the same whichever order the steps were declared in (a parameter with a default named after
    a step declared *before* it was one already)."""
    resolved = dict(steps)
    for name, spec in steps.items():
        late = {p: tp for p, tp in spec.optional_params.items() if p in steps}
        if late:
            resolved[name] = dataclasses.replace(
                spec, deps=tuple(dict.fromkeys([*spec.deps, *late])), param_deps=(*spec.param_deps, *late),
                param_types={**spec.param_types, **late},
                optional_params={p: tp for p, tp in spec.optional_params.items() if p not in late})
    return resolved

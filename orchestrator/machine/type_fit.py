"""Whether the stored outputs of a run still fit the types its code declares now.

The definition hash leaves types out: a model gaining an optional field, a class renamed or moved,
``int`` widened to ``float`` are changes every stored output still fits, and hashing the types
would refuse those resumes (and make a fork re-run, under new keys, effects that still fit). What
must not happen is the other case: the code now declares a type a completed node's stored output
does not fit (``int`` -> a model). Resumed anyway, the first reader of that output fails for good
and the run rolls back an approved order. So when a run is restored, before anything is sent or
written, each step's stored output is read as the type each step still to run declares for it, and
as its compensation's ``output``; a misfit raises ``DefinitionChangedError`` naming the steps. (A
completed step's own return type is not checked: nothing reads its output as that again.)

One completed node per step is read (a fan-out's: one of its first items; they share their step's
types): a resume pays per step, not per item.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from raysaga.errors import DefinitionChangedError
from raysaga.node_key import NodeKey
from raysaga.orchestrator.input_errors import problems
from raysaga.orchestrator.keys import compensation_node
from raysaga.orchestrator.signatures import bind
from raysaga.orchestrator.workflow import Workflow, coerce

__all__ = ["check_types"]

#: A fan-out's items looked at for a completed one (they complete roughly in order).
SAMPLED_ITEMS = 8


#: ``check_types``'s ``run_input`` when the run's input is not to be checked.
NO_INPUT: Any = object()


def check_types(wf: Workflow, run_id: str, outputs: Mapping[NodeKey, Any], run_input: Any = NO_INPUT) -> None:
    """Raise ``DefinitionChangedError`` if a stored output (``outputs``: the completed nodes'
    values, as restored), or the run's stored input (``run_input``), does not read as what ``wf``
    declares for it in a step still to run (a new required input field: the step failed for good,
    and the run rolled back charges that had succeeded)."""
    sample: dict[str, Any] = {}  # step -> one completed node's output (an item's, for a fan-out)
    for step, spec in wf.steps.items():  # (a fan-out: one of its first items; not its parent's policy result)
        for index in (-1,) if spec.map_over is None else range(SAMPLED_ITEMS):
            value = outputs.get(NodeKey(step, index))
            if value is not None:
                sample[step] = value
                break
    misfits: list[str] = []
    producers: list[str] = []  # the steps whose stored output misfits: a fork from one runs it again
    for name, spec in wf.steps.items():
        if run_input is NO_INPUT or spec.input_param is None or (NodeKey(name) in outputs and spec.map_over is None):
            continue
        problem = _misfit(spec.param_types.get(spec.input_param, Any), run_input)
        if problem:
            misfits.append(f"step {name!r} cannot read the run's stored input ({problem})")
            break  # (every step reads the one input type: ``run_input.input_type``)
    if not sample and not misfits:
        return
    for step, value in sample.items():  # what a rollback's undo of it reads
        undo = wf.compensation_for(step)
        if undo is not None and callable(undo):
            try:
                declared = bind(compensation_node(step), undo, wf.steps).param_types.get("output", Any)
            except Exception:  # refused at definition already (``Workflow.validate``)
                continue
            problem = _misfit(declared, value)
            if problem:
                misfits.append(f"the compensation of step {step!r} cannot read its stored output ({problem})")
                producers.append(step)
    for name, spec in wf.steps.items():
        if NodeKey(name) in outputs and spec.map_over is None:
            continue  # completed: it reads nothing again
        for dep in spec.param_deps:
            value = sample.get(dep)
            upstream = wf.steps.get(dep)
            if value is None or upstream is None or not (upstream.critical or upstream.on_failure != "pass"):
                continue  # (a non-critical step passing its failure hands a record instead)
            if upstream.map_over is not None:
                if upstream.fan_out_policy.kind != "all":
                    continue  # its dependents read a FanOutResult
                value = [value]  # the list of its items' outputs
            elif dep == spec.map_over:
                if not isinstance(value, list) or not value:
                    continue
                value = value[0]  # each item reads one element
            problem = _misfit(spec.param_types.get(dep, Any), value)
            if problem:
                misfits.append(f"step {name!r} cannot read the stored output of step {dep!r} ({problem})")
                producers.append(dep)
    if misfits:
        first = min(producers, key=wf.order.index) if producers else None
        fork = f", or fork it from step {first!r} with this code (it runs again, under the fork's keys)" if first \
            else ""
        raise DefinitionChangedError(
            f"run {run_id!r}: the types this code of workflow {wf.name!r} declares do not fit what the run stored: "
            f"{'; '.join(misfits)}. Nothing was sent or written: go on with the code it started with (or "
            f"declare types what it stored fits){fork}")


def _misfit(declared: Any, value: Any) -> str | None:
    try:
        coerce(declared, value)
    except ValidationError as exc:
        return problems(exc)
    except Exception:  # an annotation pydantic cannot build a validator for: nothing to check with
        return None
    return None

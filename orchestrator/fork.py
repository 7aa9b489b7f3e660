"""Fork: a new run that re-runs a finished run from one node, without re-paying for the rest.

``fork(wf, RUN, from_node="writer")`` creates a run (new id, ``parent_run_id`` = RUN,
``forked_from`` = the node) whose nodes that are neither NODE nor downstream of it start
completed with the parent's outputs: their rows are copied into the new run in the transaction
that creates it (``Store.fork_run``), outputs kept as blobs referenced by digest, each row
marked with the run that executed it. The new run is then driven like a resume: the machine
restores the copied rows as completed, so NODE and everything downstream run afresh and nothing
else is called again. Effects it executes get the new run's keys (a key is derived from the run
id); the inherited ones are never executed again, and their ledger rows stay with the run that
wrote them (``Store.inherited_effects``). If the fork rolls back, an inherited node is undone
under the keys of the run that executed it, so parent and forks share one compensation key.

What is inherited, precisely: a node's row when it completed in the parent, was not undone
there nor by another run of its lineage (``undone_elsewhere``), its step did not change in the code (per-step hashes,
``raysaga.orchestrator.versions``), and every step it depends on was inherited whole. An agent
node forked at a turn (``research@2[1]``: researcher 1's third turn) keeps the turns before it
(model responses and tool results: no model call is repeated) and asks the model from that turn
on. An ``input_patch`` (a JSON merge patch of the run's input) is seen by the nodes that run
afresh; inherited ones keep what they computed, except the steps whose effect or undo depends on
the input (an effect step, an agent with an effect tool, or a step with a compensation, when the
step or its compensation reads ``input``): those run again, under the new run's keys.
"""

from __future__ import annotations

import inspect
import re
import shlex
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from typing import Any

from raysaga.errors import DefinitionChangedError, ForkError, InvalidInputError, NotJSONableError
from raysaga.node_key import NodeKey
from raysaga.orchestrator.fork_refusals import lineage_undos, refuse_in_doubt, refuse_unsettled, undone_elsewhere
from raysaga.orchestrator.machine.type_fit import check_types
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.run_identity import own_limit
from raysaga.orchestrator.run_input import check_patched
from raysaga.orchestrator.secrets import REF_KEY
from raysaga.orchestrator.signatures import INPUT_PARAM
from raysaga.orchestrator.tracing_ids import new_trace_id
from raysaga.orchestrator.versions import changes, step_hashes, types_may_differ
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import (
    NewRun,
    NodeRecord,
    NodeStatus,
    RunRecord,
    Store,
    jsoncodec,
)
from raysaga.state.models import PRUNABLE
from raysaga.types import check_run_id, is_compensation

__all__ = ["NO_PATCH", "fork", "inherited_rows", "input_reruns", "merge_patch", "node_list", "parse_node",
           "undone_elsewhere"]

_refuse_in_doubt = refuse_in_doubt  # its name before it moved (tests call it)

#: ``fork(..., input_patch=NO_PATCH)`` (the default): the fork keeps its parent's input. Any other
#: value, ``None`` included, is a JSON merge patch (RFC 7396: a ``null`` patch makes the input null,
#: which the input type check then judges).
NO_PATCH: Any = type("NoPatch", (), {"__repr__": lambda self: "NO_PATCH"})()

# ASCII digits only: ``\d`` also matches Arabic-Indic and mathematical digits (which ``int`` reads),
# and ``int`` alone takes ' 1', '+2' and '1_0'. Step names never hold '@', '.', ':', '[', ']' or spaces.
_LABEL = re.compile(r"(?P<step>[^\[\]@.:\s]+)(?:@(?P<turn>[0-9]{1,10})(?:\.(?P<call>[0-9]{1,10}))?)?"
                    r"(?P<undo>:compensate)?(?:\[(?P<index>[0-9]{1,10})\])?", re.ASCII)


def parse_node(label: str) -> NodeKey:
    """A node label as ``raysaga status`` shows it (``writer``, ``research[2]``, ``research@2[1]``)."""
    found = _LABEL.fullmatch(label.strip())
    if found is None:
        raise ForkError(f"{label!r} is not a node label: write STEP, STEP[ITEM] or AGENT@TURN[ITEM], ITEM and TURN "
                        "in ASCII digits (as `raysaga status RUN` shows them)")

    turn, call, index = (None if text is None else int(text) for text in found.group("turn", "call", "index"))
    return NodeKey(found["step"], -1 if index is None else index, turn, call, found["undo"] is not None)


def merge_patch(target: Any, patch: Any) -> Any:
    """``target`` with the JSON merge patch ``patch`` applied (RFC 7396: null removes a key). A
    stored ``Secret`` (``{"$secret": ...}``, a reference) is opaque: a patch replaces it whole."""
    if not isinstance(patch, dict):
        return patch
    opaque = isinstance(target, dict) and REF_KEY in target
    result = dict(target) if isinstance(target, dict) and not opaque else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def node_list(wf: Workflow, rows: list[NodeRecord]) -> str:
    """The nodes of a run, for a message: each step, a fan-out's items as a range, agents' turns."""
    items: dict[str, set[int]] = defaultdict(set)
    turns: dict[str, set[int]] = defaultdict(set)
    for row in rows:
        key = NodeKey.parse(row.node_id, row.fan_index)
        if key.fan_index >= 0 and not key.compensates:
            items[key.step].add(key.fan_index)
        if key.turn is not None and key.call is None:
            turns[key.step].add(key.turn)
    shown = []
    for step in wf.order:
        text = step
        if items.get(step):
            text += f"[0..{max(items[step])}]"
        if turns.get(step):
            text += f" (turns {step}@0..{max(turns[step])})"
        shown.append(text)
    return ", ".join(shown)


def _check_node(wf: Workflow, rows: list[NodeRecord], at: NodeKey, label: str, run_id: str) -> None:
    where = f"run {run_id!r} has no node {label!r}"
    nodes = f"the nodes there are: {node_list(wf, rows)}"
    if at.step not in wf.steps:
        raise ForkError(f"{where}: {nodes}")
    if at.compensates:
        raise ForkError(f"cannot fork from a compensation ({label!r}): fork from the step it undoes, {at.step!r}")
    if at.call is not None:
        raise ForkError(f"cannot fork from a tool call ({label!r}): fork from its turn, "
                        f"{NodeKey(at.step, at.fan_index, at.turn).label!r} (that turn's model call is asked again)")
    spec = wf.steps[at.step]
    present = {(r.node_id, r.fan_index) for r in rows}
    if at.fan_index >= 0 and (spec.map_over is None or (at.step, at.fan_index) not in present):
        raise ForkError(f"{where}: {nodes}")
    if at.turn is not None:
        if spec.kind != "agent":
            raise ForkError(f"{at.step!r} is not an agent, so it has no turns: fork from {at.step!r}")
        if (at.node_id, at.fan_index) not in present:
            raise ForkError(f"{where}: {nodes}")


def _settled_call(key: NodeKey, row: NodeRecord) -> bool:
    """An agent's sub-node whose answer is part of the conversation: a response, a tool result,
    or a tool call that failed for good (the model was told)."""
    return row.status == NodeStatus.COMPLETED or (key.call is not None and row.status == NodeStatus.FAILED)


def _takes_input(fn: Callable[..., Any]) -> bool:
    try:
        return INPUT_PARAM in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True  # cannot tell: as if it did (re-running costs less than an undo with the wrong input)


def input_bound(wf: Workflow, step: str) -> bool:
    """Whether ``step``'s effect or undo depends on the run's input, so that a fork with another
    input must run it again: it makes an effect (``effect=True``, or an agent with an effect tool)
    or has a compensation, and it or its compensation reads ``input`` (the undo is called with
    the fork's input: a refund of the parent's charge must not go to the patched account)."""
    spec = wf.steps[step]
    undo = wf.compensation_for(step)
    tools = getattr(spec.options.get("agent"), "tools", ()) if spec.kind == "agent" else ()
    effect = spec.effect or undo is not None or any(getattr(t, "effect", False) for t in tools)
    return effect and (spec.input_param is not None or (undo is not None and _takes_input(undo)))


def input_reruns(wf: Workflow, st: Store, run_id: str, from_node: str, patch: Any) -> list[tuple[str, str]]:
    """What a fork with ``patch`` runs again that a fork without it would inherit, of the steps the
    parent completed that make an effect (or have an undo) or ask a human: ``(step, why)``, why
    ``"input"`` (the patch changes the input its effect or undo reads: ``input_bound``) or
    ``"upstream"`` (it reads a step that runs again). Empty when the fork would be refused
    (``fork`` says why)."""
    if patch is NO_PATCH:
        return []
    try:
        at = parse_node(from_node)
        parent = st.get_run(run_id)
        if not _fork_input(wf, parent, patch)[1]:
            return []
    except (ForkError, InvalidInputError):
        return []
    rows = st.node_states(run_id)
    same = {r.node_id for r in inherited_rows(wf, rows, at)}
    patched = {r.node_id for r in inherited_rows(wf, rows, at, input_changed=True)}
    lost = {NodeKey.parse(node_id).step for node_id in same - patched}
    found = []
    for step in wf.order:
        spec = wf.steps[step]
        tools = getattr(spec.options.get("agent"), "tools", ()) if spec.kind == "agent" else ()
        matters = spec.effect or wf.compensation_for(step) is not None or spec.kind == "approval" \
            or any(getattr(t, "effect", False) for t in tools)
        if step in lost and matters:
            found.append((step, "input" if input_bound(wf, step) else "upstream"))
    return found


def inherited_rows(wf: Workflow, rows: list[NodeRecord], at: NodeKey, *, changed: set[str] | None = None,
                   input_changed: bool = False, undone_elsewhere: set[tuple[str, int]] | None = None
                   ) -> list[NodeRecord]:
    """The parent's rows a fork from ``at`` starts with (module docstring: what is inherited).
    ``undone_elsewhere``: nodes another run of the lineage undid (``undone_elsewhere()``)."""
    changed = changed or set()
    owners: dict[str, dict[int, NodeRecord]] = defaultdict(dict)
    calls: dict[tuple[str, int], list[tuple[NodeKey, NodeRecord]]] = defaultdict(list)
    undone: set[tuple[str, int]] = set(undone_elsewhere or ())
    for row in rows:
        key = NodeKey.parse(row.node_id, row.fan_index)
        if is_compensation(row.node_id):
            if row.status == NodeStatus.COMPLETED:  # one that did not complete undid nothing known (``fork`` refuses)
                undone.add((key.step, key.fan_index))  # the step, item or agent node one of whose effects was undone
        elif key.is_agent_call:
            calls[(key.step, key.fan_index)].append((key, row))
        else:
            owners[key.step][key.fan_index] = row

    def usable(step: str, index: int) -> NodeRecord | None:
        row = owners[step].get(index)
        return row if row is not None and row.status == NodeStatus.COMPLETED and (step, index) not in undone else None

    kept: list[NodeRecord] = []
    whole: set[str] = set()  # steps inherited whole: their dependents may be inherited
    for step in wf.order:
        spec = wf.steps[step]
        if step in changed or any(dep not in whole for dep in spec.deps):
            continue
        if input_changed and input_bound(wf, step):
            continue  # its effect depends on the input: it runs again under the new run's keys
        items = [i for i in owners[step] if i >= 0]
        # a fan-out one of whose items was undone is expanded again (its parent row is not kept)
        parent_ok = usable(step, -1) is not None and not any((step, i) in undone for i in items)
        # a partial fan-out that completed accepted its failed items: they are part of its outcome
        # (its FanOutResult names them), kept like its completed ones, never run again unasked
        failed_ok = parent_ok and spec.map_over is not None and spec.fan_out_policy.partial
        for index in sorted(owners[step]):
            if step == at.step and (index == at.fan_index or index < 0 or at.fan_index < 0):
                continue  # NODE itself (and a fan-out's parent, which completes with its items)
            found = usable(step, index) if index >= 0 or parent_ok else None
            if found is None and failed_ok and index >= 0 and owners[step][index].status == NodeStatus.FAILED:
                found = owners[step][index]
            if found is not None:
                kept.append(found)
                kept += [r for k, r in calls[(step, index)] if _settled_call(k, r)]
            elif spec.kind == "agent" and (step, index) not in undone:  # an unfinished agent keeps its turns
                kept += [r for k, r in calls[(step, index)] if _settled_call(k, r)]
        if step == at.step:
            if at.turn is not None and (step, at.fan_index) not in undone:
                kept += [r for k, r in calls[(step, at.fan_index)]
                         if k.turn is not None and k.turn < at.turn and _settled_call(k, r)]
        elif parent_ok and (spec.map_over is None or spec.fan_out_policy.partial
                            or all(usable(step, i) is not None for i in items)):
            whole.add(step)  # a partial fan-out's output is its parent's row (its FanOutResult)
    return kept


def _fork_input(wf: Workflow, parent: RunRecord, patch: Any) -> tuple[Any, bool]:
    """The fork's input (checked by the code it forks with) and whether it differs from the
    parent's. Without a patch it is the parent's: a new optional field filled by its default is
    not a change (the parent's effects were made with that input), but an input the code no longer
    accepts is refused. With one, it differs when the patched input, checked, differs from the
    parent's input checked by the same code, or the parent's no longer fits it (the patch made it fit)."""
    try:
        before: Any = wf.check_input(parent.input, stored=True)  # (field names, computed fields: as stored)
    except InvalidInputError as exc:
        if patch is NO_PATCH:
            raise ForkError(f"run {parent.run_id!r}'s input does not fit the input type of the code you fork with "
                            f"({exc}): give an input patch that makes it fit (--input-patch), or fork with the code "
                            "the run started with") from None
        before = NO_PATCH
    if patch is NO_PATCH:
        return before, False
    try:  # strict JSON: the input check would let a NaN through as null for a dict input type
        jsoncodec.to_jsonable(patch, "input_patch")
    except (NotJSONableError, RecursionError) as exc:
        raise InvalidInputError(str(exc)) from None
    checked = check_patched(wf, parent.input, merge_patch(parent.input, patch))
    return checked, before is NO_PATCH or jsoncodec.dumps(checked, "input") != jsoncodec.dumps(before, "input")


def _check_inherited_types(wf: Workflow, st: Store, parent: RunRecord, keys: set[tuple[str, int]],
                           run_input: Any) -> None:
    """``ForkError`` when an output the fork inherits (or its input) does not read as ``wf``'s types
    in a step that runs afresh (``machine.type_fit``, a resume's check): not refused, the first reader
    failed for good and the fork rolled back, refunding its parent's charges under the parent's keys."""
    done = [n for n in st.nodes(parent.run_id)
            if (n.node_id, n.fan_index) in keys and n.status == NodeStatus.COMPLETED and n.node_id in wf.steps]
    blobs = st.load_blobs({n.output_digest: f"node {n.label}" for n in done if n.output_digest})
    outputs = {NodeKey.parse(n.node_id, n.fan_index): blobs[n.output_digest] if n.output_digest else n.output
               for n in done}
    try:
        check_types(wf, parent.run_id, outputs, run_input)
    except DefinitionChangedError as exc:
        raise ForkError(f"the fork would inherit what this code cannot read: {exc}") from None


def _fork_limit(given: int | None, opts: RunOptions, parent: RunRecord) -> int | None:
    """The fork's own ``max_driver_deaths``: ``given``, else the options' when not the default,
    else its parent's."""
    if given is not None:
        return own_limit(given)
    if opts.max_driver_deaths != RunOptions.max_driver_deaths:
        return own_limit(opts.max_driver_deaths)
    return parent.max_driver_deaths


def fork(workflow: Workflow, run_id: str, *, from_node: str, input_patch: Any = NO_PATCH,
         store: Store | str | None = None, new_run_id: str | None = None, executor: Any = "ray",
         address: str | None = None, options: RunOptions | None = None, workflow_ref: str | None = None,
         on_progress: Callable[[Any], None] | None = None, drive: bool = True,
         max_driver_deaths: int | None = None) -> RunRecord:
    """Fork the run ``run_id`` at rest from the node ``from_node`` and drive the new run.

    Args:
        workflow: The workflow's definition now (steps changed since the parent ran are re-run).
        run_id: The parent run (completed, failed, compensated, compensation_failed or cancelled).
        from_node: ``STEP``, ``STEP[ITEM]`` or ``AGENT@TURN[ITEM]``, as ``raysaga status`` shows it.
        input_patch: A JSON merge patch of the parent's input (``null`` removes a key; ``None``
            itself makes the input null). Left out (``NO_PATCH``), the fork keeps the input.
        new_run_id: The new run's id (default: ``<workflow>-<random>``).
        options: The new run's options (budgets default to the parent's).
        workflow_ref: ``MODULE:ATTR`` for ``raysaga resume`` (default: the parent's; ``""``: none, so
            ``resume`` asks for ``--workflow``).
        drive: False: record the fork as ``pending`` and return it (``raysaga resume`` drives it).
        max_driver_deaths: The fork's limit, whatever the parent's (``raysaga fork
            --max-driver-deaths``; the default, 3, records none of its own: the driving process's
            applies, as for any run). None: ``options.max_driver_deaths`` when it is not the
            default, else the parent's own limit (the default value cannot say "not the parent's").

    Returns:
        The new run's record (at rest when driven).
    """
    from raysaga.orchestrator import runner  # the driver and the executors, only when a fork is made
    from raysaga.orchestrator.executor import Executor, make_executor

    with runner.using_store(store) as st:  # a store opened here (a URL, None) is closed on the way out
        workflow.validate()
        parent = st.get_run(run_id)
        if parent.status not in PRUNABLE:
            raise ForkError(f"run {run_id!r} is {parent.status.value}: only a run at rest (completed, failed, "
                            "compensated, compensation_failed, cancelled) can be forked; wait for it, or "
                            f"`raysaga cancel {shlex.quote(run_id)}`")
        if parent.workflow_name != workflow.name:
            raise ForkError(f"run {run_id!r} is a run of workflow {parent.workflow_name!r}, not {workflow.name!r}: "
                            "fork it with its own workflow (--workflow MODULE:WF)")
        rows = st.node_states(run_id)  # no outputs: they are copied inside the store
        at = parse_node(from_node)
        _check_node(workflow, rows, at, from_node, run_id)
        diff = changes(parent, workflow)
        if diff is not None and not diff.known:
            raise ForkError(f"run {run_id!r} was recorded without per-step hashes and its workflow's definition "
                            f"changed since: fork it with the code it started with ({diff.describe()})")
        checked, input_changed = _fork_input(workflow, parent, input_patch)
        undos = lineage_undos(st, run_id, rows, workflow, parent.status)
        inherited = inherited_rows(workflow, rows, at, changed=diff.steps() if diff else set(),
                                   input_changed=input_changed, undone_elsewhere=undos.undone)
        keys = [(r.node_id, r.fan_index) for r in inherited]
        if types_may_differ(parent, workflow):  # what it inherits must read as this code's types
            _check_inherited_types(workflow, st, parent, set(keys), checked)
        refuse_in_doubt(workflow, st.effects(run_id), at, parent, set(keys), undos.settled)
        refuse_unsettled(workflow, st, undos.unsettled, at, parent)
        if new_run_id is not None:
            check_run_id(new_run_id, "--run-id")
        opts = options or RunOptions()
        new = NewRun(
            run_id=new_run_id or f"{workflow.name}-{uuid.uuid4().hex[:12]}", workflow_name=workflow.name,
            workflow_version=workflow.version, definition_hash=workflow.definition_hash,
            step_hashes=step_hashes(workflow), input=checked,
            workflow_ref=parent.workflow_ref if workflow_ref is None else (workflow_ref or None),
            deadline_at=time.time() + opts.deadline if opts.deadline else None,
            retry_budget=opts.retry_budget if opts.retry_budget is not None else parent.retry_budget,
            token_budget=opts.token_budget if opts.token_budget is not None else parent.token_budget,
            cost_budget=opts.cost_budget if opts.cost_budget is not None else parent.cost_budget,
            max_driver_deaths=_fork_limit(max_driver_deaths, opts, parent),
            trace_id=new_trace_id(), parent_run_id=run_id, forked_from=at.label,
            labels=opts.labels or None)  # None: the parent's
        data = {"parent": run_id, "from": at.label, "inherited": len(inherited),
                "input_patched": input_patch is not NO_PATCH, "changed_steps": sorted(diff.steps()) if diff else []}
        if not drive:
            return st.fork_run(new, keys, data)
        # the executor first (as `run` does): a cluster that cannot be reached leaves no pending fork behind
        ex = executor if isinstance(executor, Executor) else make_executor(executor, address=address)
        try:
            record = st.fork_run(new, keys, data)
            return runner.resume(workflow, record.run_id, store=st, executor=ex, options=options,
                                 on_progress=on_progress)
        finally:
            if ex is not executor:
                ex.shutdown()


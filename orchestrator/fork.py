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
from collections.abc import Set as AbstractSet
from typing import Any

import networkx as nx

from raysaga.errors import ForkError, InvalidInputError, NotJSONableError
from raysaga.node_key import NodeKey
from raysaga.orchestrator.options import RunOptions
from raysaga.orchestrator.run_identity import own_limit
from raysaga.orchestrator.secrets import REF_KEY
from raysaga.orchestrator.signatures import INPUT_PARAM
from raysaga.orchestrator.tracing_ids import new_trace_id
from raysaga.orchestrator.versions import changes, step_hashes
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import (
    EffectRecord,
    EffectStatus,
    NewRun,
    NodeRecord,
    NodeStatus,
    RunRecord,
    RunStatus,
    Store,
    jsoncodec,
)
from raysaga.state.models import PRUNABLE, node_label
from raysaga.types import check_run_id, is_compensation

__all__ = ["NO_PATCH", "fork", "inherited_rows", "input_reruns", "merge_patch", "node_list", "parse_node",
           "undone_elsewhere"]

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


def _lineage_undos(st: Store, run_id: str, rows: list[NodeRecord]
                   ) -> tuple[set[tuple[str, int]], list[tuple[str, NodeRecord]]]:
    """``undone_elsewhere``, and the compensations of the parent's nodes, in any run of the lineage
    (the parent's own included), that did not complete: ``(run, row)``."""
    executed_by = {(r.node_id, r.fan_index): r.origin_run_id or run_id for r in rows
                   if r.status == NodeStatus.COMPLETED and not is_compensation(r.node_id)}
    unsettled = [(run_id, r) for r in rows if is_compensation(r.node_id) and r.status != NodeStatus.COMPLETED]
    settled = {_undone_target(r) for r in rows if is_compensation(r.node_id) and r.status == NodeStatus.COMPLETED}
    found: set[tuple[str, int]] = set()
    for other in st.lineage(set(executed_by.values())):
        if other == run_id:
            continue  # the parent's own compensations are in ``rows``
        theirs = st.node_states(other)
        by_key = {(r.node_id, r.fan_index): r for r in theirs}
        for row in theirs:
            if not is_compensation(row.node_id):
                continue
            target = NodeKey.parse(row.node_id, row.fan_index).undone()
            undone_row = by_key.get((target.node_id, target.fan_index))
            executor = (undone_row.origin_run_id if undone_row is not None else None) or other
            if executed_by.get((target.node_id, target.fan_index)) != executor:
                continue
            if row.status == NodeStatus.COMPLETED:
                found.add((target.step, target.fan_index))
                settled.add((target.node_id, target.fan_index))
            else:  # its undo failed or never finished: the effect may well stand, and may yet be undone
                unsettled.append((other, row))
    # an undo that failed in one run and completed in another (the same node, so the same key: the
    # provider refunded once) is settled: the effect no longer stands, a retry of the failed one is deduped
    return found, [(run, r) for run, r in unsettled if _undone_target(r) not in settled]


def _undone_target(row: NodeRecord) -> tuple[str, int]:
    """The node a compensation row undoes, exactly (an agent's one tool call, not the agent)."""
    target = NodeKey.parse(row.node_id, row.fan_index).undone()
    return target.node_id, target.fan_index


def undone_elsewhere(st: Store, run_id: str, rows: list[NodeRecord]) -> set[tuple[str, int]]:
    """``(step, item)`` of the parent's rows whose execution another run undid: the run that
    executed it, or any of its forks (every fork of a run undoes an inherited node under that
    run's key). A node refunded by a sibling fork is no longer in force, however the parent's own
    rows read: a fork that inherited it would ship an order whose payment was given back. Only a
    compensation that completed undid anything (a failed one is refused by ``fork``)."""
    return _lineage_undos(st, run_id, rows)[0]


def _rerun_by_choice(wf: Workflow, at: NodeKey) -> Callable[[NodeKey], bool]:
    """Whether a fork from ``at`` runs the node again by its own choice: ``at``'s step (or, forked
    from an item, that item only) and everything downstream of it. An agent forked at a turn keeps
    the turns before it and asks that turn and the later ones again (their tool calls with them)."""
    below = set(nx.descendants(wf.graph, at.step))

    def chosen(key: NodeKey) -> bool:
        same = key.step == at.step and (at.fan_index < 0 or key.fan_index == at.fan_index)
        # forked at a turn: that turn and the later ones (their tool calls) run again
        return key.step in below or (same and (at.turn is None or (key.turn is not None and key.turn >= at.turn)))

    return chosen


def _refuse_unsettled(wf: Workflow, st: Store, unsettled: list[tuple[str, NodeRecord]], at: NodeKey,
                      parent: RunRecord) -> None:
    """``ForkError`` when a compensation of a node the fork would inherit failed or never finished
    (a ``compensation_failed`` parent, say): the effect it undoes may still stand, and a retry of
    that rollback may undo it later. Counted as undone, the fork would make the effect again while
    the first one stands; inherited, the fork would build on an effect its run is still undoing."""
    chosen = _rerun_by_choice(wf, at)
    left = [(run, r) for run, r in unsettled if not chosen(NodeKey.parse(r.node_id, r.fan_index).undone())]
    if not left:
        return
    shown = ", ".join(f"{node_label(r.node_id, r.fan_index)} ({r.status.value}"
                      + ("" if run == parent.run_id else f" in run {run!r}") + ")" for run, r in left[:5])
    ways = []
    for run in sorted({run for run, _ in left}, key=lambda run: (run != parent.run_id, run)):
        status = (parent if run == parent.run_id else st.get_run(run, lenient=True)).status
        if status == RunStatus.COMPENSATION_FAILED:  # only such a rollback can be retried
            ways.append(f"`raysaga retry {shlex.quote(run)} --compensations` finishes its rollback")
        elif status not in PRUNABLE:
            ways.append(f"run {run!r} is {status.value}: wait for it")
        else:  # a run cancelled while it was compensating, say: its undo is the operator's
            ways.append(f"undo run {run!r}'s with the provider")
    way = "; ".join(ways)
    first = min((NodeKey.parse(r.node_id, r.fan_index).step for _, r in left), key=wf.order.index)
    raise ForkError(f"run {parent.run_id!r} has {len(left)} compensation(s) that did not complete: {shown}. The "
                    f"effects they undo may still stand, so a fork from {at.label!r} can neither inherit them nor "
                    f"make them again. {way[0].upper() + way[1:]} (then fork); or fork from {first!r} to run it again "
                    "on purpose")


def _refuse_in_doubt(wf: Workflow, effects: list[EffectRecord], at: NodeKey, parent: RunRecord,
                     inherited: AbstractSet[tuple[str, int]] = frozenset()) -> None:
    """``ForkError`` when a node the fork would run again *before* ``at`` (not inherited) has an
    effect whose outcome is unknown in the parent (ledger ``pending`` or ``abandoned``: the call
    may have happened; a cancel mid-charge, say). The fork's keys are its own, so the provider could
    not dedupe it: the card would be charged twice. Forking from that node (or before it) re-runs it
    on purpose. An inherited node (an agent's tool call the model was told failed) is not called again."""
    below = set(nx.descendants(wf.graph, at.step))  # re-run by the fork's own choice, with ``at``:

    def chosen(e: EffectRecord) -> bool:  # the step, or (forked from an item) that item only
        step = NodeKey.parse(e.node_id, e.fan_index).step
        return step in below or (step == at.step and (at.fan_index < 0 or e.fan_index == at.fan_index))

    doubtful = [e for e in effects if e.status in (EffectStatus.PENDING, EffectStatus.ABANDONED)
                and not is_compensation(e.node_id) and not chosen(e) and (e.node_id, e.fan_index) not in inherited]
    if not doubtful:
        return
    shown = ", ".join(f"{node_label(e.node_id, e.fan_index)} ({e.effect_name}, key {e.idempotency_key})"
                      for e in doubtful[:5])
    first = min((NodeKey.parse(e.node_id, e.fan_index).step for e in doubtful), key=wf.order.index)
    quoted = shlex.quote(parent.run_id)
    late = parent.deadline_at is not None and time.time() >= parent.deadline_at and parent.status == RunStatus.FAILED
    retry = f"`raysaga retry {quoted}` settles them under their keys; or check "
    way = (f"A retry of it is refused past its deadline: `raysaga cancel {quoted} --compensate` undoes them "
           "under their keys; or check " if late else retry
           if parent.status in (RunStatus.FAILED, RunStatus.COMPENSATION_FAILED) else "Check ")
    raise ForkError(f"run {parent.run_id!r} left {len(doubtful)} effect(s) whose outcome is unknown (the call may "
                    f"have happened): {shown}. A fork from {at.label!r} would call them again under new keys, "
                    f"which the provider cannot dedupe. {way}them with the provider, then fork from "
                    f"{first!r} to run it again on purpose")


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
        before: Any = wf.check_input(parent.input)
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
    checked = wf.check_input(merge_patch(parent.input, patch))
    return checked, before is NO_PATCH or jsoncodec.dumps(checked, "input") != jsoncodec.dumps(before, "input")


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
        undone, unsettled = _lineage_undos(st, run_id, rows)
        inherited = inherited_rows(workflow, rows, at, changed=diff.steps() if diff else set(),
                                   input_changed=input_changed, undone_elsewhere=undone)
        keys = [(r.node_id, r.fan_index) for r in inherited]
        _refuse_in_doubt(workflow, st.effects(run_id), at, parent, set(keys))
        _refuse_unsettled(workflow, st, unsettled, at, parent)
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


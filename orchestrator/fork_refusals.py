"""What a fork must not inherit nor make again, read from its lineage's rollbacks (``fork`` asks).

A node a fork would inherit may have been undone by another run of its lineage (then it runs
again), or its undo may be owed and not done: a compensation that failed, is under way, or never
started because the rollback stopped before it (a ``compensation_failed`` run leaves everything
upstream of its failed undo waiting, with no row). Such an effect may still stand and may be
undone later by ``raysaga retry RUN --compensations``, under the key of the run that executed it:
a fork that inherited it would lose it after completing; one that made it again would stand on
two. So the fork is refused, naming the undos and the way to finish them. A node whose outcome the
parent left unknown is refused too, unless a rollback undid it (then it is re-run, like any undone node).
An owed undo that cannot be called (``undo_targets.ToolLost``: its tool gone, or its arguments no
longer fitting the tool's schema) is named with why: a retry of that rollback stops on it again
until the code can call it, so the refusal says what to restore first (``refuse_unsettled``).
"""

from __future__ import annotations

import functools
import shlex
import time
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from raysaga.errors import BlobIntegrityError, ForkError, RunNotFoundError
from raysaga.node_key import AGENT_SEP, NodeKey
from raysaga.orchestrator.machine.doubt import InDoubt, may_have_happened
from raysaga.orchestrator.machine.undo_targets import ToolLost, ToolUndo, call_undo, can_owe, turn_uses
from raysaga.orchestrator.workflow import Workflow
from raysaga.sagas.rollback import effect_time
from raysaga.state import EffectRecord, NodeRecord, NodeStatus, RunRecord, RunStatus, Store
from raysaga.state.fork_rows import ForkRows
from raysaga.state.models import PRUNABLE, node_label
from raysaga.types import compensation_node, is_compensation

__all__ = ["LineageUndos", "Unsettled", "lineage_undos", "lost_reason", "refuse_in_doubt", "refuse_unsettled",
           "tool_call_undos", "undone_elsewhere"]

#: Runs whose rollback owes the undo of every node it has not undone yet (row or no row).
_OWING = frozenset({RunStatus.COMPENSATING, RunStatus.COMPENSATION_FAILED})


@dataclass(frozen=True)
class Unsettled:
    """An undo of a node the parent holds that did not complete in ``run``: its compensation node
    (``charge:compensate``), item, and state (a row's status, or ``not started``: owed, no row)."""

    run: str
    node_id: str
    fan_index: int
    state: str
    lost: ToolLost | None = None
    """Owed, but its undo cannot be called (an agent's tool call: ``undo_targets.ToolLost``)."""

    @property
    def target(self) -> NodeKey:
        return NodeKey.parse(self.node_id, self.fan_index).undone()


@dataclass
class LineageUndos:
    """The lineage's rollbacks as they bear on the parent's completed nodes."""

    undone: set[tuple[str, int]] = field(default_factory=set)
    """``(step, item)`` undone by another run of the lineage (``undone_elsewhere``)."""
    settled: set[tuple[str, int]] = field(default_factory=set)
    """``(node_id, item)`` whose compensation completed, in the parent or any run of its lineage."""
    unsettled: list[Unsettled] = field(default_factory=list)
    """Undos of the parent's nodes that did not complete anywhere."""


def _owes(wf: Workflow, key: NodeKey, row: NodeRecord, calls: _Calls) -> bool | ToolLost:
    """Whether a rollback undoes (or stops on) the node ``row`` (``key``), which took effect or may have
    (``sagas.rollback.effect_time``: completed; in flight, cancelled or failed on a transient error;
    failed after its value was refused): an item (or a plain step) of a step with a compensation,
    or an agent's tool call that owes an undo by ``machine.undo_targets``, the rule the rollback
    itself follows (from the same facts: the tool the call's turn asked for, its result, its ledger
    rows, the run's own and those of the run it was inherited from). A call whose undo cannot be
    called (``ToolLost``: its turn unreadable, the tool gone, its arguments no longer fitting the
    tool's schema) is owed when its ledger says it took effect: the rollback stops on it, so a fork
    must not inherit it either; with no such ledger row it owes nothing, as the rollback skips it.
    Such a call's answer is its ``ToolLost`` (why its undo cannot be called)."""
    spec = wf.steps.get(key.step)
    if spec is None:
        return False
    if key.is_agent_call:
        if spec.kind != "agent" or key.call is None:
            return False
        agent, took = spec.options["agent"], calls.took(row)
        if not can_owe(agent, took):
            return False  # (call_undo's first question: its turn need not be read)
        try:
            undo = call_undo(agent, calls.use(key), row, lambda: calls.result(row), took=took)
        except BlobIntegrityError:
            return True  # its result cannot be read: owed (the rollback parks the run on it, never skips it)
        return undo if isinstance(undo, ToolLost) else undo is not None
    return wf.compensation_for(key.step) is not None and (spec.map_over is None or key.fan_index >= 0)


class _Calls:
    """What ``call_undo`` reads of ``run``'s agent tool calls, read in bulk (``read``) before it is
    asked: the tool use each call's turn asked for (the turns' rows, one query per 400), the results
    of the completed calls of tools with an undo (likewise: those of a read-only tool are never
    read), and the ledger (once: the run's rows and those of the calls it inherited, the rows the
    rollback of ``run`` reads, ``machine.doubt.InDoubt.took``). The cost is a few queries per run,
    not one per call (2,000 calls read one by one: 10-30 s)."""

    def __init__(self, st: Store, run: str, rows: list[NodeRecord]) -> None:
        self.st, self.run = st, run
        self._inherits = any(r.origin_run_id and AGENT_SEP in r.node_id for r in rows)
        self._turns: dict[tuple[str, int], list[dict[str, Any]] | None] = {}
        self._results: dict[tuple[str, int], Any] = {}
        self._broken: dict[tuple[str, int], BlobIntegrityError] = {}  # outputs whose blob cannot be read
        self._took: set[tuple[str, int]] | None = None

    def read(self, wf: Workflow, calls: list[tuple[NodeKey, NodeRecord]]) -> None:
        """Read what ``_owes`` will ask of ``calls`` (agent tool calls that may owe an undo)."""
        turns = {(k.owner.with_turn(k.turn)) for k, _ in calls if k.turn is not None}
        found = self._rows([(t.node_id, t.fan_index) for t in turns])
        outputs = self._outputs({where: row for where, row in found.items()
                                 if row[0] == NodeStatus.COMPLETED.value})
        for turn in turns:
            where = (turn.node_id, turn.fan_index)
            self._turns[where] = turn_uses(outputs[where]) if where in outputs else None
        wanted = []
        for key, row in calls:
            spec = wf.steps[key.step]
            use = self.use(key) or {}
            tool = spec.options["agent"].tool(str(use.get("name", "")))
            if row.status == NodeStatus.COMPLETED and tool is not None and tool.compensate is not None:
                wanted.append((row.node_id, row.fan_index))  # (call_undo reads the result of no other)
        self._results = self._outputs(self._rows(wanted))

    def _rows(self, keys: list[tuple[str, int]]) -> dict[tuple[str, int], tuple[str, Any, str | None]]:
        """``(status, output, digest)`` of the rows ``keys``: in bulk from the store's one
        implementation (``ForkRows.node_outputs``), else row by row."""
        if not keys:
            return {}
        if isinstance(self.st, ForkRows):
            return self.st.node_outputs(self.run, keys)
        found = {}
        for node_id, index in keys:
            row = self.st.node_row(self.run, node_id, index)
            if row is not None:
                found[(node_id, index)] = (str(row.get("status")), row.get("output"), row.get("output_digest"))
        return found

    def _outputs(self, rows: dict[tuple[str, int], tuple[str, Any, str | None]]) -> dict[tuple[str, int], Any]:
        """The outputs of ``rows``, their blobs loaded at once; a row whose blob cannot be read is
        left out and its error kept in ``_broken``."""
        def what(where: tuple[str, int]) -> str:
            return f"node {NodeKey.parse(*where).label} of run {self.run!r}"

        blobbed = {where: digest for where, (_, _, digest) in rows.items() if digest}
        try:
            blobs = self.st.load_blobs({digest: what(where) for where, digest in blobbed.items()})
        except BlobIntegrityError:  # one of them: tell which, one at a time (a damaged store, rare)
            blobs = {}
            for where, digest in blobbed.items():
                try:
                    blobs.update(self.st.load_blobs({digest: what(where)}))
                except BlobIntegrityError as exc:
                    self._broken[where] = exc
        return {where: (blobs[digest] if digest else output) for where, (_, output, digest) in rows.items()
                if not digest or digest in blobs}

    def use(self, key: NodeKey) -> dict[str, Any] | None:
        """The ``tool_use`` block of call ``key`` (None: its turn cannot be read, or asked fewer)."""
        assert key.turn is not None and key.call is not None
        turn = key.owner.with_turn(key.turn)
        uses = self._turns.get((turn.node_id, turn.fan_index))
        return uses[key.call] if uses is not None and key.call < len(uses) else None

    def result(self, row: NodeRecord) -> Any:
        """The recorded result of call ``row`` (``BlobIntegrityError`` when its blob cannot be read)."""
        where = (row.node_id, row.fan_index)
        if where in self._broken:
            raise self._broken[where]
        return self._results.get(where)

    def took(self, row: NodeRecord) -> bool:
        """Whether a ledger row of call ``row`` says it took effect or may have: the run's own, or
        the row of the run that executed it when ``run`` inherited it (``Store.inherited_effects``)."""
        if self._took is None:
            doubt = InDoubt()
            doubt.restore(self.st.effects(self.run))
            if self._inherits:
                doubt.restore(e for e in self.st.inherited_effects(self.run) if not is_compensation(e.node_id))
            self._took = set(doubt.took)
        return (row.node_id, row.fan_index) in self._took


def _owed(wf: Workflow, st: Store, run: str, rows: list[NodeRecord], executed_by: dict[tuple[str, int], str]
          ) -> list[Unsettled]:
    """The undos ``run``'s rollback (compensating, or stopped: ``compensation_failed``) owes and has
    not started, of the nodes the parent holds from the same execution: no compensation row yet.
    As the rollback's targets (``sagas.rollback.effect_time``): a completed node, and one whose
    outcome is unknown or that failed having taken effect (or maybe: a transient error, a value
    refused after the call), an agent's tool call among them."""
    started = {_undone_target(r) for r in rows if is_compensation(r.node_id)}
    found = []
    for row in rows:
        key = (row.node_id, row.fan_index)
        if is_compensation(row.node_id) or key in started or executed_by.get(key) != (row.origin_run_id or run):
            continue
        if effect_time(row) is not None:
            found.append((NodeKey.parse(row.node_id, row.fan_index), row))
    calls = _Calls(st, run, rows)
    calls.read(wf, _agent_calls(wf, found))
    owed = [(row, _owes(wf, key, row, calls)) for key, row in found]
    return [Unsettled(run, compensation_node(row.node_id), row.fan_index, "not started",
                      answer if isinstance(answer, ToolLost) else None) for row, answer in owed if answer]


def _agent_calls(wf: Workflow, found: list[tuple[NodeKey, NodeRecord]]) -> list[tuple[NodeKey, NodeRecord]]:
    return [(k, r) for k, r in found if k.call is not None and k.turn is not None
            and (spec := wf.steps.get(k.step)) is not None and spec.kind == "agent"]


def tool_call_undos(wf: Workflow, st: Store, run: str, rows: list[NodeRecord]
                    ) -> dict[NodeKey, ToolUndo | ToolLost]:
    """What ``call_undo`` answers, under the code of ``wf``, for each agent tool call of ``run`` that
    took effect or may have and whose undo is not done (``rows``: the run's node rows, inherited
    ones included), from the facts a rollback of ``run`` reads (``_Calls``): the undo it owes, or
    why that undo cannot be called (the rollback stops on it). A call that owes nothing, or whose
    recorded result cannot be read, is left out (``versions.changes`` asks, for a deploy's warning)."""
    done = {_undone_target(r) for r in rows if is_compensation(r.node_id) and r.status == NodeStatus.COMPLETED}
    found = _agent_calls(wf, [(NodeKey.parse(r.node_id, r.fan_index), r) for r in rows
                              if not is_compensation(r.node_id) and (r.node_id, r.fan_index) not in done
                              and effect_time(r) is not None])
    calls = _Calls(st, run, rows)
    calls.read(wf, found)
    answers: dict[NodeKey, ToolUndo | ToolLost] = {}
    for key, row in found:
        agent, took = wf.steps[key.step].options["agent"], calls.took(row)
        if not can_owe(agent, took):
            continue
        try:
            undo = call_undo(agent, calls.use(key), row, functools.partial(calls.result, row), took=took)
        except BlobIntegrityError:
            continue
        if undo is not None:
            answers[key] = undo
    return answers


def lost_reason(key: NodeKey, lost: ToolLost) -> str:
    """Why the undo of call ``key`` cannot be called (as ``machine.rollback.missing_tool`` says it)."""
    if lost.why:
        return f"tool {lost.name!r} is there, but {lost.why}"
    if not lost.name:
        turn = key.owner.with_turn(key.turn).label if key.turn is not None else key.step
        return f"which tool it made cannot be read from its turn {turn}"
    return f"the agent of step {key.step!r} no longer has a tool {lost.name!r}"


def _restore(key: NodeKey, lost: ToolLost) -> str | None:
    """What the code needs back so that the undo of ``key`` can be called; None: no code can call it
    (its turn cannot be read, or its recorded result is not a tool result)."""
    if not lost.name:
        return None
    if not lost.why:
        return f"tool {lost.name!r} (with its compensate=)"
    if "schema" in lost.why:
        return f"tool {lost.name!r}'s old schema (the one {key.label} ran with)"
    return None


def lineage_undos(st: Store, run_id: str, rows: list[NodeRecord], wf: Workflow | None = None,
                  status: RunStatus | None = None) -> LineageUndos:
    """The undos, in any run of the lineage (the parent ``run_id``, of ``status``, included), of the
    parent's completed nodes: which completed, and which did not (failed, under way, or, given the
    workflow ``wf``, owed by a rollback that has not reached them). An undo that failed in one run
    and completed in another (the same node, so the same key: the provider refunded once) is
    settled: a retry of the failed one is deduped."""
    executed_by = {(r.node_id, r.fan_index): r.origin_run_id or run_id for r in rows
                   if effect_time(r) is not None and not is_compensation(r.node_id)}
    found = LineageUndos()
    unsettled = [Unsettled(run_id, r.node_id, r.fan_index, r.status.value) for r in rows
                 if is_compensation(r.node_id) and r.status != NodeStatus.COMPLETED]
    if wf is not None and status in _OWING:
        unsettled += _owed(wf, st, run_id, rows, executed_by)
    found.settled = {_undone_target(r) for r in rows if is_compensation(r.node_id) and r.status == NodeStatus.COMPLETED}
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
                found.undone.add((target.step, target.fan_index))
                found.settled.add((target.node_id, target.fan_index))
            else:  # its undo failed or never finished: the effect may well stand, and may yet be undone
                unsettled.append(Unsettled(other, row.node_id, row.fan_index, row.status.value))
        if wf is not None and theirs and _status(st, other) in _OWING:
            unsettled += _owed(wf, st, other, theirs, executed_by)
    found.unsettled = [u for u in unsettled if (u.target.node_id, u.target.fan_index) not in found.settled]
    return found


def _status(st: Store, run_id: str) -> RunStatus | None:
    """A lineage run's status; None once pruned (a run that executed a node a fork holds may be gone)."""
    try:
        return st.get_run(run_id, lenient=True).status
    except RunNotFoundError:
        return None


def _undone_target(row: NodeRecord) -> tuple[str, int]:
    """The node a compensation row undoes, exactly (an agent's one tool call, not the agent)."""
    target = NodeKey.parse(row.node_id, row.fan_index).undone()
    return target.node_id, target.fan_index


def undone_elsewhere(st: Store, run_id: str, rows: list[NodeRecord]) -> set[tuple[str, int]]:
    """``(step, item)`` of the parent's rows whose execution another run undid: the run that
    executed it, or any of its forks (every fork of a run undoes an inherited node under that
    run's key). A node refunded by a sibling fork is no longer in force, however the parent's own
    rows read: a fork that inherited it would ship an order whose payment was given back. Only a
    compensation that completed undid anything (one that did not is refused by ``fork``)."""
    return lineage_undos(st, run_id, rows).undone


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


def refuse_unsettled(wf: Workflow, st: Store, unsettled: list[Unsettled], at: NodeKey, parent: RunRecord) -> None:
    """``ForkError`` when an undo of a node the fork would not run again by choice did not complete
    (failed, under way, or owed by a stopped rollback): the effect it undoes may still stand, and a
    retry of that rollback may undo it later, under the key a fork would inherit it with. Counted
    as undone, the fork would make the effect again while the first one stands; inherited, the
    fork would build on an effect its lineage is still undoing."""
    chosen = _rerun_by_choice(wf, at)
    left = [u for u in unsettled if not chosen(u.target)]
    if not left:
        return
    shown = ", ".join(f"{node_label(u.node_id, u.fan_index)} ({u.state}"
                      + ("" if u.run == parent.run_id else f" in run {u.run!r}") + ")" for u in left[:5])
    lost = [(u, u.lost) for u in left if u.lost is not None]
    why = "".join(f" The undo of {u.target.label} cannot be called: {lost_reason(u.target, x)}." for u, x in lost[:5])
    ways, stuck = [], False
    for run in sorted({u.run for u in left}, key=lambda run: (run != parent.run_id, run)):
        status = (parent if run == parent.run_id else st.get_run(run, lenient=True)).status
        retry = f"`raysaga retry {shlex.quote(run)} --compensations`"
        theirs = [(u.target, x) for u, x in lost if u.run == run]
        restore = sorted({r for k, x in theirs if (r := _restore(k, x)) is not None})
        labels = ", ".join(k.label for k, _ in theirs[:5])
        if any(_restore(k, x) is None for k, x in theirs):  # no code can call it: the fork can only run it again
            stuck = True
            ways.append(f"no retry of run {run!r} can undo {labels}: undo {'it' if len(theirs) == 1 else 'them'} "
                        "by hand with the provider")
        elif restore:  # a retry stops on it again until the code can call its undo
            now = (f"with the code as it is, {retry} stops on {labels} again" if status == RunStatus.COMPENSATION_FAILED
                   else f"run {run!r} is {status.value} and will stop on {labels}")
            ways.append(f"{now}: in the code, restore {' and '.join(restore)}, then {retry} finishes its rollback")
        elif status == RunStatus.COMPENSATION_FAILED:  # only such a rollback can be retried
            ways.append(f"{retry} finishes its rollback")
        elif status not in PRUNABLE:
            ways.append(f"run {run!r} is {status.value}: wait for it")
        else:  # a run cancelled while it was compensating, say: its undo is the operator's
            ways.append(f"undo run {run!r}'s with the provider")
    way = "; ".join(ways)
    way = way[0].upper() + way[1:]
    first = _earliest(wf, [u.target.step for u in left])
    again = f"fork from {first!r} to run it again on purpose" if first else _GONE
    end = (f"{way}; a fork from {at.label!r} stays refused while it is owed: {again}") if stuck \
        else f"{way} (then fork); or {again}"
    raise ForkError(f"run {parent.run_id!r} has {len(left)} compensation(s) that did not complete: {shown}.{why} The "
                    f"effects they undo may still stand, so a fork from {at.label!r} can neither inherit them nor "
                    f"make them again. {end}")


def refuse_in_doubt(wf: Workflow, effects: list[EffectRecord], at: NodeKey, parent: RunRecord,
                    inherited: AbstractSet[tuple[str, int]] = frozenset(),
                    undone: AbstractSet[tuple[str, int]] = frozenset()) -> None:
    """``ForkError`` when a node the fork would run again *before* ``at`` (not inherited) has an
    effect whose outcome is unknown in the parent (ledger ``pending`` or ``abandoned``: the call
    may have happened; a cancel mid-charge, say), or that failed having taken effect (``failed``
    with ``took_effect``: its value was refused after the call, ``machine.doubt.may_have_happened``).
    The fork's keys are its own, so the provider could not dedupe it: the card would be charged
    twice. Forking from that node (or before it) re-runs it on purpose. An inherited node (an
    agent's tool call the model was told failed) is not called again (whether the parent's rollback
    still owes its undo is ``lineage_undos``'s question); one a rollback undid (``undone``:
    ``(node_id, item)`` whose compensation completed, under its key) no longer stands, so running it
    again is what forking a compensated run means."""
    below = set(nx.descendants(wf.graph, at.step))  # re-run by the fork's own choice, with ``at``:

    def chosen(e: EffectRecord) -> bool:  # the step, or (forked from an item) that item only
        step = NodeKey.parse(e.node_id, e.fan_index).step
        return step in below or (step == at.step and (at.fan_index < 0 or e.fan_index == at.fan_index))

    doubtful = [e for e in effects if may_have_happened(e.status, e.result)
                and not is_compensation(e.node_id) and not chosen(e) and (e.node_id, e.fan_index) not in inherited
                and (e.node_id, e.fan_index) not in undone]
    if not doubtful:
        return
    shown = ", ".join(f"{node_label(e.node_id, e.fan_index)} ({e.effect_name}, key {e.idempotency_key})"
                      for e in doubtful[:5])
    first = _earliest(wf, [NodeKey.parse(e.node_id, e.fan_index).step for e in doubtful])
    quoted = shlex.quote(parent.run_id)
    late = parent.deadline_at is not None and time.time() >= parent.deadline_at and parent.status == RunStatus.FAILED
    retry = f"`raysaga retry {quoted}` settles them under their keys; or check "
    way = (f"A retry of it is refused past its deadline: `raysaga cancel {quoted} --compensate` undoes them "
           "under their keys; or check " if late else retry
           if parent.status in (RunStatus.FAILED, RunStatus.COMPENSATION_FAILED) else "Check ")
    raise ForkError(f"run {parent.run_id!r} left {len(doubtful)} effect(s) whose outcome is unknown (the call may "
                    f"have happened, or did and its value was refused): {shown}. A fork from {at.label!r} would "
                    f"call them again under new keys, which the provider cannot dedupe. {way}them with the provider, "
                    f"then " + (f"fork from {first!r} to run it again on purpose" if first else _GONE))


#: What a refusal says when the step to fork from is not in the code forked with (renamed, removed).
_GONE = "fork with the code the run started with (the step that made them is not in this code)"


def _earliest(wf: Workflow, steps: list[str]) -> str | None:
    """The earliest of ``steps`` in ``wf``'s order that ``wf`` still has (a deploy may have renamed or
    removed them: ``min(key=order.index)`` raised a bare ValueError), else None."""
    known = [s for s in steps if s in wf.steps]
    return min(known, key=wf.order.index) if known else None

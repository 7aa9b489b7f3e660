"""Workflow versions: a run is pinned to the definition it started with.

A run records its workflow's ``definition_hash`` (the DAG's shape and each step's contract, not
the step bodies: ``Workflow.definition_hash``) and, since schema 6, the hash of each step's
signature (``step_hashes``). A resume under another definition is refused with the steps that
changed named (``DefinitionChangedError``); with ``RunOptions(allow_changed=True)``
(``raysaga resume RUN --allow-changed``) it goes on with the new code: the changes are written
in a ``definition_changed`` event and the run is pinned to the new definition (hashes, name,
version, module ref), so a later resume (or a worker) takes it as it now is; rows of removed steps
still open are closed, and effects no rollback will undo any more are named (``Changes.standing``),
apart from agent tool calls whose undo is owed but cannot be called any more, on which a rollback
stops (``Changes.blocked``, by ``machine.undo_targets.call_undo``, the rule the rollback follows).
An operator's ``retry`` or ``cancel --compensate`` asks ``check`` before it writes anything.

A run recorded by an earlier raysaga under hash scheme 1 (``legacy_hash``) with the same code is
no change: it is pinned to the current hash (docs/execution.md, "The definition hash, scheme 2").

Why per-step hashes on the run row rather than in an event: a resume reads the run row anyway
(one query), the hashes are small (one per step), and the dashboard and ``status`` can show them
without reading the event log.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import shlex
import sys
import weakref
from dataclasses import dataclass, field
from typing import Any

from raysaga.errors import DefinitionChangedError
from raysaga.node_key import NodeKey
from raysaga.orchestrator.fork_refusals import lost_reason, tool_call_undos
from raysaga.orchestrator.machine.doubt import REPINNED_KEY, may_have_happened
from raysaga.orchestrator.machine.undo_targets import ToolLost
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import EffectStatus, Lease, NodeRecord, NodeStatus, NodeWrite, RunRecord, Store
from raysaga.state.claims import SCHEME_KEY

__all__ = ["Changes", "changes", "check", "definition_known", "legacy_hash", "pin", "step_hashes", "types_digest",
           "types_may_differ"]

log = logging.getLogger("raysaga.versions")


def step_hashes(wf: Workflow) -> dict[str, str]:
    """Each step's signature hash: its place in the DAG and its contract (``StepSpec.signature_for_hash``),
    and whether it has a compensation. 16 hex digits each.

    Kept by ``definition_hash``, which hashes the same signatures and the names of the registered
    compensations (so whether each step has one): equal hashes, equal step hashes. Every new run
    records them, and a 200-step workflow takes ~1 ms to hash."""
    return {**_step_hashes(wf, legacy=False), SCHEME_KEY: SCHEME, TYPES_KEY: types_digest(wf)}


def types_digest(wf: Workflow) -> str:
    """A digest of the types ``wf`` declares: each step's parameters and return, each compensation's
    parameters. Not in the definition hash (a model gaining an optional field, ``int`` widened to
    ``float``, a class moved are no change the stored outputs do not fit): recorded beside it, it
    tells a resume under other types, which must check that the stored outputs still read as them
    (``driver_io.types_fit``), from one under the run's own, which must not (invariant 1)."""
    found = _DIGESTS.get(wf)
    if found is not None and found[0] == wf.definition_hash:
        return found[1]
    shape = {name: [_shape(spec.output_type), sorted((k, _shape(v)) for k, v in spec.param_types.items()),
                    sorted((k, _shape(v)) for k, v in
                           (getattr(wf.compensation_for(name), "__annotations__", None) or {}).items())]
             for name, spec in wf.steps.items()}
    text = _ADDRESS.sub("", json.dumps(shape, sort_keys=True))  # (a validator's repr: where it sits in memory)
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    _DIGESTS[wf] = (wf.definition_hash, digest)
    return digest


def _shape(tp: Any) -> str:
    """A type as the digest sees it: its JSON Schema (a model's fields: ``repr`` of a model is its name
    alone, so a required field added to it changed no digest and a resume under it was not checked),
    else its ``repr``."""
    try:
        return repr(tp) + json.dumps(type_adapter(tp).json_schema(), sort_keys=True, default=str)
    except Exception:  # a type with no JSON Schema (an arbitrary class): its name
        return repr(tp)


#: ``types_digest`` per workflow object (the JSON Schemas cost ~ms a step), kept while its hash is.
_DIGESTS: weakref.WeakKeyDictionary[Workflow, tuple[str, str]] = weakref.WeakKeyDictionary()


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def types_may_differ(run: RunRecord, wf: Workflow) -> bool:
    """Whether ``run`` was recorded under other declared types than ``wf``'s (or another definition);
    False for a run recorded before types were recorded under its own definition hash."""
    recorded = (run.step_hashes or {}).get(TYPES_KEY)
    return run.definition_hash != wf.definition_hash or (recorded is not None and recorded != types_digest(wf))


#: The hash scheme a run's ``step_hashes`` were recorded under, kept among them under a key no step
#: name can be (``NAME_RE``): a run without it was recorded by an earlier raysaga (scheme 1), and
#: only such a run may be taken for this code by ``legacy_hash`` (a scheme-2 hash of code without
#: the new fields equals a scheme-1 hash of code that has them: without the mark, a deploy adding
#: ``input`` to an effect step would pass for an upgrade).
SCHEME = "2"
#: Where ``step_hashes`` keeps ``types_digest``; like ``SCHEME_KEY``, no step's name.
TYPES_KEY = ":types"


def _recorded_steps(run: RunRecord) -> dict[str, str] | None:
    return None if run.step_hashes is None else {k: v for k, v in run.step_hashes.items()
                                                 if not k.startswith(":")}  # (SCHEME_KEY, TYPES_KEY...)


def _legacy_run(run: RunRecord, wf: Workflow) -> bool:
    """``run`` was recorded by an earlier raysaga (scheme 1) with the code of ``wf``."""
    return (run.workflow_name == wf.name and (run.step_hashes is None or SCHEME_KEY not in run.step_hashes)
            and run.definition_hash == legacy_hash(wf))


def _step_hashes(wf: Workflow, *, legacy: bool) -> dict[str, str]:
    wf.validate()
    cache = (wf.definition_hash, legacy)
    found = _STEP_HASHES.get(cache)
    if found is None:
        found = {}
        for name in wf.order:
            shape = {**wf.steps[name].signature_for_hash(legacy=legacy), "undo": wf.compensation_for(name) is not None}
            found[name] = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:16]
        if len(_STEP_HASHES) >= _KEPT:
            _STEP_HASHES.clear()  # a process with this many definitions: start over
        _STEP_HASHES[cache] = found
    return found


def legacy_hash(wf: Workflow) -> str:
    """``wf``'s definition hash under scheme 1 (an earlier raysaga's: ``StepSpec.signature_for_hash``
    without the scheme-2 fields; ``Workflow.definition_hash``'s shape, kept in step with it). A run
    recording it was started by this very code: it is resumed, and pinned to the current hash."""
    found = _LEGACY.get(wf.definition_hash)
    if found is None:
        shape = {"name": wf.name, "version": wf.version,
                 "steps": [wf.steps[s].signature_for_hash(legacy=True) for s in wf.order],
                 "compensations": sorted(wf.compensations)}
        found = hashlib.sha256(json.dumps(shape, sort_keys=True).encode()).hexdigest()
        if len(_LEGACY) >= _KEPT:
            _LEGACY.clear()
        _LEGACY[wf.definition_hash] = found
    return found


#: ``step_hashes`` by (definition hash, legacy scheme), ``legacy_hash`` by definition hash, at most
#: ``_KEPT`` definitions each.
_STEP_HASHES: dict[tuple[str, bool], dict[str, str]] = {}
_LEGACY: dict[str, str] = {}
_KEPT = 64


@dataclass(frozen=True)
class Changes:
    """How a workflow's definition differs from the one a run started with."""

    changed: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    version: tuple[str, str] | None = None
    """(the run's, the code's) when the workflow's ``version`` differs."""
    known: bool = True
    """False for a run recorded without per-step hashes: the steps cannot be named."""
    renamed: tuple[str, str] | None = None
    """(the run's, the code's) workflow name when it differs."""
    standing: list[str] = field(default_factory=list)
    """Effects of removed steps (or of steps, or tools, whose undo was removed) that took effect (or
    may have): no rollback of the new code undoes them (``effects_left``)."""
    blocked: list[str] = field(default_factory=list)
    """Agent tool calls that took effect (or may have) whose undo is owed but cannot be called under
    the new code (its tool gone, its arguments no longer fitting the tool's schema), each with why:
    a rollback stops on them, ``compensation_failed`` (``undo_blocked``)."""

    def steps(self) -> set[str]:
        """Steps whose recorded rows may not fit the code: changed, added or removed."""
        return {*self.changed, *self.added, *self.removed}

    def describe(self) -> str:
        parts = []
        if self.renamed is not None:
            parts.append(f"workflow renamed {self.renamed[0]} -> {self.renamed[1]}")
        if self.version is not None:
            parts.append(f"version {self.version[0]} -> {self.version[1]}")
        for what, names in (("changed", self.changed), ("added", self.added), ("removed", self.removed)):
            if names:
                parts.append(f"steps {what}: {', '.join(names)}")
        if self.standing:
            parts.append(f"completed effects that will not be compensated: {', '.join(self.standing)}")
        if self.blocked:
            parts.append("completed tool calls whose undo cannot be called, on which a rollback will stop "
                         f"(compensation_failed): {', '.join(self.blocked)}")
        if not self.known:
            parts.append("the run was recorded without per-step hashes, so the changed steps cannot be named")
        elif not parts:
            parts.append("the compensations registered changed")
        return "; ".join(parts)

    def as_data(self) -> dict[str, Any]:
        return {"changed": self.changed, "added": self.added, "removed": self.removed, "known": self.known,
                "version": list(self.version) if self.version else None,
                "renamed": list(self.renamed) if self.renamed else None, "not_compensated": self.standing,
                "undo_blocked": self.blocked}


def changes(run: RunRecord, wf: Workflow, store: Store | None = None) -> Changes | None:
    """What changed between the definition ``run`` started with and ``wf``; None when nothing did
    (the same hash, or the run recorded by an earlier raysaga's hash scheme of this same code).
    ``store``: read the run's ledger, to name the effects of removed steps left standing."""
    if run.definition_hash == wf.definition_hash or _legacy_run(run, wf):
        return None
    version = (run.workflow_version, wf.version) if run.workflow_version != wf.version else None
    renamed = (run.workflow_name, wf.name) if run.workflow_name != wf.name else None
    before = _recorded_steps(run)
    if before is None:
        return Changes(version=version, known=False, renamed=renamed)
    now = _step_hashes(wf, legacy=False)
    legacy = now if SCHEME_KEY in (run.step_hashes or {}) else _step_hashes(wf, legacy=True)  # (scheme 1 run)
    removed = sorted(s for s in before if s not in now)
    changed = [s for s in now if s in before and before[s] not in (now[s], legacy[s])]
    undone = {*removed, *(s for s in changed if _undo_removed(wf, s, before[s]))}  # rollbacks skip these now
    agents = {s: wf.steps[s].options["agent"] for s in changed if wf.steps[s].kind == "agent"}  # (their tools')
    nodes = store.nodes(run.run_id) if store and (undone or agents or _has_agents(wf)) else []
    blocked = undo_blocked(store, run.run_id, wf, nodes) if store and _has_agents(wf) else {}
    standing = effects_left(store, run.run_id, undone, agents, nodes) if store and (undone or agents) else []
    return Changes(changed=changed, added=[s for s in now if s not in before], removed=removed, version=version,
                   renamed=renamed, standing=[s for s in standing if s not in blocked],
                   blocked=[f"{label} ({why})" for label, why in sorted(blocked.items())])


def _has_agents(wf: Workflow) -> bool:
    return any(spec.kind == "agent" for spec in wf.steps.values())


def undo_blocked(store: Store, run_id: str, wf: Workflow, nodes: list[NodeRecord]) -> dict[str, str]:
    """The agent tool calls of ``run_id`` (``nodes``: its rows, its own and those it inherited)
    whose undo a rollback under ``wf`` owes and cannot call, by label, each with why: the calls
    ``call_undo`` answers ``ToolLost`` for, from the facts the rollback reads
    (``fork_refusals.tool_call_undos``: the calls' turns and results, their ledger rows, an
    inherited call's those of the run that made it). Every agent step counts, changed or not: a
    tool's schema is not in the definition hash."""
    answers = tool_call_undos(wf, store, run_id, nodes)
    return {key.label: lost_reason(key, undo) for key, undo in answers.items() if isinstance(undo, ToolLost)}


def _undo_removed(wf: Workflow, name: str, recorded: str) -> bool:
    """Whether step ``name`` had a compensation when ``recorded`` was its hash and has none now: the
    recorded hash is the current shape's with the compensation put back."""
    if wf.compensation_for(name) is not None:
        return False
    for legacy in (False, True):
        for inline in (False, True):
            shape = {**wf.steps[name].signature_for_hash(legacy=legacy), "undo": True}
            if inline:
                shape["compensate"] = True
            if hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:16] == recorded:
                return True
    return False


def effects_left(store: Store, run_id: str, removed: set[str], agents: dict[str, Any] | None = None,
                 nodes: list[NodeRecord] | None = None) -> list[str]:
    """The nodes of ``removed`` steps whose ledger rows say their effect took place (or may have);
    and of the tool calls of changed agent steps (``agents``: step -> its ``Agent`` now) whose tool
    has no ``compensate=`` now: a rollback leaves them standing. (A call whose tool is gone is
    ``undo_blocked``'s: the rollback stops on it.) The ledger rows are the run's own and, when
    its rows (``nodes``) say it inherited some (a fork), those of the run that made them."""
    found = []
    inherits = any(n.origin_run_id for n in (store.nodes(run_id) if nodes is None else nodes))
    for row in [*store.effects(run_id), *(store.inherited_effects(run_id) if inherits else [])]:
        key = NodeKey.parse(row.node_id, row.fan_index)
        if key.compensates or not (row.status == EffectStatus.COMMITTED or may_have_happened(row.status, row.result)):
            continue
        agent = (agents or {}).get(key.step)
        if key.step in removed:
            found.append(key.label)
        elif agent is not None and key.call is not None and row.effect_name.startswith("tool:"):
            tool = agent.tool(row.effect_name.removeprefix("tool:"))
            if tool is not None and tool.compensate is None:
                found.append(key.label)
    return sorted(set(found))


def definition_known(run: RunRecord, wf: Workflow) -> bool:
    """Whether ``wf`` is the definition ``run`` is pinned to (a worker claims only such runs)."""
    return run.workflow_name == wf.name and (run.definition_hash == wf.definition_hash or _legacy_run(run, wf))


def check(store: Store, run: RunRecord, wf: Workflow, *, allow_changed: bool, verb: str = "resume") -> Changes | None:
    """Raise ``DefinitionChangedError`` when ``wf`` is not the definition ``run`` started with and
    ``allow_changed`` is off; else what changed (None: nothing). Writes nothing: an operator's
    retry or cancel asks this before it reopens the run (``runner``). ``verb``: the command the
    advice repeats with ``--allow-changed`` (a cancel's was advised ``resume``, which went forward)."""
    found = changes(run, wf, store)
    if found is not None and not allow_changed:
        head, _, rest = verb.partition(" ")
        again = " ".join(p for p in ("raysaga", head, shlex.quote(run.run_id), rest, "--allow-changed") if p)
        raise DefinitionChangedError(
            f"run {run.run_id!r} was started by another definition of workflow {run.workflow_name!r} "
            f"({found.describe()}; hash {run.definition_hash[:12]} != {wf.definition_hash[:12]}): {head} it with "
            f"the code it started with, or with the new code: `{again}` (RunOptions(allow_changed=True))")
    return found


def pin(store: Store, lease: Lease, run: RunRecord, wf: Workflow, *, allow_changed: bool) -> RunRecord:
    """Check that ``run`` may be driven by ``wf`` (the driver calls this under its lease).

    Returns the run unchanged when its definition is ``wf``'s (pinned to the current hash when it
    recorded an earlier scheme's hash of the same code); with ``allow_changed``, the run pinned to
    ``wf``: its hashes, name, version and (when found) module ref, with a ``definition_changed``
    event listing what changed, and the rows of removed steps still waiting or under way
    ``cancelled`` in the same write (nothing would ever settle them). Otherwise raises
    ``DefinitionChangedError`` naming the changed steps and both ways on.
    """
    found = check(store, run, wf, allow_changed=allow_changed)
    if found is None:
        if run.definition_hash == wf.definition_hash:
            return run
        return store.repin_definition(lease, wf.definition_hash, step_hashes(wf), {
            "from": run.definition_hash, "to": wf.definition_hash, "rehashed": True})
    what = found.describe()
    log.warning("run %s: resuming with a changed definition of %s: %s", run.run_id, run.workflow_name, what)
    closed = _removed_rows(store, run.run_id, set(found.removed))
    return store.repin_definition(lease, wf.definition_hash, {**step_hashes(wf), REPINNED_KEY: "1"}, {
        "from": run.definition_hash, "to": wf.definition_hash, **found.as_data(),
        "closed": sorted({NodeKey.parse(n.node_id, n.fan_index).label for n in closed})},
        workflow=(wf.name, wf.version, ref_of(wf, run.workflow_ref)), nodes=closed)


#: A removed step's row still in these states is closed by ``pin`` (``cancelled``).
_OPEN = (NodeStatus.WAITING, NodeStatus.RUNNING, NodeStatus.RETRYING, NodeStatus.PENDING)


def _removed_rows(store: Store, run_id: str, removed: set[str]) -> list[NodeWrite]:
    if not removed:
        return []
    return [NodeWrite(node_id=n.node_id, fan_index=n.fan_index, status=NodeStatus.CANCELLED, attempt=n.attempt,
                      error={"reason": "step removed by a definition change"}, started_at=n.started_at)
            for n in store.nodes(run_id)
            if NodeKey.parse(n.node_id, n.fan_index).step in removed and n.status in _OPEN]


def ref_of(wf: Workflow, recorded: str | None = None) -> str | None:
    """``module:attr`` of ``wf`` as a module-level name of the module its steps are defined in (what
    ``raysaga resume RUN`` loads next time); else ``recorded`` if that names ``wf`` in this process;
    else None (a script's ``__main__``, a workflow built in a function): ``resume`` then asks for
    ``--workflow`` rather than load a module that holds another definition."""
    from raysaga.orchestrator.loader import recordable_ref  # (the loader imports user code: only here)

    for spec in wf.steps.values():
        module = sys.modules.get(getattr(spec.fn, "__module__", "") or "")
        if module is None or module.__name__ == "__main__":
            continue
        for attr, value in vars(module).items():
            if value is wf:
                return recordable_ref(f"{module.__name__}:{attr}")
    name, _, attr = (recorded or "").rpartition(":")
    module = sys.modules.get(name) if name else None
    return recorded if module is not None and getattr(module, attr, None) is wf else None

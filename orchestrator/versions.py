"""Workflow versions: a run is pinned to the definition it started with.

A run records its workflow's ``definition_hash`` (the DAG's shape and each step's contract, not
the step bodies: ``Workflow.definition_hash``) and, since schema 6, the hash of each step's
signature (``step_hashes``). A resume under another definition is refused with the steps that
changed named (``DefinitionChangedError``); with ``RunOptions(allow_changed=True)``
(``raysaga resume RUN --allow-changed``) it goes on with the new code: the changes are written
in a ``definition_changed`` event and the run is pinned to the new definition, so a later resume
(or a worker) takes it as it now is.

Why per-step hashes on the run row rather than in an event: a resume reads the run row anyway
(one query), the hashes are small (one per step), and the dashboard and ``status`` can show them
without reading the event log.
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from raysaga.errors import DefinitionChangedError
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import Lease, RunRecord, Store

__all__ = ["Changes", "changes", "definition_known", "pin", "step_hashes"]

log = logging.getLogger("raysaga.versions")


def step_hashes(wf: Workflow) -> dict[str, str]:
    """Each step's signature hash: its place in the DAG and its contract (``StepSpec.signature_for_hash``),
    and whether it has a compensation. 16 hex digits each.

    Kept by ``definition_hash``, which hashes the same signatures and the names of the registered
    compensations (so whether each step has one): equal hashes, equal step hashes. Every new run
    records them, and a 200-step workflow takes ~1 ms to hash."""
    wf.validate()
    found = _STEP_HASHES.get(wf.definition_hash)
    if found is None:
        found = {}
        for name in wf.order:
            shape = {**wf.steps[name].signature_for_hash(), "undo": wf.compensation_for(name) is not None}
            found[name] = hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()[:16]
        if len(_STEP_HASHES) >= _KEPT:
            _STEP_HASHES.clear()  # a process with this many definitions: start over
        _STEP_HASHES[wf.definition_hash] = found
    return dict(found)


#: ``step_hashes`` by definition hash, at most ``_KEPT`` definitions.
_STEP_HASHES: dict[str, dict[str, str]] = {}
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

    def steps(self) -> set[str]:
        """Steps whose recorded rows may not fit the code: changed, added or removed."""
        return {*self.changed, *self.added, *self.removed}

    def describe(self) -> str:
        parts = []
        if self.version is not None:
            parts.append(f"version {self.version[0]} -> {self.version[1]}")
        for what, names in (("changed", self.changed), ("added", self.added), ("removed", self.removed)):
            if names:
                parts.append(f"steps {what}: {', '.join(names)}")
        if not self.known:
            parts.append("the run was recorded without per-step hashes, so the changed steps cannot be named")
        elif not parts:
            parts.append("the compensations registered changed")
        return "; ".join(parts)

    def as_data(self) -> dict[str, Any]:
        return {"changed": self.changed, "added": self.added, "removed": self.removed, "known": self.known,
                "version": list(self.version) if self.version else None}


def changes(run: RunRecord, wf: Workflow) -> Changes | None:
    """What changed between the definition ``run`` started with and ``wf``; None when nothing did."""
    if run.definition_hash == wf.definition_hash:
        return None
    version = (run.workflow_version, wf.version) if run.workflow_version != wf.version else None
    if run.step_hashes is None:
        return Changes(version=version, known=False)
    now = step_hashes(wf)
    before = run.step_hashes
    return Changes(changed=[s for s in now if s in before and before[s] != now[s]],
                   added=[s for s in now if s not in before], removed=sorted(s for s in before if s not in now),
                   version=version)


def definition_known(run: RunRecord, wf: Workflow) -> bool:
    """Whether ``wf`` is the definition ``run`` is pinned to (a worker claims only such runs)."""
    return run.workflow_name == wf.name and run.definition_hash == wf.definition_hash


def pin(store: Store, lease: Lease, run: RunRecord, wf: Workflow, *, allow_changed: bool) -> RunRecord:
    """Check that ``run`` may be driven by ``wf`` (the driver calls this under its lease).

    Returns the run unchanged when its definition is ``wf``'s; with ``allow_changed``, the run
    pinned to ``wf`` (a ``definition_changed`` event lists what changed). Otherwise raises
    ``DefinitionChangedError`` naming the changed steps and both ways on.
    """
    found = changes(run, wf)
    if found is None:
        return run
    what = found.describe()
    if not allow_changed:
        raise DefinitionChangedError(
            f"run {run.run_id!r} was started by another definition of workflow {run.workflow_name!r} ({what}; hash "
            f"{run.definition_hash[:12]} != {wf.definition_hash[:12]}): resume it with the code it started with, "
            "or go on with the new code with `raysaga resume RUN --allow-changed` "
            "(RunOptions(allow_changed=True))")
    log.warning("run %s: resuming with a changed definition of %s: %s", run.run_id, run.workflow_name, what)
    return store.repin_definition(lease, wf.definition_hash, step_hashes(wf), {
        "from": run.definition_hash, "to": wf.definition_hash, **found.as_data()})

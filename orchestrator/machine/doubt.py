"""Effect attempts in doubt keep their idempotency key (DESIGN invariant 2), whatever the code says now.

A node's effect key is derived from what it is called with (``keys.effect_key``): the run, the
node, its fan-out index, the effect and its arguments (a tool's ``key=`` arguments). A deploy can
change that derivation under a run in flight: a step that now also reads the run's ``input``, a
tool whose ``key=`` was narrowed. Were the key derived afresh when the run resumes, a call the
crashed driver had made (its ledger row ``pending``: the provider charged, the commit never came)
would go out a second time under a key the downstream has never seen: a second charge.

So before a node's effect is issued, the ledger is asked whether that node (node id, fan-out
index, effect name) has an attempt in doubt under another key (``may_have_happened``: ``pending``,
``abandoned``, or ``failed`` after it took effect). If so the attempt goes out under that key,
``reconciling``: the downstream dedupes it, or the reconcile hook settles it. A row that says the
call took no effect (``failed``) or a committed row under another key is not reused: the first may
be called afresh, and a completed node is never issued again.

Only a run pinned to changed code (``versions.pin`` with ``allow_changed`` marks its step hashes
with ``REPINNED_KEY``) keeps keys this way: under the code it started with, the derivation is the
same as when the attempt was made, so a key that differs means other arguments (an operator's retry
after an upstream step now answers otherwise) and a call of its own. The node (id, fan-out index)
is what is matched, not the effect's name: a deploy may rename that too.

The index is built from the ledger rows the run's snapshot holds (no query per call).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from raysaga.state import EffectRecord, EffectStatus

__all__ = ["REPINNED_KEY", "InDoubt", "may_have_happened"]

NodeEffect = tuple[str, int]  # (node_id, fan_index) of a ledger row
#: Kept among a run's ``step_hashes`` (no step's name) once it was pinned to changed code.
REPINNED_KEY = ":repinned"


def may_have_happened(status: EffectStatus | None, result: Any) -> bool:
    """Whether a call under a key whose ledger row reads ``status``/``result`` may have taken
    effect, so that its re-issue goes out ``reconciling``: ``pending`` (a driver died after the
    call, perhaps), ``abandoned`` (in flight when its run stopped, or its retries ran out on
    transient errors), or ``failed`` with an error saying ``took_effect`` (the function returned
    and its value was refused: the effect is there)."""
    if status in (EffectStatus.PENDING, EffectStatus.ABANDONED):
        return True
    error = result.get("error") if status == EffectStatus.FAILED and isinstance(result, dict) else None
    return isinstance(error, dict) and error.get("took_effect") is True


class InDoubt:
    """The key of each node's effect attempt that may have happened, from the restored ledger."""

    def __init__(self) -> None:
        self._keys: dict[NodeEffect, tuple[float, str]] = {}
        self.took: dict[tuple[str, int], str] = {}
        """Nodes with a ledger row that took effect or may have: (node_id, fan_index) -> its key
        (a rollback that cannot find the tool of such a call must say so: ``Rollback``)."""

    def restore(self, rows: Iterable[EffectRecord], *, repinned: bool = False) -> None:
        """Index the run's ledger rows in doubt (the latest of a node's, should there be several);
        their keys are kept only for a run ``repinned`` to changed code."""
        for row in rows:
            if row.status == EffectStatus.COMMITTED:
                self.took[row.node_id, row.fan_index] = row.idempotency_key
            if not may_have_happened(row.status, row.result):
                continue
            self.took[row.node_id, row.fan_index] = row.idempotency_key
            if not repinned:
                continue
            where = (row.node_id, row.fan_index)
            found = self._keys.get(where)
            if found is None or found[0] <= row.updated_at:
                self._keys[where] = (row.updated_at, row.idempotency_key)

    def key_for(self, node_id: str, fan_index: int, effect_name: str, derived: str,
                ledger: dict[str, tuple[EffectStatus, Any]]) -> str:
        """The key to issue the node's effect under: ``derived`` (what the code computes now), or
        the key of an attempt of the same node still in doubt in ``ledger`` under another one."""
        if not self._keys:
            return derived
        found = self._keys.get((node_id, fan_index))  # (whatever its effect is named now)
        if found is None or found[1] == derived:
            return derived
        held = found[1]
        status, result = ledger.get(held, (None, None))
        if ledger.get(derived, (None,))[0] == EffectStatus.COMMITTED or not may_have_happened(status, result):
            return derived  # settled since (committed, or failed with no effect): the derived key stands
        return held

"""Parking a run whose blob is missing or altered: the run is failed (``compensation_failed``
mid-rollback) naming the node and the digest, and the data is never used; an operator restores
the blob and ``raysaga retry``s it. ``parking`` is pure; ``park_on_blob`` commits what it returns.

Every parking (here, a crash loop, drives that keep failing, a write the store cannot keep)
settles the nodes the run leaves ``running`` or ``retrying`` in the same batch, as a run's end
does: a parked run showed a step under way for ever. Its ``pending`` ledger rows the store's
commit of the parked status makes ``abandoned``, as for any run's end."""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from raysaga.errors import BlobIntegrityError, CorruptRecordError
from raysaga.orchestrator.records import cancelled_row
from raysaga.orchestrator.status_text import flat
from raysaga.state import Batch, NewEvent, NodeRecord, NodeStatus, NodeWrite, RunRecord, RunStatus, RunUpdate, Store
from raysaga.state.models import PARKED, TERMINAL, can_transition

log = logging.getLogger("raysaga.driver")

#: What a node a parked run left in flight is told the run was parked for, by the parking's error.
PARKED_FOR = {"CrashLoop": "a crash loop", "BlobIntegrityError": "a missing or altered blob",
              "DriveFailed": "drives that kept failing", "NotJSONableError": "a write the store cannot keep",
              "live_takeover_loop": "a live takeover loop (a step holding the GIL past the lease)"}


def parked(status: RunStatus, reason: str, error: dict[str, Any], event: NewEvent,
           nodes: Iterable[NodeRecord] = (), now: float | None = None) -> tuple[bool, Batch]:
    """(whether the run must first go back to ``running`` to reach the parked state, the batch that
    parks it: ``failed``, or ``compensation_failed`` mid-rollback) for a run in ``status``. Shared by
    every reason to park a run (a damaged blob here, a crash loop in ``crash_loop``). ``nodes``: the
    run's rows, those in flight settled in the batch (``settled``; ``commit_parking`` reads them)."""
    target = RunStatus.COMPENSATION_FAILED if status == RunStatus.COMPENSATING else RunStatus.FAILED
    resume_first = not can_transition(status, target) and can_transition(status, RunStatus.RUNNING)
    return resume_first, Batch(run=RunUpdate(status=target, status_reason=reason, error=error, set_error=True),
                               events=[event], nodes=settled(nodes, error, time.time() if now is None else now))


def settled(nodes: Iterable[NodeRecord], error: Mapping[str, Any], now: float) -> list[NodeWrite]:
    """The rows a parked run leaves ``running`` or ``retrying``, ``cancelled`` and why, as a run's end
    settles them (``cancelled_row``, as ``Machine.cancel`` writes a row a dead driver left
    ``running``; ``not retried: ...`` as ``Calls.stop_retries`` writes a backoff's): its drivers died
    or stopped, so none will come back. ``raysaga retry`` runs them again under the same keys."""
    why = PARKED_FOR.get(str(error.get("type")), "what its reason names")
    rows: list[NodeWrite] = []
    for row in nodes:
        if row.status == NodeStatus.RUNNING:
            rows.append(cancelled_row(row.node_id, row.fan_index, row.attempt,
                                      f"in flight when the run was parked for {why}: its outcome is unknown",
                                      now, row.started_at))
        elif row.status == NodeStatus.RETRYING:
            rows.append(cancelled_row(row.node_id, row.fan_index, row.attempt,
                                      f"not retried: the run was parked for {why}", now, row.started_at))
    return rows


def parking(status: RunStatus, exc: BlobIntegrityError, where: str | None, run_id: str) -> tuple[bool, Batch]:
    """``parked`` for a blob that is missing or altered."""
    reason = (f"blob {exc.digest} of {where or 'this run'} {exc.problem}: the store was changed outside "
              "raysaga, so the run is parked and the data not used; restore the blob (or the node) and "
              f"`raysaga retry {shlex.quote(run_id)}`")[:1000]
    error = {"type": "BlobIntegrityError", "digest": exc.digest, "problem": exc.problem, "node": where,
             "message": str(exc)}
    return parked(status, reason, error, NewEvent(kind="blob_integrity_error", node_id=None, data={
        "digest": exc.digest, "problem": exc.problem, "node": where}))


def park_on_blob(store: Store, run_id: str, exc: BlobIntegrityError, where: str | None,
                 commit: Callable[[Batch], RunRecord | None]) -> RunRecord:
    """Park the run (the driver's ``commit``, under its lease) unless it is at rest already."""
    return commit_parking(store, run_id, lambda status: parking(status, exc, where, run_id), commit)


def commit_parking(store: Store, run_id: str, parks: Callable[[RunStatus], tuple[bool, Batch]],
                   commit: Callable[[Batch], RunRecord | None]) -> RunRecord:
    """Commit what ``parks`` (a ``parked``) returns for the run's status, through the driver's
    ``commit`` (under its lease), unless the run is at rest already; logged as an error."""
    current = store.get_run(run_id, lenient=True)  # (lenient: its own input may be what is damaged)
    if current.status in TERMINAL or current.status in PARKED:
        return current
    resume_first, batch = parks(current.status)
    found = batch.run.error if batch.run is not None else None
    error = {} if found is None else found if isinstance(found, Mapping) else found.as_dict()
    written = {(n.node_id, n.fan_index) for n in batch.nodes}
    batch.nodes += settled((n for n in _nodes(store, run_id) if (n.node_id, n.fan_index) not in written),
                           error, time.time())
    if resume_first:
        commit(Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
    record = commit(batch)
    assert batch.run is not None
    log.error("run %s: %s", run_id, flat(batch.run.status_reason or ""))  # one line: a step's error may hold newlines
    return record or store.get_run(run_id, lenient=True)


def _nodes(store: Store, run_id: str) -> list[NodeRecord]:
    """The run's rows, to settle those in flight; none when a row cannot be read (the run is parked
    all the same: a damaged row must not keep it driven)."""
    try:
        return store.nodes(run_id)
    except CorruptRecordError as exc:
        log.warning("run %s: parked with its rows in flight unsettled: %s", run_id, exc)
        return []

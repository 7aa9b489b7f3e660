"""Parking a run whose blob is missing or altered: the run is failed (``compensation_failed``
mid-rollback) naming the node and the digest, and the data is never used; an operator restores
the blob and ``raysaga retry``s it. ``parking`` is pure; ``park_on_blob`` commits what it returns."""

from __future__ import annotations

import logging
import shlex
from collections.abc import Callable
from typing import Any

from raysaga.errors import BlobIntegrityError
from raysaga.orchestrator.status_text import flat
from raysaga.state import Batch, NewEvent, RunRecord, RunStatus, RunUpdate, Store
from raysaga.state.models import PARKED, TERMINAL, can_transition

log = logging.getLogger("raysaga.driver")


def parked(status: RunStatus, reason: str, error: dict[str, Any], event: NewEvent) -> tuple[bool, Batch]:
    """(whether the run must first go back to ``running`` to reach the parked state, the batch that
    parks it: ``failed``, or ``compensation_failed`` mid-rollback) for a run in ``status``. Shared by
    every reason to park a run (a damaged blob here, a crash loop in ``crash_loop``)."""
    target = RunStatus.COMPENSATION_FAILED if status == RunStatus.COMPENSATING else RunStatus.FAILED
    resume_first = not can_transition(status, target) and can_transition(status, RunStatus.RUNNING)
    return resume_first, Batch(run=RunUpdate(status=target, status_reason=reason, error=error, set_error=True),
                               events=[event])


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
    if resume_first:
        commit(Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
    record = commit(batch)
    assert batch.run is not None
    log.error("run %s: %s", run_id, flat(batch.run.status_reason or ""))  # one line: a step's error may hold newlines
    return record or store.get_run(run_id, lenient=True)

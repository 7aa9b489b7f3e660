"""Parking a run whose batch of writes holds a value the store cannot keep as JSON.

Values are checked where they are made (a step's output, ``task``); one made by the machine from
checked parts can still fail at commit (a partial fan-out's ``FanOutResult`` nests each item's
output three levels deeper than it was checked at). Such a ``NotJSONableError`` escaped
``Driver.drive``: every run and resume raised it, re-ran the items, and left the run ``running``
for ever. Now the run is parked (``failed``, or ``compensation_failed`` mid-rollback) naming the
node, as a damaged blob parks it (``blob_parking.parked``); an operator fixes the step and
``raysaga retry``s the run.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable

from raysaga.errors import BlobIntegrityError, NotJSONableError
from raysaga.orchestrator.blob_parking import commit_parking, park_on_blob, parked
from raysaga.state import Batch, Lease, NewEvent, RunRecord, Store, jsoncodec


class UnstorableCommit(NotJSONableError):
    """A commit refused a value of a node's write: ``node`` names it (None: not a node's output)."""

    node: str | None = None


def committed(store: Store, lease: Lease, batch: Batch) -> RunRecord | None:
    """``store.commit(lease, batch)``; a ``NotJSONableError`` it raises names the node (``unstorable``)."""
    try:
        return store.commit(lease, batch)
    except NotJSONableError as exc:
        raise unstorable(batch, exc) from None


def park(store: Store, run_id: str, exc: BlobIntegrityError | NotJSONableError, blob_refs: dict[str, str],
         commit: Callable[[Batch], RunRecord | None]) -> RunRecord:
    """Park the run for a damaged blob (``blob_parking``: ``blob_refs`` says what read each digest)
    or for a write the store could not keep (``park_unstorable``)."""
    if isinstance(exc, BlobIntegrityError):
        return park_on_blob(store, run_id, exc, blob_refs.get(exc.digest) or exc.where, commit)
    return park_unstorable(store, run_id, exc, commit)


def unstorable(batch: Batch, exc: NotJSONableError) -> UnstorableCommit:
    """``exc`` (raised by the store's commit of ``batch``) naming the node whose output it is."""
    node = None
    for write in batch.node_writes():
        try:
            jsoncodec.dumps(write.output)
        except (NotJSONableError, RecursionError):
            node = write.node_id if write.fan_index < 0 else f"{write.node_id}[{write.fan_index}]"
            break
    found = UnstorableCommit(f"the output of node {node!r} cannot be stored: {exc}" if node else str(exc))
    found.node = node
    return found


def park_unstorable(store: Store, run_id: str, exc: NotJSONableError,
                    commit: Callable[[Batch], RunRecord | None]) -> RunRecord:
    """Park the run (the driver's ``commit``, under its lease) unless it is at rest already."""
    node = exc.node if isinstance(exc, UnstorableCommit) else None
    reason = (f"{jsoncodec.printable(str(exc))[:700]}: the run is parked; change the step so its value can be "
              f"stored, then `raysaga retry {shlex.quote(run_id)}`")
    error = {"type": "NotJSONableError", "node": node, "message": jsoncodec.printable(str(exc))[:2000]}
    event = NewEvent(kind="unstorable_write", node_id=node, data={"node": node})
    return commit_parking(store, run_id, lambda status: parked(status, reason[:1000], error, event), commit)

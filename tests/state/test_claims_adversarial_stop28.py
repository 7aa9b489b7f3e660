"""Third adversarial round, a worker's claim (``Store.claim_next``) on SQLite and PostgreSQL.

- A backlog of a workflow at its ``--limit`` hid every other workflow's runs: the claim read the
  16 oldest runnable runs, all of the limited workflow, skipped them all and answered "nothing",
  so a worker serving ``research`` (limit 1, 100 queued) and ``order`` left an ``order`` run
  waiting behind the backlog with its slots idle, until the backlog drained. Now the workflows at
  their limit are left out of the query itself.
"""

from __future__ import annotations

import uuid

from raysaga.state import NewRun, SqlStore
from raysaga.state.claims import CANDIDATES


def _new(store: SqlStore, run_id: str, workflow: str, digest: str = "h1") -> str:
    store.create_run(NewRun(run_id=run_id, workflow_name=workflow, workflow_version="1", definition_hash=digest,
                            trace_id="t", queue="default"))
    return run_id


def test_a_backlog_at_its_limit_does_not_hide_another_workflows_run(store: SqlStore) -> None:
    tag = uuid.uuid4().hex[:8]
    limited, other = f"research{tag}", f"order{tag}"
    served = {limited: "h1", other: "h9"}
    limits = {limited: 1}
    backlog = [_new(store, f"r{i:03d}-{tag}", limited) for i in range(CANDIDATES + 4)]  # older than the order
    order = _new(store, f"o-{tag}", other, "h9")
    first = store.claim_next("w1", 30, served, limits=limits)
    assert first is not None and first.lease.run_id == backlog[0]  # the limited workflow's one slot
    second = store.claim_next("w2", 30, served, limits=limits)
    assert second is not None and second.lease.run_id == order, "the order waited behind the backlog"
    assert store.claim_next("w3", 30, served, limits=limits) is None  # the backlog waits for its slot
    store.release(first.lease)
    third = store.claim_next("w3", 30, served, limits=limits)
    assert third is not None and third.lease.run_id == backlog[0]  # released: its slot is free again

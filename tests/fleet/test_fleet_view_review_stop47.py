"""The fleet line's diff review (stop 47): a run an earlier raysaga recorded under the code's
earlier-scheme hash was reported served by no worker while a live one claimed it; a worker told to
stop (SIGTERM) that still finished its runs was counted as serving a run it would never claim.

The registry rows are written as a worker writes them (``Presence``), on a real store; the
worker processes themselves are tests/fleet/test_worker_registry.py's."""

from __future__ import annotations

from sqlalchemy import update

from raysaga import Client
from raysaga.orchestrator import fleet_view, versions
from raysaga.orchestrator.worker_presence import Presence
from raysaga.state import SqlStore, Store
from raysaga.state.schema import runs
from tests.support.fleet_view_flows import alpha


def _as_recorded_by_an_earlier_raysaga(store: Store, run_id: str) -> None:
    assert isinstance(store, SqlStore)
    with store.engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == run_id)
                     .values(definition_hash=versions.legacy_hash(alpha), step_hashes=None))


def test_a_run_recorded_under_the_earlier_hash_is_served_by_a_worker_of_its_code(store_url: str) -> None:
    with Client(store_url) as client:
        presence = Presence(client.store, {alpha.name: alpha}, 1)
        presence.register()
        try:
            run = client.submit(alpha, 5)
            _as_recorded_by_an_earlier_raysaga(client.store, run.run_id)
            now = client.get_run(run.run_id).created_at + 1
            seen = fleet_view.fleet(client.store, client.get_run(run.run_id), now)
            assert seen is not None and seen["serving"] == 1, seen
        finally:
            presence.stop()


def test_a_worker_that_stopped_claiming_serves_no_run(store_url: str) -> None:
    with Client(store_url) as client:
        presence = Presence(client.store, {alpha.name: alpha}, 1)
        presence.register()
        run = client.submit(alpha, 5)
        now = client.get_run(run.run_id).created_at + 1
        assert (fleet_view.fleet(client.store, client.get_run(run.run_id), now) or {}).get("serving") == 1
        presence._next = 0.0  # (its next beat is due)
        presence.beat(1, stopping=True)  # SIGTERM: it finishes its run, claims no more
        seen = fleet_view.fleet(client.store, client.get_run(run.run_id), now)
        assert seen is not None and seen["serving"] == 0, seen
        [row] = [w for w in client.workers(include_gone=True) if w.worker_id == presence.worker_id]
        assert row.stopped_at is not None


"""An operator's pause beside a cancel, and a pause of a run whose driver was killed (stop 51, a review).

1. ``cancel(compensate=True)`` then ``pause``: the pause moved the run to ``paused``, which cleared
   the ``wake_at`` the cancel had set; a paused run is never due, so no worker rolled it back, and
   nothing said the rollback waited for an unpause. A pause of a run with a cancel queued is refused.
2. ``Client.cancel`` while a pause at rest held the run's lease for its transition: the cancel took
   the lease for a live driver's, queued its signal and returned; the run rested ``paused`` with
   the cancel queued (5 of 12 races on PostgreSQL). The interleaving is made here by holding the
   lease as the pause does, without a thread race: the cancel now waits for the lease and cancels.
3. ``pause`` of a run whose driver was SIGKILLed (its lease still valid) said "its driver pauses it
   shortly", and none did: the run is paused at once, as a cancel is taken at once.

Real inline runs on real SQLite files; the killed driver a real ``raysaga run`` process.
"""

from __future__ import annotations

import signal
import threading
import uuid
from pathlib import Path

import pytest

import raysaga
from raysaga import Approval, Client, StepContext, Workflow
from raysaga.errors import UserError
from raysaga.state import RunRecord, RunStatus, SqlStore
from tests.support import no_driver_flows as flows
from tests.support.crash_driver import wait_until


def _approval_flow(log: Path) -> Workflow:
    wf = Workflow(f"stop51_pc_{uuid.uuid4().hex[:6]}")

    @wf.step(effect=True)
    def hold_funds(ctx: StepContext, input: int) -> int:
        with log.open("a") as fh:
            fh.write(f"hold {ctx.idempotency_key}\n")
        return input

    @wf.compensation("hold_funds")
    def release_funds(ctx: StepContext, output: int) -> None:
        with log.open("a") as fh:
            fh.write(f"release {output}\n")

    @wf.approval(approvers=["alice"])
    def review(hold_funds: int) -> str:
        return f"pay {hold_funds}?"

    @wf.step(after=["review"])
    def pay(review: Approval) -> str:
        return "paid"

    del pay
    return wf


def _waiting(tmp_path: Path) -> tuple[Workflow, str, Path]:
    log = tmp_path / "effects.log"
    wf = _approval_flow(log)
    url = f"sqlite:///{tmp_path / 's.db'}"
    run = raysaga.run(wf, 7, store=url, run_id="r", executor="inline")
    assert run.status == RunStatus.WAITING_HUMAN
    return wf, url, log


def test_a_pause_after_a_cancel_with_rollback_is_refused_and_the_rollback_still_runs(tmp_path: Path) -> None:
    wf, url, log = _waiting(tmp_path)
    client = Client(url)
    asked = client.cancel("r", compensate=True, by="ops1")
    assert asked.wake_at is not None
    with pytest.raises(UserError, match=r"has a cancel queued .*it is not paused"):
        client.pause("r", by="ops2")
    run = client.get_run("r")
    assert run.status == RunStatus.WAITING_HUMAN and run.wake_at is not None  # still due for a driver
    done = raysaga.resume(wf, "r", store=url, executor="inline")
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    assert log.read_text().splitlines()[-1] == "release 7"


def test_a_cancel_meeting_a_pause_at_rest_waits_for_its_lease_and_cancels(tmp_path: Path) -> None:
    _, url, _ = _waiting(tmp_path)
    store = SqlStore(url)
    client = Client(url)
    lease = store.claim("r", "pausing-operator", 30)  # as ``Client.pause`` holds it while it moves the run
    result: list[RunRecord] = []
    canceller = threading.Thread(target=lambda: result.append(client.cancel("r", by="ops1")))
    canceller.start()
    try:
        wait_until(lambda: [s for s in store.pending_signals("r") if s.kind == "cancel"] or None,
                   timeout=30, what="the cancel to queue its signal")
        run = store.get_run("r")
        store.transition("r", run.version, RunStatus.PAUSED, reason="paused by ops2")
    finally:
        store.release(lease)
    canceller.join(30)
    assert not canceller.is_alive()
    assert result[0].status == RunStatus.CANCELLED, result[0].status_reason
    assert store.get_run("r").status == RunStatus.CANCELLED and store.pending_signals("r") == []
    store.close()


def test_a_pause_of_a_run_whose_driver_was_killed_pauses_it_at_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    proc = flows.start("effect", url, "k", tmp_path, "--lease-ttl", "600")
    try:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        (tmp_path / "release").touch()
    client = Client(url)
    before = client.get_run("k")
    assert before.status == RunStatus.RUNNING and before.lease_owner is not None  # its lease outlives it
    paused = client.pause("k", by="ops")
    assert paused.status == RunStatus.PAUSED, paused.status_reason
    assert [s for s in client.store.pending_signals("k") if s.kind == "pause"] == []


def test_a_pause_of_a_waiting_run_its_live_driver_holds_is_signalled(tmp_path: Path) -> None:
    """A driver may hold a run while it waits (an approval with a timeout near): the pause goes to
    it as a signal at once (a first version of the fix above waited on that lease, then said the
    run "kept changing")."""
    from raysaga.orchestrator.ownership import new_owner

    _, url, _ = _waiting(tmp_path)
    store = SqlStore(url)
    lease = store.claim("r", new_owner(), 30)  # this process: alive
    try:
        held = Client(url).pause("r", by="ops")
        assert held.status == RunStatus.WAITING_HUMAN
        assert [s.kind for s in store.pending_signals("r")] == ["pause"]
    finally:
        store.release(lease)
        store.close()

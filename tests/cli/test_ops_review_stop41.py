"""Operations found wrong in review (stop 41): a launch of a paused run, an approval beside an
inline step, and the message for a second decision after a timely first one."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

import raysaga
from raysaga import Approval, Client, Workflow
from raysaga.errors import RunNotFoundError, UserError
from raysaga.state import RunStatus, SqlStore
from tests.support.fake_jobs import FakeJobs


def _one_step(name: str) -> Workflow:
    wf = Workflow(name)

    @wf.step()
    def only() -> int:
        return 1

    return wf


def test_launching_a_run_an_operator_paused_is_refused_before_any_job_is_submitted(tmp_path: Path) -> None:
    """It said "launched" (exit 0) and submitted a job whose driver refused the paused run at once,
    using up the job id; ``resume`` refuses it with the unpause hint, and so does launch now."""
    from raysaga.orchestrator import cli_launch
    from raysaga.orchestrator.runner import create_run

    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        create_run(_one_step("stop41_paused_launch"), None, store=store, run_id="held-1")
        Client(store).pause("held-1", by="op", reason="maintenance")
        record = store.get_run("held-1")
        assert record.status == RunStatus.PAUSED
        cluster = FakeJobs({})
        with pytest.raises(UserError, match="raysaga unpause held-1"):
            cli_launch._drive_on_cluster(cluster, store, record, {}, "python -m raysaga resume held-1")  # type: ignore[arg-type]
        assert cluster.submitted == []
    finally:
        store.close()


def _approval_beside_a_slow_step(gate: threading.Event) -> Workflow:
    wf = Workflow("stop41_inline_approval")

    @wf.step()
    def first() -> int:
        return 1

    @wf.step()
    def slow(first: int) -> int:
        assert gate.wait(60), "the approval was never decidable while this step ran"
        return 2

    @wf.approval(approvers=["alice"], timeout=120)
    def review(first: int) -> str:
        return "ship it?"

    @wf.step()
    def done(review: Approval, slow: int) -> list[str]:
        return list(review.by)

    return wf


def test_an_approval_is_decidable_while_an_inline_sibling_step_runs(tmp_path: Path) -> None:
    """The inline executor runs a step at submit: the batch asking for the approval was committed
    only after the sibling returned, so ``approve`` was refused all along (and a timeout could pass
    before anyone saw the request). Here the sibling waits until the approval is decided."""
    gate = threading.Event()
    wf = _approval_beside_a_slow_step(gate)
    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    outcome: dict[str, object] = {}

    def decide() -> None:
        client = Client(db)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not gate.is_set():
            try:
                client.approve("inline-1", "review", by="alice")
                gate.set()
            except (UserError, RunNotFoundError) as exc:  # not created or asked yet: polled, as an operator would
                outcome["refused"] = str(exc)
                time.sleep(0.05)

    decider = threading.Thread(target=decide, daemon=True)
    decider.start()
    try:
        record = raysaga.run(wf, store=db, executor="inline", run_id="inline-1")
    finally:
        gate.set()
        decider.join(10)
    assert record.status == RunStatus.COMPLETED, outcome
    assert record.output == {"done": ["alice"]}


def test_a_second_decision_after_a_timely_first_says_already_decided_not_timed_out(tmp_path: Path) -> None:
    wf = Workflow("stop41_decided_then_late")

    @wf.approval(approvers=["alice", "bob"], timeout=1)
    def review() -> str:
        return "ok?"

    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    record = raysaga.run(wf, store=db, executor="inline", options=raysaga.RunOptions(release_after=0))
    assert record.status == RunStatus.WAITING_HUMAN
    client = Client(db)
    client.approve(record.run_id, "review", by="alice")
    request_timeout = time.time() + 1.5
    while time.time() < request_timeout:  # the subject is the wall clock: past the approval's timeout
        time.sleep(0.05)
    with pytest.raises(UserError, match="already decided: approved by alice"):
        client.approve(record.run_id, "review", by="bob")


def test_pausing_a_running_run_whose_driver_died_pauses_it_at_once(tmp_path: Path) -> None:
    """A ``running`` run whose lease expired has no driver to obey a pause signal: ``pause`` said
    "its driver pauses it shortly" and left it running, and ``unpause`` then refused it ("not
    paused"). It is paused at once now, under a lease of its own, as a resting run is."""
    from raysaga.orchestrator.runner import create_run

    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        created = create_run(_one_step("stop41_dead_driver_pause"), None, store=store, run_id="orphan-1")
        lease = store.claim("orphan-1", "a-driver-that-died", 0.2)
        store.transition("orphan-1", created.version, RunStatus.RUNNING)
        while time.time() <= lease.expires_at:  # the subject is the wall clock: the dead driver's lease runs out
            time.sleep(0.05)
        client = Client(store)
        paused = client.pause("orphan-1", by="op")
        assert paused.status == RunStatus.PAUSED
        assert client.unpause("orphan-1", by="op").wake_at is not None  # a worker takes it up at once
    finally:
        store.close()

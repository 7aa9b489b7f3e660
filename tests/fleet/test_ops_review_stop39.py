"""The operations layer as the stop-39 review found it broken, each fixed case proved here.

- A short wait (a timer within ``release_after``) kept its writes uncommitted while the driver
  slept through it: an approval with a short timeout was in no inbox and could not be decided
  until it timed out, and a short sleep restarted from zero after a crash. Now what waits is
  committed before the driver waits.
- A run paused at rest kept its ``wake_at``: a worker took it up when its timer came due and ran
  the rest (an approval's timeout applied while paused). Now a paused run is due only once
  unpaused; its timers keep their times and fire then.
- A decision id reused for another fan-out item said done and lost the approval.
- ``raysaga worker --executor bogus`` claimed a run, its slot died, the run stayed leased and the
  worker exited 0 having "claimed 0".

Real SQLite files; subprocess drivers and workers where the bug is about them. Every wait polls
the store with a bound; the only waits for time to pass are for a run's own timers to come due.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import Ask, RunOptions, Workflow
from raysaga.errors import UserError
from raysaga.orchestrator.client import Client
from raysaga.orchestrator.worker import Worker
from raysaga.state import NodeStatus, RunRecord, RunStatus, SqlStore
from tests.support import REPO
from tests.support.files import import_file

FLOWS = '''
import time
from raysaga import Ask, Approval, StepContext, Workflow

approve_soon = Workflow("ops39_approve_soon")


@approve_soon.step()
def prep(input: dict) -> int:
    return 1


@approve_soon.approval(approvers=["alice"], timeout=8.0, on_timeout="reject")
def review(prep: int) -> Ask:
    return Ask(prompt="ship it?", payload=prep)


@approve_soon.step()
def ship(review: Approval) -> list:
    return review.by


short_sleep = Workflow("ops39_short_sleep")


@short_sleep.step()
def before(input: dict) -> float:
    return time.time()


short_sleep.sleep("nap", seconds=5.0, after=["before"])


@short_sleep.step(after=["nap"])
def after(ctx: StepContext) -> float:
    return time.time()


sleeper = Workflow("ops39_sleeper")


@sleeper.step()
def s1(input: dict) -> int:
    return 1


sleeper.sleep("nap", seconds=0.3, after=["s1"])


@sleeper.step(after=["nap"])
def s2(ctx: StepContext) -> float:
    return time.time()


timing_out = Workflow("ops39_timing_out")


@timing_out.step()
def ask(input: dict) -> int:
    return 1


@timing_out.approval(approvers=["alice"], timeout=0.3, on_timeout="reject")
def gate(ask: int) -> Ask:
    return Ask(prompt="go?", payload=ask)


@timing_out.step()
def act(gate: Approval) -> str:
    return "acted"


long_sleep = Workflow("ops39_long_sleep")


@long_sleep.step()
def first(input: dict) -> int:
    return 1


long_sleep.sleep("nap", seconds=3600.0, after=["first"])


marker = Workflow("ops39_marker")


@marker.step()
def one(input: dict) -> int:
    return 1


fanned = Workflow("ops39_fanned")


@fanned.step()
def items(input: dict) -> list:
    return [10, 20]


@fanned.approval(approvers=["alice"], map_over="items")
def check(items: int) -> Ask:
    return Ask(prompt=f"approve {items}?", payload=items)


@fanned.step()
def total(check: list) -> int:
    return len(check)
'''


@pytest.fixture
def flows(tmp_path: Path) -> Iterator[tuple[Path, Any]]:
    """The flows file (subprocesses name it ``PATH:wf``) and the same module imported here."""
    path = tmp_path / "ops39_flows.py"
    path.write_text(FLOWS)
    yield path, import_file(path, "ops39_flows")


def _until(what: str, check: Callable[[], Any], timeout: float = 60.0) -> Any:
    """Poll ``check`` (every 20 ms) until it returns something truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)
    raise AssertionError(f"timed out waiting for {what}")


def _cli(db: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "raysaga", *args, "--db", db], cwd=REPO, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _alive(proc: subprocess.Popen[str]) -> bool:
    """True while ``proc`` runs; a failure naming its stderr once it has exited (nothing to wait for)."""
    if proc.poll() is None:
        return True
    _, err = proc.communicate()
    pytest.fail(f"the process exited ({proc.returncode}) before what the test waits for: {err}")


def _node(store: SqlStore, run_id: str, node_id: str, fan_index: int = -1) -> Any:
    return next((n for n in store.nodes(run_id) if n.node_id == node_id and n.fan_index == fan_index), None)


# ---------------------------------------------------------------- short waits are durable


def test_an_approval_with_a_short_timeout_is_in_the_inbox_and_decided_while_its_driver_waits(
        sqlite_url: str, flows: tuple[Path, Any]) -> None:
    """timeout=8 < release_after=30: the driver holds the run until the timeout; the request is
    committed first, so the approver sees it and decides it long before it times out."""
    store = SqlStore(sqlite_url)
    driver = _cli(sqlite_url, "run", f"{flows[0]}:approve_soon", "--run-id", "soon", "--executor", "inline",
                  "--input", "{}")
    try:
        [waiting] = _until("the approval in the inbox", lambda: _alive(driver) and store.waiting_approvals("alice"))
        assert (waiting.run_id, waiting.node) == ("soon", "review")
        asked = time.time()
        assert store.get_run("soon").lease_owner is not None  # the live driver holds it meanwhile
        store.decide("soon", "review", "approve", by="alice", comment="go")
        driver.communicate(timeout=60)
        done = store.get_run("soon")
        assert done.status == RunStatus.COMPLETED, done.status_reason
        assert done.output == {"ship": ["alice"]}
        assert done.updated_at < waiting.request.timeout_at  # decided, not timed out
        assert done.updated_at - asked < 5.0
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
        store.close()


def test_a_short_sleep_killed_midway_resumes_to_the_same_moment(sqlite_url: str, flows: tuple[Path, Any]) -> None:
    """A 5 s sleep (under release_after): its not_before is durable as it starts, so a SIGKILL of the
    driver during it and a resume wake at the original time, not 5 s after the resume."""
    path, module = flows
    store = SqlStore(sqlite_url)
    driver = _cli(sqlite_url, "run", f"{path}:short_sleep", "--run-id", "nap1", "--executor", "inline",
                  "--input", "{}")
    try:
        nap = _until("the sleep's row", lambda: _alive(driver) and _node(store, "nap1", "nap"))
        assert nap.status == NodeStatus.WAITING and nap.not_before is not None  # durable while it sleeps
        assert any(e.kind == "sleep_started" for e in store.events("nap1"))
        driver.send_signal(signal.SIGKILL)
        driver.communicate(timeout=60)
        assert time.time() < nap.not_before  # killed during the sleep
        done = raysaga.resume(module.short_sleep, "nap1", store=sqlite_url, executor="inline")
        assert done.status == RunStatus.COMPLETED, done.status_reason
        after = done.output["after"]
        assert nap.not_before <= after < nap.not_before + 3.0, (after - nap.not_before)
        assert _node(store, "nap1", "nap").output == {"slept_until": nap.not_before}  # the same moment
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.communicate()
        store.close()


# ---------------------------------------------------------------- a paused run holds


def _rest(module: Any, wf_name: str, url: str, run_id: str) -> RunRecord:
    return raysaga.run(getattr(module, wf_name), {}, store=url, executor="inline", run_id=run_id,
                       options=RunOptions(release_after=0))


def test_a_paused_run_is_not_taken_up_when_its_timer_comes_due_and_its_timers_fire_at_unpause(
        sqlite_url: str, flows: tuple[Path, Any]) -> None:
    path, module = flows
    store = SqlStore(sqlite_url)
    client = Client(store)
    worker: subprocess.Popen[str] | None = None
    try:
        sleeping = _rest(module, "sleeper", sqlite_url, "sleepy")
        waiting = _rest(module, "timing_out", sqlite_url, "gated")
        assert sleeping.status == RunStatus.WAITING_TIMER and waiting.status == RunStatus.WAITING_HUMAN
        for run_id in ("sleepy", "gated"):
            paused = client.pause(run_id, by="ops")
            assert paused.status == RunStatus.PAUSED and paused.wake_at is None  # not due while paused
        due = max(w for w in (sleeping.wake_at, waiting.wake_at) if w is not None)
        _until("the paused runs' timers to come due", lambda: time.time() > due + 0.05)
        # a worker that claims oldest-due first, one at a time: once it has driven the marker
        # (submitted after both timers came due) it has looked at the paused runs too
        client.submit(module.marker, {}, run_id="mark")
        worker = _cli(sqlite_url, "worker", "-w", f"{path}:sleeper", "-w", f"{path}:timing_out",
                      "-w", f"{path}:marker", "--executor", "inline", "--concurrency", "1", "--poll", "0.05",
                      "--lease-ttl", "2")
        _until("the marker run to complete", lambda: store.get_run("mark").status == RunStatus.COMPLETED)
        for run_id, node in (("sleepy", "nap"), ("gated", "gate")):
            run = store.get_run(run_id)
            assert run.status == RunStatus.PAUSED, (run_id, run.status, run.status_reason)
            assert _node(store, run_id, node).status == NodeStatus.WAITING
            kinds = [e.kind for e in store.events(run_id)]
            assert "lease_claimed" not in kinds[kinds.index("run_paused"):], kinds
        with pytest.raises(UserError, match="timed out"):  # the timeout passed, paused or not
            store.decide("gated", "gate", "approve", by="alice")
        unpaused_at = time.time()
        client.unpause("sleepy", by="ops")
        client.unpause("gated", by="ops")
        done = _until("the sleeper to complete", lambda: (r := store.get_run("sleepy")).status in
                      (RunStatus.COMPLETED, RunStatus.FAILED) and r)
        assert done.status == RunStatus.COMPLETED and done.output["s2"] >= unpaused_at  # its nap fired now
        ended = _until("the timeout's outcome", lambda: (r := store.get_run("gated")).status == RunStatus.FAILED
                       and r)
        assert "before its timeout" in (ended.status_reason or ""), ended.status_reason
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            _, err = worker.communicate(timeout=60)
            assert worker.returncode == 0, err
        store.close()


def test_an_unpaused_run_rests_again_until_a_timer_not_yet_due(sqlite_url: str, flows: tuple[Path, Any]) -> None:
    """Unpause honours the timer's own time: a sleep not due yet rests again with the same wake_at."""
    _, module = flows
    rested = _rest(module, "long_sleep", sqlite_url, "long")
    assert rested.status == RunStatus.WAITING_TIMER and rested.wake_at is not None
    client = Client(sqlite_url)
    try:
        client.pause("long", by="ops")
        client.unpause("long", by="ops")
        assert client.get_run("long").wake_at is not None  # due now: a worker takes it up
        again = raysaga.resume(module.long_sleep, "long", store=sqlite_url, executor="inline",
                               options=RunOptions(release_after=0))
        assert again.status == RunStatus.WAITING_TIMER
        assert again.wake_at == pytest.approx(rested.wake_at)
    finally:
        client.close()


# ---------------------------------------------------------------- decision ids


def test_a_decision_id_reused_on_another_item_is_refused_and_that_item_still_waits(
        sqlite_url: str, flows: tuple[Path, Any]) -> None:
    _, module = flows
    rested = raysaga.run(module.fanned, {}, store=sqlite_url, executor="inline", run_id="fan")
    assert rested.status == RunStatus.WAITING_HUMAN
    store = SqlStore(sqlite_url)
    try:
        first = store.decide("fan", "check", "approve", by="alice", fan_index=0, decision_id="batch-42")
        assert store.decide("fan", "check", "approve", by="alice", fan_index=0, decision_id="batch-42") == first
        with pytest.raises(UserError, match=r"decision id 'batch-42' was already used .*'check\[0\]'"):
            store.decide("fan", "check", "approve", by="alice", fan_index=1, decision_id="batch-42")
        assert [(w.node, w.fan_index) for w in store.waiting_approvals()] == [("check", 1)]
        second = store.decide("fan", "check", "approve", by="alice", fan_index=1, decision_id="batch-43")
        assert second.fan_index == 1
        done = raysaga.resume(module.fanned, "fan", store=sqlite_url, executor="inline")
        assert done.status == RunStatus.COMPLETED and done.output == {"total": 2}
    finally:
        store.close()


class Edit(BaseModel):
    amount: int


answers = Workflow("ops39_answers")


@answers.step()
def start(input: dict[str, Any]) -> int:
    return 40


@answers.approval(approvers=["alice"], answer=Edit)
def review(start: int) -> Ask:
    return Ask(prompt="refund?", payload=start)


def test_a_decision_id_reused_with_another_answer_is_refused(sqlite_url: str) -> None:
    raysaga.run(answers, {}, store=sqlite_url, executor="inline", run_id="ans")
    store = SqlStore(sqlite_url)
    try:
        first = store.decide("ans", "review", "approve", by="alice", answer={"amount": 30}, decision_id="d-1")
        assert store.decide("ans", "review", "approve", by="alice", answer={"amount": 30}, decision_id="d-1") == first
        with pytest.raises(UserError, match="decision id 'd-1' was already used"):
            store.decide("ans", "review", "approve", by="alice", answer={"amount": 10}, decision_id="d-1")
    finally:
        store.close()


# ---------------------------------------------------------------- a worker that cannot drive


def test_a_worker_with_an_unknown_executor_refuses_to_start_and_claims_nothing(
        sqlite_url: str, flows: tuple[Path, Any]) -> None:
    path, module = flows
    client = Client(sqlite_url)
    try:
        client.submit(module.marker, {}, run_id="m1")
        with pytest.raises(UserError, match="--executor must be ray or inline, got 'bogus'"):
            Worker([module.marker], client.store, executor="bogus")
        done = subprocess.run([sys.executable, "-m", "raysaga", "worker", "-w", f"{path}:marker", "--executor",
                               "bogus", "--poll", "0.05", "--db", sqlite_url], cwd=REPO, text=True,
                              capture_output=True, timeout=60, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert done.returncode == 2, done.stderr
        assert "--executor must be ray or inline, got 'bogus'" in done.stderr
        run = client.get_run("m1")
        assert run.status == RunStatus.PENDING and run.lease_owner is None
        assert "lease_claimed" not in [e.kind for e in client.store.events("m1")]
    finally:
        client.close()


def test_a_slot_whose_executor_fails_stops_the_worker_with_why_and_leaves_the_run_free(
        sqlite_url: str, flows: tuple[Path, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    _, module = flows
    from raysaga.orchestrator import worker as worker_module

    def broken(kind: str, address: str | None = None) -> Any:
        raise RuntimeError("the executor could not start")

    monkeypatch.setattr(worker_module, "make_executor", broken)
    client = Client(sqlite_url)
    try:
        client.submit(module.marker, {}, run_id="m2")
        w = Worker([module.marker], client.store, executor="inline", concurrency=2, poll=0.05)
        with pytest.raises(RuntimeError, match="the executor could not start"):
            w.run()
        assert w.counts.claimed == 0
        run = client.get_run("m2")
        assert run.status == RunStatus.PENDING and run.lease_owner is None
    finally:
        client.close()

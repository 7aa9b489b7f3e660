"""Review stop 46, waits: decisions on runs at rest, a rollback on its way, the worker's last line.

- A decision on a run resting at a rate limit's gate (an agent's second model call paced for 10
  minutes, an approval ``gate`` waiting beside it) did not wake it: the run rested
  ``waiting_timer`` and only a run resting ``waiting_human`` was made due, so ``after_gate`` waited
  out the window while ``approve`` said "a worker takes the run up now". A decision recorded while
  the driver still held the run was lost the same way: its rest at the gate never looked for one.
- ``Client.cancel(compensate=True)`` of a waiting run was invisible: ``status`` still said "waiting
  for a decision on review", ``inbox`` listed it, and an approval was taken, then rolled back.
- ``raysaga worker``'s last line counted a run it rolled back (or that failed) as "resting".
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import update

import raysaga
from raysaga import Approval, Client, RateLimit, RunRecord, RunStatus, Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply
from raysaga.errors import UserError
from raysaga.orchestrator import cli_ops
from raysaga.orchestrator.dashboard.actions import perform
from raysaga.orchestrator.worker import Worker
from raysaga.state import NodeStatus, SqlStore
from raysaga.state.schema import runs
from tests.support import fleet_flows
from tests.support.crash_driver import wait_until
from tests.support.services import FakeServices, get_log
from tests.support.worker_procs import fleet_input, start_worker, stop

#: The paced model's window: far longer than any wait here (the bug waited all of it).
WINDOW = 600.0


def _gate_flow(name: str, look: Any = None) -> Workflow:
    """``a`` → ``slow`` (an agent: a tool call, then an answer; its model admits one call per
    ``WINDOW``, so its second turn waits at the gate) and ``a`` → ``gate`` (an approval) →
    ``after_gate``. ``look``: the tool's body (default: an answer)."""

    @tool()
    def lookup(q: str) -> str:
        """Look something up."""
        return look(q) if look is not None else "found " + q

    model = ScriptedModel(default=(tool_reply(("lookup", {"q": "a"})), text_reply("done")))
    agent = Agent(name=f"{name}-agent", model=model, tools=(lookup,),
                  rate_limit=RateLimit(name=f"{name}-model", requests=1, per=WINDOW))
    wf = Workflow(name, version="1")

    @wf.step()
    def a(input: dict[str, Any]) -> int:
        return 1

    @wf.agent(agent)
    def slow(a: int) -> str:
        return "go"

    @wf.approval()
    def gate(a: int) -> str:
        return "ship it?"

    @wf.step()
    def after_gate(gate: Approval) -> str:
        return "shipped by " + ",".join(gate.by)

    return wf


def _node(store: SqlStore, run_id: str, node: str) -> NodeStatus | None:
    """The node's status; None before it has a row."""
    return next((n.status for n in store.nodes(run_id) if n.node_id == node), None)


@pytest.fixture
def store(own_store_url: str) -> Iterator[SqlStore]:
    """A store of this test's own (a SQLite file, or a fresh PostgreSQL database): the worker here
    claims every runnable run in it, and its rate limits' windows start empty."""
    opened = SqlStore(own_store_url)
    yield opened
    opened.close()


def _working(store: SqlStore, wf: Workflow) -> tuple[Worker, threading.Thread]:
    worker = Worker([wf], store, concurrency=1, executor="inline", poll=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return worker, thread


def _stopped(worker: Worker, thread: threading.Thread) -> None:
    worker.stop()
    thread.join(timeout=60)
    assert not thread.is_alive()


def test_a_decision_wakes_a_run_resting_at_a_rate_limit_gate(store: SqlStore) -> None:
    wf = _gate_flow("stop46_gate")
    rested = raysaga.run(wf, {}, store=store, run_id="gated", executor="inline")
    assert rested.wake_at is not None and rested.wake_at > time.time() + WINDOW / 2  # due when the window ends
    assert rested.status == RunStatus.WAITING_HUMAN, rested.status  # a human is awaited too: it says so
    assert rested.status_reason is not None and rested.status_reason.startswith("waiting for a decision on gate, "
                                                                                "and for rate limit stop46_gate-model")
    with Client(store) as client:
        assert [(w.run_id, w.node) for w in client.inbox()] == [("gated", "gate")]
        before = cli_ops._next_step("gated", client)  # a decision that did not settle would leave it so
        assert "takes the run up now" not in before and "when it is due" in before, before
        client.approve("gated", "gate", by="ada")
        woken = client.get_run("gated")
        assert woken.wake_at is not None and woken.wake_at <= time.time()  # due now, not in 10 minutes
        assert woken.status_reason is not None and woken.status_reason.startswith("gate approved by ada")
        assert "takes the run up now" in cli_ops._next_step("gated", client)  # and so it is
    worker, thread = _working(store, wf)
    try:
        wait_until(lambda: _node(store, "gated", "after_gate") == NodeStatus.COMPLETED, timeout=60,
                   what="a worker to take the approved branch up")
    finally:
        _stopped(worker, thread)
    after = store.get_run("gated")  # the agent's turn still waits for the window: only time now
    assert after.status == RunStatus.WAITING_TIMER, after.status
    assert after.status_reason is not None and after.status_reason.startswith("waiting for rate limit "), \
        after.status_reason
    assert worker.counts.rested == 1 and worker.counts.ended == 0


def test_a_decision_wakes_a_run_rested_waiting_timer_with_an_approval_waiting(store: SqlStore) -> None:
    """A run that earlier code rested ``waiting_timer`` at the gate, its approval waiting: a decision
    makes it due now; one due sooner (a timer passed, no worker yet) keeps its time."""
    wf = _gate_flow("stop46_timer")
    for run_id, wake in (("later", time.time() + WINDOW), ("sooner", time.time() - 5.0)):
        raysaga.run(wf, {}, store=store, run_id=run_id, executor="inline")
        with store.engine.begin() as conn:  # as raysaga before this fix rested it
            conn.execute(update(runs).where(runs.c.run_id == run_id).values(
                status=RunStatus.WAITING_TIMER.value, wake_at=wake,
                status_reason="waiting for rate limit stop46_timer-model (paced: its own limit's window is full)"))
        with Client(store) as client:
            client.approve(run_id, "gate", by="ada")
            woken = client.get_run(run_id)
        assert woken.status == RunStatus.WAITING_TIMER
        assert woken.wake_at is not None and woken.wake_at <= time.time(), woken.wake_at
        if run_id == "sooner":
            assert woken.wake_at == pytest.approx(wake)  # not put off to now
        assert (woken.status_reason or "").startswith("gate approved by ada: waiting for a driver"), woken.status_reason
        claimed = store.claim_next("w-1", 15.0, {wf.name: wf.definition_hash})
        assert claimed is not None and claimed.lease.run_id == run_id  # a worker's claim takes it now
        store.release(claimed.lease)


def test_a_decision_made_while_the_driver_holds_the_run_wakes_its_rest_at_the_gate(store: SqlStore) -> None:
    """The tool (run by the driver, between the agent's two turns) approves ``gate``: the run is
    ``running`` then, so the decision wakes nothing, and the driver, which never read it, rests the
    run at the gate for the window. The rest's commit finds the decision and makes the run due."""
    decided: list[str] = []

    def look(q: str) -> str:
        with Client(store.url) as client:
            assert client.get_run("held").status == RunStatus.RUNNING
            decided.append(client.approve("held", "gate", by="ada").decision_id)
        return "found " + q

    wf = _gate_flow("stop46_held", look)
    rested = raysaga.run(wf, {}, store=store, run_id="held", executor="inline")
    assert decided, "the tool never ran"
    if _node(store, "held", "after_gate") != NodeStatus.COMPLETED:  # (the driver's heartbeat did not bring it)
        assert rested.wake_at is not None and rested.wake_at <= time.time(), (rested.status, rested.status_reason)
        worker, thread = _working(store, wf)
        try:
            wait_until(lambda: _node(store, "held", "after_gate") == NodeStatus.COMPLETED, timeout=60,
                       what="a worker to take the approved branch up")
        finally:
            _stopped(worker, thread)
    assert store.get_run("held").status == RunStatus.WAITING_TIMER


def test_a_rollback_on_its_way_shows_and_refuses_decisions(own_store_url: str, tmp_path: Path) -> None:
    """A cancel with rollback of a run waiting for a decision: ``status`` says it, ``inbox`` (the
    CLI's and the dashboard's) leaves it out, and a decision (the client's, the dashboard's) is
    refused saying the run is being rolled back. The real ``raysaga worker`` then rolls it back and
    counts it ended, not resting."""
    with FakeServices() as services, Client(own_store_url) as client:
        rested = raysaga.run(fleet_flows.approval, fleet_input(46, services, tmp_path / "trace"),
                             store=own_store_url, run_id="rolled", executor="inline")
        assert rested.status == RunStatus.WAITING_HUMAN
        assert [w.run_id for w in client.inbox()] == ["rolled"]
        client.cancel("rolled", compensate=True, by="ops", reason="customer asked")
        run = client.get_run("rolled")
        assert run.status_reason is not None
        assert run.status_reason.startswith("cancel with rollback requested by ops (customer asked): waiting for "
                                            "a driver"), run.status_reason
        assert client.inbox() == [] and client.store.waiting_approvals(run_id="rolled") == []
        with pytest.raises(UserError) as refused:
            client.approve("rolled", "review", by="alice")
        assert "'rolled' is being rolled back" in str(refused.value) and "asked by ops" in str(refused.value)
        with pytest.raises(UserError, match="is being rolled back"):  # the dashboard's approve: its 400
            perform(client.store, "rolled", "approve", by="alice", body={"node": "review"})
        assert not [e for e in client.store.events("rolled") if e.kind == "decision"]
        requested = next(e for e in client.store.events("rolled") if e.kind == "cancel_requested")
        assert requested.data["reason"] == "customer asked" and requested.data["by"] == "ops"
        worker = start_worker(own_store_url, "approval")
        try:
            def rolled_back() -> RunRecord | None:
                run = client.get_run("rolled")
                return run if run.status in (RunStatus.COMPENSATED, RunStatus.CANCELLED) else None

            ended = wait_until(rolled_back, timeout=60, what="the worker to roll it back")
        finally:
            code, said, err = stop(worker)
        assert code == 0, err
        assert ended.status_reason is not None and "customer asked" in ended.status_reason
        last = said.strip().splitlines()[-1]
        assert "completed 0, ended otherwise 1 (failed, rolled back or cancelled), resting 0" in last, last
        assert get_log(services.url)["by_subject"] == {}  # the approval never let pay run


def test_an_unpause_says_the_run_waits_for_a_driver(store: SqlStore) -> None:
    """``wake`` of a run at rest says why in its reason (it said "paused by ops" of a run due now)."""
    wf = _gate_flow("stop46_unpause")
    raysaga.run(wf, {}, store=store, run_id="unpaused", executor="inline")
    with Client(store) as client:
        assert client.pause("unpaused", by="ops").status == RunStatus.PAUSED
        run = client.unpause("unpaused", by="bo")
    assert run.status == RunStatus.PAUSED and run.wake_at is not None
    assert (run.status_reason or "").startswith("unpaused by bo: waiting for a driver"), run.status_reason


def _review_flow(name: str) -> Workflow:
    """``review`` (an approval) → ``after``: a run that rests waiting for a decision."""
    wf = Workflow(name, version="1")

    @wf.approval()
    def review(input: int) -> str:
        return "go on?"

    @wf.step()
    def after(review: Approval) -> str:
        return "went on"

    return wf


def test_a_cancel_left_on_a_run_at_rest_not_due_takes_decisions_which_wake_it(store: SqlStore) -> None:
    """A diff review of the refusal above: a cancel can sit unconsumed on a run at rest that is not
    due (sent as its driver rested; queued by a `cancel --compensate` whose own drive failed). Refusing
    every decision and leaving the run out of the inbox held it for ever; as before, a decision is
    taken, wakes the run, and its next driver obeys the cancel first."""
    wf = _review_flow("stop46_cancel_at_rest")
    assert raysaga.run(wf, 1, store=store, run_id="missed", executor="inline").status == RunStatus.WAITING_HUMAN
    store.send_signal("missed", "cancel", payload={"reason": "stop it", "compensate": False})  # never woken
    with Client(store) as client:
        assert [w.run_id for w in client.inbox()] == ["missed"]
        client.approve("missed", "review", by="alice")  # taken: it wakes the run
        assert client.get_run("missed").wake_at is not None
    ended = raysaga.resume(wf, "missed", store=store, executor="inline")
    assert ended.status == RunStatus.CANCELLED and _node(store, "missed", "after") is None


def test_a_cancel_arriving_as_the_driver_lets_the_run_rest_is_obeyed(
        store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A diff review: a plain cancel sent (``Client.cancel``, ``wait=0``) between the driver's last
    read of its signals and its rest was left unread: the run rested waiting for a decision, not
    due, and the cancel was never carried out. The look before the rest now takes a cancel too."""
    from raysaga.orchestrator import heartbeat

    wf = _review_flow("stop46_cancel_before_rest")
    looked = heartbeat.Heartbeat.poll_decisions
    sent: list[str] = []

    def cancel_then_look(self: heartbeat.Heartbeat, handled: set[int], obeys: bool = False) -> bool:
        if not sent:  # the operator's cancel lands in the window before the rest
            sent.append(Client(store).cancel(self.lease.run_id, by="ops").status.value)
        return looked(self, handled, obeys) if obeys else looked(self, handled)

    monkeypatch.setattr(heartbeat.Heartbeat, "poll_decisions", cancel_then_look)
    ended = raysaga.run(wf, 1, store=store, run_id="window", executor="inline")
    assert sent == ["running"]  # queued for the live driver
    assert ended.status == RunStatus.CANCELLED, (ended.status, ended.status_reason)
    assert store.pending_signals("window") == []


def test_a_cancel_queued_behind_a_pause_is_obeyed_without_an_unpause(
        store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A diff review: a pause and then a cancel, both queued while a step ran: the driver obeyed the
    pause and rested before reading the cancel, so the run sat paused with the cancel pending (docs:
    "`cancel` needs no unpause"). A cancel beside a pause wins."""
    wf = Workflow("stop46_pause_then_cancel", version="1")
    heard = threading.Event()  # the driver's heartbeat has read both signals
    read = SqlStore.pending_signals

    def reading(self: SqlStore, run_id: str) -> Any:
        found = read(self, run_id)
        if run_id == "both" and len(found) >= 2:
            heard.set()
        return found

    monkeypatch.setattr(SqlStore, "pending_signals", reading)

    @wf.step()
    def a(input: int) -> int:
        with Client(store) as client:  # the operator, while the step runs: a pause, then a cancel
            assert client.pause("both", by="ops").status == RunStatus.RUNNING  # queued for the live driver
            client.cancel("both", by="ops", reason="changed my mind")
        assert heard.wait(60), "the driver's heartbeat never read the signals"
        return input

    @wf.step()
    def b(a: int) -> int:
        return a

    ended = raysaga.run(wf, 1, store=store, run_id="both", executor="inline")
    assert ended.status == RunStatus.CANCELLED, (ended.status, ended.status_reason)
    assert _node(store, "both", "b") is None


def test_a_decision_on_a_run_whose_live_driver_has_a_cancel_queued_is_refused(store: SqlStore) -> None:
    """A second diff review: narrowed to runs due, the refusal let a decision through on a run whose
    live driver had a cancel queued; the driver obeyed the cancel at its next step boundary and the
    decision was dropped, the approver told it went on."""
    wf = Workflow("stop46_live_cancel", version="1")
    done = threading.Event()
    said: dict[str, Any] = {}

    @wf.step()
    def slow(input: int) -> int:
        assert done.wait(60), "the operator never acted"
        return input

    @wf.approval()
    def review(input: int) -> str:
        return "go on?"

    @wf.step()
    def after(review: Approval, slow: int) -> str:
        return "went on"

    def operator() -> None:
        try:
            with Client(store) as client:
                wait_until(lambda: _node(store, "live", "review") == NodeStatus.WAITING, timeout=60,
                           what="the approval to wait while its driver runs 'slow'")
                client.cancel("live", by="ops")  # queued for the live driver
                said["inbox"] = [w.run_id for w in client.inbox()]
                try:
                    client.approve("live", "review", by="alice")
                    said["approve"] = "accepted"
                except UserError as exc:
                    said["approve"] = str(exc)
        finally:
            done.set()

    ops = threading.Thread(target=operator)
    ops.start()
    ended = raysaga.run(wf, 1, store=store, run_id="live", executor="inline")
    ops.join(60)
    assert ended.status == RunStatus.CANCELLED
    assert said["inbox"] == [] and "'live' is being cancelled" in said["approve"], said

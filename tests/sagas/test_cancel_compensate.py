"""Cancel with and without compensation, with a live driver and with none.

A cancelled run keeps its committed effects (``cancelled``) unless the operator asks for
compensation: then every committed effect is undone, once, in reverse order, and the run ends
``compensated`` — never "cancelled, compensations skipped" (the Temporal sdk-java #305 class
of bug). The workflow: ``reserve`` and ``charge`` (compensable effects) commit, then ``ship``
blocks until a gate file appears (it never does), ``notify`` would follow. Every step and
compensation appends a line to a log file, so the order and count of calls survive any process.

A live driver is a real ``python -m raysaga run`` process (on the session's Ray cluster); the
test cancels it through the API or the CLI. Without a live driver, the driver process was
SIGKILLed mid-run and its lease has expired (polled, no sleeps).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga.orchestrator.loader import load_workflow
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from tests.support import crash_driver as harness  # its wait_until and process_gone

FLOW = textwrap.dedent('''
    import os
    import time
    from pathlib import Path

    from raysaga import Permanent, StepContext, Workflow

    wf = Workflow("cancel_comp")
    BLOCK_LIMIT = 120.0


    def _log(input: dict, line: str) -> None:
        with open(input["log"], "a") as fh:
            fh.write(line + "\\n")


    def cancel_reservation(ctx: StepContext, input: dict, output: dict) -> None:
        _log(input, f"undo reserve {output['id']} {ctx.idempotency_key}")


    def refund(ctx: StepContext, input: dict, output: dict) -> None:
        _log(input, f"undo charge {output['id']} {ctx.idempotency_key}")


    @wf.step(effect=True, compensate=cancel_reservation)
    def reserve(ctx: StepContext, input: dict) -> dict:
        _log(input, f"do reserve {ctx.idempotency_key}")
        return {"id": "R-1"}


    @wf.step(effect=True, compensate=refund)
    def charge(ctx: StepContext, input: dict, reserve: dict) -> dict:
        _log(input, f"do charge {ctx.idempotency_key}")
        return {"id": "C-1"}


    @wf.step()
    def ship(input: dict, charge: dict) -> str:
        _log(input, f"start ship {os.getpid()}")
        gate, deadline = Path(input["gate"]), time.monotonic() + BLOCK_LIMIT
        while not gate.exists():  # the workload: blocks until the test opens the gate
            if time.monotonic() > deadline:
                raise Permanent("the gate never opened")
            time.sleep(0.02)
        return "shipped"


    @wf.step()
    def notify(ship: str) -> str:
        return "notified"
''')

REASON = "customer changed their mind"


class Case:
    """One run of the flow: its files, store and driver process."""

    def __init__(self, tmp_path: Path, db: str, run_id: str) -> None:
        self.flow_file = tmp_path / "cancel_comp_flow.py"
        self.flow_file.write_text(FLOW)
        self.log = tmp_path / "calls.log"
        self.gate = tmp_path / "gate-never-opens"
        self.db = db
        self.run_id = run_id
        self.proc: subprocess.Popen[str] | None = None

    def start(self, executor: str, *extra: str) -> None:
        inp = {"log": str(self.log), "gate": str(self.gate)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "raysaga", "run", f"{self.flow_file}:wf", "--db", self.db, "--run-id",
             self.run_id, "--input", json.dumps(inp), "--executor", executor, "--quiet", *extra],
            cwd=self.flow_file.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ))
        harness.wait_until(lambda: self.ship_pid() is not None or self.proc.poll() is not None,  # type: ignore[union-attr]
                           timeout=60.0, what="the driver to reach the blocking step 'ship'")
        assert self.ship_pid() is not None, self.finish()

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def ship_pid(self) -> int | None:
        started = [line for line in self.lines() if line.startswith("start ship ")]
        return int(started[0].split()[-1]) if started else None

    def finish(self, timeout: float = 120.0) -> tuple[int, str]:
        assert self.proc is not None
        try:
            _, err = self.proc.communicate(timeout=timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.communicate()
        return self.proc.returncode, err

    def kill_driver(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.communicate(timeout=30)
        store = SqlStore(self.db)
        try:  # the dead driver's lease runs out (lease_ttl): poll the row, no sleeps
            harness.wait_until(lambda: (r := store.get_run(self.run_id)).lease_expires_at is not None
                               and r.lease_expires_at < time.time(), timeout=60.0,
                               what="the dead driver's lease to expire")
        finally:
            store.close()

    def workflow(self) -> raysaga.Workflow:
        return load_workflow(f"{self.flow_file}:wf")

    def cli_cancel(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "raysaga", "cancel", self.run_id, "--db", self.db,
                               "--reason", REASON, *args], cwd=self.flow_file.parent, capture_output=True,
                              text=True, timeout=120, env=dict(os.environ))

    def cancel_signalled_at(self) -> float:
        """When the cancel signal reached the store (its row stays, marked consumed)."""
        with sqlite3.connect(self.db.removeprefix("sqlite:///")) as conn:
            [(at,)] = conn.execute("SELECT created_at FROM raysaga_signals WHERE run_id = ? AND kind = 'cancel'",
                                   (self.run_id,)).fetchall()
        return float(at)

    def facts(self) -> dict[str, Any]:
        store = SqlStore(self.db)
        try:
            return {"run": store.get_run(self.run_id),
                    "nodes": {n.label: n for n in store.nodes(self.run_id)},
                    "effects": {e.node_id: e for e in store.effects(self.run_id)},
                    "events": store.events(self.run_id),
                    "signals": store.pending_signals(self.run_id)}
        finally:
            store.close()


def _committed_calls(case: Case) -> tuple[str, str]:
    """The first two log lines: both effects committed, each with its idempotency key."""
    lines = case.lines()
    assert lines[0].startswith("do reserve rs-") and lines[1].startswith("do charge rs-"), lines
    return lines[0].split()[-1], lines[1].split()[-1]


def _check_rolled_back(case: Case, *, ship_runs: int = 1) -> dict[str, Any]:
    """Compensated: both compensations ran exactly once, charge before reserve, with derived keys."""
    reserve_key, charge_key = _committed_calls(case)
    lines = case.lines()
    assert [line.split()[0] + " " + line.split()[1] for line in lines] == [
        "do reserve", "do charge", *(["start ship"] * ship_runs), "undo charge", "undo reserve"], lines
    assert lines[-2] == f"undo charge C-1 {charge_key}:compensate"
    assert lines[-1] == f"undo reserve R-1 {reserve_key}:compensate"
    facts = case.facts()
    run = facts["run"]
    assert run.status == RunStatus.COMPENSATED, (run.status, run.status_reason)
    assert REASON in (run.status_reason or "") and "rolled back" in (run.status_reason or "")
    nodes = facts["nodes"]
    for comp in ("reserve:compensate", "charge:compensate"):
        assert nodes[comp].status == NodeStatus.COMPLETED and nodes[comp].attempt == 1
    assert "notify" not in nodes
    effects = facts["effects"]
    assert {name: effects[name].status for name in effects} == {
        name: EffectStatus.COMMITTED for name in ("reserve", "charge", "reserve:compensate", "charge:compensate")}
    kinds = [e.kind for e in facts["events"]]
    assert kinds.count("run_compensating") == 1 and kinds[-1] == "run_compensated"
    assert facts["signals"] == []  # the cancel signal was consumed
    return facts


# ---------------------------------------------------------------------------- a live driver


@pytest.mark.ray
@pytest.mark.parametrize("via", ["api", "cli"])
def test_cancel_with_compensation_rolls_back_under_a_live_driver(
        tmp_path: Path, sqlite_url: str, ray_address: str, via: str) -> None:
    case = Case(tmp_path, sqlite_url, f"live-comp-{via}")
    case.start("ray")
    try:
        if via == "api":
            record = raysaga.cancel(case.run_id, store=sqlite_url, reason=REASON, compensate=True,
                                    workflow=case.workflow())
            assert record.status == RunStatus.COMPENSATED
        else:
            done = case.cli_cancel("--compensate")
            assert done.returncode == 0, (done.stdout, done.stderr)
            assert f"run {case.run_id}: compensated" in done.stdout
        code, err = case.finish()
    finally:
        if case.proc is not None and case.proc.poll() is None:
            case.proc.kill()
    assert code == 1, err  # the driver process itself ended the run, not completed
    facts = _check_rolled_back(case)
    nodes, events = facts["nodes"], facts["events"]
    assert nodes["ship"].status == NodeStatus.CANCELLED  # the blocked step, stopped in flight
    [started] = [e for e in events if e.kind == "rollback_started"]
    assert started.data == {"reason": REASON, "targets": 2}
    # from the cancel signal's write, not from the call: the CLI's own start (~1-2 s under load) is not the driver's
    assert started.at - case.cancel_signalled_at() < 3.0, "the live driver took too long to act on the cancel"
    ship_pid = case.ship_pid()
    assert ship_pid is not None
    harness.wait_until(lambda: harness.process_gone(ship_pid), timeout=30.0,
                       what="the Ray worker running 'ship' to be killed")


@pytest.mark.ray
def test_cancel_without_compensation_keeps_the_committed_effects(
        tmp_path: Path, sqlite_url: str, ray_address: str) -> None:
    case = Case(tmp_path, sqlite_url, "live-plain")
    case.start("ray")
    try:
        asked = time.time()
        record = raysaga.cancel(case.run_id, store=sqlite_url, reason=REASON)
        code, err = case.finish()
    finally:
        if case.proc is not None and case.proc.poll() is None:
            case.proc.kill()
    assert record.status == RunStatus.CANCELLED and record.status_reason == REASON
    assert code == 1, err
    _committed_calls(case)
    assert [line.split()[1] for line in case.lines()] == ["reserve", "charge", "ship"]  # nothing undone
    facts = case.facts()
    nodes, effects, events = facts["nodes"], facts["effects"], facts["events"]
    assert (nodes["reserve"].status, nodes["charge"].status) == (NodeStatus.COMPLETED, NodeStatus.COMPLETED)
    assert nodes["ship"].status == NodeStatus.CANCELLED
    assert not [label for label in nodes if label.endswith(":compensate")]
    assert {name: e.status for name, e in effects.items()} == {
        "reserve": EffectStatus.COMMITTED, "charge": EffectStatus.COMMITTED}
    kinds = [e.kind for e in events]
    assert "rollback_started" not in kinds and kinds[-1] == "run_cancelled"
    assert events[-1].at - asked < 3.0, "the live driver took too long to act on the cancel"
    # terminal: a resume changes nothing and calls nothing
    again = raysaga.resume(case.workflow(), case.run_id, store=sqlite_url, executor="inline")
    assert again.status == RunStatus.CANCELLED
    assert len(case.lines()) == 3


# ---------------------------------------------------------------------------- no live driver


@pytest.mark.parametrize("via", ["api", "cli"])
def test_cancel_with_compensation_without_a_live_driver(tmp_path: Path, sqlite_url: str, via: str) -> None:
    case = Case(tmp_path, sqlite_url, f"orphan-{via}")
    case.start("inline", "--lease-ttl", "1")
    case.kill_driver()
    assert case.facts()["run"].status == RunStatus.RUNNING  # an orphan: running, nobody driving it
    if via == "api":
        record = raysaga.cancel(case.run_id, store=sqlite_url, reason=REASON, compensate=True,
                                workflow=case.workflow(), executor="inline")
        assert record.status == RunStatus.COMPENSATED
    else:  # the CLI finds the workflow where the run recorded it
        done = case.cli_cancel("--compensate", "--executor", "inline")
        assert done.returncode == 0, (done.stdout, done.stderr)
        assert f"run {case.run_id}: compensated" in done.stdout
    facts = _check_rolled_back(case)  # 'ship' was not dispatched again: one "start ship" line
    # inline, 'ship' ran inside the killed driver before any row of it was written (a plain step
    # records nothing before its call); the rollback did not start it again
    assert "ship" not in facts["nodes"]
    # compensated is terminal: cancelling again (with compensation) runs nothing twice
    lines = case.lines()
    again = raysaga.cancel(case.run_id, store=sqlite_url, compensate=True, workflow=case.workflow(),
                           executor="inline")
    assert again.status == RunStatus.COMPENSATED and case.lines() == lines


def test_cancel_with_compensation_of_a_parked_failed_run(tmp_path: Path, sqlite_url: str) -> None:
    """A run an operator parked as ``failed`` after its driver died is still rolled back on request.

    (A driver never parks a run with committed compensable effects as ``failed`` itself: it rolls
    them back. The operator's ``transition`` does, and cancel --compensate must still undo them.)
    """
    case = Case(tmp_path, sqlite_url, "parked")
    case.start("inline", "--lease-ttl", "1")
    case.kill_driver()
    store = SqlStore(sqlite_url)
    try:
        run = store.get_run(case.run_id)
        parked = store.transition(case.run_id, run.version, RunStatus.FAILED, reason="operator parked it")
        assert parked.status == RunStatus.FAILED
        # without compensation, cancelling a parked run changes nothing
        assert raysaga.cancel(case.run_id, store=store, reason=REASON).status == RunStatus.FAILED
        assert [line.split()[0] for line in case.lines()] == ["do", "do", "start"]
        record = raysaga.cancel(case.run_id, store=store, reason=REASON, compensate=True, workflow=case.workflow(),
                                executor="inline")
    finally:
        store.close()
    assert record.status == RunStatus.COMPENSATED
    _check_rolled_back(case)

"""The runtime against real processes: SIGTERM/SIGINT stop a driver cleanly (lease released, an
immediate resume continues), a SIGKILLed driver's lease is taken over at once on its own host,
a stopped (SIGSTOP) driver is never taken over, and ``cancel`` acts at once on a run whose driver
is gone and reaches a live driver through its signal.

The flow (``first -> slow -> charge (effect) -> done``) runs with the inline executor unless a
test says otherwise: ``slow`` writes its pid to ``started`` and waits for the ``gate`` file (or a
timeout) so the test knows where the driver is; ``charge`` appends its idempotency key to a log
file only once per key, so ``applied`` counts what took effect and ``calls`` every call.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga.state import NodeStatus, RunStatus, SqlStore
from tests.support import crash_driver as harness
from tests.support.child_signals import sigint_default

FLOW = textwrap.dedent('''
    import os, time
    from pathlib import Path
    from raysaga import StepContext, Workflow

    wf = Workflow("runtime_slow")

    @wf.step()
    def first(input: dict) -> str:
        return "ok"

    @wf.step()
    def slow(input: dict, first: str) -> str:
        pid_file = Path(input["started"])  # written whole, then renamed: a reader never sees it empty
        pid_file.with_name(f".{pid_file.name}").write_text(str(os.getpid()))
        os.replace(pid_file.with_name(f".{pid_file.name}"), pid_file)
        gate, deadline = Path(input["gate"]), time.time() + float(input.get("slow_for", 300))
        while not gate.exists() and time.time() < deadline:   # the workload: waits for the test
            time.sleep(0.02)
        return "slept"

    @wf.step(effect=True)
    def charge(ctx: StepContext, input: dict, slow: str) -> str:
        log = Path(input["log"])
        calls = log.with_suffix(".calls")
        with calls.open("a") as fh:
            fh.write(ctx.idempotency_key + "\\n")
        seen = log.read_text().split() if log.exists() else []
        if ctx.idempotency_key not in seen:      # the provider dedupes by key
            with log.open("a") as fh:
                fh.write(ctx.idempotency_key + "\\n")
        return "charged"

    @wf.step()
    def done(charge: str) -> str:
        return "done"
''')


@pytest.fixture
def flow(tmp_path: Path) -> Path:
    path = tmp_path / "runtime_slow_flow.py"
    path.write_text(FLOW)
    return path


@pytest.fixture
def inp(tmp_path: Path) -> dict[str, Any]:
    return {"started": str(tmp_path / "started"), "gate": str(tmp_path / "gate"), "log": str(tmp_path / "charges")}


def start(flow: Path, db: str, run_id: str, inp: dict[str, Any], *extra: str) -> subprocess.Popen[str]:
    cmd = [sys.executable, "-m", "raysaga", "run", f"{flow}:wf", "--db", db, "--run-id", run_id,
           "--input", json.dumps(inp), "--quiet", *extra]
    return subprocess.Popen(cmd, cwd=flow.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={k: v for k, v in os.environ.items() if k != "RAYSAGA_FAULTS"},
                            preexec_fn=sigint_default)  # SIGINT reaches it even in a background test run


def cli(flow: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "raysaga", *args], cwd=flow.parent, capture_output=True,
                          text=True, timeout=timeout,
                          env={k: v for k, v in os.environ.items() if k != "RAYSAGA_FAULTS"})


def charges(inp: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(applied keys, every call's key) at the fake provider."""
    log, calls = Path(inp["log"]), Path(inp["log"]).with_suffix(".calls")
    return (log.read_text().split() if log.exists() else [], calls.read_text().split() if calls.exists() else [])


def wait_running(store: SqlStore, run_id: str, inp: dict[str, Any], proc: subprocess.Popen[str]) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            raise AssertionError(harness.Finished(proc.returncode, *proc.communicate()).describe())
        if not Path(inp["started"]).exists():
            return False
        run = store.get_run(run_id)
        return run.status == RunStatus.RUNNING and run.lease_owner is not None

    harness.wait_until(ready, timeout=120, what=f"run {run_id} to be running inside `slow`")


@pytest.fixture
def store(sqlite_url: str) -> Iterator[SqlStore]:
    st = SqlStore(sqlite_url)
    yield st
    st.close()


def _finish(proc: subprocess.Popen[str], timeout: float = 120) -> Any:
    return harness.finish(proc, timeout)


def _check_resumes_once(flow: Path, db: str, run_id: str, inp: dict[str, Any], store: SqlStore,
                        *extra: str) -> None:
    """An immediate resume (no TTL wait: the lease TTL is 60 s) completes the run, charge once."""
    Path(inp["gate"]).touch()
    began = time.monotonic()
    done = cli(flow, "resume", run_id, "--db", db, "--quiet", "--lease-ttl", "60", *extra)
    assert done.returncode == 0, done.stdout + done.stderr
    assert time.monotonic() - began < 45, "the resume waited for the lease to expire"
    run = store.get_run(run_id)
    assert run.status == RunStatus.COMPLETED and run.output == {"done": "done"}
    applied, calls = charges(inp)
    assert len(applied) == 1 and len(set(calls)) == 1, (applied, calls)


# ---------------------------------------------------------------------- SIGTERM / SIGINT


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_stop_signal_releases_the_lease_and_resume_continues_at_once(
        flow: Path, sqlite_url: str, store: SqlStore, inp: dict[str, Any], signum: int) -> None:
    run_id = f"sig-{signum}"
    proc = start(flow, sqlite_url, run_id, inp, "--executor", "inline", "--lease-ttl", "60")
    try:
        wait_running(store, run_id, inp, proc)
        proc.send_signal(signum)
        # inline: the step in the driver's own thread finishes first (here: once the gate opens);
        # then the driver stops at the boundary without starting `charge`
        Path(inp["gate"]).touch()
        finished = _finish(proc)
    finally:
        harness.stop(proc)
    expected = 143 if signum == signal.SIGTERM else 130
    name = signal.Signals(signum).name
    assert finished.returncode == expected, finished.describe()
    assert name in finished.stderr and f"raysaga resume {run_id}" in finished.stderr, finished.stderr
    run = store.get_run(run_id)
    assert run.lease_owner is None and run.lease_expires_at is None
    assert run.status == RunStatus.RUNNING
    assert charges(inp) == ([], []), "no new step starts after the stop signal"
    events = [e for e in store.events(run_id) if e.kind == "driver_interrupted"]
    assert [e.data["signal"] for e in events] == [name]
    Path(inp["gate"]).unlink()
    Path(inp["started"]).unlink()
    _check_resumes_once(flow, sqlite_url, run_id, inp, store, "--executor", "inline")


@pytest.mark.ray
def test_sigterm_on_ray_cancels_the_inflight_task_and_releases_the_lease(
        flow: Path, sqlite_url: str, store: SqlStore, inp: dict[str, Any], ray_address: str) -> None:
    run_id = "sig-ray"
    proc = start(flow, sqlite_url, run_id, inp, "--executor", "ray", "--address", ray_address,
                 "--lease-ttl", "60")
    try:
        wait_running(store, run_id, inp, proc)
        proc.send_signal(signal.SIGTERM)  # `slow` is in a Ray worker: the driver stops without waiting for it
        finished = _finish(proc)
    finally:
        harness.stop(proc)
    assert finished.returncode == 143, finished.describe()
    run = store.get_run(run_id)
    assert run.lease_owner is None and run.status == RunStatus.RUNNING
    assert charges(inp) == ([], [])
    _check_resumes_once(flow, sqlite_url, run_id, inp, store, "--executor", "ray", "--address", ray_address)


# ---------------------------------------------------------------------- takeover of a dead owner


def test_sigkilled_driver_is_taken_over_at_once_on_its_host(
        flow: Path, sqlite_url: str, store: SqlStore, inp: dict[str, Any]) -> None:
    run_id = "takeover"
    proc = start(flow, sqlite_url, run_id, inp, "--executor", "inline", "--lease-ttl", "60")
    try:
        wait_running(store, run_id, inp, proc)
        dead_owner = store.get_run(run_id).lease_owner
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        harness.stop(proc)
    run = store.get_run(run_id)
    assert run.lease_owner == dead_owner and run.lease_expires_at is not None
    assert run.lease_expires_at > time.time() + 30, "the dead driver's lease is still far from expiry"
    from raysaga.orchestrator.ownership import describe_lease
    line = describe_lease(run, time.time())
    assert f"pid {proc.pid}" in line and "is gone (process not running)" in line, line
    _check_resumes_once(flow, sqlite_url, run_id, inp, store, "--executor", "inline")
    taken = [e for e in store.events(run_id) if e.kind == "lease_taken_over"]
    assert [e.data["from"] for e in taken] == [dead_owner]


def test_a_stopped_driver_is_alive_and_never_taken_over(
        flow: Path, sqlite_url: str, store: SqlStore, inp: dict[str, Any]) -> None:
    run_id = "stopped"
    proc = start(flow, sqlite_url, run_id, inp, "--executor", "inline", "--lease-ttl", "60")
    try:
        wait_running(store, run_id, inp, proc)
        proc.send_signal(signal.SIGSTOP)
        harness.wait_until(lambda: "\nState:\tT" in Path(f"/proc/{proc.pid}/status").read_text(), timeout=30,
                           what="the driver to be stopped")
        busy = cli(flow, "resume", run_id, "--db", sqlite_url, "--quiet", "--executor", "inline")
        assert busy.returncode == 3, busy.stdout + busy.stderr  # another live driver owns the run
        from raysaga.orchestrator.ownership import describe_lease, owner_is_gone
        run = store.get_run(run_id)
        assert run.lease_owner is not None and not owner_is_gone(run.lease_owner)
        assert describe_lease(run, time.time()).startswith(f"live driver pid {proc.pid} on ")
        proc.send_signal(signal.SIGCONT)
        Path(inp["gate"]).touch()
        finished = _finish(proc)
    finally:
        harness.stop(proc)
    assert finished.returncode == 0, finished.describe()
    assert store.get_run(run_id).status == RunStatus.COMPLETED
    applied, calls = charges(inp)
    assert len(applied) == 1 and len(calls) == 1


# ---------------------------------------------------------------------- cancel


def test_cancel_of_a_run_whose_driver_was_killed_is_immediate(
        flow: Path, sqlite_url: str, store: SqlStore, inp: dict[str, Any]) -> None:
    run_id = "cancel-dead"
    proc = start(flow, sqlite_url, run_id, inp, "--executor", "inline", "--lease-ttl", "60")
    try:
        wait_running(store, run_id, inp, proc)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        harness.stop(proc)
    began = time.monotonic()
    done = cli(flow, "cancel", run_id, "--db", sqlite_url, "--reason", "operator: stop it", timeout=60)
    took = time.monotonic() - began
    assert done.returncode == 0, done.stdout + done.stderr
    assert took < 20, f"cancel took {took:.1f}s: it waited for the dead driver's lease"
    run = store.get_run(run_id)
    assert run.status == RunStatus.CANCELLED and run.status_reason == "operator: stop it"
    assert run.lease_owner is None
    assert store.pending_signals(run_id) == []
    nodes = {n.label: n.status for n in store.nodes(run_id)}
    assert nodes.get("slow") in (None, NodeStatus.CANCELLED) and "charge" not in nodes
    assert charges(inp) == ([], [])


def test_cancel_reaches_a_live_inline_driver(
        flow: Path, sqlite_url: str, store: SqlStore, inp: dict[str, Any]) -> None:
    run_id = "cancel-live"
    proc = start(flow, sqlite_url, run_id, inp, "--executor", "inline", "--lease-ttl", "3")
    results: list[Any] = []
    canceller = threading.Thread(target=lambda: results.append(
        raysaga.cancel(run_id, store=sqlite_url, reason="live stop", wait=60)))
    try:
        wait_running(store, run_id, inp, proc)
        owner = store.get_run(run_id).lease_owner
        canceller.start()
        harness.wait_until(lambda: store.pending_signals(run_id), timeout=30, what="the cancel signal")
        # the live driver is busy in `slow` (its own thread) but its heartbeat goes on: two renewals
        # after the signal was queued, the heartbeat has read it (it polls signals after each renewal)
        seen = [store.get_run(run_id).lease_expires_at]

        def renewed_twice() -> bool:
            at = store.get_run(run_id).lease_expires_at
            if at != seen[-1]:
                seen.append(at)
            return len(seen) >= 3

        harness.wait_until(renewed_twice, timeout=30, what="two heartbeats")
        Path(inp["gate"]).touch()  # `slow` returns; the driver acts on the cancel before anything else
        canceller.join(timeout=90)
        finished = _finish(proc)
    finally:
        harness.stop(proc)
    assert not canceller.is_alive() and len(results) == 1
    record = results[0]
    assert record.status == RunStatus.CANCELLED and record.status_reason == "live stop"
    assert finished.returncode == 1, finished.describe()
    assert store.pending_signals(run_id) == []
    # the driver itself cancelled the run (it ended `cancelled`, exit 1, not with a lost lease: 4),
    # and no other process held the lease before that
    events = store.events(run_id)
    cancelled_at = next(e.seq for e in events if e.kind == "run_cancelled")
    claims = [e.data["owner"] for e in events if e.kind == "lease_claimed" and e.seq < cancelled_at]
    assert claims == [owner]
    assert charges(inp) == ([], []), "after a cancel is seen nothing new starts"


def test_cancel_takes_over_when_the_live_driver_stops_renewing(
        flow: Path, sqlite_url: str, store: SqlStore, inp: dict[str, Any]) -> None:
    run_id = "cancel-stalled"
    proc = start(flow, sqlite_url, run_id, inp, "--executor", "inline", "--lease-ttl", "2")
    try:
        wait_running(store, run_id, inp, proc)
        proc.send_signal(signal.SIGSTOP)  # alive (never taken over early) but no longer renewing
        record = raysaga.cancel(run_id, store=sqlite_url, reason="stalled", wait=60)
        assert record.status == RunStatus.CANCELLED and record.status_reason == "stalled"
        assert store.pending_signals(run_id) == [], "the queued signal is consumed by the takeover"
        proc.send_signal(signal.SIGCONT)
        Path(inp["gate"]).touch()
        finished = _finish(proc)
    finally:
        harness.stop(proc)
    assert finished.returncode == 4, finished.describe()  # the stalled driver finds its lease lost
    assert store.get_run(run_id).status == RunStatus.CANCELLED
    assert charges(inp) == ([], []), "the zombie driver calls nothing after losing its lease"

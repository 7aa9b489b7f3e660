"""Invariant 4, one driver per run: a zombie driver writes and calls nothing; two resumers, one wins.

Both tests use the ``gate`` flow (``gate_prepare → gate → gate_charge (effect) → gate_finish``)
with the inline executor: the first process to enter ``gate`` blocks there (inline, so in the
driver itself, heartbeat still beating) until the test creates ``release``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga.state import SqlStore
from tests.support import crash_driver as harness
from tests.support.services import FakeServices

flows = harness.load_flows()


def durable_state(store: SqlStore, run_id: str) -> dict[str, Any]:
    """Everything the store holds about a run (rows as dicts, in a stable order)."""
    return {
        "run": store.get_run(run_id).model_dump(),
        "events": [e.model_dump() for e in store.events(run_id)],
        "nodes": sorted((n.model_dump() for n in store.nodes(run_id)), key=lambda n: (n["node_id"], n["fan_index"])),
        "effects": sorted((e.model_dump() for e in store.effects(run_id)), key=lambda e: e["idempotency_key"]),
    }


def gate_entries(control: Path) -> list[int]:
    path = control / "gate.entries"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


@pytest.fixture
def control(tmp_path: Path) -> Path:
    path = tmp_path / "control"
    path.mkdir()
    return path


def test_zombie_driver_after_takeover_writes_nothing_and_calls_nothing(store_url: str, control: Path) -> None:
    run_id = f"zombie-{uuid.uuid4().hex[:8]}"
    store = SqlStore(store_url)
    with FakeServices() as services:
        run_input = flows.sample_input("gate", services.url, str(control))
        a = harness.spawn("gate", store_url, run_id, run_input=run_input, lease_ttl=1.5)
        try:
            # A blocks inside `gate`, holding a live lease
            harness.wait_until(lambda: (control / "gate.entered").exists() or a.poll() is not None, timeout=60,
                               what="driver A to enter the gate")
            assert a.poll() is None, harness.finish(a).describe()
            assert gate_entries(control) == [a.pid]
            fence_a = store.get_run(run_id).fence

            # A is frozen (a GC pause, a stopped VM); its lease runs out
            os.kill(a.pid, signal.SIGSTOP)
            harness.wait_lease_expired(store, run_id, timeout=30)

            # B takes the run over and finishes it, gate and charge included
            b = harness.run_driver("gate", store_url, run_id, resume=True, lease_ttl=1.5)
            assert b.returncode == 0, b.describe()
            assert b.result is not None and b.result["status"] == "completed"
            assert gate_entries(control) == [a.pid, b.result["pid"]]
            before = durable_state(store, run_id)
            log_before = services.log()
            assert before["run"]["fence"] == fence_a + 1 and before["run"]["status"] == "completed"
            assert list(log_before["effective"].values()) == [1] and list(log_before["raw"].values()) == [1]

            # A wakes up, its step returns: it must notice the stale fence and stop
            (control / "release").touch()
            os.kill(a.pid, signal.SIGCONT)
            woke = harness.finish(a, timeout=60)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(a.pid, signal.SIGCONT)
            (control / "release").touch()
            harness.stop(a)
        log_after = services.log()
    try:
        assert woke.returncode == harness.EXIT_LEASE_LOST, woke.describe()
        assert "lease lost" in woke.stderr and woke.result is None
        # nothing written after the takeover (no row, no event, not even a lease release)...
        assert durable_state(store, run_id) == before
        # ...and no call made: the provider's log is exactly what it was when B finished
        assert log_after == log_before
    finally:
        store.close()


@pytest.mark.parametrize("mode", ["resume", "run"])
def test_two_drivers_on_one_run_exactly_one_advances(mode: str, store_url: str, control: Path) -> None:
    """``resume``: two drivers resume an existing run. ``run``: two drivers start the same new run
    id together (``raysaga.run`` creates it or, having lost that race, resumes it)."""
    run_id = f"twins-{uuid.uuid4().hex[:8]}"
    go = control / "go"
    store = SqlStore(store_url)
    with FakeServices() as services:
        run_input = flows.sample_input("gate", services.url, str(control))
        if mode == "resume":
            raysaga.create_run(flows.gate_flow, run_input, store=store, run_id=run_id)
        # both start together: each imports, waits for `go`, then claims (or creates) the same run
        twins = [harness.spawn("gate", store_url, run_id, resume=mode == "resume", run_input=run_input,
                               lease_ttl=5.0, go_file=go) for _ in range(2)]
        try:
            go.touch()
            # the loser backs off at once; the winner is held in the gate, lease alive
            loser = harness.wait_until(lambda: next((p for p in twins if p.poll() is not None), None), timeout=60,
                                       what="one of the two drivers to back off")
            winner = next(p for p in twins if p is not loser)
            lost = harness.finish(loser)
            assert winner.poll() is None, harness.finish(winner).describe()
            harness.wait_until(lambda: (control / "gate.entered").exists(), timeout=60,
                               what="the winner to enter the gate")
            (control / "release").touch()
            won = harness.finish(winner)
        finally:
            (control / "release").touch()
            for proc in twins:
                harness.stop(proc)
        log = services.log()
    try:
        assert lost.returncode == harness.EXIT_LEASE_HELD, lost.describe()
        assert "lease held" in lost.stderr and "being driven by" in lost.stderr and lost.result is None
        assert won.returncode == 0, won.describe()
        assert won.result is not None and won.result["status"] == "completed"
        # only the winner ever claimed the run and ran its steps; one charge
        claims = [e for e in store.events(run_id) if e.kind == "lease_claimed"]
        assert len(claims) == 1 and f":{winner.pid}:" in claims[0].data["owner"], claims
        assert gate_entries(control) == [winner.pid]
        assert list(log["effective"].values()) == [1] and list(log["raw"].values()) == [1]
    finally:
        store.close()

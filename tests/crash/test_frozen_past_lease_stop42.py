"""Invariant 4 between an effect's ``pending`` row and its call: a driver frozen past its lease (a
GC pause, a stopped VM: its heartbeat thread frozen with it) while another driver took the run
over must find out before the call, and make none.

``tests/crash/test_zombie_driver.py`` freezes a driver inside a plain step, whose completion
commit meets the stale fence whatever happens before a call; nothing froze one between the
``pending`` commit and the send, where only ``Driver._ensure_lease`` (renew when the local lease
is about to run out) stands. A mutation review (stop 42) showed every test passing with that
renewal gone. Deterministic, in one process: the heartbeat thread is never started (frozen), and
at ``after_pending:charge`` the fault hook moves the driver's clock past its lease (its local
lease and the store's both run out) and another owner claims the run, fence + 1."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path

import pytest

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.errors import LeaseLostError
from raysaga.orchestrator import heartbeat
from raysaga.orchestrator.driver import Driver
from raysaga.orchestrator.executor import InlineExecutor
from raysaga.orchestrator.faults import Faults
from raysaga.state import EffectStatus, SqlStore

CALLS: list[str] = []

wf = Workflow("frozen42", version="1")


@wf.step(effect=True)
def charge() -> str:
    CALLS.append("charge")
    return "charged"


class FrozenPastLease(Faults):
    """At ``after_pending:charge``: the lease runs out while the process is frozen, and another
    driver takes the run."""

    def __init__(self, path: Path, run_id: str) -> None:
        super().__init__("")
        self.active = True
        self.path, self.run_id = path, run_id
        self.driver: Driver | None = None
        self.fired = False

    def hit(self, point: str, labels: Iterable[str]) -> None:
        if self.fired or point != "after_pending" or "charge" not in list(labels):
            return
        self.fired = True
        assert self.driver is not None and self.driver._hb is not None
        hb = self.driver._hb
        hb.lease = hb.lease.model_copy(update={"expires_at": time.time() - 1})  # its own view: run out
        with sqlite3.connect(self.path) as db:  # the store's view: run out too
            db.execute("UPDATE raysaga_runs SET lease_expires_at = ? WHERE run_id = ?", (time.time() - 1, self.run_id))
        other = SqlStore(f"sqlite:///{self.path}")
        try:
            other.claim(self.run_id, "another-driver", ttl=30)
        finally:
            other.close()


def test_a_driver_frozen_past_its_lease_makes_no_call_after_a_takeover(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    CALLS.clear()
    monkeypatch.setattr(heartbeat.Heartbeat, "start", lambda self: None)  # its thread froze with it
    path, run_id = tmp_path / "frozen.db", "frozen42"
    raysaga.create_run(wf, None, store=f"sqlite:///{path}", run_id=run_id)
    store = SqlStore(f"sqlite:///{path}")
    try:
        faults = FrozenPastLease(path, run_id)
        driver = Driver(wf, store, InlineExecutor(), run_id, options=RunOptions(lease_ttl=30), faults=faults)
        faults.driver = driver
        with pytest.raises(LeaseLostError):
            driver.drive()
        assert faults.fired
        assert CALLS == [], "the frozen driver made the call after another driver took the run over"
        run = store.get_run(run_id)
        assert run.lease_owner == "another-driver"
        assert [e.status for e in store.effects(run_id)] == [EffectStatus.PENDING]  # the new driver settles it
    finally:
        store.close()

"""A run whose lease expired, its driver on another machine (stop 50, a review): ``raysaga status``
and ``stats`` on an ops box sharing a PostgreSQL store said ``its driver (pid N on HOST) died``,
and advised a resume, of a driver alive and busy in a long step on its own machine. A pid of
another host names nothing here: the views now say the driver is silent past its lease and that
this machine cannot tell dead from busy, and what it runs still shows ``running``. On its own
machine a dead driver is still told as dead, and a live one as driving (``derive`` is the one rule
of every view: ``status``, ``--json``, ``list``, the dashboard)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

from raysaga.orchestrator import undriven
from raysaga.orchestrator.ownership import new_owner
from raysaga.state.owner_identity import parse_owner


def _row(owner: str, expired: bool = True) -> dict[str, Any]:
    now = time.time()
    return {"run_id": "r", "status": "running", "lease_owner": owner,
            "lease_expires_at": now - 30 if expired else now + 30, "updated_at": now - 60, "workflow_ref": "m:wf",
            "queue": None}


def _elsewhere(owner: str) -> str:
    parsed = parse_owner(owner)
    assert parsed is not None
    return owner.replace(parsed.host + ":", "opsbox-elsewhere:", 1)


def test_an_expired_lease_of_a_driver_on_another_machine_is_not_called_dead() -> None:
    none = undriven.derive(_row(_elsewhere(new_owner())), None, time.time())
    assert none is not None and none.why == "silent", none
    note = none.note()
    assert "died:" not in note and "on opsbox-elsewhere" in note and "another machine" in note, note
    assert "cannot tell" in note and "a driver still at work then loses it" in note, note
    assert none.in_flight == "running" and undriven.shown_state("running", none) == "running"
    assert none.as_json()["why"] == "silent"
    # a lease still valid on another machine: driven (nothing here can say otherwise)
    assert undriven.derive(_row(_elsewhere(new_owner()), expired=False), None, time.time()) is None


def test_on_its_own_machine_a_dead_driver_is_dead_and_a_live_one_drives() -> None:
    child = subprocess.Popen([sys.executable, "-c", "from raysaga.orchestrator.ownership import new_owner; "
                              "print(new_owner(), flush=True); import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None and child.stdin is not None
    owner = child.stdout.readline().strip()
    try:
        assert undriven.derive(_row(owner), None, time.time()) is None  # alive, silent: it still drives
    finally:
        child.stdin.close()
        child.wait(timeout=30)
    dead = undriven.derive(_row(owner), None, time.time())
    assert dead is not None and dead.why == "expired" and "died" in dead.note(), dead
    assert dead.in_flight == "interrupted"


def test_a_driver_of_this_host_before_a_reboot_or_in_the_old_format_is_dead_not_silent() -> None:
    """(A review of the above: every owner ``checkable_here`` refuses was called silent, "on another
    machine": a driver of this host before its reboot, provably dead, showed its steps running.)"""
    parsed = parse_owner(new_owner())
    assert parsed is not None and parsed.boot is not None
    rebooted = new_owner().replace(f":{parsed.boot}:", ":00000000-0000-0000-0000-000000000000:", 1)
    old_format = f"{parsed.host}:999999:ab12cd"
    for owner in (rebooted, old_format):
        none = undriven.derive(_row(owner), None, time.time())
        assert none is not None and none.why == "expired" and "died" in none.note(), (owner, none)
        assert none.in_flight == "interrupted"

"""Lease owners name their process (host, pid, start time, boot id, pid namespace), so a driver
on the same host can prove a holder dead — exited, a zombie, or its pid reused — and take the
lease at once; anything it cannot prove (another host or boot, a stopped process, an old-style
owner string) is alive until its lease expires. Real child processes stand in for drivers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga.orchestrator import ownership
from raysaga.orchestrator.ownership import describe_lease, gone_because, owner_is_gone, parse_owner
from raysaga.state import RunRecord, RunStatus
from tests.support import crash_driver as harness

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")


def owner_of(pid: int, *, start: int | None = None, host: str | None = None, boot: str | None = None) -> str:
    """The owner string a driver in process ``pid`` writes (optionally with one part changed)."""
    started = ownership.process_start(pid) if start is None else start
    return ":".join([host or ownership._host(), str(pid), str(started), boot or ownership.boot_id() or "",
                     ownership.pid_namespace() or "", "abcd1234"])


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time\nwhile True: time.sleep(1)"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


def test_own_owner_string_round_trips() -> None:
    owner = ownership.new_owner()
    parsed = parse_owner(owner)
    assert parsed is not None and parsed.pid == os.getpid() and parsed.host == ownership._host()
    assert parsed.start == ownership.process_start(os.getpid()) and parsed.boot == ownership.boot_id()
    assert len(owner) <= 200  # the column's width
    assert not owner_is_gone(owner)
    legacy = parse_owner("host-a:4242:deadbeef")
    assert legacy is not None and (legacy.host, legacy.pid, legacy.boot) == ("host-a", 4242, None)
    assert not owner_is_gone("host-a:4242:deadbeef") and parse_owner("garbage") is None


def test_a_live_or_stopped_process_is_not_gone(child: subprocess.Popen[bytes]) -> None:
    owner = owner_of(child.pid)
    assert gone_because(owner) is None
    child.send_signal(signal.SIGSTOP)  # a stopped driver still holds its lease
    harness.wait_until(lambda: "\nState:\tT" in Path(f"/proc/{child.pid}/status").read_text(), timeout=30,
                       what="the child to stop")
    assert gone_because(owner) is None
    child.send_signal(signal.SIGCONT)


def test_exited_zombie_and_reused_pids_are_gone(child: subprocess.Popen[bytes]) -> None:
    owner = owner_of(child.pid)
    # a pid whose process started at another time is a reused pid: the owner is gone
    assert gone_because(owner_of(child.pid, start=(ownership.process_start(child.pid) or 0) + 1)) == \
        "its pid now belongs to a newer process"
    os.kill(child.pid, signal.SIGKILL)
    harness.wait_until(lambda: harness.process_gone(child.pid), timeout=30, what="the child to die")
    assert gone_because(owner) == "process exited (zombie)"  # not reaped yet
    child.wait()
    assert gone_because(owner) == "process not running"
    assert owner_is_gone(owner)


def test_what_cannot_be_proven_from_here_is_alive(child: subprocess.Popen[bytes]) -> None:
    here, there, other_boot = (owner_of(child.pid), owner_of(child.pid, host="another-host"),
                               owner_of(child.pid, boot="0" * 32))
    child.kill()
    child.wait()
    assert owner_is_gone(here)
    assert not owner_is_gone(there)  # a lease cannot be proven dead from elsewhere
    assert not owner_is_gone(other_boot)  # another kernel (or machine)


def _run(owner: str | None, expires: float | None, updated: float = 1795000000.0,
         workflow_ref: str | None = "flows:wf") -> RunRecord:
    return RunRecord(run_id="r", workflow_name="w", workflow_version="1", definition_hash="h",
                     status=RunStatus.RUNNING, version=1, lease_owner=owner, lease_expires_at=expires,
                     trace_id="t", created_at=updated, updated_at=updated, workflow_ref=workflow_ref)


def test_describe_lease(child: subprocess.Popen[bytes]) -> None:
    now = time.time()
    live = describe_lease(_run(owner_of(child.pid), now + 12.4), now)
    assert live == f"live driver pid {child.pid} on {ownership._host()} (lease renews; expires in 12s)"
    elsewhere = describe_lease(_run(owner_of(child.pid, host="host-b"), now + 5), now)
    assert elsewhere.startswith(f"driver pid {child.pid} on host-b holds the lease")
    expired = describe_lease(_run(owner_of(child.pid, host="host-b"), 1795000061.0), now)
    assert expired.startswith("no live driver since 2026-11-18 ") and "expired" in expired, expired
    # its process provably still runs here: silent (a step holding the GIL), not "no live driver"
    silent = describe_lease(_run(owner_of(child.pid), 1795000061.0), now)
    assert silent.startswith(f"driver pid {child.pid} on {ownership._host()} is alive but silent: its lease "
                             "expired at 2026-11-18 "), silent
    assert describe_lease(_run(None, None), now) == "no live driver since 2026-11-18 11:06:40 UTC"
    owner = owner_of(child.pid)
    child.kill()
    child.wait()
    gone = describe_lease(_run(owner, now + 50), now)
    assert gone == (f"driver pid {child.pid} on {ownership._host()} is gone (process not running); "
                    "`raysaga resume r` takes over at once")
    # a run that records no workflow module: the hint names the option resume then needs
    unrecorded = describe_lease(_run(owner, now + 50, workflow_ref=None), now)
    assert unrecorded.endswith("`raysaga resume r --workflow MODULE:WF` takes over at once"), unrecorded

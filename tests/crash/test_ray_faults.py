"""Ray faults under load: Ray worker processes SIGKILLed while a fan-out of effects runs on them,
and a second Ray node removed (its processes SIGKILLed) mid-run.

The fan-out (``tests.support.ray_fault_flows``) charges the deduping fake provider under each
item's idempotency key, then holds: a kill lands after the effect, before its result is back. The
driver must see the attempt fail, retry it under the same key, and finish: every item's charge
takes effect once (the provider saw some keys twice: the retries), the run completes with every
item, and no ledger row stays ``pending``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga.state import EffectStatus, RunStatus, SqlStore
from tests.support import crash_driver as harness
from tests.support import ray_fault_flows as flows
from tests.support.processes import first_pid_mentioning, ray_nodes
from tests.support.services import FakeServices, get_log

pytestmark = pytest.mark.ray

FULL = os.environ.get("RAYSAGA_FULL_SWEEP") == "1"


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


def starts(log: Path) -> list[tuple[str, int, str]]:
    """(label, pid, node id) of every attempt that started; and which ended."""
    if not log.exists():
        return []
    return [(parts[1], int(parts[2]), parts[3]) for parts in (line.split() for line in log.read_text().splitlines())
            if parts and parts[0] == "start" and len(parts) == 4]


def ended(log: Path) -> set[tuple[str, int]]:
    if not log.exists():
        return set()
    return {(parts[1], int(parts[2])) for parts in (line.split() for line in log.read_text().splitlines())
            if parts and parts[0] == "end"}


class Background:
    """``raysaga.run`` on the session's Ray, in a thread, so the test can fire at it meanwhile."""

    def __init__(self, url: str, run_input: flows.FanIn) -> None:
        self.result: list[Any] = []
        self.thread = threading.Thread(target=lambda: self.result.append(
            raysaga.run(flows.fan, run_input, store=url, executor="ray")), daemon=True)
        self.thread.start()

    def record(self, timeout: float = 240) -> raysaga.RunRecord:
        self.thread.join(timeout)
        assert not self.thread.is_alive() and self.result, "the run did not return"
        record: raysaga.RunRecord = self.result[0]
        return record


def check_exactly_once(record: raysaga.RunRecord, n: int, url: str, services: FakeServices) -> dict[str, Any]:
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"total": n}
    provider = get_log(services.url)
    assert len(provider["effective"]) == n and set(provider["effective"].values()) == {1}
    store = SqlStore(url)
    try:
        effects = store.effects(record.run_id)
    finally:
        store.close()
    assert len(effects) == n and {e.status for e in effects} == {EffectStatus.COMMITTED}
    return provider


def test_ray_workers_killed_under_load(ray_session: str, sqlite_url: str, tmp_path: Path,
                                       services: FakeServices) -> None:
    n, kills = (60, 12) if FULL else (20, 4)
    log = tmp_path / "attempts.log"
    run = Background(sqlite_url, flows.FanIn(services=services.url, log=str(log), n=n, hold=0.5))
    killed: set[int] = set()
    for _ in range(kills):
        def victim() -> int | None:
            done = ended(log)
            running = [pid for label, pid, _ in starts(log) if (label, pid) not in done and pid not in killed]
            return running[0] if running else None

        pid = harness.wait_until(victim, timeout=120, what="an item running in a Ray worker", interval=0.02)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        killed.add(pid)
    provider = check_exactly_once(run.record(), n, sqlite_url, services)
    retried = {label for label, pid, _ in starts(log) if pid in killed}
    assert len(retried) == kills, "each kill should have hit an item in flight"
    assert sum(provider["raw"].values()) >= n + kills  # the killed attempts had charged already


@pytest.fixture
def second_node(ray_address: str) -> Iterator[tuple[str, int]]:
    """A second Ray node with 2 CPUs: (its node id, its session: `ray start` runs it in a new one,
    and its raylet's workers are in it too, whatever their process groups)."""
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    assert ray_bin
    marker = f"raysaga_faults_{uuid.uuid4().hex[:10]}"
    proc = subprocess.run(
        [ray_bin, "start", f"--address={ray_address}", "--num-cpus=2", "--node-ip-address=127.0.0.1",
         f"--resources={json.dumps({marker: 1})}", "--disable-usage-stats"],
        capture_output=True, text=True, timeout=120, start_new_session=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    raylet = harness.wait_until(lambda: first_pid_mentioning(marker), timeout=30, what="the second node's raylet")
    sid = os.getsid(raylet)
    assert sid != os.getsid(0)
    try:
        node_id: str = harness.wait_until(
            lambda: next((n["NodeID"] for n in ray_nodes() if n["Alive"] and marker in n["Resources"]), None),
            timeout=60, what="the second node to join the cluster")
        yield node_id, sid
    finally:
        kill_session(sid)


def kill_session(sid: int) -> int:
    """SIGKILL every process of session ``sid``; how many there were."""
    killed = 0
    for proc_dir in Path("/proc").iterdir():
        if proc_dir.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(proc_dir.name)) == sid:
                    os.kill(int(proc_dir.name), signal.SIGKILL)
                    killed += 1
    return killed




def test_a_ray_node_removed_mid_run(ray_session: str, second_node: tuple[str, int], sqlite_url: str,
                                    tmp_path: Path, services: FakeServices) -> None:
    node_id, sid = second_node
    n = 40 if FULL else 16
    log = tmp_path / "attempts.log"
    run = Background(sqlite_url, flows.FanIn(services=services.url, log=str(log), n=n, hold=1.0))

    def busy_there() -> bool:
        done = ended(log)
        return any(node == node_id and (label, pid) not in done for label, pid, node in starts(log))

    harness.wait_until(busy_there, timeout=120, what="an item running on the second node", interval=0.02)
    assert kill_session(sid) >= 2  # the node is gone: its raylet, its workers, mid-item
    check_exactly_once(run.record(), n, sqlite_url, services)
    there = {label for label, _, node in starts(log) if node == node_id}
    again = [label for label in there if sum(1 for lb, _, _ in starts(log) if lb == label) > 1]
    assert again, "an item cut off with the node should have run again elsewhere"

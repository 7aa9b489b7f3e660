"""A worker fleet under fire: 3 ``raysaga worker`` processes on PostgreSQL and 2 on SQLite drive
submitted runs while workers are SIGKILLed at random and restarted.

Every run must end as an uninterrupted one does (its golden output), every effect must take
effect once at the deduping provider, no run may ever be driven by two workers at once (each
step's start and end are traced with the worker's pid: per run, the spans of different workers
never overlap, a killed worker's span ending when it was killed; and the run's claims carry
strictly increasing fences), and nothing is left pending or leased.

The default run is a representative subset (24 runs a store, submitted a few at a time while a
worker is killed every 0.4-1.2 s); the acceptance size (150 runs a store: 300) runs with
``RAYSAGA_FULL_SWEEP=1``.
"""

from __future__ import annotations

import itertools
import os
import random
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga import Client
from raysaga.orchestrator.ownership import parse_owner
from raysaga.state import EffectStatus, RunStatus, SqlStore
from tests.support import fleet_flows as flows
from tests.support.crash_driver import wait_until
from tests.support.services import FakeServices, get_log
from tests.support.worker_procs import fleet_input, start_worker

FULL = os.environ.get("RAYSAGA_FULL_SWEEP") == "1"
RUNS_PER_STORE = 150 if FULL else 24
LEASE_TTL = 1.5
PER_TICK = 4
MAX_KILLS = 40 if FULL else 8


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


@pytest.mark.postgres
def test_fleet_survives_random_worker_kills(pg_url: str, tmp_path: Path, services: FakeServices) -> None:
    sqlite_url = f"sqlite:///{tmp_path / 'fleet.db'}"
    trace = tmp_path / "trace.log"
    stores = {"pg": (pg_url, 3, 0), "sqlite": (sqlite_url, 2, RUNS_PER_STORE)}  # (url, workers, first n)
    runs: dict[str, list[tuple[str, int]]] = {name: [] for name in stores}
    clients = {name: Client(url) for name, (url, _, _) in stores.items()}
    waiting = {name: list(range(first, first + RUNS_PER_STORE)) for name, (_, _, first) in stores.items()}

    def submit_some() -> None:
        """Runs arrive while the fleet works (and is killed): a few a tick."""
        for name, numbers in waiting.items():
            for n in numbers[:PER_TICK]:
                runs[name].append((clients[name].submit(flows.short, fleet_input(n, services, trace)).run_id, n))
            del numbers[:PER_TICK]

    slots = [(url, start_worker(url, "short", lease_ttl=LEASE_TTL)) for url, count, _ in stores.values()
             for _ in range(count)]
    killed: dict[int, float] = {}
    rng = random.Random(int(os.environ.get("RAYSAGA_CHAOS_SEED", "7")))
    readers = {name: SqlStore(url) for name, (url, _, _) in stores.items()}

    def all_done() -> bool:
        """Every run of this test at rest (PostgreSQL's database is the session's: other tests'
        runs are there too, some left waiting on purpose)."""
        at_rest = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.COMPENSATED)
        return not any(waiting.values()) and all(readers[name].get_run(run_id).status in at_rest
                                                 for name, submitted in runs.items() for run_id, _ in submitted)

    try:
        # the chaos lasts while runs arrive and for a fixed number of kills, then the fleet finishes
        # in peace: on a loaded machine a restarted worker may die again before it did any work
        while (any(waiting.values()) or len(killed) < MAX_KILLS) and not all_done():
            submit_some()
            time.sleep(rng.uniform(0.4, 1.2))  # the chaos schedule: a kill every 0.4-1.2 s (not a synchronisation)
            index = rng.randrange(len(slots))
            url, proc = slots[index]
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                killed[proc.pid] = time.time()
            slots[index] = (url, start_worker(url, "short", lease_ttl=LEASE_TTL))
        wait_until(all_done, timeout=600 if FULL else 240, what="the fleet to bring every run to rest",
                   interval=0.2)
        for _, proc in slots:
            proc.send_signal(signal.SIGTERM)
        for _, proc in slots:
            _, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
        assert len(killed) >= min(MAX_KILLS, 3), f"only {len(killed)} workers were killed: the chaos was too mild"

        for name, store in readers.items():
            for run_id, n in runs[name]:
                run = store.get_run(run_id)
                assert (run.status, run.output) == (RunStatus.COMPLETED, flows.golden(n)), run_id
                if run.lease_owner is not None:  # only a driver SIGKILLed after the run's last commit and
                    owner = parse_owner(run.lease_owner)  # before its release leaves its (expiring) lease
                    assert owner is not None and owner.pid in killed, f"{run_id} still leased by {run.lease_owner}"
                assert [e.run_id for e in store.effects(run_id) if e.status != EffectStatus.COMMITTED] == []
                fences = [e.data["fence"] for e in store.events(run_id) if e.kind == "lease_claimed"]
                assert fences == sorted(set(fences)), f"{run_id}: claims with fences {fences}"
        log = get_log(services.url)
        total = 2 * len(stores) * RUNS_PER_STORE
        assert len(log["by_subject"]) == total and set(log["by_subject"].values()) == {1}
        assert set(log["effective"].values()) == {1}
        _assert_one_driver_at_a_time(trace, killed)
        print(f"fleet: {len(stores) * RUNS_PER_STORE} runs, {len(killed)} workers SIGKILLed, "
              f"{len(log['calls'])} provider calls for {total} effects, 0 duplicate effects")
    finally:
        for _, proc in slots:
            if proc.poll() is None:
                proc.kill()
        for store in readers.values():
            store.close()
        for client in clients.values():
            client.close()


def _assert_one_driver_at_a_time(trace: Path, killed: dict[int, float]) -> None:
    """Per run, the time spans in which each worker process ran its steps never overlap."""
    spans: dict[str, dict[int, list[float]]] = defaultdict(dict)
    open_starts: dict[tuple[str, int], int] = defaultdict(int)
    for line in trace.read_text().splitlines():
        what, run_id, _node, pid_text, at_text = line.split()
        pid, at = int(pid_text), float(at_text)
        span = spans[run_id].setdefault(pid, [at, at])
        span[0], span[1] = min(span[0], at), max(span[1], at)
        open_starts[(run_id, pid)] += 1 if what == "start" else -1
    for (run_id, pid), unfinished in open_starts.items():
        if unfinished:  # a step under way when its worker was killed: its span ends at the kill
            assert pid in killed, f"run {run_id}: worker {pid} left a step unfinished yet was not killed"
            spans[run_id][pid][1] = max(spans[run_id][pid][1], killed[pid])
    for run_id, by_pid in spans.items():
        ordered = sorted(by_pid.items(), key=lambda item: item[1][0])
        for (pid_a, (_, end_a)), (pid_b, (start_b, _)) in itertools.pairwise(ordered):
            assert end_a <= start_b, f"run {run_id} was driven by workers {pid_a} and {pid_b} at once"

"""Soak: a fleet drives runs for a long time with faults on, and its long-lived processes do not grow.

Two ``raysaga worker`` processes (never killed: they are what must stay flat) drive runs submitted
at a steady 4 a second on a PostgreSQL server of the test's own, which is crashed and restarted every
20-60 s, while about one write in twenty is answered by a dropped connection
(``RAYSAGA_FAULTS=...=drop:0.05``). Every 5 s the test samples each worker's resident memory
(``VmRSS``) and open file descriptors, and the server's connections. After a warm-up (the first
third), the least-squares slope of each worker's memory must stay under 2 MiB a minute, its
descriptors and the server's connections must not grow, every run must end golden with every
effect once.

Off by default (it takes as long as it is told): ``RAYSAGA_SOAK_SECONDS=1800 pytest
tests/fleet/test_soak.py -s`` (the acceptance's 30 minutes). The figures are printed and written to
``$RAYSAGA_SOAK_REPORT`` (JSON) when set.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, text

import raysaga
from raysaga import Client
from raysaga.state import EffectStatus, RunStatus, SqlStore
from raysaga.state.engine import is_outage
from tests.support import fleet_flows as flows
from tests.support import private_postgres
from tests.support.crash_driver import wait_until
from tests.support.private_postgres import retrying, submit_once
from tests.support.services import FakeServices, get_log
from tests.support.worker_procs import fleet_input, start_worker

SECONDS = float(os.environ.get("RAYSAGA_SOAK_SECONDS", "0"))
SAMPLE_EVERY = 5.0
RUNS_PER_SECOND = 4.0  # a steady load, not a flood: the soak is about time and cycles
CLIENTS = "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
MAX_SLOPE_MIB_PER_MIN = 2.0

pytestmark = [
    pytest.mark.timeout(SECONDS + 900),  # the suite's per-test limit is for tests, not for a soak
    pytest.mark.skipif(SECONDS <= 0, reason="a soak runs only when RAYSAGA_SOAK_SECONDS is set"),
    pytest.mark.skipif(private_postgres.available() is not None,
                       reason=f"no private PostgreSQL server here: {private_postgres.available()}"),
]



def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, value) points, per minute."""
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    return 60 * sum((t - mean_t) * (v - mean_v) for t, v in points) / var if var else 0.0


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


def test_a_fleet_stays_flat_under_faults(tmp_path: Path, services: FakeServices) -> None:
    pg = private_postgres.PrivatePostgres()
    pg.start()
    raysaga.open_store(pg.url).close()
    client, reader = Client(pg.url), SqlStore(pg.url)
    probe = create_engine(pg.url.replace("postgresql://", "postgresql+psycopg://"), pool_pre_ping=True)
    os.environ["RAYSAGA_FAULTS"] = "after_commit:*=drop:0.05,after_pending:*=drop:0.05"
    try:
        workers = [start_worker(pg.url, "short", lease_ttl=5.0) for _ in range(2)]
    finally:
        del os.environ["RAYSAGA_FAULTS"]
    drains = [threading.Thread(target=lambda p=p: [None for _ in p.stderr or []], daemon=True) for p in workers]
    for thread in drains:
        thread.start()
    rng = random.Random(5)
    stop = threading.Event()
    crashes: list[float] = []

    def chaos() -> None:
        while not stop.wait(rng.uniform(20, 60)):  # the chaos schedule, not a synchronisation
            pg.crash()
            crashes.append(time.time())
            time.sleep(rng.uniform(0.5, 2.0))
            pg.start()

    samples: dict[int, list[tuple[float, float, int]]] = {w.pid: [] for w in workers}
    connections: list[tuple[float, int]] = []
    trace = tmp_path / "trace.log"
    submitted: list[tuple[str, int]] = []
    started = time.time()
    crasher = threading.Thread(target=chaos, daemon=True)
    crasher.start()
    try:
        next_sample, n = started, 0
        while time.time() - started < SECONDS:
            while n < (time.time() - started) * RUNS_PER_SECOND:
                submitted.append((submit_once(client, flows.short, fleet_input(n, services, trace),
                                              f"soak-{n}"), n))
                n += 1
            if time.time() >= next_sample:
                at = time.time() - started
                for w in workers:
                    assert w.poll() is None, "a worker died"
                    samples[w.pid].append((at, rss_mib(w.pid), open_fds(w.pid)))
                try:
                    with probe.connect() as conn:
                        connections.append((at, int(conn.execute(text(CLIENTS)).scalar_one())))
                except Exception as exc:
                    if not is_outage(exc):
                        raise
                next_sample += SAMPLE_EVERY
            time.sleep(0.2)  # the submitter's pace (not a synchronisation)
        stop.set()
        crasher.join(timeout=120)
        wait_until(lambda: retrying(lambda: all(reader.get_run(r).status == RunStatus.COMPLETED
                                                for r, _ in submitted)), timeout=120, what="every run completed")
        report: dict[str, Any] = {"seconds": SECONDS, "runs": len(submitted), "crashes": len(crashes), "workers": {}}
        for pid, points in samples.items():
            warm = [p for p in points if p[0] >= SECONDS / 3]
            slope = slope_per_minute([(t, rss) for t, rss, _ in warm])
            report["workers"][pid] = {"rss_first": warm[0][1], "rss_last": warm[-1][1], "slope_mib_per_min": slope,
                                      "fds_first": warm[0][2], "fds_max": max(f for _, _, f in warm)}
            assert slope < MAX_SLOPE_MIB_PER_MIN, report
            assert max(f for _, _, f in warm) <= warm[0][2] + 8, report
        warm_conns = [c for t, c in connections if t >= SECONDS / 3]
        report["connections_first"], report["connections_max"] = warm_conns[0], max(warm_conns)
        assert max(warm_conns) <= warm_conns[0] + 10, report
        for run_id, k in submitted:
            run = reader.get_run(run_id)
            assert run.output == flows.golden(k), run_id
            assert [e for e in reader.effects(run_id) if e.status != EffectStatus.COMMITTED] == []
        provider = get_log(services.url)
        assert set(provider["effective"].values()) == {1} and len(provider["by_subject"]) == 2 * len(submitted)
        print("soak:", json.dumps(report, indent=1))
        if os.environ.get("RAYSAGA_SOAK_REPORT"):
            Path(os.environ["RAYSAGA_SOAK_REPORT"]).write_text(json.dumps(report, indent=1))
        for w in workers:
            w.send_signal(signal.SIGTERM)
            assert w.wait(timeout=60) == 0
    finally:
        stop.set()
        for w in workers:
            if w.poll() is None:
                w.kill()
        probe.dispose()
        reader.close()
        client.close()
        pg.close()

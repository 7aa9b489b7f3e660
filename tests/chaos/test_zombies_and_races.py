"""Invariant 4 at scale: zombies write and call nothing; of many racing resumers exactly one wins.

- Zombies (``tests.support.chaos_race.zombie_trial``): a driver stalled at a fault point of a
  chaos DAG is SIGSTOPped past its lease; another resumes the run to rest (equal to golden);
  the zombie, SIGCONTed, exits with its lease lost, and the store and the provider's log are
  exactly what they were before it woke. ``tests/crash/test_zombie_driver.py`` does this once,
  inside a step; here the zombie is stopped between the engine's own steps (a pending row
  written, a call returned, a commit made). CI: 3 trials on the reference rollback DAG;
  ``RAYSAGA_FULL_SWEEP=1``: 500 trials (``RAYSAGA_CHAOS_ZOMBIES``) over it and random DAGs, at
  random points.
- Racing resumes: N driver processes resume one run at the same moment (the ``gate`` flow
  holds the winner inside a step): exactly one claims and completes it, every other exits
  "lease held", one ``lease_claimed`` event, one charge. CI 6 processes, full 16.
- Claim race: P processes x T threads call ``store.claim`` on one run at the same moment:
  exactly one wins, every other is told the lease is held (no other error: no "database is
  locked"), one ``lease_claimed`` event. CI 4 x 25; full 4 x 250 = 1,000. SQLite and, when
  configured, PostgreSQL.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import raysaga
from raysaga.state import SqlStore
from tests.support import REPO
from tests.support import crash_driver as harness
from tests.support.chaos_gen import dag_specs
from tests.support.chaos_race import MODULE_RACE, race_result, zombie_points, zombie_trial
from tests.support.chaos_sweep import Golden, golden_run
from tests.support.kill_sweep import FULL_SWEEP
from tests.support.services import FakeServices

crash_flows = harness.load_flows()
LONG = 4 * 3600  # seconds: a full sweep's own time limit
ZOMBIES = int(os.environ.get("RAYSAGA_CHAOS_ZOMBIES", "500" if FULL_SWEEP else "3"))
RESUMERS = 16 if FULL_SWEEP else 6
RACE_PROCS, RACE_THREADS = 4, (250 if FULL_SWEEP else 25)
STATS: dict[str, int] = {"zombie_trials": 0}

ROLLBACK = {"name": "zombie_rollback", "steps": [
    {"name": "a", "kind": "step", "deps": [], "effect": True, "compensate": True},
    {"name": "plan", "kind": "plan", "deps": ["a"], "items": 3},
    {"name": "work", "kind": "map", "over": "plan", "deps": ["plan"], "effect": True, "compensate": True,
     "fail_items": [], "policy": {"kind": "all"}},
    {"name": "merge", "kind": "step", "deps": ["work"]},
    {"name": "boom", "kind": "step", "deps": ["merge"], "effect": True, "fate": "fail"},
]}


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    print(f"\nzombies and races: {STATS}")


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        yield fake


@pytest.fixture(scope="module")
def rollback(services: FakeServices, tmp_path_factory: pytest.TempPathFactory) -> Golden:
    golden = golden_run(ROLLBACK, tmp_path_factory.mktemp("golden-zombie"), services)
    assert golden.run["status"] == "compensated", golden.run
    return golden


def test_zombie_points_cover_each_kind(rollback: Golden) -> None:
    points = zombie_points(rollback)
    assert {p for p, _ in points} == {"after_pending", "before_commit", "after_commit"}
    assert ("before_commit", "work:compensate[1]") in points and ("after_commit", "merge") in points


CI_ZOMBIES = [("after_pending", "work[1]"), ("before_commit", "a:compensate"), ("after_commit", "merge")]


@pytest.mark.skipif(FULL_SWEEP, reason="the full sweep runs the random trials instead")
@pytest.mark.parametrize("kill", CI_ZOMBIES, ids=[f"{p}:{label}" for p, label in CI_ZOMBIES])
def test_zombie_writes_and_calls_nothing(kill: tuple[str, str], rollback: Golden, services: FakeServices,
                                         tmp_path: Path) -> None:
    assert kill in zombie_points(rollback)
    zombie_trial(rollback, kill, services, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not FULL_SWEEP, reason="500 zombie trials run with RAYSAGA_FULL_SWEEP=1")
@pytest.mark.timeout(LONG if FULL_SWEEP else 300)  # the suite-wide 300 s stops a full sweep
@settings(max_examples=max(1, ZOMBIES // 20), deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is real processes
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=dag_specs(5, 30), seed=st.integers(0, 2**32 - 1))
def test_zombie_trials_full(spec: dict[str, Any], seed: int, rollback: Golden, services: FakeServices,
                            tmp_path_factory: pytest.TempPathFactory) -> None:
    """Each example: 10 trials on a random DAG, 10 on the reference one, at random points."""
    rng = random.Random(seed)
    golden = golden_run(spec, tmp_path_factory.mktemp("golden-zdag"), services)
    for dag in (golden, rollback):
        points = zombie_points(dag)
        for kill in rng.sample(points, min(10, len(points))):
            try:
                zombie_trial(dag, kill, services, tmp_path_factory.mktemp("zombie"))
            except AssertionError as exc:  # a replay may fail otherwise (timing): say which trial this was
                raise AssertionError(f"zombie trial at {kill} of {dag.spec['name']}: {exc}\n"
                                     f"SPEC {json.dumps(dag.spec, sort_keys=True)}") from exc
            STATS["zombie_trials"] += 1


# ---------------------------------------------------------------------- races


def test_racing_resumes_exactly_one_advances(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'race.db'}"
    control = tmp_path / "control"
    control.mkdir()
    run_id = f"race-{uuid.uuid4().hex[:8]}"
    go = tmp_path / "go"
    store = SqlStore(db)
    with FakeServices() as services:
        raysaga.create_run(crash_flows.gate_flow, crash_flows.sample_input("gate", services.url, str(control)),
                           store=store, run_id=run_id)
        racers = [harness.spawn("gate", db, run_id, resume=True, lease_ttl=5.0, go_file=go) for _ in range(RESUMERS)]
        try:
            go.touch()
            # the winner is held inside `gate` with a live lease: every other racer must back off
            harness.wait_until(lambda: (control / "gate.entered").exists(), timeout=120, what="a racer in the gate")
            harness.wait_until(lambda: sum(p.poll() is not None for p in racers) == RESUMERS - 1, timeout=120,
                               what=f"{RESUMERS - 1} racers to back off")
            (winner,) = [p for p in racers if p.poll() is None]
            lost = [harness.finish(p) for p in racers if p is not winner]
            (control / "release").touch()
            won = harness.finish(winner)
        finally:
            (control / "release").touch()
            for proc in racers:
                harness.stop(proc)
        log = services.log()
    try:
        assert [f.returncode for f in lost] == [harness.EXIT_LEASE_HELD] * (RESUMERS - 1), \
            [f.describe() for f in lost if f.returncode != harness.EXIT_LEASE_HELD]
        assert won.returncode == 0 and won.result is not None and won.result["status"] == "completed", won.describe()
        claims = [e for e in store.events(run_id) if e.kind == "lease_claimed"]
        assert len(claims) == 1 and f":{winner.pid}:" in claims[0].data["owner"], claims
        assert (control / "gate.entries").read_text().split() == [str(winner.pid)]
        assert list(log["effective"].values()) == [1] and list(log["raw"].values()) == [1]
    finally:
        store.close()


def test_claim_race_has_exactly_one_winner(store_url: str, tmp_path: Path) -> None:
    run_id = f"claims-{uuid.uuid4().hex[:8]}"
    store = SqlStore(store_url)
    go = tmp_path / "go"
    try:
        raysaga.create_run(crash_flows.gate_flow, {"services_url": "http://127.0.0.1:9", "control_dir": "/nonexistent"},
                           store=store, run_id=run_id)
        procs = [subprocess.Popen([sys.executable, "-m", MODULE_RACE, "--db", store_url, "--run-id", run_id,
                                   "--threads", str(RACE_THREADS), "--go", str(go)], cwd=REPO, text=True,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(RACE_PROCS)]
        try:
            go.touch()
            results = [race_result(harness.finish(p, timeout=240)) for p in procs]
        finally:
            for proc in procs:
                harness.stop(proc)
        total = RACE_PROCS * RACE_THREADS
        errors = [e for r in results for e in r["errors"]]
        assert errors == [], errors[:5]
        assert sum(r.get("won", 0) for r in results) == 1, results
        assert sum(r.get("held", 0) for r in results) == total - 1, results
        claims = [e for e in store.events(run_id) if e.kind == "lease_claimed"]
        assert len(claims) == 1 and store.get_run(run_id).fence == claims[0].data["fence"], claims
        print(f"claim race ({store_url.split(':')[0]}): {total} racers, 1 winner")
    finally:
        store.close()

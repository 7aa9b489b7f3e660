"""A fork's own execution under SIGKILL: no effect twice, none of the parent's again.

A completed run of the order example (``reserve_stock → charge_card → send_email → ship``) is
forked from ``charge_card``: ``reserve_stock`` is inherited, the two effects and ``ship`` run
in the fork. A golden fork goes uninterrupted. Then, for every crash point of the fork's own
execution (each node's ``after_commit``, the four points of each effect, the final transition),
a driver process forks and must die of SIGKILL there; once its lease has expired a second
process resumes the fork, and the test checks against the golden fork:

- the same final status, output and node statuses;
- at the deduping provider, one effective call per key, and only the golden fork's keys: none
  of the parent's keys is called again (0 extra calls upstream of the fork point) and no fresh
  key appears;
- a key called twice only where the kill left it uncertain (``before_commit``, inline: exact).

Inline in the default run: one of each kind of point on PostgreSQL (``PG_CI_CASES``), every other
point on SQLite (``SQLITE_CI_CASES``), so each point once, and one case on Ray; every point on SQLite,
on PostgreSQL and on Ray behind ``RAYSAGA_FULL_SWEEP=1`` (``slow``).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import raysaga
from examples.order import workflow as order
from raysaga.state import EffectStatus, RunStatus, SqlStore
from tests.support import REPO, fork_driver
from tests.support import crash_driver as harness
from tests.support.kill_sweep import (
    EFFECT_POINTS,
    FULL_SWEEP,
    LEASE_TTL,
    case_ids,
    kill_and_resume,
    ledger_label,
    sweep_params,
)
from tests.support.postgres import drop_pg_database, make_pg_database
from tests.support.services import FakeServices

PARENT, CHILD, FROM = "fork-parent", "fork-child", "charge_card"
RUN_IN_FORK = ("charge_card", "send_email", "ship")
EFFECTS_IN_FORK = ("charge_card", "send_email")
POINTS = [("after_commit", label) for label in RUN_IN_FORK]
POINTS += [(point, label) for label in EFFECTS_IN_FORK for point in EFFECT_POINTS if point != "after_commit"]
POINTS.append(("before_transition", "*"))
INLINE_CASES = [("inline", point, label) for point, label in POINTS]
RAY_CI_CASES = [("ray", "before_commit", "send_email")]
#: CI's PostgreSQL cases: each kind of point once (all on PostgreSQL with ``RAYSAGA_FULL_SWEEP=1``).
PG_CI_CASES = [("inline", "before_pending", "charge_card"), ("inline", "after_pending", "send_email"),
               ("inline", "before_commit", "charge_card"), ("inline", "after_commit", "ship"),
               ("inline", "before_transition", "*")]
#: CI's SQLite cases: every other point, so CI runs each point once, on one store or the other (the
#: fork's execution does not depend on the store; every point on SQLite with ``RAYSAGA_FULL_SWEEP=1``).
SQLITE_CI_CASES = [case for case in INLINE_CASES if case not in PG_CI_CASES]
RAY_CASES = [("ray", point, label) for point, label in POINTS if ("ray", point, label) not in RAY_CI_CASES]


@pytest.fixture(scope="module")
def services() -> Iterator[Any]:
    with FakeServices() as fake:
        yield fake


@dataclass
class Golden:
    output: Any
    nodes: dict[str, str]
    keys: dict[str, str]  # the fork's effect node label -> its key
    parent_keys: set[str]


def _parent(db: str, services: Any) -> set[str]:
    """A completed parent run in ``db``; its effect keys."""
    services.reset()
    parent = raysaga.run(order.wf, order.sample_input(services.url), store=db, run_id=PARENT, executor="inline")
    assert parent.status == RunStatus.COMPLETED
    store = SqlStore(db)
    try:
        return {e.idempotency_key for e in store.effects(PARENT)}
    finally:
        store.close()


@pytest.fixture(scope="module")
def golden(services: Any, tmp_path_factory: pytest.TempPathFactory) -> Golden:
    db = f"sqlite:///{tmp_path_factory.mktemp('fork-golden') / 'golden.db'}"
    parent_keys = _parent(db, services)
    services.reset()
    child = raysaga.fork(order.wf, PARENT, from_node=FROM, store=db, new_run_id=CHILD, executor="inline")
    assert child.status == RunStatus.COMPLETED
    store = SqlStore(db)
    try:
        keys = {ledger_label(e): e.idempotency_key for e in store.effects(CHILD)}
        nodes = {n.label: n.status.value for n in store.nodes(CHILD)}
    finally:
        store.close()
    assert sorted(keys) == sorted(EFFECTS_IN_FORK) and not set(keys.values()) & parent_keys
    log = services.log()
    assert log["raw"] == log["effective"] == dict.fromkeys(keys.values(), 1)
    return Golden(child.output, nodes, keys, parent_keys)


def sweep_case(executor: str, point: str, label: str, golden: Golden, services: Any, tmp_path: Path,
               db: str | None = None) -> None:
    db = db or f"sqlite:///{tmp_path / 'fork.db'}"
    assert _parent(db, services) == golden.parent_keys  # the same parent: the same keys
    services.reset()
    uncertain: set[str] = set()

    def start(faults: str | None, resume: bool, go_file: Path | None) -> subprocess.Popen[str]:
        cmd = fork_driver.command(db, PARENT, CHILD, FROM, executor=executor, lease_ttl=LEASE_TTL[executor],
                                  resume=resume, go_file=go_file)
        return subprocess.Popen(cmd, cwd=REPO, env=harness.driver_env(faults), text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def at_kill(kill: tuple[str, str], snap: Any) -> None:
        uncertain.update(e.idempotency_key for e in snap.effects if e.status == EffectStatus.PENDING)
        assert snap.run.parent_run_id == PARENT  # the fork was created whole before any kill point

    with kill_and_resume(start, db, CHILD, [(point, label)], tmp_path, at_kill=at_kill) as (resumed, store):
        result = resumed.result
        assert result is not None
        assert (result["status"], result["output"]) == ("completed", golden.output)
        assert {n.label: n.status.value for n in store.nodes(CHILD)} == golden.nodes
        effects = store.effects(CHILD)
        assert {ledger_label(e): e.idempotency_key for e in effects} == golden.keys
        assert {e.status for e in effects} == {EffectStatus.COMMITTED}
        log = services.log()
        assert log["effective"] == dict.fromkeys(golden.keys.values(), 1), log
        # no parent key called again, no fresh key
        assert set(log["raw"]) == set(golden.keys.values()), log["raw"]
        repeated = {key for key, n in log["raw"].items() if n > 1}
        if executor == "inline":
            assert repeated == (uncertain if point == "before_commit" else set()), (repeated, uncertain)
        else:
            assert repeated <= uncertain, (repeated, uncertain)


def test_the_sweep_covers_the_forks_own_execution() -> None:
    assert len(POINTS) == 3 + 2 * 3 + 1


@pytest.mark.parametrize(("executor", "point", "label"),
                         sweep_params(INLINE_CASES, SQLITE_CI_CASES, "CI: SQLITE_CI_CASES, and the rest on PostgreSQL"))
def test_fork_kill_sweep_inline(executor: str, point: str, label: str, golden: Golden, services: Any,
                                tmp_path: Path) -> None:
    sweep_case(executor, point, label, golden, services, tmp_path)


@pytest.mark.parametrize(("executor", "point", "label"), sweep_params(INLINE_CASES, PG_CI_CASES, "CI: PG_CI_CASES"))
def test_fork_kill_sweep_inline_on_postgresql(executor: str, point: str, label: str, golden: Golden, services: Any,
                                              pg_base_url: str, tmp_path: Path) -> None:
    """The same points with the store on PostgreSQL (a database per case; the golden fork is SQLite's:
    outputs and keys do not depend on the store)."""
    url = make_pg_database(pg_base_url, migrated=True)  # an empty store, as copy_template gives SQLite's
    try:
        sweep_case(executor, point, label, golden, services, tmp_path, db=url)
    finally:
        drop_pg_database(pg_base_url, url)


@pytest.mark.ray
@pytest.mark.parametrize(("executor", "point", "label"), RAY_CI_CASES, ids=case_ids(RAY_CI_CASES))
def test_fork_kill_sweep_ray_ci(executor: str, point: str, label: str, ray_address: str, golden: Golden,
                                services: Any, tmp_path: Path) -> None:
    sweep_case(executor, point, label, golden, services, tmp_path)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not FULL_SWEEP, reason="the Ray fork sweep runs with RAYSAGA_FULL_SWEEP=1")
@pytest.mark.parametrize(("executor", "point", "label"), RAY_CASES, ids=case_ids(RAY_CASES))
def test_fork_kill_sweep_ray(executor: str, point: str, label: str, ray_address: str, golden: Golden,
                             services: Any, tmp_path: Path) -> None:
    sweep_case(executor, point, label, golden, services, tmp_path)

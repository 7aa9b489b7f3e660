"""Invariants 1 and 2 under SIGKILL: resume equals uninterrupted, and effects happen once per key.

For each flow (``order``: the example, 4 nodes; ``wide``: 20 nodes with an 8-way effect
fan-out) a golden run goes uninterrupted. Then, for every crash point, a driver subprocess is
started with ``RAYSAGA_FAULTS=<point>:<label>`` and must die of SIGKILL there; once its lease
has expired (polled in the store) a second subprocess resumes the run, and the test checks:

- the run's final status and output equal the golden run's, and so does every node's status;
- every node completed as often as in the golden run (once: ``node_completed`` and
  ``items_completed`` events): a step committed completed at the kill is restored, never run
  again (its output and status would not show a second execution);
- the fake provider saw exactly one *effective* call per key, and exactly the golden keys (a
  re-issued call under a fresh key would add a key and a second effect on its subject);
- a key got more than one *raw* call only where the effect was uncertain at the kill: its
  ledger row was ``pending`` and its call had returned (``before_commit``). With the inline
  executor that is exact; with Ray a call in flight at the kill may also land, so only
  ``pending`` keys may repeat.

The crash points: ``after_commit`` of every node (the node boundaries), ``before_pending``,
``after_pending``, ``before_commit`` and ``after_commit`` of every effect node, and
``before_transition`` of the final ``completed`` transition. The whole sweep runs inline with
``RAYSAGA_FULL_SWEEP=1``, and again on Ray; by default (CI) a representative subset of each does
(``INLINE_CI_CASES``, ``RAY_CI_CASES``). The order flow's sweep runs again with the store on
PostgreSQL (when a server answers; CI: ``PG_CI_CASES``, one case per kind of point); without one,
``PG_CI_CASES`` run on SQLite instead, so CI covers every point of ``order`` either way.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from tests.support import REPO
from tests.support import crash_driver as harness
from tests.support.kill_sweep import (
    EFFECT_POINTS,
    FULL_SWEEP,
    LEASE_TTL,
    case_ids,
    completion_counts,
    differing_counts,
    kill_and_resume,
    ledger_label,
    rows,
    sweep_params,
)
from tests.support.postgres import drop_pg_database, make_pg_database
from tests.support.services import FakeServices

flows = harness.load_flows()

RUN_ID = "sweep-1"  # golden and killed runs share the id (and the input): their keys must match


def node_labels(flow: str) -> list[str]:
    """Every node a run of ``flow`` records: each step, and each fan-out item of a map step."""
    wf = flows.FLOWS[flow]
    labels = []
    for step in wf.order:
        labels.append(step)
        if wf.steps[step].map_over is not None:
            labels += [f"{step}[{i}]" for i in range(flows.WIDE_ITEMS)]
    return labels


def effect_labels(flow: str) -> list[str]:
    """Nodes with a ledger row: effect steps, and the items (not the parent) of a mapped effect."""
    wf = flows.FLOWS[flow]
    labels = []
    for label in node_labels(flow):
        step, _, item = label.partition("[")
        if wf.steps[step].effect and (item or wf.steps[step].map_over is None):
            labels.append(label)
    return labels


def kill_points(flow: str) -> list[tuple[str, str]]:
    points = [("after_commit", label) for label in node_labels(flow)]
    points += [(point, label) for label in effect_labels(flow) for point in EFFECT_POINTS]
    points.append(("before_transition", "*"))
    return list(dict.fromkeys(points))


INLINE_CASES = [(flow, point, label) for flow in ("order", "wide") for point, label in kill_points(flow)]
#: CI's Ray case: a node boundary. The order flow's effect points on Ray run in the full sweep since
#: stop 28; CI runs the same families on Ray in the other sweeps: a call returned, its result not
#: durable (``test_fork_kill_sweep.py``: the order flow's ``before_commit:send_email``), and a pending
#: ledger row (``test_agent_kill_sweep.py``: ``after_pending:research@1.0``; ``test_rollback_crash_sweep.py``).
RAY_CI_CASES = [("order", "after_commit", "reserve_stock")]
RAY_FULL_CASES = [case for case in INLINE_CASES if case not in RAY_CI_CASES]
PG_CASES = [("order", point, label) for point, label in kill_points("order")]
#: CI's PostgreSQL cases: each kind of point once (all of them with ``RAYSAGA_FULL_SWEEP=1``).
PG_CI_CASES = [("order", "before_pending", "charge_card"), ("order", "after_pending", "send_email"),
               ("order", "before_commit", "charge_card"), ("order", "after_commit", "ship"),
               ("order", "before_transition", "*")]
#: CI's inline cases on SQLite: every point of ``order`` that CI does not run on PostgreSQL (so each
#: point of ``order`` once, on one store or the other; since stop 28); of ``wide``, each kind of
#: effect point once at a fan-out item (first and last item in turn), the map step's and the join's
#: boundaries, and the effect behind the join with its call returned (since 2026-11-29: the other
#: points of ``work[0]``, ``work[7]`` and ``notify`` repeat those kinds, and ``order`` runs the final
#: transition on PostgreSQL; every point with ``RAYSAGA_FULL_SWEEP=1``).
WIDE_CI_CASES = [("wide", "before_pending", "work[0]"), ("wide", "after_pending", "work[7]"),
                 ("wide", "before_commit", "work[0]"), ("wide", "after_commit", "work[7]"),
                 ("wide", "after_commit", "work"), ("wide", "after_commit", "join"),
                 ("wide", "before_commit", "notify")]
INLINE_CI_CASES = [case for case in INLINE_CASES
                   if (case[0] == "order" and case not in PG_CI_CASES) or case in WIDE_CI_CASES]


def test_the_sweep_covers_what_it_claims() -> None:
    assert len(node_labels("wide")) >= 20 and len(effect_labels("wide")) == flows.WIDE_ITEMS + 1
    assert effect_labels("order") == ["charge_card", "send_email"]
    # every node boundary, 4 points per effect node (after_commit shared), the final transition
    assert len(kill_points("order")) == 4 + 2 * 3 + 1
    assert len(kill_points("wide")) == len(node_labels("wide")) + len(effect_labels("wide")) * 3 + 1
    # CI: each point of ``order`` once (SQLite or PostgreSQL), and each kind of point of ``wide``
    assert sorted(c for c in INLINE_CI_CASES + PG_CI_CASES if c[0] == "order") == sorted(PG_CASES)
    wide_points = {point for point, _ in kill_points("wide")} - {"before_transition"}
    assert {c[1] for c in INLINE_CI_CASES if c[0] == "wide"} == wide_points
    assert set(WIDE_CI_CASES) <= set(INLINE_CASES)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def services() -> Iterator[Any]:
    """One provider for the module; its log is reset before each run, so URL and keys stay the same."""
    with FakeServices() as fake:
        yield fake


@dataclass
class Golden:
    status: str
    output: Any
    nodes: dict[str, str]
    keys: dict[str, str]  # effect node label -> idempotency key
    by_subject: dict[str, int]
    executions: dict[str, int]  # node label -> how often it completed (``completion_counts``)


@pytest.fixture(scope="module")
def goldens() -> dict[tuple[str, str], Golden]:
    """Golden runs by (flow, executor), computed on first use."""
    return {}


def golden_run(flow: str, executor: str, services: Any, goldens: dict[tuple[str, str], Golden],
               tmp_path_factory: pytest.TempPathFactory) -> Golden:
    """The uninterrupted run (computed once per flow and executor)."""
    if (flow, executor) in goldens:
        return goldens[(flow, executor)]
    db = f"sqlite:///{tmp_path_factory.mktemp(f'golden-{flow}-{executor}') / 'golden.db'}"
    services.reset()
    done = harness.run_driver(flow, db, RUN_ID, executor=executor, run_input=flows.sample_input(flow, services.url),
                              lease_ttl=LEASE_TTL[executor])
    assert done.returncode == 0, done.describe()
    assert done.result is not None and done.result["status"] == "completed", done.describe()
    nodes, effects = rows(db, RUN_ID)
    store = SqlStore(db)
    try:
        executions = dict(completion_counts(store, RUN_ID))
    finally:
        store.close()
    assert executions == dict.fromkeys(nodes, 1), f"the golden run completed nodes other than once: {executions}"
    assert sorted(nodes) == sorted(node_labels(flow)), "the golden run recorded other nodes than expected"
    assert set(nodes.values()) == {"completed"}
    keys = {ledger_label(e): e.idempotency_key for e in effects}
    assert sorted(keys) == sorted(effect_labels(flow)) and {e.status for e in effects} == {EffectStatus.COMMITTED}
    log = services.log()
    assert log["raw"] == log["effective"] == dict.fromkeys(keys.values(), 1), log
    golden = Golden(done.result["status"], done.result["output"], nodes, keys, log["by_subject"], executions)
    goldens[(flow, executor)] = golden
    return golden


# ---------------------------------------------------------------------- the check


def sweep_case(flow: str, point: str, label: str, executor: str, golden: Golden, services: Any,
               tmp_path: Path, db: str | None = None) -> None:
    db = db or f"sqlite:///{tmp_path / 'run.db'}"
    ttl = LEASE_TTL[executor]
    services.reset()
    uncertain: set[str] = set()

    def start(faults: str | None, resume: bool, go_file: Path | None) -> subprocess.Popen[str]:
        run_input = None if resume else flows.sample_input(flow, services.url)
        return harness.spawn(flow, db, RUN_ID, executor=executor, lease_ttl=ttl, resume=resume, go_file=go_file,
                             run_input=run_input, faults=faults)

    def at_kill(kill: tuple[str, str], snap: Any) -> None:
        log_at_kill = services.log()
        uncertain.update(e.idempotency_key for e in snap.effects if e.status == EffectStatus.PENDING)
        check_state_at_kill(point, label, snap, log_at_kill, golden)

    with kill_and_resume(start, db, RUN_ID, [(point, label)], tmp_path, at_kill=at_kill) as (resumed, store):
        result = resumed.result
        assert result is not None

        # invariant 1: resume equals uninterrupted
        assert (result["status"], result["output"]) == (golden.status, golden.output)
        run = store.get_run(RUN_ID)
        assert (run.status.value, run.output) == (golden.status, golden.output)
        assert {n.label: n.status.value for n in store.nodes(RUN_ID)} == golden.nodes
        # ... and every node ran to completion as often as there (a restored step is not run again)
        differ = differing_counts(completion_counts(store, RUN_ID), golden.executions)
        assert not differ, f"{point}:{label}: nodes completed other than as in the golden run (here, golden): {differ}"

        # invariant 2: one effective call per key, under the golden keys only
        effects = store.effects(RUN_ID)
        assert {e.idempotency_key for e in effects} == set(golden.keys.values())
        assert {e.status for e in effects} == {EffectStatus.COMMITTED}
        log = services.log()
        assert log["effective"] == dict.fromkeys(golden.keys.values(), 1), log
        assert set(log["raw"]) == set(golden.keys.values()), "a call carried a key the golden run never used"
        assert log["by_subject"] == golden.by_subject
        repeated = {key for key, n in log["raw"].items() if n > 1}
        if point == "before_commit":
            # the call had returned: the resume re-issued it, under the same key
            assert log["raw"][golden.keys[label]] == 2, log["raw"]
        if executor == "inline":
            assert repeated == (uncertain if point == "before_commit" else set()), (repeated, uncertain)
            assert max(log["raw"].values()) <= 2
        else:
            assert repeated <= uncertain, (repeated, uncertain)


def check_state_at_kill(point: str, label: str, snap: Any, log: dict[str, Any], golden: Golden) -> None:
    """The crash point meant what it says: what is durable, and what the provider saw, at the kill."""
    nodes = {n.label: n.status for n in snap.nodes}
    ledger = {ledger_label(e): e.status for e in snap.effects}
    key = golden.keys.get(label)
    if point == "after_commit":
        assert nodes.get(label) == NodeStatus.COMPLETED
    elif point == "before_commit":
        assert nodes.get(label) != NodeStatus.COMPLETED and ledger.get(label) == EffectStatus.PENDING
        assert log["raw"].get(key) == 1, "before_commit: the call should have returned"
    elif point == "after_pending":
        assert ledger.get(label) == EffectStatus.PENDING
        assert key not in log["raw"], "after_pending: the call must not have been made yet"
    elif point == "before_pending":
        assert label not in ledger and key not in log["raw"]
    elif point == "before_transition":
        assert snap.run.status == RunStatus.RUNNING and set(nodes.values()) == {NodeStatus.COMPLETED}


# ---------------------------------------------------------------------- the sweeps


@pytest.mark.parametrize(("flow", "point", "label"), sweep_params(INLINE_CASES, INLINE_CI_CASES, "CI: INLINE_CI_CASES"))
def test_kill_sweep_inline(flow: str, point: str, label: str, services: Any, goldens: dict[Any, Golden],
                           tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    golden = golden_run(flow, "inline", services, goldens, tmp_path_factory)
    sweep_case(flow, point, label, "inline", golden, services, tmp_path)


@pytest.mark.parametrize(("flow", "point", "label"), sweep_params(PG_CASES, PG_CI_CASES, "CI: PG_CI_CASES"))
def test_kill_sweep_inline_on_postgresql(flow: str, point: str, label: str, services: Any,
                                         goldens: dict[Any, Golden], pg_base_url: str,
                                         tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """The order flow's every crash point with the store on PostgreSQL (a database per case): the
    golden run is the SQLite one, since outputs and keys do not depend on the store."""
    golden = golden_run(flow, "inline", services, goldens, tmp_path_factory)
    url = make_pg_database(pg_base_url, migrated=True)  # an empty store, as copy_template gives SQLite's
    try:
        sweep_case(flow, point, label, "inline", golden, services, tmp_path, db=url)
    finally:
        drop_pg_database(pg_base_url, url)


@pytest.mark.parametrize(("flow", "point", "label"), PG_CI_CASES, ids=case_ids(PG_CI_CASES))
def test_kill_sweep_pg_ci_cases_on_sqlite_without_postgresql(flow: str, point: str, label: str,
                                                           request: pytest.FixtureRequest, services: Any,
                                                           goldens: dict[Any, Golden],
                                                           tmp_path_factory: pytest.TempPathFactory,
                                                           tmp_path: Path) -> None:
    """``PG_CI_CASES`` on SQLite when no PostgreSQL answers (the PostgreSQL test is skipped then):
    CI runs every point of ``order`` on one store or the other, with or without a server."""
    if postgresql_answers(request):
        pytest.skip("PostgreSQL answers: test_kill_sweep_inline_on_postgresql runs these cases")
    golden = golden_run(flow, "inline", services, goldens, tmp_path_factory)
    sweep_case(flow, point, label, "inline", golden, services, tmp_path)


def postgresql_answers(request: pytest.FixtureRequest) -> bool:
    """Whether the ``pg_base_url`` fixture gives a server (it skips its tests when none answers)."""
    try:
        request.getfixturevalue("pg_base_url")
    except pytest.skip.Exception:
        return False
    return True


@pytest.mark.ray
@pytest.mark.parametrize(("flow", "point", "label"), RAY_CI_CASES, ids=case_ids(RAY_CI_CASES))
def test_kill_sweep_ray(flow: str, point: str, label: str, ray_address: str, services: Any,
                        goldens: dict[Any, Golden], tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    golden = golden_run(flow, "ray", services, goldens, tmp_path_factory)
    sweep_case(flow, point, label, "ray", golden, services, tmp_path)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not FULL_SWEEP, reason="the full Ray sweep runs with RAYSAGA_FULL_SWEEP=1")
@pytest.mark.parametrize(("flow", "point", "label"), RAY_FULL_CASES, ids=case_ids(RAY_FULL_CASES))
def test_kill_sweep_ray_full(flow: str, point: str, label: str, ray_address: str, services: Any,
                             goldens: dict[Any, Golden], tmp_path_factory: pytest.TempPathFactory,
                             tmp_path: Path) -> None:
    golden = golden_run(flow, "ray", services, goldens, tmp_path_factory)
    sweep_case(flow, point, label, "ray", golden, services, tmp_path)


@pytest.mark.ray
def test_golden_runs_agree_across_executors(ray_address: str, services: Any, goldens: dict[Any, Golden],
                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    """An inline run and a Ray run of the same run id and input: same output, same keys."""
    inline = golden_run("order", "inline", services, goldens, tmp_path_factory)
    ray = golden_run("order", "ray", services, goldens, tmp_path_factory)
    assert (ray.output, ray.nodes, ray.keys) == (inline.output, inline.nodes, inline.keys)


# ---------------------------------------------------------------------- the demo the README runs


def test_order_demo_runs(tmp_path: Path) -> None:
    """``python -m examples.order.workflow`` (inline here: the Ray path is the sweep's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RAYSAGA_FAULTS", "RAYSAGA_DB")}
    done = subprocess.run([sys.executable, "-m", "examples.order.workflow", "--executor", "inline",
                           "--db", f"sqlite:///{tmp_path / 'demo.db'}", "--run-id", "demo-1"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run demo-1: completed" in done.stdout
    assert done.stdout.count("raw=1 effective=1") == 2, done.stdout

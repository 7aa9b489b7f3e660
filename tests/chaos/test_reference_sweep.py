"""Every fault point x every node of reference DAGs the crash sweeps of ``tests/crash`` do not cover.

``tests/crash`` already kills at every point of ``order`` (a chain of effects), ``wide`` (an
effect fan-out), ``trip`` (a linear rollback), and of agent, approval and fork runs. The DAGs
here add what those lack, built from specs like the random ones (``tests.support.chaos_flows``):

- ``ref_rollback``: a fan-out of compensated effect items, a compensated step that is not an
  effect, a flaky effect (its retry is a commit of its own), a non-critical failure whose
  dependents are skipped, and a critical failure at the end: the run rolls back, compensating
  fan-out items and steps in reverse order, cancelling nothing.
- ``ref_partial``: fan-outs under ``quorum`` and ``best_effort`` with failing items, a
  non-critical step failing with ``on_failure="pass"`` (its dependent effect receives the
  failure record, so the record is part of the effect's key), a plain step digesting both partial
  results, and a clean end (``completed``). (An effect never takes a partial result directly:
  see ``tests.support.chaos_gen``.)

Per DAG a golden run, then per fault point one test that faults a driver (SIGKILL) at that point
of every node the golden run passes it at, and resumes the run: each must end as the golden
run (``tests.support.chaos_sweep.check``). CI takes one label per point (the middle one of
those the run passes it at, in label order) and each point on one DAG (``CI_CASES``, the DAGs
taking turns); ``RAYSAGA_FULL_SWEEP=1`` takes them all, on both DAGs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.chaos_sweep import Golden, fault_case, golden_run
from tests.support.kill_sweep import FULL_SWEEP, sweep_params
from tests.support.services import FakeServices

POINTS = ("before_pending", "after_pending", "before_commit", "after_commit", "before_transition")


def _s(name: str, deps: list[str], **kw: Any) -> dict[str, Any]:
    return {"name": name, "kind": "step", "deps": deps, **kw}


REFERENCE: dict[str, dict[str, Any]] = {
    "ref_rollback": {"name": "ref_rollback", "steps": [
        _s("a", [], effect=True, compensate=True),
        {"name": "plan", "kind": "plan", "deps": ["a"], "items": 3},
        {"name": "work", "kind": "map", "over": "plan", "deps": ["plan"], "effect": True, "compensate": True,
         "fail_items": [], "policy": {"kind": "all"}},
        _s("stamp", ["a"], compensate=True),
        _s("flaky", ["stamp"], effect=True, fate="flaky"),
        _s("side", ["a"], fate="fail", critical=False, on_failure="skip"),
        _s("after_side", ["side"], effect=True),
        _s("merge", ["work", "flaky"]),
        _s("boom", ["merge"], effect=True, fate="fail"),
    ]},
    "ref_partial": {"name": "ref_partial", "steps": [
        {"name": "plan", "kind": "plan", "deps": [], "items": 4},
        {"name": "q", "kind": "map", "over": "plan", "deps": ["plan"], "effect": True, "fail_items": [1],
         "policy": {"kind": "quorum", "k": 3}},
        {"name": "be", "kind": "map", "over": "plan", "deps": ["plan"], "fail_items": [0, 3],
         "policy": {"kind": "best_effort"}},
        _s("enrich", ["plan"], fate="fail", critical=False, on_failure="pass"),
        _s("tally", ["q", "be"]),
        _s("use", ["enrich", "tally"], effect=True, compensate=True),
        _s("report", ["tally", "use"], effect=True),
    ]},
}
GOLDEN_STATUS = {"ref_rollback": "compensated", "ref_partial": "completed"}
WORK_ITEMS = ("work[0]", "work[1]", "work[2]")
CASES = [(dag, point) for dag in REFERENCE for point in POINTS]
#: CI's cases: each point once, the two DAGs taking turns (both DAGs at every point with
#: ``RAYSAGA_FULL_SWEEP=1``).
CI_CASES = [(list(REFERENCE)[i % len(REFERENCE)], point) for i, point in enumerate(POINTS)]


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        yield fake


@pytest.fixture(scope="module")
def goldens(services: FakeServices, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Golden]:
    runs = {dag: golden_run(spec, tmp_path_factory.mktemp(f"golden-{dag}"), services)
            for dag, spec in REFERENCE.items()}
    for dag, golden in runs.items():
        assert golden.run["status"] == GOLDEN_STATUS[dag], (dag, golden.run)
    rollback = runs["ref_rollback"]
    assert rollback.nodes["side"] == "failed" and rollback.nodes["after_side"] == "skipped"
    assert set(rollback.undo_order) == {"a:compensate", "stamp:compensate",
                                        *(f"work:compensate[{i}]" for i in range(3))}
    # the reverse of the completions: each compensated before anything it depends on
    compensated = [label for label in reversed(rollback.completions) if label in ("a", "stamp", *WORK_ITEMS)]
    assert rollback.undo_order == [f"{c.partition('[')[0]}:compensate" + (f"[{c.partition('[')[2]}" if "[" in c else "")
                                   for c in compensated], rollback.undo_order
    assert rollback.undo_order[-1] == "a:compensate", rollback.undo_order
    partial = runs["ref_partial"]
    assert partial.nodes["q[1]"] == "failed" and partial.nodes["q"] == "completed", partial.nodes
    assert partial.nodes["enrich"] == "failed" and partial.nodes["use"] == "completed", partial.nodes
    return runs


def test_the_sweep_covers_what_it_claims(goldens: dict[str, Golden]) -> None:
    for dag, golden in goldens.items():
        points = {point for point, _ in golden.reachable}
        assert points == set(POINTS), (dag, points)
    assert len(goldens["ref_rollback"].reachable) >= 40 and len(goldens["ref_partial"].reachable) >= 40


@pytest.mark.parametrize(("dag", "point"),
                         sweep_params(CASES, CI_CASES, "CI: CI_CASES", ids=[f"{d}-{p}" for d, p in CASES]))
def test_every_node_at_this_point(dag: str, point: str, goldens: dict[str, Golden], services: FakeServices,
                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    golden = goldens[dag]
    labels = [label for p, label in golden.reachable if p == point]
    if not FULL_SWEEP:
        labels = [labels[len(labels) // 2]]
    for label in labels:
        fault_case(golden, (point, label), "kill", services, tmp_path_factory.mktemp(f"{dag}-{point}"))

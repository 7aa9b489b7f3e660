"""The saga examples do what their READMEs say.

- ``examples/trip``: flight → charge → hotel (sold out) ends ``compensated``; the provider saw
  flight, charge, hotel (refused), refund, cancel_flight, in that order, each undo under its
  action's key + ``:compensate`` and given the action's output; nothing was cancelled that
  never took effect (no cancel_hotel).
- ``examples/research``: 5 researchers, 1 fails, ``quorum(4)`` continues with 4 (the
  ``fanout_decision`` event says so), the writer merges a ``FanOutResult``; with the editor
  rejecting the draft, the 4 filed reports are withdrawn in reverse and the failed one is not.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from examples.research import workflow as research
from examples.trip import workflow as trip
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from tests.support import REPO
from tests.support.services import FakeServices


@pytest.fixture
def store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'examples.db'}"


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    s = SqlStore(store_url)
    yield s
    s.close()


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("RAYSAGA_FAULTS", "RAYSAGA_DB")}


# ---------------------------------------------------------------------- trip


def test_trip_rolls_back_in_reverse(store_url: str, store: SqlStore) -> None:
    with trip.TripServices() as services:
        record = trip.saga.run(trip.sample_input(services.url, trip_id="t-1"), store=store_url, run_id="t-1")
        log = services.log()
    assert record.status == RunStatus.COMPENSATED
    assert "book_hotel" in (record.status_reason or "") and "no rooms" in (record.status_reason or "")

    calls = log["calls"]
    assert [c["kind"] for c in calls] == ["flight", "charge", "hotel", "refund", "cancel_flight"]
    assert [bool(c.get("refused")) for c in calls] == [False, False, True, False, False]
    flight, charge, hotel, refund, cancel = (c["key"] for c in calls)
    assert refund == charge + ":compensate" and cancel == flight + ":compensate"
    assert log["effective"] == {flight: 1, charge: 1, refund: 1, cancel: 1}  # the refused hotel took no effect
    assert log["raw"][hotel] == 1  # a refusal is permanent: not retried

    nodes = {n.label: n for n in store.nodes("t-1")}
    assert {k: n.status for k, n in nodes.items()} == {
        "book_flight": NodeStatus.COMPLETED, "charge_card": NodeStatus.COMPLETED, "book_hotel": NodeStatus.FAILED,
        "charge_card:compensate": NodeStatus.COMPLETED, "book_flight:compensate": NodeStatus.COMPLETED}
    # each undo was handed its action's committed output
    assert nodes["charge_card:compensate"].output["of"] == nodes["charge_card"].output["charge_id"]
    assert nodes["book_flight:compensate"].output["of"] == nodes["book_flight"].output["booking_id"]
    assert all(n.output["undone"] for k, n in nodes.items() if k.endswith(":compensate"))
    assert {e.status for e in store.effects("t-1") if e.node_id.endswith(":compensate")} == {EffectStatus.COMMITTED}
    kinds = [e.kind for e in store.events("t-1")]
    assert kinds.index("run_compensating") < kinds.index("run_compensated")
    assert kinds.index("rollback_started") < kinds.index("run_compensated")


def test_trip_demo_prints_status_and_ordered_calls(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert trip.main(["--db", store_url, "--run-id", "trip-demo"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("run trip-demo: compensated")
    lines = [line.split() for line in out.splitlines() if line.startswith("  ")]
    assert [parts[1] for parts in lines] == ["flight", "charge", "hotel", "refund", "cancel_flight"]
    assert "refused (409: no rooms)" in out and out.count(" ok") == 4


@pytest.mark.ray
def test_trip_demo_on_ray(ray_address: str, tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "examples.trip.workflow", "--executor", "ray",
                           "--db", f"sqlite:///{tmp_path / 'ray.db'}", "--run-id", "trip-ray"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run trip-ray: compensated" in done.stdout
    kinds = [line.split()[1] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert kinds == ["flight", "charge", "hotel", "refund", "cancel_flight"], done.stdout


# ---------------------------------------------------------------------- research


def _research(store_url: str, services: Any, run_id: str, *, reject: bool = False) -> raysaga.RunRecord:
    return raysaga.run(research.wf, research.sample_input(services.url, reject=reject), store=store_url,
                       run_id=run_id, executor="inline")


def test_research_quorum_continues_with_four(store_url: str, store: SqlStore) -> None:
    with FakeServices() as services:
        record = _research(store_url, services, "r-1")
        log = services.log()
    assert record.status == RunStatus.COMPLETED, record.status_reason

    items = {n.fan_index: n for n in store.nodes("r-1") if n.node_id == "researcher" and n.fan_index >= 0}
    assert sorted(items) == [0, 1, 2, 3, 4]
    failed = [i for i, n in items.items() if n.status == NodeStatus.FAILED]
    assert failed == [research.ANGLES.index("archives")]
    assert sum(n.status == NodeStatus.COMPLETED for n in items.values()) == 4
    assert items[failed[0]].attempt == 1  # a permanent failure is not retried

    decisions = [e for e in store.events("r-1") if e.kind == "fanout_decision"]
    assert len(decisions) == 1
    assert decisions[0].node_id == "researcher"
    assert decisions[0].data["verdict"] == "continue"
    assert decisions[0].data["successes"] == 4 and decisions[0].data["failures"] == failed
    assert decisions[0].data["policy"]["kind"] == "quorum" and decisions[0].data["policy"]["quorum"] == 4

    article = research.Article.model_validate(record.output["editor"]["article"])
    writer = next(n for n in store.nodes("r-1") if n.node_id == "writer")
    assert writer.output == article.model_dump()
    assert len(article.sections) == 4 and article.coverage == 0.8
    assert article.gaps == ["archives: no reachable sources for the archives angle"]
    # the merged report ids are exactly the 4 the provider issued, in index order
    reports = [c for c in log["calls"] if c["kind"] == "report"]
    assert len(reports) == 4 and all(log["effective"][c["key"]] == 1 for c in reports)
    ids = [items[i].output["report_id"] for i in sorted(items) if i not in failed]
    assert article.report_ids == ids
    assert not [c for c in log["calls"] if c["kind"] != "report"], "nothing to withdraw on success"


def test_research_rejected_draft_withdraws_the_four_reports(store_url: str, store: SqlStore) -> None:
    with FakeServices() as services:
        record = _research(store_url, services, "r-2", reject=True)
        log = services.log()
    assert record.status == RunStatus.COMPENSATED, record.status_reason
    filed = [c["key"] for c in log["calls"] if c["kind"] == "report"]
    withdrawn = [c["key"] for c in log["calls"] if c["kind"] == "withdraw_report"]
    assert len(filed) == 4
    assert withdrawn == [key + ":compensate" for key in reversed(filed)]  # inline: reverse of filing
    assert all(log["effective"][k] == 1 for k in withdrawn)
    comp = {n.fan_index for n in store.nodes("r-2") if n.node_id == "researcher:compensate"}
    assert comp == {0, 1, 2, 4}  # the failed researcher filed nothing: nothing to withdraw


def test_research_demo_main(store_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert research.main(["--db", store_url, "--run-id", "research-demo"]) == 0
    out = capsys.readouterr().out
    assert "run research-demo: completed" in out
    assert "fan-out decision: continue (quorum met: 4 of 5 succeeded, 4 needed); failed items: [3]" in out
    assert out.count(" report ") == 4 and '"coverage": 0.8' in out


@pytest.mark.ray
def test_research_demo_on_ray(ray_address: str, tmp_path: Path) -> None:
    """The researchers run as parallel Ray tasks; the outcome is the same."""
    done = subprocess.run([sys.executable, "-m", "examples.research.workflow", "--executor", "ray",
                           "--db", f"sqlite:///{tmp_path / 'ray.db'}", "--run-id", "research-ray"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "run research-ray: completed" in done.stdout
    assert "fan-out decision: continue" in done.stdout and "failed items: [3]" in done.stdout

"""``status --errors`` and ``status --json --summary`` say when they leave failed nodes out (stop 47):
a run with 3,000 failed items showed 50 under ``--errors`` and listed 1,000 ``failures``, with
nothing saying more existed (docs/cli.md: "--errors: the same for every failed node")."""

from __future__ import annotations

import json
from typing import Any

import raysaga
from raysaga import BEST_EFFORT, RetryPolicy, Workflow
from raysaga.orchestrator import cli_status
from raysaga.state import SqlStore
from tests.support.cli import invoke

wf = Workflow("failures_bounded_stop47")


@wf.step()
def plan(input: int) -> list[int]:
    return list(range(input))


@wf.step(map_over="plan", policy=BEST_EFFORT, critical=False, retry=RetryPolicy(max_attempts=1))
def item(plan: int) -> int:
    raise ValueError(f"item {plan} is refused")


def _run(url: str, failed: int) -> str:
    store = SqlStore(url)
    try:
        return raysaga.run(wf, failed, store=store, executor="inline").run_id
    finally:
        store.close()


def test_errors_says_how_many_failed_nodes_it_leaves_out(sqlite_url: str) -> None:
    run_id = _run(sqlite_url, 60)
    code, out, err = invoke("status", run_id, "--db", sqlite_url, "--errors")
    assert code == 0, err
    assert out.count(": failed") == 50
    assert "10 more failed node(s) not shown (the first 50 are)" in " ".join(out.split()), out[-600:]
    code, out, err = invoke("status", run_id, "--db", sqlite_url, "--errors", "--json")
    assert code == 0 and len(out.strip().splitlines()) == 50
    assert "10 more failed node(s) not shown" in " ".join(err.split()), err
    few = _run(sqlite_url, 3)
    code, out, err = invoke("status", few, "--db", sqlite_url, "--errors")
    assert code == 0 and "not shown" not in out and out.count(": failed") == 3


def test_the_summarys_failures_say_how_many_are_left_out(sqlite_url: str, monkeypatch: Any) -> None:
    monkeypatch.setattr(cli_status, "SUMMARY_FAILURES", 7)  # (the bound, 1,000, made small)
    run_id = _run(sqlite_url, 12)
    code, out, err = invoke("status", run_id, "--db", sqlite_url, "--json", "--summary")
    assert code == 0, err
    doc = json.loads(out)
    assert len(doc["failures"]) == 7 and doc["failures_left_out"] == 5, doc.get("failures_left_out")
    assert doc["node_counts"]["failed"] == 12

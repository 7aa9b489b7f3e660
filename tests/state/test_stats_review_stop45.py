"""The p50/p95 of ``raysaga stats`` are nearest-rank (the ``ceil(q*n)``-th smallest value):
``int(q*n)`` made the p50 of two waits the longer one, and the p95 of up to 20 values the largest."""

from __future__ import annotations

from pathlib import Path

import raysaga
from raysaga import Ask, Workflow
from raysaga.state import RunStatus, SqlStore
from raysaga.state.stats import compute

wf = Workflow("stop45_stats")


@wf.approval(approvers=["ann"])
def review(input: int) -> Ask:
    return Ask(prompt=f"ship {input}?")


def test_the_median_wait_of_two_runs_is_the_shorter_one(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'stats.db'}")
    try:
        runs = [raysaga.run(wf, i, store=store, executor="inline") for i in (1, 2)]
        assert {r.status for r in runs} == {RunStatus.WAITING_HUMAN}
        since = sorted(e.at for r in runs for e in store.events(r.run_id) if e.kind == "run_waiting_human")
        now = since[-1] + 10.0
        waits = sorted(now - at for at in since)  # still waiting: counted up to now
        stats = compute(store.engine, now=now)
        assert stats.waiting_human_seconds.count == 2
        assert stats.waiting_human_seconds.p50 == round(waits[0], 4)  # the first of two, not the larger
        assert stats.waiting_human_seconds.p95 == round(waits[1], 4)
    finally:
        store.close()


def test_the_p95_of_twenty_values_is_the_nineteenth(tmp_path: Path) -> None:
    """Twenty runs waiting: nearest rank puts p50 at the 10th shortest wait, p95 at the 19th (not the longest)."""
    store = SqlStore(f"sqlite:///{tmp_path / 'twenty.db'}")
    try:
        runs = [raysaga.run(wf, i, store=store, executor="inline") for i in range(20)]
        since = sorted(e.at for r in runs for e in store.events(r.run_id) if e.kind == "run_waiting_human")
        now = since[-1] + 1.0
        waits = sorted(now - at for at in since)
        stats = compute(store.engine, now=now).waiting_human_seconds
        assert (stats.count, stats.p50, stats.p95) == (20, round(waits[9], 4), round(waits[18], 4))
    finally:
        store.close()

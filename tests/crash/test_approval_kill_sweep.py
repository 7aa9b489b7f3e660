"""A kill at every point around a human decision loses nothing and repeats nothing.

The ``approval`` flow (``ready → review (approval, alice) → pay (effect)``) is driven by real
driver processes: the first rests ``waiting_human``; alice approves from the test process; the
next driver is SIGKILLed at a crash point (committing the decision's outcome, around the effect
it lets run, at the run's last transition); the last one resumes once the dead driver's lease
has expired. Each case must end completed with the decision recorded once and consumed, the
approval's output naming alice, and the effect taken once at the deduping provider. CI runs
``CI_KILLS``; ``RAYSAGA_FULL_SWEEP=1`` every point (``KILLS``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raysaga.state import NodeStatus, RunStatus, SqlStore
from tests.support import crash_driver
from tests.support.kill_sweep import EFFECT_POINTS, LEASE_TTL, kill_and_resume, sweep_params
from tests.support.services import FakeServices, get_log

FLOWS = "tests.support.fleet_flows"
RUN_ID = "appr-kill"
KILLS = [("before_commit", "review"), ("after_commit", "review"),
         *((point, "pay") for point in EFFECT_POINTS), ("before_transition", "*")]
#: CI's cases: the decision's outcome lost and durable at the kill, the effect it lets run killed
#: with its call returned, the last transition. The effect's other points (``before_pending``,
#: ``after_pending``, ``after_commit`` of ``pay``) run with ``RAYSAGA_FULL_SWEEP=1`` since
#: 2026-11-29: CI kills at each of them in ``test_kill_sweep.py``'s order flow, and after a
#: decision here at ``before_commit:pay`` and the last transition.
CI_KILLS = [("before_commit", "review"), ("after_commit", "review"), ("before_commit", "pay"),
            ("before_transition", "*")]


@pytest.fixture
def services() -> Iterator[FakeServices]:
    with FakeServices() as svc:
        yield svc


@pytest.mark.parametrize(("point", "label"), sweep_params(KILLS, CI_KILLS, "CI: CI_KILLS"))
def test_kill_around_a_decision(point: str, label: str, sqlite_url: str, tmp_path: Path,
                                services: FakeServices) -> None:
    run_input = {"n": 5, "services": services.url, "trace": str(tmp_path / "trace")}
    first = crash_driver.run_driver("approval", sqlite_url, RUN_ID, flows=FLOWS, run_input=run_input,
                                    any_state_ok=True, lease_ttl=LEASE_TTL["inline"])
    assert first.returncode == 0 and first.result is not None, first.describe()
    assert first.result["status"] == "waiting_human"
    store = SqlStore(sqlite_url)
    try:
        store.decide(RUN_ID, "review", "approve", by="alice", comment="ok")
    finally:
        store.close()

    def start(faults: str | None, resume: bool, go_file: Path | None) -> Any:
        return crash_driver.spawn("approval", sqlite_url, RUN_ID, faults=faults, resume=True, go_file=go_file,
                                  flows=FLOWS, run_input=run_input, lease_ttl=LEASE_TTL["inline"])

    def at_kill(kill: Any, snap: Any) -> None:
        assert snap.run.status in (RunStatus.RUNNING, RunStatus.COMPLETED)

    with kill_and_resume(start, sqlite_url, RUN_ID, [(point, label)], tmp_path, at_kill=at_kill,
                         resting=(RunStatus.RUNNING, RunStatus.COMPLETED)) as (resumed, store):
        assert resumed.result is not None and resumed.result["status"] == "completed", resumed.describe()
        review = next(n for n in store.nodes(RUN_ID) if n.node_id == "review")
        assert review.status == NodeStatus.COMPLETED and review.output["by"] == ["alice"]
        assert store.pending_signals(RUN_ID) == []
        assert [e.data["by"] for e in store.events(RUN_ID) if e.kind == "decision"] == ["alice"]
    log = get_log(services.url)
    assert log["by_subject"] == {"charge:pay-5": 1} and set(log["effective"].values()) == {1}

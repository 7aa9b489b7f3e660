"""``on_progress``'s ``failed`` after a fan-out's failed items were retried and succeeded (stop 51).

Every failed attempt of a partial fan-out's item counted one more failed node, and a retry round
took none back: a run that ended ``completed`` with all 10 items completed said ``failed 8`` in its
last progress. An item retried by its policy is failed no more.

Real inline runs on a real SQLite file (``store_url``: SQLite and PostgreSQL).
"""

from __future__ import annotations

import uuid

import raysaga
from raysaga import Continue, FanOutResult, Permanent, RetryFailed, Workflow, on_partial_failure
from raysaga.orchestrator.progress import Progress
from raysaga.state import RunStatus


def _flaky(calls: dict[int, int], ok_on: int) -> Workflow:
    wf = Workflow(f"progress_stop51_{uuid.uuid4().hex[:6]}")

    @wf.step()
    def plan(input: int) -> list[int]:
        return list(range(input))

    @wf.step(map_over="plan", policy=on_partial_failure(lambda r: RetryFailed() if r.round < 3 else Continue()))
    def item(plan: int) -> int:
        calls[plan] = calls.get(plan, 0) + 1
        if plan < 4 and calls[plan] < ok_on:
            raise Permanent("not yet")
        return plan

    @wf.step()
    def gather(item: FanOutResult) -> int:
        return len(item.successes)

    del gather
    return wf


def test_items_retried_into_success_are_not_counted_failed(store_url: str) -> None:
    seen: list[Progress] = []
    run = raysaga.run(_flaky({}, ok_on=3), 10, store=store_url, executor="inline", on_progress=seen.append)
    assert run.status == RunStatus.COMPLETED and run.output == {"gather": 10}, run.output
    assert (seen[-1].done, seen[-1].total, seen[-1].failed) == (3, 3, 0)


def test_items_still_failed_after_the_last_round_are_counted(store_url: str) -> None:
    seen: list[Progress] = []
    run = raysaga.run(_flaky({}, ok_on=99), 10, store=store_url, executor="inline", on_progress=seen.append)
    assert run.status == RunStatus.COMPLETED and run.output == {"gather": 6}, run.output
    assert seen[-1].failed == 4

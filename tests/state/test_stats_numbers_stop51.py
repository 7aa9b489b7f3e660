"""Figures of ``raysaga stats`` and ``/metrics`` the stop-51 review found wrong, each checked on
runs driven for real (inline executor) on a SQLite file and, when configured, on PostgreSQL:

- ``/metrics`` declared ``raysaga_retries_total``, ``raysaga_resumes_total`` and
  ``raysaga_events_total`` counters, yet they count rows of the store, which ``raysaga prune``
  deletes: they went down, which Prometheus reads as a counter reset (``rate()`` then counted the
  pruned runs' retries again). Every figure is a gauge now.
- an operator's ``retry`` counted as a resume: its own driver's claim, after the retry's claim,
  was taken for a driver taking the run up again.
- one approval counted as a wait per park of its run (a driver handing it back and another
  taking it up ended the wait and began another), each shorter than the human's real wait.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import pytest

import raysaga
from raysaga import Approval, RetryPolicy, RunOptions, StepContext, Transient, Workflow
from raysaga.orchestrator.dashboard import metrics
from raysaga.state import EventRecord, RunStatus, SqlStore
from raysaga.state.pruning import prune
from raysaga.state.stats import compute

flaky_wf = Workflow("stop51_stats_flaky")


@flaky_wf.step(retry=RetryPolicy(max_attempts=3, base=0.001, cap=0.001))
def flaky(ctx: StepContext, input: int) -> int:
    raise Transient(f"attempt {ctx.attempt} fails")


ask_wf = Workflow("stop51_stats_ask")


@ask_wf.step()
def prep(input: int) -> int:
    return input


@ask_wf.approval(after=["prep"])
def ok(prep: int) -> str:
    return f"ship {prep}?"


@ask_wf.step()
def after(ok: Approval) -> int:
    return 1


two_wf = Workflow("stop51_stats_two")


@two_wf.approval(approvers=["ann", "bob"], quorum=2)
def both(input: int) -> str:
    return f"ship {input}? (two of you)"


timed_wf = Workflow("stop51_stats_timed")


@timed_wf.approval(timeout=3600.0, on_timeout="reject")
def timed(input: int) -> str:
    return f"ship {input} within the hour?"


PARK = RunOptions(release_after=0)  # a driver waiting for a human hands the run back at once


@pytest.fixture
def store(own_store_url: str) -> Iterator[SqlStore]:
    """A store of its own: the prune below must not reach another test's runs."""
    s = SqlStore(own_store_url)
    yield s
    s.close()


def _events(store: SqlStore, run_id: str, kind: str) -> list[EventRecord]:
    return [e for e in store.events(run_id) if e.kind == kind]


def _exposition(text: str) -> tuple[dict[str, str], dict[str, float]]:
    """The families' types and the samples (name with labels -> value) of a Prometheus text."""
    types = dict(re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M))
    samples = {m[1]: float(m[2]) for m in re.finditer(r"^([^#\s]\S*) (\S+)$", text, re.M)}
    return types, samples


def _family(sample: str, types: dict[str, str]) -> str:
    name = sample.split("{", 1)[0]
    return next((f for f in types if name in (f, f"{f}_count", f"{f}_sum", f"{f}_total")), name)


def test_no_counter_of_metrics_goes_down_when_runs_are_pruned(store: SqlStore) -> None:
    failed = raysaga.run(flaky_wf, 1, store=store, executor="inline")
    assert failed.status == RunStatus.FAILED and _events(store, failed.run_id, "retry_scheduled")
    asked = raysaga.run(ask_wf, 1, store=store, executor="inline", options=PARK)
    store.decide(asked.run_id, "ok", "approve", by="alice")
    assert raysaga.resume(ask_wf, asked.run_id, store=store, executor="inline").status == RunStatus.COMPLETED
    types, before = _exposition(metrics.render(store))
    prune(store, 1.0, ["failed"], now=time.time() + 60.0)  # the failed run only, as if a minute passed
    assert [r.run_id for r in store.list_runs()] == [asked.run_id]
    after_types, after = _exposition(metrics.render(store))
    assert after_types == types
    lowered = {s: (before[s], after.get(s)) for s in before if after.get(s, 0.0) < before[s]}
    assert lowered, "the prune deleted a failed run's retries: some figure must go down"
    # a counter (or a summary's _count) that goes down is read as a reset: only gauges may
    assert {s: types.get(_family(s, types)) for s in lowered} == {s: "gauge" for s in lowered}, lowered
    assert set(types.values()) == {"gauge"}  # each figure counts rows a prune deletes


def test_an_operators_retry_is_no_resume(store: SqlStore) -> None:
    first = raysaga.run(flaky_wf, 2, store=store, executor="inline")
    assert first.status == RunStatus.FAILED
    retried = raysaga.retry(flaky_wf, first.run_id, store=store, executor="inline")
    assert retried.status == RunStatus.FAILED
    claims = _events(store, first.run_id, "lease_claimed")
    reopened = [e for e in _events(store, first.run_id, "run_running") if e.data.get("reason") == "operator retry"]
    # the run's driver, the retry's claim to reopen it, the retry's own driver: no crash, hand-back or wake-up
    assert len(claims) == 3 and len(reopened) == 1 and claims[1].seq < reopened[0].seq < claims[2].seq
    stats = compute(store.engine)
    assert (stats.resumes, stats.resumed_runs) == (0, 0)


def test_one_approval_is_one_wait_across_the_parks_of_its_run(store: SqlStore) -> None:
    run = raysaga.run(ask_wf, 3, store=store, executor="inline", options=PARK)
    assert run.status == RunStatus.WAITING_HUMAN
    again = raysaga.resume(ask_wf, run.run_id, store=store, executor="inline", options=PARK)
    assert again.status == RunStatus.WAITING_HUMAN  # taken up and handed back: still the same question
    store.decide(run.run_id, "ok", "approve", by="alice")
    done = raysaga.resume(ask_wf, run.run_id, store=store, executor="inline", options=PARK)
    assert done.status == RunStatus.COMPLETED
    assert len(_events(store, run.run_id, "run_waiting_human")) == 2
    (requested,), (decided,) = _events(store, run.run_id, "approval_requested"), _events(store, run.run_id, "decision")
    stats = compute(store.engine)
    assert stats.waiting_human_seconds.count == 1
    assert stats.waiting_human_seconds.p50 == round(decided.at - requested.at, 4)
    assert stats.resumes == 2  # the two resumes are resumes still (hand-backs taken up)


def test_a_quorum_wait_ends_at_the_approval_that_completes_it(store: SqlStore) -> None:
    run = raysaga.run(two_wf, 4, store=store, executor="inline", options=PARK)
    store.decide(run.run_id, "both", "approve", by="ann")
    parked = raysaga.resume(two_wf, run.run_id, store=store, executor="inline", options=PARK)
    assert parked.status == RunStatus.WAITING_HUMAN  # one of two: it waits on
    store.decide(run.run_id, "both", "approve", by="bob")
    assert raysaga.resume(two_wf, run.run_id, store=store, executor="inline").status == RunStatus.COMPLETED
    (requested,) = _events(store, run.run_id, "approval_requested")
    decisions = _events(store, run.run_id, "decision")
    assert [d.data["by"] for d in decisions] == ["ann", "bob"]
    stats = compute(store.engine).waiting_human_seconds
    assert (stats.count, stats.p50) == (1, round(decisions[-1].at - requested.at, 4))


def test_an_approval_nobody_decided_waits_until_its_timeout_not_until_now(store: SqlStore) -> None:
    run = raysaga.run(timed_wf, 5, store=store, executor="inline", options=PARK)
    assert run.status == RunStatus.WAITING_HUMAN
    (requested,) = _events(store, run.run_id, "approval_requested")
    timeout_at = requested.data["timeout_at"]
    assert isinstance(timeout_at, float)
    later = compute(store.engine, now=timeout_at + 7200.0)  # no driver came to time it out
    assert (later.waiting_human_seconds.count, later.waiting_human_seconds.p50) == (
        1, round(timeout_at - requested.at, 4))
    meanwhile = compute(store.engine, now=requested.at + 60.0)  # under way: up to now
    assert meanwhile.waiting_human_seconds.p50 == 60.0

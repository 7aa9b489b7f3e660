"""Stop 42, a review of the run views and traces. What was wrong:

- An operator's retry of a failed run started its attempts at 1 again, so the retried node's
  ``attempt``/``node`` spans and the ``run`` span were exported a second time with the ids of the
  failure's (one id, two spans). Now the retry is a new *drive epoch* folded into every id, under
  a new ``run`` span that is a child of the failure's.
- A ``wait`` span (an approval, a ``wf.sleep``) lasted 0 s: it ended at the row's start.
- A run cancelled with no driver (``raysaga cancel``, ``Client.cancel``) wrote no ``run`` span:
  the spans exported before pointed at a parent that never came (``tracing.for_commit``).
- Inline, a fan-out's ``node`` span had no length and sat after its items: the first item's
  start was taken only from running rows, which the inline executor never writes.
- ``raysaga stats`` counted an operator's cancel, pause or retry as a resume (its lease claim),
  and summed ``retries_used``, which an operator retry resets (a counter went down).
- ``status --dag`` (and the dashboard) drew a completed best-effort fan-out with failed items as
  failed, where its own row said completed.
- A running step with no row yet (the inline executor writes it when the step ends) was
  ``pending ... not started`` in ``status --workflow`` and ``--json`` but running in ``--dag``.
- A ``compensation_failed`` run's error printed as a Python dict dump; its reason said
  ``raysaga retry RUN`` instead of naming the run.
- ``status --json --workflow``: a step that never started had no ``inherited_from`` key.
- A waiting run's header said ``(14ms in all)``: updated minus created, not how long it has lived.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from rich.console import Console

import raysaga
from raysaga import BEST_EFFORT, Ask, Permanent, RetryPolicy, Transient, Workflow
from raysaga.orchestrator import cli_status, run_views, tracing
from raysaga.orchestrator.dag_svg import workflow_graph
from raysaga.sagas.plan import RollbackPlan
from raysaga.sagas.rollback import rollback_outcome
from raysaga.state import RunStatus, RunUpdate, SqlStore, open_store
from tests.support.spans import in_memory_spans

# ---------------------------------------------------------------- workflows

FLAGS = {"fail": False, "transient": False}

once = Workflow("once42", version="1")


@once.step()
def o1() -> int:
    return 1


@once.step(retry=RetryPolicy(max_attempts=1))
def o2(o1: int) -> int:
    if FLAGS["fail"]:
        raise Permanent("the flag is on")
    return 2


flaky = Workflow("flaky42", version="1")


@flaky.step(retry=RetryPolicy(max_attempts=3, base=0.001, cap=0.002))
def f3() -> int:
    if FLAGS["transient"]:
        raise Transient("still flaky")
    return 3


appr = Workflow("appr42", version="1")


@appr.step()
def prep(input: dict[str, Any]) -> dict[str, Any]:
    return {"amount": 5}


@appr.approval(approvers=["alice"])
def gate(prep: dict[str, Any]) -> Ask:
    return Ask(prompt="ok?", payload=prep)


@appr.step()
def act(gate: Any) -> str:
    return "done"


nap = Workflow("nap42", version="1")


@nap.step()
def n1() -> int:
    return 1


nap.sleep("zz", seconds=0.3, after="n1")


@nap.step(after=["zz"])
def n2(n1: int) -> int:
    return 2


fan = Workflow("fan42", version="1")


@fan.step()
def src(input: dict[str, Any]) -> list[int]:
    return list(range(int(input["n"])))


@fan.map("src", retry=RetryPolicy(max_attempts=1), policy=BEST_EFFORT)
def work(src: int) -> int:
    if src % 7 == 3:
        raise Permanent(f"bad item {src}")
    return src


@fan.step()
def fin(work: Any) -> int:
    return 1


#: What the in-flight step of ``inflight`` saw of itself, through each view, while it ran.
SEEN: dict[str, Any] = {}
inflight = Workflow("inflight42", version="1")


@inflight.step()
def first() -> int:
    return 1


@inflight.step()
def look(first: int, input: dict[str, Any]) -> int:
    store = open_store(input["db"], create=False)
    try:
        run = store.get_run(input["run_id"])
        out = io.StringIO()
        cli_status.print_status(Console(file=out, width=200), store, run, store_text="here", wf=inflight)
        SEEN["table"] = [line for line in out.getvalue().splitlines() if line.startswith("look ")]
        doc = io.StringIO()
        cli_status.stream_json(store, run, doc, wf=inflight)
        SEEN["json"] = [n["status"] for n in json.loads(doc.getvalue())["nodes"] if n["node"] == "look"]
        views = run_views.step_views(store, run.run_id, workflow_graph(inflight), running=True)
        SEEN["dag"] = [v.state for v in views if v.step == "look"]
    finally:
        store.close()
    return 2


# ---------------------------------------------------------------- helpers


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    with in_memory_spans() as exporter:
        yield exporter


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'raysaga.db'}"


def _spans(exporter: InMemorySpanExporter, run_id: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if (s.attributes or {}).get("raysaga.run.id") == run_id]


def _no_duplicate_and_no_orphan(spans: list[ReadableSpan]) -> dict[int, ReadableSpan]:
    ids = [s.context.span_id for s in spans]
    twice = sorted({(s.name, hex(s.context.span_id)) for s in spans if ids.count(s.context.span_id) > 1})
    assert not twice, f"span ids emitted twice: {twice}"
    index = {s.context.span_id: s for s in spans}
    orphans = [s.name for s in spans if s.parent is not None and s.parent.span_id not in index]
    assert not orphans, f"spans whose parent is nowhere: {orphans}"
    return index


def _named(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def _seconds(span: ReadableSpan) -> float:
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


# ---------------------------------------------------------------- 1. an operator's retry: new span ids


def test_an_operator_retry_writes_new_spans_under_a_run_span_of_its_own(
        exported: InMemorySpanExporter, db: str) -> None:
    FLAGS["fail"] = True
    try:
        assert raysaga.run(once, {}, store=db, run_id="rt", executor="inline").status == RunStatus.FAILED
    finally:
        FLAGS["fail"] = False
    assert raysaga.retry(once, "rt", store=db, executor="inline").status == RunStatus.COMPLETED
    spans = _spans(exported, "rt")
    index = _no_duplicate_and_no_orphan(spans)
    runs = _named(spans, "run once42")
    assert [(r.attributes or {}).get("raysaga.run.status") for r in runs] == ["failed", "completed"]
    failed, retried = runs
    assert failed.parent is None and retried.parent is not None
    assert retried.parent.span_id == failed.context.span_id, "the retry's run span hangs under the failure's"
    assert (retried.attributes or {}).get("raysaga.run.retry") == 1
    nodes = _named(spans, "node o2")
    assert [n.status.status_code.name for n in nodes] == ["ERROR", "UNSET"]
    assert [index[n.parent.span_id].name for n in nodes if n.parent] == ["run once42", "run once42"]
    assert nodes[1].parent is not None and nodes[1].parent.span_id == retried.context.span_id


def test_the_drive_epoch_counts_the_parks_before_and_starts_at_the_retry(db: str) -> None:
    FLAGS["fail"] = True
    try:
        raysaga.run(once, {}, store=db, run_id="ep", executor="inline")
    finally:
        FLAGS["fail"] = False
    store = open_store(db, create=False)
    try:
        assert tracing.drive_epoch(store.events("ep")) == (1, None)  # parked once: its next drive's, not begun
        raysaga.Client(db).retry("ep")
        epoch, since = tracing.drive_epoch(store.events("ep"))
        reopened = [e for e in store.events("ep") if e.kind == "run_running"][-1]
        assert (epoch, since) == (1, reopened.at)
    finally:
        store.close()


# ---------------------------------------------------------------- 2. waits last as long as they waited


def test_an_approval_s_wait_span_lasts_until_the_decision(exported: InMemorySpanExporter, db: str) -> None:
    raysaga.run(appr, {}, store=db, run_id="w", executor="inline")
    raysaga.Client(db).approve("w", "gate", by="alice")
    assert raysaga.resume(appr, "w", store=db, executor="inline").status == RunStatus.COMPLETED
    store = open_store(db, create=False)
    try:
        events = store.events("w")
    finally:
        store.close()
    asked = next(e.at for e in events if e.kind == "approval_requested")
    decided = next(e.at for e in events if e.kind == "decision")
    (wait,) = _named(_spans(exported, "w"), "wait gate")
    assert wait.start_time is not None and wait.end_time is not None
    assert wait.start_time <= int(asked * 1e9) + 1_000_000
    assert wait.end_time >= int(decided * 1e9), f"the wait ends {_seconds(wait):.6f}s in, before the decision"


def test_a_sleep_s_wait_span_lasts_the_sleep(exported: InMemorySpanExporter, db: str) -> None:
    assert raysaga.run(nap, {}, store=db, run_id="zz", executor="inline").status == RunStatus.COMPLETED
    (wait,) = _named(_spans(exported, "zz"), "wait zz")
    assert (wait.attributes or {}).get("raysaga.wait.kind") == "timer"
    assert _seconds(wait) >= 0.3


# ---------------------------------------------------------------- 3. a cancel without a driver


@pytest.mark.parametrize("through", ["raysaga.cancel", "Client.cancel"])
def test_a_cancel_without_a_driver_writes_the_run_span(exported: InMemorySpanExporter, db: str, through: str) -> None:
    raysaga.run(appr, {}, store=db, run_id="cx", executor="inline")
    if through == "raysaga.cancel":
        assert raysaga.cancel("cx", store=db, reason="no").status == RunStatus.CANCELLED
    else:
        with raysaga.Client(db) as client:
            assert client.cancel("cx", reason="no").status == RunStatus.CANCELLED
    spans = _spans(exported, "cx")
    _no_duplicate_and_no_orphan(spans)
    (run,) = _named(spans, "run appr42")
    assert (run.attributes or {}).get("raysaga.run.status") == "cancelled" and run.status.status_code.name == "ERROR"
    assert [(n.attributes or {}).get("raysaga.node.status") for n in _named(spans, "node gate")] == ["cancelled"]
    assert len(_named(spans, "wait gate")) == 1


def test_for_commit_is_none_when_tracing_is_off(db: str) -> None:
    raysaga.run(appr, {}, store=db, run_id="off", executor="inline")
    store = open_store(db, create=False)
    try:
        raysaga.configure_tracing(None)
        import opentelemetry.trace as api

        if not isinstance(api.get_tracer_provider(), (api.ProxyTracerProvider, api.NoOpTracerProvider)):
            pytest.skip("a global tracer provider is set in this process")
        assert tracing.for_commit(store, "off", "operator-42") is None
    finally:
        store.close()


# ---------------------------------------------------------------- 4. an inline fan-out's node span holds its items


def test_an_inline_fan_out_s_node_span_holds_its_items(exported: InMemorySpanExporter, db: str) -> None:
    assert raysaga.run(fan, {"n": 6}, store=db, run_id="fs", executor="inline").status == RunStatus.COMPLETED
    spans = _spans(exported, "fs")
    (parent,) = [s for s in _named(spans, "node work") if (s.attributes or {}).get("raysaga.fan_index") == -1]
    items = [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]
    assert len(items) == 6
    assert parent.start_time is not None and parent.end_time is not None
    outside = [(s.attributes or {}).get("raysaga.node") for s in items
               if s.start_time is None or s.end_time is None
               or s.start_time < parent.start_time or s.end_time > parent.end_time]
    assert not outside, f"item spans outside their fan-out's ({_seconds(parent):.6f}s long): {outside}"


# ---------------------------------------------------------------- 6. stats: resumes and retries


def test_an_operator_s_cancel_is_no_resume(db: str) -> None:
    raysaga.run(appr, {}, store=db, run_id="c1", executor="inline")
    raysaga.Client(db).cancel("c1", by="ops")
    stats = raysaga.Client(db).stats()
    assert (stats.resumes, stats.resumed_runs, stats.resume_success_rate) == (0, 0, None)


def test_a_resume_after_an_approval_is_one_and_a_retry_s_drive_too(db: str) -> None:
    raysaga.run(appr, {}, store=db, run_id="a1", executor="inline")
    raysaga.Client(db).approve("a1", "gate", by="alice")
    raysaga.resume(appr, "a1", store=db, executor="inline")
    stats = raysaga.Client(db).stats()
    assert (stats.resumes, stats.resumed_runs, stats.resume_success_rate) == (1, 1, 1.0)


def test_retries_stay_counted_after_an_operator_retry(db: str) -> None:
    FLAGS["transient"] = True
    try:
        assert raysaga.run(flaky, {}, store=db, run_id="f1", executor="inline").status == RunStatus.FAILED
    finally:
        FLAGS["transient"] = False
    before = raysaga.Client(db).stats().retries
    raysaga.retry(flaky, "f1", store=db, executor="inline")
    after = raysaga.Client(db).stats()
    assert before == after.retries == 2
    # the retry's reopen is the operator's, and the drive it starts starts the run again, as a first
    # claim does (stop 51: ``stats`` said "resumes: 1 of 1 runs" with no crash, hand-back or wake-up)
    assert after.resumes == 0


# ---------------------------------------------------------------- 7. a completed best-effort fan-out is completed


def test_a_completed_best_effort_fan_out_is_drawn_completed(db: str) -> None:
    assert raysaga.run(fan, {"n": 10}, store=db, run_id="be", executor="inline").status == RunStatus.COMPLETED
    store = SqlStore(db)
    try:
        views = {v.step: v for v in run_views.step_views(store, "be", workflow_graph(fan))}
    finally:
        store.close()
    assert views["work"].state == "completed"
    assert views["work"].counts == {"completed": 9, "failed": 1}


def test_in_flight_are_the_steps_without_a_row_whose_inputs_all_completed() -> None:
    deps = {"a": [], "b": ["a"], "c": ["b"], "d": ["a", "c"]}
    assert run_views.in_flight(deps, {"a": "completed"}) == {"b"}
    assert run_views.in_flight(deps, {"a": "completed", "b": "failed"}) == set()


# ---------------------------------------------------------------- 8. a step in flight without a row


def test_a_step_in_flight_without_a_row_is_running_in_every_view(db: str) -> None:
    SEEN.clear()
    result = raysaga.run(inflight, {"db": db, "run_id": "il"}, store=db, run_id="il", executor="inline")
    assert result.status == RunStatus.COMPLETED
    assert SEEN["dag"] == ["running"]
    assert SEEN["json"] == ["running"]
    (line,) = SEEN["table"]
    assert line.split()[1] == "running" and "not started" not in line, line


# ---------------------------------------------------------------- 9. a compensation_failed run's error and reason


comp = Workflow("comp42", version="1")


@comp.step(effect=True)
def charge(input: dict[str, Any]) -> dict[str, Any]:
    return {"charged": 1}


@comp.compensation("charge", retry=RetryPolicy(max_attempts=1))
def uncharge(output: dict[str, Any]) -> None:
    raise RuntimeError("refund service down")


@comp.step(retry=RetryPolicy(max_attempts=1))
def ship(charge: dict[str, Any]) -> None:
    raise RuntimeError("shipping exploded")


def _status_text(db: str, run_id: str, wf: Workflow | None = None) -> str:
    store = SqlStore(db)
    try:
        out = io.StringIO()
        cli_status.print_status(Console(file=out, width=300), store, store.get_run(run_id), store_text="here", wf=wf)
        return out.getvalue()
    finally:
        store.close()


def test_a_compensation_failed_run_s_error_reads_as_one_line(db: str) -> None:
    assert raysaga.run(comp, {}, store=db, run_id="order-7", executor="inline").status == \
        RunStatus.COMPENSATION_FAILED
    (line,) = [ln for ln in _status_text(db, "order-7").splitlines() if ln.startswith("error:")]
    assert line == ("error: compensation failed: charge (RuntimeError: refund service down); "
                    "cause: RuntimeError: shipping exploded"), line


def test_the_reason_names_the_run_to_retry() -> None:
    update = _outcome_with_one_failure("order 7")
    assert update.status_reason is not None
    assert "`raysaga retry 'order 7' --compensations`" in update.status_reason, update.status_reason


def _outcome_with_one_failure(run_id: str) -> RunUpdate:
    """``rollback_outcome`` of a rollback whose one compensation failed for good."""

    class Plan:
        failed = {("charge", -1)}

        @staticmethod
        def blocked() -> list[tuple[str, int]]:
            return []

    plan: RollbackPlan = Plan()  # type: ignore[assignment]  # what rollback_outcome reads of a plan
    return rollback_outcome("step ship failed", plan, {}, None, run_id=run_id)


# ---------------------------------------------------------------- 11. one shape for every node of --json


def test_every_node_of_status_json_has_the_same_keys(db: str) -> None:
    raysaga.run(appr, {}, store=db, run_id="sh", executor="inline")
    store = SqlStore(db)
    try:
        doc = io.StringIO()
        cli_status.stream_json(store, store.get_run("sh"), doc, wf=appr)
    finally:
        store.close()
    nodes = json.loads(doc.getvalue())["nodes"]
    assert [n["status"] for n in nodes] == ["completed", "waiting", "pending"]
    assert len({tuple(sorted(n)) for n in nodes}) == 1, nodes
    assert nodes[-1]["inherited_from"] is None


# ---------------------------------------------------------------- the header of a run that is not over


def test_a_waiting_run_s_header_says_how_long_it_has_lived(db: str) -> None:
    raysaga.run(appr, {}, store=db, run_id="hd", executor="inline")
    store = SqlStore(db)
    try:
        run = store.get_run("hd")
        out = io.StringIO()
        now: Callable[[], float] = lambda: run.created_at + 660.0  # noqa: E731 - eleven minutes later
        cli_status.print_status(Console(file=out, width=300), store, run, store_text="here", now=now)
    finally:
        store.close()
    header = out.getvalue().splitlines()[1]
    assert "in all" not in header and "11.0m so far" in header, header


def test_an_ended_run_s_header_says_how_long_it_took(db: str) -> None:
    raysaga.run(once, {}, store=db, run_id="done", executor="inline")
    header = _status_text(db, "done").splitlines()[1]
    assert header.endswith(" in all)"), header


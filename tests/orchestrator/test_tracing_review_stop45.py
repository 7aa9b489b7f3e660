"""Tracing review (stop 45): a sampler that drops a run drops all of it; a park made before (or
without) a driver's tracer writes the trace's root; captured content has a size limit; a fan-out's
span starts with its first item after a resume; a provider that is not the SDK's is said to give no
single tree.

Spans are read back from the SDK's in-memory exporter; runs are real, in SQLite stores.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, Sampler, TraceIdRatioBased
from sqlalchemy import text

import raysaga
from raysaga import Ask, RunOptions, Workflow
from raysaga.orchestrator import tracing, tracing_attrs
from raysaga.orchestrator.tracing_ids import new_trace_id, step_span_context, trace_id_of
from raysaga.orchestrator.worker_runs import FailedDrives
from raysaga.state import Batch, Lease, NodeStatus, NodeWrite, RunStatus, RunUpdate, SqlStore
from raysaga.state.claims import Claim

LIMIT_ENV = "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"  # the SDK's own limit of an attribute's length


@contextmanager
def spans_of(provider: Any, exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    """raysaga's spans to ``provider`` (whose processor feeds ``exporter``) for the block."""
    raysaga.configure_tracing(provider)
    try:
        yield exporter
    finally:
        raysaga.configure_tracing(None)


@contextmanager
def sdk_spans(sampler: Sampler | None = None) -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider() if sampler is None else TracerProvider(sampler=sampler)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with spans_of(provider, exporter):
            yield exporter
    finally:
        provider.shutdown()


def one_tree(spans: list[ReadableSpan]) -> ReadableSpan:
    """The root of ``spans``, which form one tree in one trace (every parent there); returned."""
    assert spans, "no span"
    ids = {s.context.span_id for s in spans}
    assert len({s.context.trace_id for s in spans}) == 1, "spans in more than one trace"
    orphans = [s.name for s in spans if s.parent is not None and s.parent.span_id not in ids]
    assert not orphans, f"spans whose parent is nowhere: {orphans}"
    roots = [s for s in spans if s.parent is None]
    assert len(roots) == 1 and roots[0].name.startswith("run "), [r.name for r in roots]
    return roots[0]


fan = Workflow("stop45_fan")


@fan.step()
def make(input: dict[str, Any]) -> list[int]:
    return [1, 2, 3]


@fan.map("make")
def item(make: int) -> int:
    return make * 2


# ---------------------------------------------------------------------------------------------- B2


def test_a_ratio_sampler_that_drops_a_run_drops_all_of_its_spans(tmp_path: Path) -> None:
    """``ParentBased(TraceIdRatioBased(0))``: every span had a synthetic parent marked sampled, so
    all but the root were kept (45 of 50 spans, 10 orphans for 5 runs). Now none is."""
    db = f"sqlite:///{tmp_path / 'drop.db'}"
    with sdk_spans(ParentBased(TraceIdRatioBased(0.0))) as exporter:
        for _ in range(3):
            assert raysaga.run(fan, {}, store=db, executor="inline").status == RunStatus.COMPLETED
    assert [s.name for s in exporter.get_finished_spans()] == []


def test_a_ratio_sampler_keeps_or_drops_each_run_whole_as_its_trace_id_says(tmp_path: Path) -> None:
    """Ratio 0.5: each run is all there (one tree) or not at all, as the ratio sampler decides on
    its trace id; ratio 1.0 keeps every run, as before."""
    db = f"sqlite:///{tmp_path / 'half.db'}"
    ratio = TraceIdRatioBased(0.5)
    with sdk_spans(ParentBased(ratio)) as exporter:
        runs = [raysaga.run(fan, {}, store=db, executor="inline") for _ in range(20)]
    spans = exporter.get_finished_spans()
    kept = 0
    for run in runs:
        mine = [s for s in spans if s.context.trace_id == trace_id_of(run.trace_id)]
        wanted = ratio.should_sample(None, trace_id_of(run.trace_id), "run").decision == Decision.RECORD_AND_SAMPLE
        if wanted:
            kept += 1
            one_tree(mine)
            assert len(mine) == 10  # run, node make, attempt make, node item, 3 x (node + attempt) item
        else:
            assert mine == [], f"a dropped run exported {[s.name for s in mine]}"
    assert len(spans) == 10 * kept
    assert 0 < kept < 20, kept  # some kept, some dropped (uuid4 trace ids were never kept at 0.5: below)
    unsampled = trace.NonRecordingSpan(trace.SpanContext(0xABC, 0xDEF, is_remote=True,
                                                         trace_flags=trace.TraceFlags(trace.TraceFlags.DEFAULT)))
    with sdk_spans(ParentBased(TraceIdRatioBased(1.0))) as exporter, trace.use_span(unsampled):
        raysaga.run(fan, {}, store=db, executor="inline")  # (the caller's own span, not sampled, is not the run's)
    assert len(exporter.get_finished_spans()) == 10
    one_tree(list(exporter.get_finished_spans()))


# ---------------------------------------------------------------------------------------------- B3

looping = Workflow("stop45_loop", version="1")


@looping.step()
def work(input: dict[str, Any]) -> str:
    return "done"


def _dead_drivers(store: SqlStore, run_id: str, deaths: int) -> Lease:
    """A first driver, then ``deaths`` drivers each taking the lease its predecessor never let go;
    the last one's lease has lapsed at once (a resume takes it)."""
    lease = store.claim(run_id, "d0", 15)
    for i in range(1, deaths + 1):
        lease = store.claim(run_id, f"d{i}", 15 if i < deaths else -1.0, take_from=f"d{i - 1}")
    return lease


def test_a_crash_loop_park_writes_the_run_span_and_a_retry_hangs_under_it(tmp_path: Path) -> None:
    """The driver parks a crash loop before it has a tracer: the park wrote no ``run`` span, so
    the trace had no root, even after ``raysaga retry`` (whose run span is the park's child)."""
    store = SqlStore(f"sqlite:///{tmp_path / 'loop.db'}")
    try:
        run = raysaga.create_run(looping, {}, store=store)
        _dead_drivers(store, run.run_id, RunOptions().max_driver_deaths - 1)
        with sdk_spans() as exporter:
            parked = raysaga.resume(looping, run.run_id, store=store, executor="inline")
            assert parked.status == RunStatus.FAILED and parked.error is not None
            assert parked.error["type"] == "CrashLoop", parked.status_reason
            [park] = exporter.get_finished_spans()
            assert park.name == "run stop45_loop" and park.parent is None
            assert park.attributes is not None and park.attributes["raysaga.run.status"] == "failed"
            done = raysaga.retry(looping, run.run_id, store=store, executor="inline")
            assert done.status == RunStatus.COMPLETED
        spans = list(exporter.get_finished_spans())
        assert one_tree(spans).context.span_id == park.context.span_id
        [retried] = [s for s in spans if s.name == "run stop45_loop" and s.parent is not None]
        assert retried.attributes is not None and retried.attributes["raysaga.run.retry"] == 1
    finally:
        store.close()


def test_a_worker_park_after_failed_drives_writes_the_run_span(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'worker.db'}")
    try:
        run = raysaga.create_run(looping, {}, store=store)
        lease = store.claim(run.run_id, "w0", 15)
        store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
        store.release(lease)
        claimed = Claim(lease=lease, workflow=looping.name, reason="new", latency=0.0, status=RunStatus.RUNNING)
        with sdk_spans() as exporter:
            FailedDrives(store).park(claimed, 3, RuntimeError("the run row cannot be read"), 10.0)
        assert store.get_run(run.run_id).status == RunStatus.FAILED
        root = one_tree(list(exporter.get_finished_spans()))
        assert root.attributes is not None and root.attributes["raysaga.run.status"] == "failed"
        assert root.context.trace_id == trace_id_of(run.trace_id)
    finally:
        store.close()


blobby = Workflow("stop45_blob")


@blobby.step()
def big(input: dict[str, Any]) -> list[str]:
    return ["x" * 1000 for _ in range(100)]  # ~100 KB of JSON: kept as a blob


@blobby.approval(approvers=["ann"])
def review(big: list[str]) -> Ask:
    return Ask(prompt=f"{len(big)} lines?")


@blobby.step()
def use(big: list[str], review: Any) -> int:
    return len(big)


def test_a_blob_found_damaged_as_the_run_is_restored_parks_it_with_its_run_span(tmp_path: Path) -> None:
    """The damaged blob is read while the driver restores the run, before its tracer exists: the
    park's commit went untraced, and the trace (big's spans) had no root."""
    store = SqlStore(f"sqlite:///{tmp_path / 'blob.db'}")
    try:
        with sdk_spans() as exporter:
            rested = raysaga.run(blobby, {}, store=store, executor="inline")
            assert rested.status == RunStatus.WAITING_HUMAN
            [row] = [n for n in store.nodes(rested.run_id) if n.node_id == "big"]
            assert row.output_digest is not None, "big's output must be blob-stored for this test"
            with store.engine.begin() as conn:  # behind raysaga's back
                conn.execute(text("UPDATE raysaga_blobs SET data = :d WHERE digest = :g"),
                             {"d": b'["tampered"]', "g": row.output_digest})
            raysaga.Client(store).approve(rested.run_id, "review", by="ann")
            parked = raysaga.resume(blobby, rested.run_id, store=store, executor="inline")
        assert parked.status == RunStatus.FAILED and parked.error is not None
        assert parked.error["type"] == "BlobIntegrityError", parked.status_reason
        root = one_tree(list(exporter.get_finished_spans()))
        assert root.attributes is not None and root.attributes["raysaga.run.status"] == "failed"
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------- B4


def test_captured_content_is_cut_to_a_fixed_size_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    """A 3 MB tool result was one 3,000,018-character attribute: past what an OTLP collector takes
    in a request, so the whole batch of spans around it was lost."""
    monkeypatch.setenv(tracing_attrs.CAPTURE_ENV, "true")
    monkeypatch.delenv(LIMIT_ENV, raising=False)
    huge = "y" * 3_000_000
    result = tracing_attrs.tool_call("search", "c1", {"content": huge})["gen_ai.tool.call.result"]
    assert len(result) == 16 * 1024 and result.startswith('"yyy')
    assert result.endswith(f"...[cut by raysaga: {len(huge) + 2} characters in all]")
    turn = {"content": [{"type": "text", "text": huge}], "usage": {"input_tokens": 1, "output_tokens": 1}}
    messages = tracing_attrs.model_turn(turn, "m", None)["gen_ai.output.messages"]
    assert len(messages) == 16 * 1024 and "cut by raysaga" in messages
    small = tracing_attrs.tool_call("search", "c1", {"content": "ok"})["gen_ai.tool.call.result"]
    assert small == '"ok"'  # whole, unmarked
    monkeypatch.setenv(LIMIT_ENV, "500")  # the SDK's own limit would cut the mark off
    cut = tracing_attrs.tool_call("search", "c1", {"content": huge})["gen_ai.tool.call.result"]
    assert len(cut) == 500 and cut.endswith("characters in all]")


# ---------------------------------------------------------------------------------------------- B8


def test_after_a_resume_a_fan_outs_span_starts_with_its_first_item(tmp_path: Path) -> None:
    """A resume reads the fan-out's own row (started a few ms after its items were sent) before
    its items' rows: its start won, and the node span began after its items' spans."""
    store = SqlStore(f"sqlite:///{tmp_path / 'fan.db'}")
    try:
        run = raysaga.create_run(fan, {}, store=store)
        lease = store.claim(run.run_id, "d0", 15)
        t = 1_000_000.0
        store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING), nodes=[
            NodeWrite(node_id="make", status=NodeStatus.COMPLETED, attempt=1, output=[1, 2],
                      started_at=t, finished_at=t + 0.01),
            NodeWrite(node_id="item", status=NodeStatus.RUNNING, attempt=1, started_at=t + 0.025),
            *(NodeWrite(node_id="item", fan_index=i, status=NodeStatus.RUNNING, attempt=1, started_at=t + 0.02)
              for i in (0, 1))]))
        snap = store.snapshot(run.run_id)
        snap = snap.model_copy(update={"nodes": sorted(snap.nodes, key=lambda n: n.fan_index)})  # its own row first
        with sdk_spans() as exporter:
            traced = tracing.for_run(fan, snap, {}, "d1", store)
            assert traced is not None
            traced.committed(Batch(nodes=[
                *(NodeWrite(node_id="item", fan_index=i, status=NodeStatus.COMPLETED, attempt=1, output=i,
                            started_at=t + 0.02, finished_at=t + 0.03) for i in (0, 1)),
                NodeWrite(node_id="item", status=NodeStatus.COMPLETED, attempt=1, output=[0, 1],
                          finished_at=t + 0.04)]), None)
        spans = {s.name + str((s.attributes or {}).get("raysaga.node")): s for s in exporter.get_finished_spans()}
        node, first_item = spans["node itemitem"], spans["attempt itemitem[0]"]
        assert node.start_time == first_item.start_time == int((t + 0.02) * 1e9), (node.start_time,
                                                                                  first_item.start_time)
    finally:
        store.close()


# ---------------------------------------------------------------------------------------------- B7


class _WrappedTracer:
    """A vendor's tracer around the SDK's: it has no ``id_generator``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def start_span(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner.start_span(*args, **kwargs)


class _VendorProvider:
    def __init__(self, inner: TracerProvider) -> None:
        self._inner = inner

    def get_tracer(self, *args: Any, **kwargs: Any) -> _WrappedTracer:
        return _WrappedTracer(self._inner.get_tracer(*args, **kwargs))


def test_a_provider_that_is_not_the_sdks_is_said_once_to_give_no_single_tree(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its spans cannot take raysaga's ids, so their parents are ids no span has (2 traces, 4 of 5
    spans orphans), and nothing said so."""
    monkeypatch.setattr(tracing, "_warned", [], raising=False)  # (said once a process)
    exporter = InMemorySpanExporter()
    sdk = TracerProvider()
    sdk.add_span_processor(SimpleSpanProcessor(exporter))
    db = f"sqlite:///{tmp_path / 'vendor.db'}"
    with caplog.at_level(logging.WARNING, logger="raysaga.driver"), spans_of(_VendorProvider(sdk), exporter):
        for _ in range(2):
            assert raysaga.run(looping, {}, store=db, executor="inline").status == RunStatus.COMPLETED
    said = [r.getMessage() for r in caplog.records if "not the OpenTelemetry SDK's" in r.getMessage()]
    assert len(said) == 1, said
    assert "_WrappedTracer" in said[0] and "opentelemetry.sdk.trace.TracerProvider" in said[0]
    assert "docs/observability.md" in said[0]
    assert len(exporter.get_finished_spans()) == 6  # its spans are still written
    sdk.shutdown()


# ------------------------------------------------------------------ the diff review of the fixes above


def test_new_trace_ids_are_sampled_at_the_ratio_asked() -> None:
    """Runs had ``uuid4`` trace ids, whose low 64 bits (what ``TraceIdRatioBased`` reads) start with
    the variant bits ``10``: at a ratio of 0.5 or less no run was ever traced, at 0.75 all were."""
    import uuid

    ratio = TraceIdRatioBased(0.1)

    def share(ids: list[str]) -> float:
        kept = [i for i in ids
                if ratio.should_sample(None, trace_id_of(i), "run").decision == Decision.RECORD_AND_SAMPLE]
        return len(kept) / len(ids)

    assert share([uuid.uuid4().hex for _ in range(2000)]) == 0.0  # the old ids
    assert 0.05 < share([new_trace_id() for _ in range(2000)]) < 0.15  # binomial: mean 0.1, sd 0.0067


def test_a_steps_own_span_context_is_sampled_as_the_run_is(monkeypatch: pytest.MonkeyPatch) -> None:
    """``step_span_context`` marked every context sampled: under a sampler that dropped the run, a
    step's own spans were kept as orphans (their parent attempt span was never written)."""
    dropping = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.0)))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: dropping)
    assert not step_span_context("r", new_trace_id(), "a", 1).trace_flags.sampled
    keeping = TracerProvider(sampler=ParentBased(TraceIdRatioBased(1.0)))
    monkeypatch.setattr(trace, "get_tracer_provider", lambda: keeping)
    assert step_span_context("r", new_trace_id(), "a", 1).trace_flags.sampled


def test_an_sdk_switched_off_is_tracing_off_without_a_warning(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """``OTEL_SDK_DISABLED=true``: the SDK's provider hands out ``NoOpTracer``s. raysaga warned it
    was "not the OpenTelemetry SDK's" and built spans for nothing."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    provider = TracerProvider()
    raysaga.configure_tracing(provider)
    try:
        with caplog.at_level(logging.WARNING, logger="raysaga.driver"):
            run = raysaga.run(fan, {}, store=f"sqlite:///{tmp_path / 'off.db'}", executor="inline")
    finally:
        raysaga.configure_tracing(None)
    assert run.status == RunStatus.COMPLETED
    assert "not the OpenTelemetry SDK" not in caplog.text
    assert tracing.for_commit(SqlStore(f"sqlite:///{tmp_path / 'off.db'}"), run.run_id, "me") is None


def test_the_span_limit_the_sdk_reads_first_keeps_the_cut_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK reads ``OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT`` before ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``:
    raysaga's cut to the second was cut again by the SDK to the first, its mark lost."""
    monkeypatch.setenv(tracing_attrs.SPAN_LIMIT_ENV, "1000")
    monkeypatch.setenv(LIMIT_ENV, "5000")
    cut = tracing_attrs.content("x" * 50_000)
    assert len(cut) == 1000 and cut.endswith("characters in all]")


retried_fan = Workflow("stop45_retried_fan")
FIXED: list[bool] = []


@retried_fan.step()
def seeds(input: dict[str, Any]) -> list[int]:
    return [0, 1, 2]


@retried_fan.map("seeds")
def each(seeds: int) -> int:
    if seeds == 2 and not FIXED:
        raise ValueError("bad item")
    return seeds


def test_after_an_operators_retry_a_fan_outs_span_starts_in_the_retrys_epoch(tmp_path: Path) -> None:
    """Items completed before the park fed their start times to the retry's fan-out span, which
    then began before its own run span (in the earlier epoch)."""
    db = f"sqlite:///{tmp_path / 'retry.db'}"
    FIXED.clear()
    with sdk_spans() as exporter:
        first = raysaga.run(retried_fan, {}, store=db, executor="inline")
        assert first.status == RunStatus.FAILED
        FIXED.append(True)
        assert raysaga.retry(retried_fan, first.run_id, store=db, executor="inline").status == RunStatus.COMPLETED
    spans = list(exporter.get_finished_spans())
    retry_run = next(s for s in spans if s.name.startswith("run ") and s.attributes
                     and s.attributes.get("raysaga.run.retry") == 1)
    fan_spans = [s for s in spans if s.name == "node each" and s.parent is not None
                 and s.parent.span_id == retry_run.context.span_id]
    assert fan_spans, [s.name for s in spans]
    for span in fan_spans:
        assert span.start_time is not None and retry_run.start_time is not None
        assert span.start_time >= retry_run.start_time, "the retry's fan-out span starts in the earlier epoch"

"""OpenTelemetry spans (``raysaga.configure_tracing``, the ``otel`` extra), read back from the
SDK's in-memory exporter.

- A crash and its resume make one trace: a driver process (the agent flow of the kill sweep,
  through the real ``anthropic`` SDK to the local Messages server) is SIGKILLed right after model
  turn 1 is committed; the spans it exported went to a file (``tests.support.spans``: the one
  exporter a SIGKILL cannot lose); this process resumes the run with an in-memory exporter. The
  two halves share one trace id (the run's), form one tree (every parent is there) that nests
  run → node → attempt → turn → tool, and hold exactly one span per model turn: the resume's
  replay of turns 0 and 1 is marked ``raysaga.turn.replayed`` and carries no token usage, so the
  tokens in the trace add up to what the store counted (and the server billed).
- A rollback draws each compensation under the node it undoes; a wait for a human is a span.
- Off (no provider configured and OpenTelemetry never imported), a run imports nothing of it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import raysaga
from raysaga import Ask, Workflow
from raysaga.orchestrator import tracing, tracing_attrs
from raysaga.state import RunStatus, SqlStore
from tests.support import REPO, saga_flows
from tests.support import agent_flows as af
from tests.support import crash_driver as harness
from tests.support import messages_server as ms
from tests.support.kill_sweep import LEASE_TTL
from tests.support.services import FakeServices
from tests.support.spans import ENV, Span, from_memory, in_memory_spans, read_file

af.use_test_key()


@pytest.fixture
def exported() -> Iterator[InMemorySpanExporter]:
    with in_memory_spans() as exporter:
        yield exporter


def by_id(spans: list[Span]) -> dict[int, Span]:
    ids = [s.span_id for s in spans]
    duplicates = sorted({hex(i) for i in ids if ids.count(i) > 1})
    assert not duplicates, f"span ids emitted twice: {duplicates}"
    return {s.span_id: s for s in spans}


def chain(span: Span, index: dict[int, Span]) -> list[str]:
    """The names from ``span`` up to the root."""
    names = [span.name]
    while span.parent_id is not None:
        span = index[span.parent_id]
        names.append(span.name)
    return names


def one_tree(spans: list[Span], trace_id: str) -> dict[int, Span]:
    index = by_id(spans)
    assert {s.trace_id for s in spans} == {int(trace_id, 16)}, "every span is in the run's trace"
    orphans = [(s.name, s.source) for s in spans if s.parent_id is not None and s.parent_id not in index]
    assert not orphans, f"spans whose parent is nowhere: {orphans}"
    roots = [s for s in spans if s.parent_id is None]
    assert [r.name for r in roots] == [roots[0].name] and roots[0].name.startswith("run "), roots
    return index


def test_a_crash_and_its_resume_make_one_trace(exported: InMemorySpanExporter, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'run.db'}"
    span_file = tmp_path / "killed-driver-spans.jsonl"
    run_id = "otel-crash-1"
    with ms.MessagesServer(af.reply_for) as srv, FakeServices() as services:
        killed = harness.finish(af.spawn(
            db, run_id, model_url=srv.base_url, services_url=services.url, api_key=af.TEST_KEY,
            faults=f"after_commit:{af.STEP}@1", lease_ttl=LEASE_TTL["inline"], extra_env={ENV: str(span_file)}))
        assert killed.returncode == -signal.SIGKILL, killed.describe()
        store = SqlStore(db)
        try:
            assert harness.wait_lease_expired(store, run_id).status == RunStatus.RUNNING
        finally:
            store.close()
        flow = af.make_flow(srv.base_url, services.url)
        done = raysaga.resume(flow, run_id, store=db, executor="inline")
        assert done.status == RunStatus.COMPLETED, done.status_reason
        assert srv.repeated_requests() == [], "an answered turn was asked again"
        billed = srv.usage_totals()

    before = read_file(span_file)
    after = from_memory(exported.get_finished_spans())
    assert before and after
    index = one_tree(before + after, done.trace_id)

    turns = [s for s in index.values() if s.attributes.get("gen_ai.operation.name") == "chat"]
    first = {s.attributes["raysaga.node"]: s for s in turns if not s.attributes["raysaga.turn.replayed"]}
    replays = [s for s in turns if s.attributes["raysaga.turn.replayed"]]
    # one span per answered turn, each from the process that committed it
    assert sorted(first) == [f"{af.STEP}@0", f"{af.STEP}@1", f"{af.STEP}@2"]
    assert len([s for s in turns if not s.attributes["raysaga.turn.replayed"]]) == 3
    assert {first[f"{af.STEP}@{t}"].source for t in (0, 1)} == {str(span_file)}
    assert first[f"{af.STEP}@2"].source == "memory"
    # the resume replays turns 0 and 1 from the store: marked, and never billed again
    assert sorted(s.attributes["raysaga.node"] for s in replays) == [f"{af.STEP}@0", f"{af.STEP}@1"]
    assert all("gen_ai.usage.input_tokens" not in s.attributes for s in replays)
    counted = sum(s.attributes["gen_ai.usage.input_tokens"] + s.attributes["gen_ai.usage.output_tokens"]
                  for s in first.values())
    assert counted == done.tokens_used == billed.input_tokens + billed.output_tokens
    # GenAI semantic conventions on a turn
    turn1 = first[f"{af.STEP}@1"].attributes
    assert turn1["gen_ai.request.model"] == af.MODEL and turn1["gen_ai.provider.name"] == "anthropic"
    assert tuple(turn1["gen_ai.response.finish_reasons"]) == ("tool_use",)
    assert (turn1["gen_ai.usage.input_tokens"], turn1["gen_ai.usage.output_tokens"]) == af.TURN_USAGE[1]
    assert "gen_ai.output.messages" not in turn1, "message content is off by default"

    # run → node → attempt → turn → tool, the tool called after the crash by the resumed driver
    [report] = [s for s in index.values() if s.attributes.get("gen_ai.tool.name") == "file_report"]
    assert report.source == "memory" and report.attributes["raysaga.effect.key"]
    assert chain(report, index) == ["execute_tool file_report", f"chat {af.MODEL}", f"attempt {af.STEP}",
                                    f"node {af.STEP}", "run agent_sweep"]
    [search] = [s for s in index.values() if s.attributes.get("gen_ai.tool.name") == "search"]
    assert search.source == str(span_file)  # called before the crash: exported once, by the killed driver
    assert chain(search, index) == ["execute_tool search", *chain(report, index)[1:]]


def test_a_rollback_draws_each_compensation_under_the_node_it_undoes(exported: InMemorySpanExporter,
                                                                      tmp_path: Path) -> None:
    with FakeServices() as services:
        done = raysaga.run(saga_flows.diamond, saga_flows.FlowIn(services_url=services.url),
                           store=f"sqlite:///{tmp_path / 'r.db'}", executor="inline")
    assert done.status == RunStatus.COMPENSATED, done.status_reason
    index = one_tree(from_memory(exported.get_finished_spans()), done.trace_id)
    undo = sorted((s for s in index.values() if s.name.startswith("compensate ")), key=lambda s: s.start_ns)
    assert {s.name for s in undo} == {"compensate a", "compensate b", "compensate c"}
    assert undo[-1].name == "compensate a", "a, done first, is undone last"
    for span in undo:
        assert index[span.parent_id or 0].name == f"node {span.name.split()[-1]}"
    [failed] = [s for s in index.values() if s.name == "node d"]
    assert failed.status == "ERROR"
    [run] = [s for s in index.values() if s.parent_id is None]
    assert run.status == "ERROR" and run.attributes["raysaga.run.status"] == "compensated"


def test_a_wait_for_a_human_is_a_span_of_its_node(exported: InMemorySpanExporter, tmp_path: Path) -> None:
    wf = Workflow("otel_approval")

    @wf.step()
    def draft(input: int) -> int:
        return input

    @wf.approval(approvers=["ann"])
    def review(draft: int) -> Ask:
        return Ask(prompt=f"send {draft}?")

    db = f"sqlite:///{tmp_path / 'a.db'}"
    rested = raysaga.run(wf, 7, store=db, executor="inline")
    assert rested.status == RunStatus.WAITING_HUMAN
    assert not [s for s in exported.get_finished_spans() if s.name.startswith("run ")], "a rest ends no run"
    raysaga.Client(db).approve(rested.run_id, "review", by="ann")
    done = raysaga.resume(wf, rested.run_id, store=db, executor="inline")
    assert done.status == RunStatus.COMPLETED
    index = one_tree(from_memory(exported.get_finished_spans()), done.trace_id)
    [wait] = [s for s in index.values() if s.name == "wait review"]
    assert wait.attributes["raysaga.wait.kind"] == "human"
    assert index[wait.parent_id or 0].name == "node review"


def test_runs_driven_at_once_in_one_process_keep_their_own_ids(exported: InMemorySpanExporter,
                                                               tmp_path: Path) -> None:
    """A worker drives several runs at once, one per thread, through the SDK's one shared tracer:
    each run's spans carry its own trace id and ids (a barrier makes the two runs' steps, and so
    their commits and spans, interleave)."""
    barrier = threading.Barrier(2)
    wf = Workflow("otel_pair")

    @wf.step()
    def one(input: int) -> int:
        barrier.wait(30)
        return input

    @wf.step()
    def two(one: int) -> int:
        barrier.wait(30)
        return one + 1

    done: dict[int, raysaga.RunRecord] = {}

    def drive(i: int) -> None:
        done[i] = raysaga.run(wf, i, store=f"sqlite:///{tmp_path / f'{i}.db'}", executor="inline")

    threads = [threading.Thread(target=drive, args=(i,)) for i in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(done) == [1, 2] and {r.status for r in done.values()} == {RunStatus.COMPLETED}
    spans = from_memory(exported.get_finished_spans())
    for record in done.values():
        mine = [s for s in spans if s.trace_id == int(record.trace_id, 16)]
        index = one_tree(mine, record.trace_id)
        assert {s.attributes["raysaga.run.id"] for s in mine} == {record.run_id}
        assert sorted(s.name for s in index.values()) == [
            "attempt one", "attempt two", "node one", "node two", "run otel_pair"]
    assert len(spans) == 10, "a span in neither run's trace"


def test_a_turn_carries_cache_tokens_and_content_only_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    response = {"model": "claude-x", "stop_reason": "end_turn", "content": [{"type": "text", "text": "hi"}],
                "usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 40,
                          "cache_creation_input_tokens": 3}}
    attrs = tracing_attrs.model_turn(response, "claude-x", 0.25)
    assert attrs["gen_ai.usage.cache_read.input_tokens"] == 40
    assert attrs["gen_ai.usage.cache_creation.input_tokens"] == 3
    assert attrs["raysaga.cost_usd"] == 0.25 and "gen_ai.output.messages" not in attrs
    monkeypatch.setenv(tracing_attrs.CAPTURE_ENV, "true")
    assert '"hi"' in tracing_attrs.model_turn(response, "claude-x", None)["gen_ai.output.messages"]
    replayed = tracing_attrs.model_turn(response, "claude-x", 0.25, replayed=True)
    assert not [k for k in replayed if k.startswith("gen_ai.usage") or k == "raysaga.cost_usd"]


def test_off_a_run_makes_no_tracer_and_imports_no_opentelemetry(tmp_path: Path) -> None:
    raysaga.configure_tracing(None)  # this process has imported OpenTelemetry, but set no global provider
    wf = Workflow("otel_off")

    @wf.step()
    def only(input: int) -> int:
        return input

    store = SqlStore(f"sqlite:///{tmp_path / 'off.db'}")
    try:
        record = raysaga.run(wf, 1, store=store, executor="inline")
        assert tracing.for_run(wf, store.snapshot(record.run_id), {}, "me") is None
    finally:
        store.close()
    script = ("import sys, raysaga\n"
              "wf = raysaga.Workflow('off')\n"
              "@wf.step()\n"
              "def only(input: int) -> int:\n"
              "    return input\n"
              f"assert raysaga.run(wf, 1, store={str(tmp_path / 'p.db')!r}, executor='inline').status == 'completed'\n"
              "loaded = sorted(m for m in sys.modules if m.startswith('opentelemetry'))\n"
              "assert not loaded, loaded\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


def test_configuring_something_that_is_no_tracer_provider_is_refused_at_once() -> None:
    with pytest.raises(raysaga.InvalidOptionError, match="str is not an OpenTelemetry TracerProvider"):
        raysaga.configure_tracing("http://collector:4318")  # an endpoint where a provider belongs
    assert tracing._provider is None  # nothing half-configured

"""OpenTelemetry spans of a run, made from what its driver commits (the ``otel`` extra).

Off unless the process uses the OpenTelemetry SDK: an application that set a global
``TracerProvider`` (or ran under ``opentelemetry-instrument``), or called ``configure_tracing``.
Off, a driver pays one dictionary lookup per run and imports nothing.

Spans are written from committed rows, never from what is about to happen, so a span says what the
store says: run → node → attempt → model turn → tool call, plus compensations (under the node they
undo), waits for a human or a timer, and retry backoffs. Every id is derived from the run and what
the span is about (``raysaga.orchestrator.tracing_ids``), so a crash and its resume, even on
another machine, make one trace. A row is committed once, so its span is emitted once: a resume
replays a model turn answered before the crash from the store, and marks that as a *replay* span
(``raysaga.turn.replayed``, no token usage) instead of a second span of the turn.

A span starts and ends at the times the rows hold; a node's span starts at the first attempt this
driver saw begin (after a resume: the attempt in flight when it took over).

An operator's retry of a parked run (``failed``, ``compensation_failed``) starts a new *drive
epoch*: the run's spans from then on get ids of their own (the epoch is folded into every id) under
a new ``run`` span, a child of the one the park wrote, so attempt 1 of a node retried by the
operator is not a second span with the id of the attempt 1 that failed. The epoch is the number of
times the run parked before, counted from its events.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from raysaga.agents.messages import Usage
from raysaga.errors import InvalidOptionError
from raysaga.node_key import NodeKey, NodeKind
from raysaga.orchestrator import tracing_attrs as attrs_of
from raysaga.orchestrator.retry import message_of
from raysaga.orchestrator.tracing_ids import (
    DeterministicIds,
    deterministic,
    new_trace_id,
    span_id,
    trace_id_of,
    trace_sampled,
)
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import Batch, EventRecord, NodeStatus, NodeWrite, RunRecord, RunSnapshot
from raysaga.state.models import PARKED, TERMINAL

if TYPE_CHECKING:
    from raysaga.state import Store

__all__ = ["RunTracing", "configure_tracing", "drive_epoch", "for_commit", "for_run", "new_trace_id", "traced"]

log = logging.getLogger("raysaga.driver")
_provider: Any = None
_ENDED = frozenset({NodeStatus.COMPLETED, NodeStatus.FAILED, NodeStatus.CANCELLED})
_OUTCOMES = _ENDED | {NodeStatus.RETRYING}
_RUN_ENDS = TERMINAL | PARKED
_PARKS = frozenset("run_" + s.value for s in PARKED)  # the events of a run parking


def configure_tracing(tracer_provider: Any | None = None) -> None:
    """Send raysaga's spans to ``tracer_provider`` (an OpenTelemetry SDK ``TracerProvider``)
    instead of OpenTelemetry's global one; ``None`` goes back to the global provider."""
    global _provider
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise InvalidOptionError(f"configure_tracing: {type(tracer_provider).__name__} is not an OpenTelemetry "
                                 "TracerProvider (it has no get_tracer): pass e.g. "
                                 "opentelemetry.sdk.trace.TracerProvider(), or None for the global provider")
    _provider = tracer_provider


def _provider_in_use() -> Any | None:
    provider = _provider
    if provider is None:
        api = sys.modules.get("opentelemetry.trace")
        if api is None:  # nobody imported OpenTelemetry: tracing is off
            return None
        provider = api.get_tracer_provider()
        if isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
            return None
    api = sys.modules.get("opentelemetry.trace")
    try:
        if api is not None and isinstance(provider.get_tracer("raysaga"), api.NoOpTracer):
            return None  # the SDK's provider under OTEL_SDK_DISABLED=true: switched off on purpose
    except Exception:  # (a provider failing is said when a run's tracer is made: ``for_run``)
        pass
    return provider


def drive_epoch(events: Iterable[EventRecord]) -> tuple[int, float | None]:
    """The drive epoch of a run from its events (how many times it parked, ``failed`` or
    ``compensation_failed``, before), and when the current epoch began (None: at the run's start)."""
    epoch, since, parked = 0, None, False
    for e in events:
        if e.kind in _PARKS:
            epoch, parked = epoch + 1, True
        elif parked and e.kind.startswith("run_"):  # the first move out of the park: an operator's
            since, parked = e.at, False
    return epoch, since


def for_run(workflow: Workflow | None, snap: RunSnapshot, outputs: Mapping[str, Any], owner: str,
            store: Store | None = None, *, replay: bool = True) -> RunTracing | None:
    """The tracer of the run a driver restored from ``snap`` (node outputs by digest in
    ``outputs``), or None when nothing would receive its spans. ``store``: the run's store, read
    for the run's drive epoch (without it the run is taken as never retried by an operator)."""
    provider = _provider_in_use()
    if provider is None:
        return None
    try:  # a provider of the application's that fails must not fail the run: it goes untraced
        epoch, since = (0, None) if store is None else drive_epoch(store.events(snap.run.run_id))
        tracer = RunTracing(workflow, snap.run, owner, provider, epoch=epoch, since=since)
    except Exception as exc:
        log.warning("run %s is not traced: the tracer provider failed (%s: %s)", snap.run.run_id,
                    type(exc).__name__, message_of(exc))
        return None
    tracer.restored(snap, outputs, replay=replay)
    return tracer


def for_commit(store: Store, run_id: str, owner: str, workflow: Workflow | None = None) -> RunTracing | None:
    """A tracer for one commit made without a driver (a cancel taken at once, ``raysaga cancel`` or
    ``Client.cancel``), read from the store before that commit: pass it the commit's batch and the
    record it returned (``committed``). None when tracing is off."""
    if _provider_in_use() is None:
        return None
    try:
        snap = store.snapshot(run_id)
    except Exception as exc:  # tracing must not stop the commit
        log.warning("run %s: a commit made without a driver is not traced (%s: %s)", run_id, type(exc).__name__,
                    message_of(exc))
        return None
    return for_run(workflow, snap, {}, owner, store, replay=False)


def traced(store: Store, run_id: str, owner: str, commit: Callable[[Batch], RunRecord | None],
           workflow: Workflow | None = None) -> Callable[[Batch], RunRecord | None]:
    """``commit`` that also writes the spans of what it commits, for a commit made before (or
    without) a driver's tracer: a park for a crash loop, a damaged blob or failed drives. Without
    it the park's ``run`` span, the root of the run's trace, was never written. ``commit`` itself
    when tracing is off."""
    tracer = for_commit(store, run_id, owner, workflow)
    if tracer is None:
        return commit

    def commit_and_trace(batch: Batch) -> RunRecord | None:
        record = commit(batch)
        try:
            tracer.committed(batch, record)
        except Exception as exc:  # the commit is done: tracing must not say otherwise
            log.warning("run %s: the spans of a commit were not written (%s: %s)", run_id, type(exc).__name__,
                        message_of(exc))
        return record

    return commit_and_trace


def sampled(tracer: Any, provider: Any, trace_id: int) -> bool:
    """Whether the provider's sampler keeps the run's trace, asked once as for its root span
    (``tracing_ids.trace_sampled``). Every other span has a synthetic remote parent marked sampled,
    so a ``ParentBased`` sampler asked span by span kept them all and dropped only the root."""
    return trace_sampled(trace_id, provider if getattr(tracer, "sampler", None) is None else tracer)


_warned: list[str] = []  # the tracer types already warned about (once a process)


def _not_one_tree(tracer: Any) -> None:
    """Say once that a tracer that is not the SDK's cannot take raysaga's span ids: each span's
    parent is a derived id no span of that tracer has, so the run is no single tree."""
    kind = type(tracer).__qualname__
    if kind in _warned:
        return
    _warned.append(kind)
    log.warning("tracing: the tracer provider's tracer (%s) is not the OpenTelemetry SDK's (it has no id_generator), "
                "so raysaga cannot give its spans their ids: a run's spans will not form one tree (their parents "
                "are missing). Configure an opentelemetry.sdk.trace.TracerProvider (raysaga.configure_tracing or "
                "the global provider) to get one trace per run; see docs/observability.md", kind)


class RunTracing:
    """Turns one driver's committed batches into spans (used from the driver's thread)."""

    def __init__(self, workflow: Workflow | None, run: RunRecord, owner: str, provider: Any, *, epoch: int = 0,
                 since: float | None = None) -> None:
        from opentelemetry import context, trace

        self._api, self._empty = trace, context.Context()
        self.wf, self.run, self.owner = workflow, run, owner
        self.trace_id = trace_id_of(run.trace_id)
        self.tracer = provider.get_tracer("raysaga")
        self.ids: DeterministicIds | None = deterministic(self.tracer)  # None: not the SDK's tracer
        if self.ids is None:
            _not_one_tree(self.tracer)
        self.sampled = sampled(self.tracer, provider, self.trace_id)
        self._started: dict[str, float] = {}  # label -> start of its attempt in flight
        self._first: dict[str, float] = {}  # label -> start of the first attempt seen
        self._waiting: dict[str, tuple[float, str]] = {}  # label -> (since, "human" | "timer")
        self._attempt: dict[str, int] = {}  # label -> its latest attempt (agent nodes, turns)
        self._tool_uses: dict[str, list[tuple[str, str]]] = {}  # turn label -> (tool, call id)s
        self._failed = False  # a span failed to record (said once in the log)
        self.epoch, self._since = epoch, since  # the drive epoch (operator retries) and when it began
        self._fanned: set[str] = set()  # steps with item rows (fan-outs, when there is no workflow)

    # ------------------------------------------------------------------ what the driver tells

    def restored(self, snap: RunSnapshot, outputs: Mapping[str, Any], replay: bool = True) -> None:
        """Learn the rows a resume starts from; mark the model turns it replays from the store
        (``replay=False``: none, nothing will replay them)."""
        status = {NodeKey.parse(n.node_id, n.fan_index): n.status for n in snap.nodes}
        now = time.time()
        for n in snap.nodes:
            key = NodeKey.parse(n.node_id, n.fan_index)
            self._seen(key, n.status, n.attempt, n.started_at, n.not_before, now)
            if key.kind != NodeKind.TURN or n.status != NodeStatus.COMPLETED:
                continue
            output = outputs.get(n.output_digest) if n.output_digest else n.output
            self._tool_uses[key.label] = attrs_of.tool_uses(output)
            if replay and status.get(key.owner) not in _ENDED:  # its agent goes on: this answer is replayed
                self._emit(self._turn_name(key), self._sid("replay", key.label, self.owner),
                           self._owner_attempt(key), now, now,
                           {**self._where(key, n.attempt), **attrs_of.model_turn(output, self._model(key), None,
                                                                                 replayed=True)})

    def committed(self, batch: Batch, record: RunRecord | None) -> None:
        if record is not None:
            self.run = record
        now = time.time()
        effects = {(e.node_id, e.fan_index): e for e in batch.effects}
        for row in batch.node_writes():
            self._row(row, batch.blobs, effects, now)
        if batch.run is not None and batch.run.status in _RUN_ENDS:
            self._run_span(now)

    # ------------------------------------------------------------------ rows to spans

    def _seen(self, key: NodeKey, status: NodeStatus, attempt: int, started: float | None,
              not_before: float | None, now: float) -> None:
        label = key.label
        if attempt:
            self._attempt[label] = attempt
        if started is not None and self._since is not None:  # rows of an earlier epoch (items done
            started = max(started, self._since)  # before an operator's retry) start no span of this one
        if key.kind == NodeKind.ITEM:
            self._fanned.add(key.step)
            if started is not None:  # a fan-out's span starts with its first item, whatever rows it had
                self._first[key.step] = min(self._first.get(key.step, started), started)  # (inline: an
                # item's first row is its outcome; after a resume the fan-out's own row, seen first, may be later)
        if status in (NodeStatus.RUNNING, NodeStatus.WAITING, NodeStatus.RETRYING) and started is not None:
            self._first[label] = min(self._first.get(label, started), started)
            if status != NodeStatus.RETRYING:
                self._started[label] = started
        if status == NodeStatus.WAITING:
            self._waiting.setdefault(label, (started or now, "timer" if not_before else "human"))

    def _row(self, row: NodeWrite, blobs: Mapping[str, bytes], effects: Mapping[tuple[str, int], Any],
             now: float) -> None:
        key = NodeKey.parse(row.node_id, row.fan_index)
        label, status = key.label, row.status
        self._seen(key, status, row.attempt, row.started_at, row.not_before, now)
        if status not in _OUTCOMES and status != NodeStatus.SKIPPED:
            return
        end = row.finished_at or now
        start = row.started_at or self._started.pop(label, None) or end
        self._started.pop(label, None)
        waited = self._waiting.pop(label, None)
        if waited is not None:  # it ends when the work after it began, else with its row (a decision, a timer)
            over = start if row.started_at is not None and row.started_at > waited[0] else end
            self._emit(f"wait {key.step}", self._sid("wait", label, row.attempt),
                       self._node_span(key.owner), waited[0], max(waited[0], over),
                       {**self._where(key, row.attempt), "raysaga.wait.kind": waited[1]})
        attrs = self._where(key, row.attempt)
        error = attrs_of.error_type(row.error) if status not in (NodeStatus.COMPLETED, NodeStatus.SKIPPED) else None
        effect = effects.get((row.node_id, row.fan_index))
        if effect is not None:
            attrs["raysaga.effect.key"], attrs["raysaga.effect.status"] = effect.idempotency_key, str(effect.status)
        kind = key.kind
        if kind == NodeKind.TURN:
            output = self._value(row, blobs)
            if status == NodeStatus.COMPLETED:
                self._tool_uses[label] = attrs_of.tool_uses(output)
            attrs.update(attrs_of.model_turn(output, self._model(key), self._cost(key, output)))
            self._emit(self._turn_name(key), self._sid("turn", label, row.attempt or 1),
                       self._owner_attempt(key), start, end, attrs, error)
        elif kind == NodeKind.TOOL_CALL:
            turn = NodeKey(key.step, key.fan_index, key.turn).label
            asked = self._tool_uses.get(turn, [])
            name, call_id = asked[key.call] if key.call is not None and key.call < len(asked) else ("", "")
            result = self._value(row, blobs)
            attrs.update(attrs_of.tool_call(name, call_id, result))
            self._emit(f"execute_tool {name}".rstrip(), self._sid("tool", label, row.attempt),
                       self._sid("turn", turn, self._attempt.get(turn, 1)), start, end, attrs,
                       error or attrs.get("error.type"))
        elif kind == NodeKind.COMPENSATION:
            self._emit(f"compensate {key.step}", self._sid("compensate", label, row.attempt),
                       self._node_span(key.owner), start, end, attrs, error)
        else:
            self._step_row(key, row, start, end, attrs, error)

    def _step_row(self, key: NodeKey, row: NodeWrite, start: float, end: float, attrs: dict[str, Any],
                  error: str | None) -> None:
        label, status = key.label, row.status
        spec = self.wf.steps.get(key.step) if self.wf is not None else None
        fan_out_parent = key.fan_index < 0 and (key.step in self._fanned if spec is None else spec.map_over is not None)
        if status != NodeStatus.SKIPPED and not fan_out_parent:
            self._emit(f"attempt {key.step}", self._sid("attempt", label, row.attempt), self._node_span(key),
                       start, end, attrs, error)
        if status == NodeStatus.RETRYING and row.not_before:
            self._emit(f"backoff {key.step}", self._sid("backoff", label, row.attempt), self._node_span(key),
                       end, max(end, row.not_before), {**attrs, "raysaga.wait.kind": "backoff"})
        if status in _ENDED or status == NodeStatus.SKIPPED:
            parent = self._sid("node", key.step) if key.fan_index >= 0 else self._run_id_of(self.epoch)
            node_attrs = {**attrs, "raysaga.node.status": str(status)}
            node_attrs.pop("raysaga.attempt", None)
            self._emit(f"node {key.step}", self._node_span(key), parent, min(self._first.pop(label, start), start),
                       end, node_attrs, error)

    def _run_span(self, now: float) -> None:
        run = self.run
        attrs = {"raysaga.run.id": run.run_id, "raysaga.workflow.name": run.workflow_name,
                 "raysaga.workflow.version": run.workflow_version, "raysaga.run.status": str(run.status),
                 "raysaga.run.tokens_used": run.tokens_used, "raysaga.run.cost_usd": run.cost_used}
        if run.parent_run_id:
            attrs["raysaga.run.parent_run_id"] = run.parent_run_id
        parent = None
        if self.epoch:  # an operator's retry: under the run span its park wrote
            attrs["raysaga.run.retry"] = self.epoch
            parent = self._run_id_of(self.epoch - 1)
        failed = None if run.status == "completed" else (run.status_reason or str(run.status))
        start = run.created_at if self._since is None else self._since
        self._emit(f"run {run.workflow_name}", self._run_id_of(self.epoch), parent, start, max(start, now), attrs,
                   failed)

    # ------------------------------------------------------------------ helpers

    def _emit(self, name: str, sid: int, parent: int | None, start: float, end: float, attrs: dict[str, Any],
              error: str | None = None) -> None:
        if not self.sampled:  # the provider's sampler dropped this run's trace: none of its spans
            return
        api = self._api
        ctx = self._empty
        if parent is not None:
            ctx = api.set_span_in_context(api.NonRecordingSpan(api.SpanContext(
                self.trace_id, parent, is_remote=True, trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED))), ctx)
        if self.ids is not None:
            self.ids.use(self.trace_id, sid)
        try:
            span = self.tracer.start_span(name, context=ctx, attributes=attrs, start_time=int(start * 1e9))
            if error:
                span.set_status(api.Status(api.StatusCode.ERROR, error))
            span.end(end_time=int(max(start, end) * 1e9))
        except Exception as exc:  # the application's span processor or exporter: never the run's failure
            if not self._failed:  # it raised out of the driver after a commit: the run stayed running
                log.warning("run %s: a span could not be recorded, its tracer raised (%s: %s); the run goes on",
                            self.run.run_id, type(exc).__name__, message_of(exc))
            self._failed = True

    def _where(self, key: NodeKey, attempt: int) -> dict[str, Any]:
        return {"raysaga.run.id": self.run.run_id, "raysaga.node": key.label, "raysaga.step": key.step,
                "raysaga.fan_index": key.fan_index, "raysaga.attempt": attempt}

    def _sid(self, *parts: object) -> int:
        """The id of the span of ``parts`` in this drive epoch (epoch 0: the ids a run never
        retried has always had)."""
        return span_id(self.run.run_id, *parts, *((f"epoch {self.epoch}",) if self.epoch else ()))

    def _run_id_of(self, epoch: int) -> int:
        return span_id(self.run.run_id, "run", *((f"epoch {epoch}",) if epoch else ()))

    def _node_span(self, key: NodeKey) -> int:
        return self._sid("node", key.label)

    def _owner_attempt(self, key: NodeKey) -> int:
        owner = key.owner.label
        return self._sid("attempt", owner, self._attempt.get(owner, 1))

    def _agent(self, key: NodeKey) -> Any:
        spec = self.wf.steps.get(key.step) if self.wf is not None else None
        return None if spec is None else spec.options.get("agent")

    def _model(self, key: NodeKey) -> str | None:
        agent = self._agent(key)
        name = getattr(getattr(agent, "model", None), "name", None)
        return str(name) if name else None

    def _turn_name(self, key: NodeKey) -> str:
        model = self._model(key)
        return f"chat {model}" if model else "chat"

    def _cost(self, key: NodeKey, response: Any) -> float | None:
        agent = self._agent(key)
        if agent is None or not isinstance(response, dict) or not isinstance(response.get("usage"), dict):
            return None
        try:
            return float(agent.model.cost(Usage.model_validate(response["usage"])))
        except Exception:  # a model without prices, a usage it cannot read: no cost attribute
            return None

    @staticmethod
    def _value(row: NodeWrite, blobs: Mapping[str, bytes]) -> Any:
        if row.output_digest is None:
            return row.output
        raw = blobs.get(row.output_digest)
        return None if raw is None else json.loads(raw)

"""Deterministic OpenTelemetry ids: the same span gets the same id in every process.

A run's trace id is the run's own ``trace_id`` (stored when the run is created, handed to every
step as ``StepContext.trace_id``), and a span id is a hash of what the span is about: ``("attempt",
"pay", 2)`` names attempt 2 of node ``pay`` in any process on any machine. So the spans a killed
driver exported and the spans of the driver that resumed the run join in one trace, a child
exported before its parent still finds it, and a span emitted twice would show up as one id twice
(the test for "no duplicate span" relies on that).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from typing import Any

__all__ = ["DeterministicIds", "deterministic", "new_trace_id", "span_id", "step_span_context", "trace_id_of",
           "trace_sampled"]


def new_trace_id() -> str:
    """A new run's trace id: 128 random bits as 32 hex digits, never zero. Not a ``uuid4``: its low
    64 bits start with the variant bits ``10`` (always >= 2**63), and OpenTelemetry's
    ``TraceIdRatioBased`` samples on those bits, so at a ratio of 0.5 or less it kept no run at all."""
    while True:
        text = secrets.token_hex(16)
        if int(text, 16):
            return text


def trace_sampled(trace_id: int, provider: Any = None) -> bool:
    """Whether ``provider``'s sampler (OpenTelemetry's global provider by default) keeps the trace
    ``trace_id``, asked as for its root span (an empty context, not the caller's current span).
    A ratio sampler decides on the trace id alone, so every process agrees; True without a sampler
    or when it fails (the application's sampler failing is not a reason to drop a run's trace)."""
    try:
        from opentelemetry import context, trace

        provider = provider if provider is not None else trace.get_tracer_provider()
        sampler = getattr(provider, "sampler", None)
        if sampler is None or not callable(getattr(sampler, "should_sample", None)):
            return True
        return bool(sampler.should_sample(context.Context(), trace_id, "run").decision.is_sampled())
    except Exception:
        return True


def trace_id_of(run_trace_id: str) -> int:
    """The OTel trace id of a run: its stored 32-hex ``trace_id`` (any other text is hashed)."""
    try:
        value = int(run_trace_id, 16)
    except ValueError:
        value = 0
    if len(run_trace_id) != 32 or value == 0:
        value = int.from_bytes(hashlib.blake2b(run_trace_id.encode(), digest_size=16).digest(), "big") or 1
    return value


def span_id(run_id: str, *parts: object) -> int:
    """A 64-bit, never-zero span id for ``parts`` (what the span is) within ``run_id``."""
    text = "\x1f".join([run_id, *(str(p) for p in parts)])
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") or 1


def step_span_context(run_id: str, run_trace_id: str, node_label: str, attempt: int, epoch: int = 0) -> Any:
    """The attempt span of a step as an OTel ``SpanContext``, so a step's own spans can nest
    under the attempt that runs them (``trace.set_span_in_context(NonRecordingSpan(...))``);
    ``epoch``: the run's drive epoch (``raysaga.orchestrator.tracing.drive_epoch``)."""
    from opentelemetry.trace import SpanContext, TraceFlags

    parts: tuple[object, ...] = ("attempt", node_label, attempt, *((f"epoch {epoch}",) if epoch else ()))
    trace_id = trace_id_of(run_trace_id)  # sampled as raysaga's own spans are (``trace_sampled``): the
    flags = TraceFlags(TraceFlags.SAMPLED if trace_sampled(trace_id) else TraceFlags.DEFAULT)  # step's spans
    return SpanContext(trace_id, span_id(run_id, *parts), is_remote=True, trace_flags=flags)  # go with the run's


class DeterministicIds:
    """An SDK ``IdGenerator`` that hands out the ids its caller set just before ``start_span``.

    The SDK shares one tracer per instrumentation scope in a process, and asks its generator for a
    span id (and, for a root span, a trace id) inside ``start_span``. A worker drives several runs
    at once, one per thread, so the ids are set per thread (``use``) and taken by the next span
    that thread starts; a span started by anyone else gets the SDK's random ids (``fallback``).
    """

    def __init__(self, fallback: Any) -> None:
        self.fallback = fallback
        self._local = threading.local()

    def use(self, trace_id: int, span_id: int) -> None:
        self._local.ids = (trace_id, span_id)

    def generate_span_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        if ids is None:
            return int(self.fallback.generate_span_id())
        self._local.ids = None
        return int(ids[1])

    def generate_trace_id(self) -> int:
        ids = getattr(self._local, "ids", None)
        return int(self.fallback.generate_trace_id()) if ids is None else int(ids[0])

    def is_trace_id_random(self) -> bool:
        return getattr(self._local, "ids", None) is None and bool(self.fallback.is_trace_id_random())


_install = threading.Lock()


def deterministic(tracer: Any) -> DeterministicIds | None:
    """Make ``tracer`` (an SDK tracer, shared by the process) take its ids from a
    ``DeterministicIds``, once; None for a tracer that is not the SDK's (its ids stay its own)."""
    with _install:
        current = getattr(tracer, "id_generator", None)
        if current is None:
            return None
        if not isinstance(current, DeterministicIds):
            current = tracer.id_generator = DeterministicIds(current)
        return current

"""Spans a test reads back: from this process's in-memory exporter, or from a file a killed driver
process wrote them to (the one exporter that outlives a SIGKILL: a line per span, flushed as it ends).

``RAYSAGA_TEST_SPANS=<path>`` makes a driver script of the tests (``agent_flows``) install the file
exporter; ``read_file`` and ``from_memory`` give both kinds as the same plain ``Span`` records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

ENV = "RAYSAGA_TEST_SPANS"


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: int
    span_id: int
    parent_id: int | None
    attributes: dict[str, Any]
    status: str
    start_ns: int
    end_ns: int
    source: str  # "memory", or the file it was read from


@contextmanager
def in_memory_spans() -> Iterator[InMemorySpanExporter]:
    """raysaga's spans, for the ``with`` block, to an in-memory exporter (its provider shut down after)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import raysaga

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    raysaga.configure_tracing(provider)
    try:
        yield exporter
    finally:
        raysaga.configure_tracing(None)
        provider.shutdown()


def install_from_env() -> None:
    """In a driver process: send raysaga's spans to the file ``RAYSAGA_TEST_SPANS`` names, if set."""
    path = os.environ.get(ENV)
    if not path:
        return
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor

    import raysaga

    out = open(path, "a", encoding="utf-8")  # noqa: SIM115 (open for the process's life: a SIGKILL ends it)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter(
        out=out, formatter=lambda span: span.to_json(indent=None) + "\n")))
    raysaga.configure_tracing(provider)


def _hex(text: str | None) -> int | None:
    return None if text is None else int(text, 16)


def read_file(path: Path) -> list[Span]:
    spans = []
    for line in path.read_text(encoding="utf-8").splitlines():
        data = json.loads(line)
        start, end = data["start_time"], data["end_time"]
        spans.append(Span(name=data["name"], trace_id=int(data["context"]["trace_id"], 16),
                          span_id=int(data["context"]["span_id"], 16), parent_id=_hex(data.get("parent_id")),
                          attributes=dict(data.get("attributes") or {}), status=data["status"]["status_code"],
                          start_ns=_iso_ns(start), end_ns=_iso_ns(end), source=str(path)))
    return spans


def _iso_ns(text: str) -> int:
    from datetime import datetime

    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    return int(stamp.timestamp() * 1e9)


def from_memory(readable: Any) -> list[Span]:
    """``InMemorySpanExporter.get_finished_spans()`` as ``Span`` records."""
    return [Span(name=s.name, trace_id=s.context.trace_id, span_id=s.context.span_id,
                 parent_id=s.parent.span_id if s.parent is not None else None,
                 attributes=dict(s.attributes or {}), status=s.status.status_code.name,
                 start_ns=s.start_time, end_ns=s.end_time, source="memory") for s in readable]

"""``/metrics``: the store's figures in the Prometheus text format (0.0.4), written by hand (a few
gauges and counters need no client library). Each scrape costs a handful of GROUP BY queries."""

from __future__ import annotations

import time
from typing import Any

from raysaga.state import RunStatus, Store

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def render(store: Store, live_streams: int = 0, now: float | None = None) -> str:
    """The exposition text: runs by state, retries, failures, ledger rows by status (duplicates
    prevented are the committed rows a resume found instead of calling again: counted by the
    engine's events), open breakers, and how long runs have been waiting (p50/p95/max)."""
    figures: dict[str, Any] = store.store_metrics()
    now = time.time() if now is None else now
    lines: list[str] = []

    def family(name: str, kind: str, text: str) -> None:
        lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])

    family("raysaga_runs", "gauge", "Runs in the store by state.")
    runs = figures["runs"]
    known = [s.value for s in RunStatus]
    for name in known + sorted(set(runs) - set(known)):
        lines.append(f'raysaga_runs{{status="{_label(name)}"}} {runs.get(name, 0)}')
    family("raysaga_events_total", "counter", "Events of these kinds in the event log (retries, failures, ...).")
    for kind, n in sorted(figures["events"].items()):
        lines.append(f'raysaga_events_total{{kind="{_label(kind)}"}} {n}')
    family("raysaga_retries_total", "counter", "Attempts retried after a transient failure.")
    lines.append(f"raysaga_retries_total {figures['events'].get('retry_scheduled', 0)}")
    family("raysaga_effects", "gauge", "Idempotency ledger rows by status.")
    for status in ("pending", "committed", "failed"):
        lines.append(f'raysaga_effects{{status="{status}"}} {figures["effects"].get(status, 0)}')
    family("raysaga_breakers_open", "gauge", "Circuit breakers not closed (open or half-open).")
    lines.append(f"raysaga_breakers_open {figures['open_breakers']}")
    waits = [max(0.0, now - t) for t in figures["waiting_since"]]
    family("raysaga_waiting_seconds", "gauge", "How long runs waiting (human, timer, paused) have waited.")
    for q in (0.5, 0.95):
        lines.append(f'raysaga_waiting_seconds{{quantile="{q}"}} {_quantile(waits, q):.3f}')
    lines.append(f'raysaga_waiting_seconds{{quantile="1"}} {max(waits, default=0.0):.3f}')
    family("raysaga_dashboard_streams", "gauge", "Live streams (server-sent events) this dashboard serves.")
    lines.append(f"raysaga_dashboard_streams {live_streams}")
    return "\n".join(lines) + "\n"


__all__ = ["CONTENT_TYPE", "render"]

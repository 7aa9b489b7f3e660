"""``/metrics``: the store's figures in the Prometheus text format (0.0.4), written by hand (a few
gauges need no client library). One scrape is ``Store.stats`` (the figures ``raysaga stats``
prints) and two GROUP BY queries of the dashboard's own (``Store.store_metrics``)."""

from __future__ import annotations

from raysaga.state import RunStatus, Store

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(store: Store, live_streams: int = 0) -> str:
    """The exposition text: runs by state, time waiting for a human (p50/p95), duplicates
    prevented, retries, breakers open, resumes, counted events, ledger rows by status."""
    stats = store.stats()
    extra = store.store_metrics()
    lines: list[str] = []

    def gauge(name: str, text: str, samples: list[tuple[str, float | int | None]], kind: str = "gauge") -> None:
        lines.extend([f"# HELP {name} {text}", f"# TYPE {name} {kind}"])
        for labels, value in samples:
            if value is not None:
                lines.append(f"{name}{labels} {value}")

    runs = stats.runs_by_state
    known = [s.value for s in RunStatus]
    gauge("raysaga_runs", "Runs in the store by state.",
          [(f'{{status="{_label(n)}"}}', runs.get(n, 0)) for n in known + sorted(set(runs) - set(known))])
    waits = stats.waiting_human_seconds
    gauge("raysaga_waiting_human_seconds", "How long runs waited for a human (finished waits, and ongoing ones "
          "up to now).", [('{quantile="0.5"}', waits.p50), ('{quantile="0.95"}', waits.p95)], "summary")
    lines.append(f"raysaga_waiting_human_seconds_count {waits.count}")
    gauge("raysaga_duplicates_prevented_total", "Effects served from the ledger instead of called again.",
          [("", stats.duplicates_prevented)], "counter")
    gauge("raysaga_retries_total", "Attempts retried after a transient failure.", [("", stats.retries)], "counter")
    gauge("raysaga_breakers_open", "Circuit breakers open now.", [("", stats.breaker_trips)])
    gauge("raysaga_resumes_total", "Claims of a run after its first (crash, hand-back, wake-up).",
          [("", stats.resumes)], "counter")
    gauge("raysaga_resume_success_ratio", "Of the runs resumed and now at rest, the share that completed.",
          [("", stats.resume_success_rate)])
    gauge("raysaga_events_total", "Events of these kinds in the event log.",
          [(f'{{kind="{_label(k)}"}}', n) for k, n in sorted(extra["events"].items())], "counter")
    gauge("raysaga_effects", "Idempotency ledger rows by status.",
          [(f'{{status="{s}"}}', extra["effects"].get(s, 0)) for s in ("pending", "committed", "failed")])
    gauge("raysaga_dashboard_streams", "Live streams (server-sent events) this dashboard serves.",
          [("", live_streams)])
    return "\n".join(lines) + "\n"


__all__ = ["CONTENT_TYPE", "render"]

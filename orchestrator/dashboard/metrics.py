"""``/metrics``: the store's figures in the Prometheus text format (0.0.4), written by hand (a few
gauges need no client library). Every figure is a gauge: each is read from the rows the store
holds, which ``raysaga prune`` deletes, so none is a counter (one that goes down reads as a
reset). One scrape is ``Store.stats`` (the figures ``raysaga stats`` prints) and two GROUP BY
queries of the dashboard's own (``Store.store_metrics``)."""

from __future__ import annotations

from raysaga.state import EffectStatus, Store
from raysaga.state.stats import HELD, label_value, prometheus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def render(store: Store, live_streams: int = 0) -> str:
    """The exposition text: the store's figures (``raysaga.state.stats.prometheus``: runs by state,
    waits for humans, claim latency, duplicates prevented, retries, breakers, resumes), then the
    dashboard's own: counted events, ledger rows by status (each ``EffectStatus``, and any other
    status a row holds, as ``raysaga_runs`` lists run states), live streams."""
    extra = store.store_metrics()
    lines: list[str] = [prometheus(store.stats()).rstrip("\n")]

    def gauge(name: str, text: str, samples: list[tuple[str, float | int | None]]) -> None:
        lines.extend([f"# HELP {name} {text}", f"# TYPE {name} gauge"])
        for labels, value in samples:
            if value is not None:
                lines.append(f"{name}{labels} {value}")

    # a gauge: ``raysaga prune`` deletes its runs' events (a counter going down read as a reset)
    gauge("raysaga_events", f"Events of these kinds in the event log{HELD}.",
          [(f'{{kind="{label_value(k)}"}}', n) for k, n in sorted(extra["events"].items())])
    # every status a ledger row can have (0 when none has it), then any other found in the store
    known = [s.value for s in EffectStatus]
    ledger = known + sorted(set(extra["effects"]) - set(known))
    gauge("raysaga_effects", "Idempotency ledger rows by status.",
          [(f'{{status="{label_value(s)}"}}', extra["effects"].get(s, 0)) for s in ledger])
    gauge("raysaga_dashboard_streams", "Live streams (server-sent events) this dashboard serves.",
          [("", live_streams)])
    return "\n".join(lines) + "\n"


__all__ = ["CONTENT_TYPE", "render"]

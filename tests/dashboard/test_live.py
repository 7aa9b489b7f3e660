"""Live updates: server-sent events from the event log with a (run_id, seq) cursor. A change sends
the events, the rows they name and the fan-outs' new counts, never the DAG again; a reconnect
(``Last-Event-ID`` or ``?after=``) catches up from its cursor. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx

from raysaga import Client
from raysaga.state import SqlStore
from tests.support import dashboard_flows as flows
from tests.support.dashboard_serving import serving


def changes(base: str, run_id: str, *, after: int | None = None, last_id: int | None = None,
            timeout: float = 30.0) -> Iterator[tuple[int, dict[str, Any], int]]:
    """(id, change, bytes on the wire) of each ``change`` message of a run's stream."""
    url = f"{base}/api/runs/{run_id}/stream" + ("" if after is None else f"?after={after}")
    headers = {} if last_id is None else {"Last-Event-ID": str(last_id)}
    with httpx.stream("GET", url, headers=headers, timeout=timeout) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        size = 0
        for line in response.iter_lines():
            size += len(line.encode()) + 1
            if line.startswith(":"):
                continue
            if line:
                key, _, value = line.partition(":")
                fields[key] = value.removeprefix(" ")
                continue
            if fields.get("event") == "change":
                yield int(fields["id"]), json.loads(fields["data"]), size
            fields, size = {}, 0


def test_a_stream_resumes_from_its_cursor(demo: tuple[SqlStore, dict[str, str]]) -> None:
    store, runs = demo
    shop = runs["shop"]
    last = store.get_run(shop).event_seq
    with serving(store) as base:
        seq, change, _ = next(changes(base, shop, after=5))
        assert seq == last and [e["seq"] for e in change["events"]] == list(range(6, last + 1))
        assert {n["node"] for n in change["nodes"]} >= {"ship", "charge:compensate", "reserve:compensate"}
        assert "graph" not in change and "steps" not in change  # the change, never the DAG again
        seq, change, _ = next(changes(base, shop, last_id=8))  # a browser's reconnect
        assert [e["seq"] for e in change["events"]] == list(range(9, last + 1))
        # at the head of the log: the next event to come is the first thing sent
        refund = runs["refund"]
        head = store.get_run(refund).event_seq
        stream = changes(base, refund, after=head)
        got: list[tuple[int, dict[str, Any], int]] = []
        reader = threading.Thread(target=lambda: got.append(next(stream)))
        reader.start()
        Client(store).pause(refund, by="carol")
        reader.join(30)
        [(seq, change, _)] = got
        # a pause of a run no driver holds takes the run's lease, then pauses it: the stream sends
        # the first of those events first (the pause may come in the same change or the next)
        kinds = [e["kind"] for e in change["events"]]
        assert kinds in (["lease_claimed"], ["lease_claimed", "run_paused"]) and seq == head + len(kinds)
        assert change["events"][0]["seq"] == head + 1
        assert store.get_run(refund).status.value == "paused"
        Client(store).unpause(refund, by="carol")


def test_node_states_stream_while_a_run_advances(store_url: str) -> None:
    run_id = flows.start(flows.gated, "gated", {"items": 3}, store_url)
    store = SqlStore(store_url)
    workers: list[threading.Thread] = []

    def later(target: Any, *args: Any) -> None:
        workers.append(threading.Thread(target=target, args=args, daemon=True))
        workers[-1].start()

    try:
        with serving(store) as base:
            seen: dict[str, str] = {}
            counts: dict[str, dict[str, int]] = {}
            sizes: list[tuple[int, int]] = []
            later(flows.drive, flows.gated, run_id, store_url)  # runs until the approval, then rests
            for _, change, size in changes(base, run_id, after=0):
                sizes.append((len(change["nodes"]), size))
                seen.update({n["node"]: n["status"] for n in change["nodes"]})
                counts.update(change["counts"])
                kinds = [e["kind"] for e in change["events"]]
                if "run_waiting_human" in kinds:
                    assert counts["fetch"] == {"completed": 3} and seen["gate"] == "waiting"
                    later(flows.approve_and_resume, flows.gated, run_id, "gate", store_url)
                if "run_completed" in kinds:
                    break
            assert seen["gate"] == "completed" and seen["report"] == "completed"
            assert all(seen[f"fetch[{i}]"] == "completed" for i in range(3))
            # a change costs its nodes, not the run's: about 0.5 KB per node on the wire (docs/dashboard.md)
            assert all(size < 1200 + 600 * nodes for nodes, size in sizes), sizes
    finally:
        for worker in workers:
            worker.join(30)
        store.close()

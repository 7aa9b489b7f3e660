"""The dashboard's JSON API over a real store: the run list, a run's page, a node's panel, values
on demand, /metrics, and no secret anywhere."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient

from raysaga.orchestrator.dashboard.server import build
from raysaga.state import SqlStore
from tests.support import dashboard_flows as flows

BASE = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def client(demo: tuple[SqlStore, dict[str, str]]) -> TestClient:
    app, _ = build(demo[0])
    return TestClient(app, base_url=BASE)


def get(client: TestClient, url: str) -> Any:
    response = client.get(url)
    assert response.status_code == 200, response.text
    assert flows.LEAKY not in response.text  # secrets never shown, whatever a step returned
    return response.json()


def test_run_list_filters_counts_and_pages(client: TestClient, demo: tuple[SqlStore, dict[str, str]]) -> None:
    _, runs = demo
    page = get(client, "/api/runs")
    assert {r["run_id"] for r in page["runs"]} == set(runs.values())
    assert page["counts"] == {"completed": 3, "compensated": 1, "waiting_human": 1}
    assert [r["run_id"] for r in get(client, "/api/runs?status=compensated")["runs"]] == [runs["shop"]]
    assert [r["run_id"] for r in get(client, "/api/runs?workflow=wide")["runs"]] == [runs["wide"]]
    assert [r["run_id"] for r in get(client, "/api/runs?q=CARRIER")["runs"]] == [runs["shop"]]  # the reason
    assert get(client, "/api/runs?since=2999-01-01")["runs"] == []
    assert len(get(client, "/api/runs?until=2999-01-01T00:00")["runs"]) == len(runs)
    assert client.get("/api/runs?since=yesterday").status_code == 400
    seen: list[str] = []
    cursor = ""
    while True:  # keyset paging, two at a time, newest first
        page = get(client, f"/api/runs?limit=2&before={cursor}")
        seen += [r["run_id"] for r in page["runs"]]
        if page["next"] is None:
            break
        cursor = page["next"]
    assert sorted(seen) == sorted(runs.values()) and len(seen) == len(set(seen))
    figures = get(client, "/api/stats")
    assert figures["runs_by_state"]["completed"] == 3 and figures["retries"] == 0
    [waiting] = get(client, "/api/inbox")["waiting"]
    assert (waiting["run_id"], waiting["node"], waiting["prompt"]) == (runs["refund"], "review", "Refund 40?")
    assert get(client, "/api/inbox?approver=bob")["waiting"] == [waiting]  # bob may decide it
    assert get(client, "/api/inbox?approver=mallory")["waiting"] == []


def test_run_page_draws_the_workflows_graph_with_states(client: TestClient,
                                                        demo: tuple[SqlStore, dict[str, str]]) -> None:
    _, runs = demo
    doc = get(client, f"/api/runs/{runs['gated']}")
    graph = doc["graph"]
    assert graph["source"] == "workflow"
    assert [n["id"] for n in graph["nodes"]] == ["plan", "fetch", "gate", "report"]
    assert sorted(map(tuple, graph["edges"])) == [("fetch", "gate"), ("gate", "report"), ("plan", "fetch"),
                                                  ("plan", "report")]
    assert next(n for n in graph["nodes"] if n["id"] == "fetch")["map_over"] == "plan"
    steps = doc["steps"]
    assert steps["fetch"]["counts"] == {"completed": 4} and len(steps["fetch"]["items"]) == 4
    assert steps["gate"]["row"]["status"] == "completed"
    assert doc["cursor"] == doc["run"]["event_seq"] > 0
    assert doc["run"]["output"] == {"value": {"report": {"items": 4, "approved_by": ["alice"], "token": "[redacted]"}}}


def test_wide_fan_out_is_counted_and_its_items_paged(client: TestClient,
                                                     demo: tuple[SqlStore, dict[str, str]]) -> None:
    _, runs = demo
    doc = get(client, f"/api/runs/{runs['wide']}")
    assert doc["steps"]["square"]["counts"] == {"completed": 40}
    assert len(doc["steps"]["square"]["items"]) == 24  # the first ITEMS_SHOWN; the rest on demand
    first = get(client, f"/api/runs/{runs['wide']}/items/square?limit=30")
    assert [i["index"] for i in first["items"]] == list(range(30)) and first["next"] == 29
    rest = get(client, f"/api/runs/{runs['wide']}/items/square?after=29&limit=30")
    assert [i["index"] for i in rest["items"]] == list(range(30, 40)) and rest["next"] is None


def test_node_panel_ledger_compensation_and_agent_turns(client: TestClient,
                                                        demo: tuple[SqlStore, dict[str, str]]) -> None:
    _, runs = demo
    charge = get(client, f"/api/runs/{runs['shop']}/nodes/charge")
    assert charge["row"]["status"] == "completed"
    assert [(e["effect"], e["status"]) for e in charge["effects"]] == [("charge", "committed"),
                                                                       ("charge:compensate", "committed")]
    assert [c["node"] for c in charge["compensation"]] == ["charge:compensate"]
    ship = get(client, f"/api/runs/{runs['shop']}/nodes/ship")
    assert ship["error"]["type"] == "Permanent" and "carrier refused" in ship["error"]["message"]
    assert [a["kind"] for a in ship["attempts"]] == ["node_failed"]
    agent = get(client, f"/api/runs/{runs['helper']}/nodes/restock")
    turns = {t["node"]: t for t in agent["turns"]}
    assert list(turns) == ["restock@0", "restock@0.0", "restock@1", "restock@1.0", "restock@2"]
    assert turns["restock@0"]["stop_reason"] == "tool_use" and turns["restock@0"]["input_tokens"] == 10
    assert [u["name"] for u in turns["restock@1"]["tool_uses"]] == ["order"]
    assert turns["restock@2"]["stop_reason"] == "end_turn"
    assert [e["effect"] for e in agent["effects"]] == ["tool:order"]
    review = get(client, f"/api/runs/{runs['refund']}/nodes/review")
    assert review["row"]["status"] == "waiting"
    assert review["output"]["value"]["approval"]["answer_schema"]["required"] == ["amount"]
    assert client.get(f"/api/runs/{runs['shop']}/nodes/nope").status_code == 404  # no such node (stop 49)
    assert client.get("/api/runs/nope/nodes/x").status_code == 404
    assert client.get("/api/runs/nope").status_code == 404


def test_large_output_is_a_preview_then_fetched_whole(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'big.db'}"
    big = {"rows": ["x" * 100] * 2000, "token": flows.LEAKY}  # ~200 KB: kept as a blob by digest
    run_id = flows.start(flows.wide, "wide", {"items": 1}, url)
    store = SqlStore(url)
    try:
        from raysaga.state.models import Batch, NodeStatus, NodeWrite

        lease = store.claim(run_id, "test", 30)
        digest, data = _blob(big)
        store.commit(lease, Batch(nodes=[NodeWrite(node_id="split", status=NodeStatus.COMPLETED, attempt=1,
                                                   output_digest=digest)], blobs={digest: data}))
        client = TestClient(build(store)[0], base_url=BASE)
        panel = get(client, f"/api/runs/{run_id}/nodes/split")
        assert panel["output"] == {"digest": digest}
        whole = get(client, f"/api/runs/{run_id}/nodes/split/output")["value"]
        assert whole["rows"] == big["rows"] and whole["token"] == "[redacted]"
    finally:
        store.close()


def _blob(value: Any) -> tuple[str, bytes]:
    import hashlib

    data = json.dumps(value).encode()
    return "sha256:" + hashlib.sha256(data).hexdigest(), data


def test_metrics_are_prometheus_text(client: TestClient, demo: tuple[SqlStore, dict[str, str]]) -> None:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain; version=0.0.4")
    lines = response.text.splitlines()
    assert 'raysaga_runs{status="completed"} 3' in lines
    assert 'raysaga_runs{status="waiting_human"} 1' in lines
    assert 'raysaga_effects{status="committed"} 7' in lines
    assert "raysaga_retries 0" in lines
    assert any(line.startswith('raysaga_waiting_human_seconds{quantile="0.95"}') for line in lines)
    assert "# TYPE raysaga_duplicates_prevented gauge" in lines


def test_a_fan_out_in_flight_counts_its_items_without_rows(tmp_path: Any) -> None:
    """Items in flight have no row yet: the fan-out counts them pending (from its expansion), and a
    step whose inputs are complete is drawn in flight."""
    from raysaga.orchestrator.run_views import run_graph, step_views
    from raysaga.state.models import Batch, NewEvent, NodeStatus, NodeWrite, RunStatus, RunUpdate

    url = f"sqlite:///{tmp_path / 'flight.db'}"
    run_id = flows.start(flows.wide, "wide", {"items": 5}, url)
    store = SqlStore(url)
    try:
        lease = store.claim(run_id, "test", 30)
        done = [NodeWrite(node_id="square", fan_index=i, status=NodeStatus.COMPLETED, attempt=1, output=i * i)
                for i in (0, 1)]
        store.commit(lease, Batch(
            nodes=[NodeWrite(node_id="split", status=NodeStatus.COMPLETED, attempt=1, output=[0, 1, 2, 3, 4]), *done],
            events=[NewEvent(kind="fanout_expanded", node_id="square", data={"items": 5})],
            run=RunUpdate(status=RunStatus.RUNNING)))
        client = TestClient(build(store)[0], base_url=BASE)
        assert get(client, f"/api/runs/{run_id}")["steps"]["square"]["counts"] == {"completed": 2, "pending": 3}
        run = store.get_run(run_id)
        views = {v.step: v.state for v in step_views(store, run_id, run_graph(store, run), running=True)}
        assert views == {"split": "completed", "square": "running", "total": "pending"}
    finally:
        store.close()


def test_run_list_reads_on_sqlite_and_postgresql(store_url: str) -> None:
    """The list's filters and keyset paging are plain SQL on both dialects; a search for ``%`` or
    ``_`` means those characters, not wildcards. (The PostgreSQL database is the session's: every
    query is narrowed to this test's runs by their unique prefix.)"""
    import uuid

    tag = "t" + uuid.uuid4().hex[:8]
    ids = [f"{tag}-alpha-1", f"{tag}-beta_50%", f"{tag}-beta-2", f"{tag}-gamma-3"]
    for run_id in ids:
        flows.start(flows.wide, "wide", {"items": 1}, store_url, run_id=run_id)
    flows.start(flows.shop, "shop", {}, store_url, run_id=f"{tag}-shop-1")
    store = SqlStore(store_url)
    try:
        client = TestClient(build(store)[0], base_url=BASE)

        def ids_for(query: str) -> list[str]:
            return [r["run_id"] for r in get(client, f"/api/runs?{query}")["runs"]]

        assert ids_for(f"q={tag.upper()}-BETA") == [f"{tag}-beta-2", f"{tag}-beta_50%"]
        assert ids_for(f"q={tag}-beta_50%25") == [f"{tag}-beta_50%"]
        assert ids_for(f"q={tag}-a_1") == []  # '_' is not a wildcard
        page = get(client, f"/api/runs?q={tag}&workflow=wide&limit=3")
        assert len(page["runs"]) == 3 and page["counts"] == {"pending": 4}
        rest = get(client, f"/api/runs?q={tag}&workflow=wide&limit=3&before={page['next']}")
        assert {r["run_id"] for r in page["runs"] + rest["runs"]} == set(ids) and rest["next"] is None
        assert get(client, f"/api/runs?q={tag}&status=pending")["counts"] == {"pending": 5}
    finally:
        store.close()


def test_actions_are_the_clients_and_name_the_actor(tmp_path: Any) -> None:
    """Each action needs confirming, is done through raysaga.Client as the actor the page names,
    and leaves an event saying who."""
    url = f"sqlite:///{tmp_path / 'act.db'}"
    store = SqlStore(url)
    try:
        app, guard = build(store)
        client = TestClient(app, base_url=BASE)
        csrf = {"X-Raysaga-CSRF": guard.csrf}

        def act(run_id: str, verb: str, **body: Any) -> Any:
            return client.post(f"/api/runs/{run_id}/actions/{verb}", json=body, headers=csrf)

        paused = flows.start(flows.refund, "refund", {"amount": 5}, url)
        flows.drive(flows.refund, paused, url)
        assert act(paused, "pause", by="dave").status_code == 400  # not confirmed: nothing done
        assert act(paused, "pause", confirm=True, by="dave").json()["status"] == "paused"
        assert act(paused, "unpause", confirm=True, by="dave").status_code == 200
        assert "only a failed run can be retried" in act(paused, "retry", confirm=True).json()["error"]
        assert act(paused, "jump", confirm=True).status_code == 400
        rejected = act(paused, "reject", confirm=True, by="bob", node="review", comment="no")
        assert rejected.status_code == 200 and rejected.json()["decision"]["by"] == "bob"
        refused = act(paused, "approve", confirm=True, by="mallory", node="review")
        assert refused.status_code == 400 and "mallory may not decide" in refused.json()["error"]
        kinds = {e.kind: e.data for e in store.events(paused)}
        assert kinds["run_paused"]["by"] == "dave" and kinds["decision"]["by"] == "bob"
        cancelled = flows.start(flows.refund, "refund", {"amount": 6}, url)
        flows.drive(flows.refund, cancelled, url)
        assert act(cancelled, "cancel", confirm=True, by="erin").json()["status"] == "cancelled"
        assert store.get_run(cancelled).status_reason == "cancelled by erin"
        assert act("nope", "cancel", confirm=True).status_code == 404
    finally:
        store.close()


def test_a_run_without_its_workflows_module_is_drawn_from_its_rows(tmp_path: Any) -> None:
    from raysaga.orchestrator.runner import create_run

    url = f"sqlite:///{tmp_path / 'noref.db'}"
    run_id = create_run(flows.shop, {}, store=url, workflow_ref="").run_id  # "": record none
    flows.drive(flows.shop, run_id, url)
    store = SqlStore(url)
    try:
        client = TestClient(build(store)[0], base_url=BASE)
        graph = get(client, f"/api/runs/{run_id}")["graph"]
        assert graph["source"] == "rows" and graph["edges"] == [] and "does not record" in graph["note"]
        assert [n["id"] for n in graph["nodes"]] == ["reserve", "charge", "ship"]  # in the order they started
    finally:
        store.close()


def test_lineage_of_a_forked_run(tmp_path: Any) -> None:
    """A fork's page names its parent and the node it was forked from; the parent's page lists its
    forks; an inherited node's row says where it was run (docs/fork.md)."""
    import raysaga
    from raysaga import Workflow

    wf = Workflow("lineage")

    @wf.step()
    def first() -> int:
        return 1

    @wf.step()
    def second(first: int) -> int:
        return first + 1

    url = f"sqlite:///{tmp_path / 'lineage.db'}"
    parent = raysaga.run(wf, None, store=url, executor="inline", run_id="parent-1")
    raysaga.fork(wf, parent.run_id, from_node="second", store=url, new_run_id="fork-1", executor="inline")
    store = SqlStore(url)
    try:
        app, _ = build(store)
        lineage = TestClient(app, base_url=BASE)
        forked = get(lineage, "/api/runs/fork-1")
        assert (forked["run"]["parent_run_id"], forked["run"]["forked_from"]) == ("parent-1", "second")
        rows = {r["node"]: r for r in forked["rows"]}
        assert rows["first"]["inherited_from"] == "parent-1" and rows["second"]["inherited_from"] is None
        assert get(lineage, "/api/runs/parent-1")["run"]["children"] == [
            {"run_id": "fork-1", "status": "completed", "forked_from": "second"}]
    finally:
        store.close()

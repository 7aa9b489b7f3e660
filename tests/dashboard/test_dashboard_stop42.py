"""Stop 42: a waiting approval whose request blob is missing (a store restored without its blobs,
a pruning gone wrong) made the node's panel a bare 500, and the whole output read one too. The
panel now shows the rest of the node and says why there is no form; the output read says which
blob is missing. A mapped agent of more than 24 items had its turns undercounted."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from raysaga import Workflow
from raysaga.agents import Agent, tool
from raysaga.agents.models import ScriptedModel, text_reply, tool_reply
from raysaga.orchestrator.dashboard import views
from raysaga.orchestrator.dashboard.server import build
from raysaga.state import SqlStore
from tests.dashboard.test_dashboard_review_stop41 import BASE, _run, bigask, request_as_blob


def test_a_waiting_approval_whose_request_blob_is_gone_still_shows_its_panel(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _run(bigask, "bigask", url, "noblob")
    store = SqlStore(url)
    try:
        digest = request_as_blob(store, run_id)  # the request kept as a blob...
        with sqlite3.connect(tmp_path / "raysaga.db") as db:  # ...and that blob lost
            assert db.execute("DELETE FROM raysaga_blobs WHERE digest = ?", (digest,)).rowcount == 1
        app, _ = build(store)
        client = TestClient(app, base_url=BASE, raise_server_exceptions=False)
        answer = client.get(f"/api/runs/{run_id}/nodes/gate")
        assert answer.status_code == 200, answer.text
        doc = answer.json()
        assert doc["row"]["status"] == "waiting" and doc["output"] == {"digest": digest}
        assert doc["approval"] is None
        assert digest[:12] in doc["approval_error"] and "cannot be read" in doc["approval_error"]
        whole = client.get(f"/api/runs/{run_id}/nodes/gate/output")
        assert whole.status_code == 500 and digest[:12] in whole.json()["error"], whole.text
    finally:
        store.close()


# ---------------------------------------------------------------- a mapped agent of more than ITEMS_SHOWN items

ITEMS = views.ITEMS_SHOWN + 6


@tool
def size42(sku: str) -> str:
    """How big a product is."""
    return f"{sku}: 3 kg"


many = Workflow("many_agents42", version="1")


@many.step()
def skus(input: dict[str, Any]) -> list[str]:
    return [f"S{i}" for i in range(ITEMS)]


@many.agent(Agent(name="sizer", model=ScriptedModel(default=(
    tool_reply(("size42", {"sku": "S"})), text_reply("3 kg."))), system="You size things.", tools=(size42,)),
    map_over="skus")
def measure(skus: str) -> str:
    return f"size {skus}"


def test_a_mapped_agent_of_many_items_counts_every_item_s_turns(tmp_path: Path) -> None:
    """The page counted the turns of the rows it first read: the first 24 items' of each turn
    number. 30 items of 2 turns and 1 tool call each said "48 turns"; the server counts them all,
    on load and in each live change that touches the agent."""
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _run(many, "many", url, "many42")
    store = SqlStore(url)
    try:
        app, _ = build(store)
        client = TestClient(app, base_url=BASE, raise_server_exceptions=False)
        doc = client.get(f"/api/runs/{run_id}").json()
        assert doc["run"]["status"] == "completed"
        measure_step = doc["steps"]["measure"]
        assert (measure_step["turns"], measure_step["calls"]) == (2 * ITEMS, ITEMS), measure_step
        last_turn = max(e.seq for e in store.events(run_id, limit=10_000) if e.node_id and "@" in e.node_id)
        _, change = views.live_change(store, run_id, last_turn - 1)
        assert change is not None and change["agents"] == {"measure": {"turns": 2 * ITEMS, "calls": ITEMS}}
    finally:
        store.close()

"""Stop 41, a review of the dashboard: a waiting approval whose payload is above the preview size
had no Approve/Reject form; after Retry or Cancel from the page the live view kept the old node
states until reload; a mapped agent's turns were counted per turn number, not per item, and from
zero rather than from the loaded count; every action was a 403 once ``raysaga dashboard``
restarted under an open page; a fan-out's label left its pending items out.

The browser tests use Debian's ``/usr/bin/chromium`` (skipped without it, unless
``RAYSAGA_REQUIRE_BROWSER=1``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fastapi.testclient import TestClient
from pydantic import BaseModel

import raysaga
from raysaga import Approval, Ask, Permanent, Workflow
from raysaga.agents import Agent, tool
from raysaga.agents.models import ScriptedModel, text_reply, tool_reply
from raysaga.orchestrator.dashboard import views
from raysaga.orchestrator.dashboard.server import build
from raysaga.orchestrator.runner import create_run
from raysaga.state import Batch, NodeStatus, NodeWrite, SqlStore, jsoncodec
from tests.support import dashboard_flows as flows
from tests.support.browser import TIMEOUT_MS, checked_page, require_chromium
from tests.support.dashboard_serving import free_port, serving

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Dialog, Page

BASE = "http://127.0.0.1:8765"
MODULE = "tests.dashboard.test_dashboard_review_stop41"
BIG = 20_000  # bytes of payload: above views.PREVIEW_BYTES

# ---------------------------------------------------------------- workflows


class Edit(BaseModel):
    amount: int


bigask = Workflow("bigask41", version="1")


@bigask.step()
def prep(input: dict[str, Any]) -> dict[str, Any]:
    return {"amount": 5, "blob": "x" * int(input.get("size", BIG))}


@bigask.approval(approvers=["alice"], answer=Edit)
def gate(prep: dict[str, Any]) -> Ask:
    return Ask(prompt="Pay 5 to ACME?", payload=prep)


@bigask.step()
def pay(gate: Approval) -> int:
    return int(gate.answer["amount"]) if gate.answer else 5


patchy = Workflow("patchy41", version="1")


@patchy.step()
def seed(input: dict[str, Any]) -> list[int]:
    return list(range(30))


@patchy.map("seed")
def work(seed: int) -> int:
    if seed % 10 == 7:
        raise Permanent(f"item {seed} is bad")
    return seed * 2


@patchy.step()
def total(work: list[int]) -> int:
    return sum(work)


@tool(requires_approval=True)
def lookup41(sku: str) -> str:
    """Look a product up (a human allows each call)."""
    return f"{sku}: 12 in stock"


agents = Workflow("agents41", version="1")


@agents.step()
def topics(input: dict[str, Any]) -> list[str]:
    return ["A1", "B2"]


@agents.agent(Agent(name="researcher", model=ScriptedModel(default=(
    tool_reply(("lookup41", {"sku": "A1"})), text_reply("A1 is in stock."))), system="You look things up.",
    tools=(lookup41,)), map_over="topics")
def research(topics: str) -> str:
    return f"look up {topics}"


def _run(wf: Workflow, name: str, url: str, run_id: str, input: Any = None) -> str:
    """Record a run of ``wf`` (``name`` in this module) and drive it until it rests."""
    create_run(wf, input or {}, store=url, run_id=run_id, workflow_ref=f"{MODULE}:{name}")
    raysaga.resume(wf, run_id, store=url, executor="inline")
    return run_id


def _client(store: SqlStore) -> tuple[TestClient, str]:
    app, guard = build(store)
    return TestClient(app, base_url=BASE, raise_server_exceptions=False), guard.csrf


# ---------------------------------------------------------------- 1. an approval's form, whatever its payload


def request_as_blob(store: SqlStore, run_id: str) -> str:
    """Keep the waiting approval ``gate``'s request as a blob (its row: only the digest), as a large
    output is kept; returns the digest."""
    row = store.node_row(run_id, "gate", -1)
    assert row is not None and str(row["status"]) == "waiting"
    data = jsoncodec.dumps(row["output"]).encode()
    digest = jsoncodec.digest(data)
    lease = store.claim(run_id, "test-blob", 10)
    store.commit(lease, Batch(blobs={digest: data}, nodes=[NodeWrite(
        node_id="gate", fan_index=-1, status=NodeStatus.WAITING, attempt=0, output=None, output_digest=digest,
        started_at=row["started_at"])]))
    store.release(lease)
    return digest


def test_a_waiting_approval_kept_as_a_blob_sends_its_request_for_the_form(tmp_path: Path) -> None:
    """The page built its form from the output's value: a blob (only its digest sent) or an output
    above the preview size (a preview) left no Approve/Reject. The request comes in its own key."""
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _run(bigask, "bigask", url, "blobbed")
    store = SqlStore(url)
    try:
        digest = request_as_blob(store, run_id)
        client, _ = _client(store)
        doc = client.get(f"/api/runs/{run_id}/nodes/gate").json()
        assert doc["output"] == {"digest": digest}
        form = doc["approval"]
        assert form["prompt"] == "Pay 5 to ACME?" and form["approvers"] == ["alice"] and form["takes_answer"]
        assert form["answer_schema"]["properties"]["amount"]["type"] == "integer"
        assert form["prefill"] == {"amount": 5}
        assert set(form["payload"]) == {"preview", "size"} and form["payload"]["size"] > BIG
        assert len(form["payload"]["preview"]) == views.PREVIEW_BYTES
    finally:
        store.close()


# ---------------------------------------------------------------- 2. the live view after a run-level action


def test_a_retry_s_change_holds_the_reset_rows_and_counts(tmp_path: Path) -> None:
    """A retry resets the failed items and skipped steps in one commit whose events name no node:
    the change sent only the run's events, and the page kept them failed."""
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _run(patchy, "patchy", url, "patchy")
    store = SqlStore(url)
    try:
        cursor = store.get_run(run_id).event_seq
        assert views.run_page(store, run_id)["steps"]["work"]["counts"] == {"completed": 27, "failed": 3}
        raysaga.Client(store).retry(run_id, by="ada")
        _, change = views.live_change(store, run_id, cursor)
        assert change is not None and change["full"] is True
        fresh = views.run_page(store, run_id)
        assert change["counts"]["work"] == fresh["steps"]["work"]["counts"] == {"completed": 27, "pending": 3}
        live = {n["node"]: n["status"] for n in change["nodes"]}
        assert live == {r["node"]: r["status"] for r in fresh["rows"]}
        assert live["work[7]"] == "pending"
    finally:
        store.close()


def test_a_cancel_s_change_holds_the_cancelled_gate(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = flows.start(flows.gated, "gated", {"items": 2}, url, run_id="cancelled41")
    flows.drive(flows.gated, run_id, url)
    store = SqlStore(url)
    try:
        cursor = store.get_run(run_id).event_seq
        raysaga.Client(store).cancel(run_id, by="ada")
        _, change = views.live_change(store, run_id, cursor)
        assert change is not None and {n["node"]: n["status"] for n in change["nodes"]}["gate"] == "cancelled"
    finally:
        store.close()


# ---------------------------------------------------------------- 4. the CSRF value after a restart


def test_the_csrf_value_is_read_as_the_page_is_and_a_stale_one_is_named(tmp_path: Path) -> None:
    """`GET /api/csrf` is guarded as the page is: a token, the Host check. A stale value's 403 says
    so (`X-Raysaga-Refused: csrf`): the page asks anew then, and sends once more."""
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        token = "t" * 20
        app, guard = build(store, token=token)
        client = TestClient(app, base_url=BASE, raise_server_exceptions=False)
        assert client.get("/api/csrf").status_code == 401
        assert client.get("/api/csrf", headers={"Authorization": f"Bearer {token}",
                                                "Host": "evil.example"}).status_code == 403
        got = client.get("/api/csrf", headers={"Authorization": f"Bearer {token}"})
        assert got.status_code == 200 and got.json() == {"csrf": guard.csrf}
        auth = {"Authorization": f"Bearer {token}"}
        stale = client.post("/api/runs/r/actions/pause", json={"confirm": True},
                            headers={**auth, "X-Raysaga-CSRF": "from-an-earlier-process"})
        assert stale.status_code == 403 and stale.headers["X-Raysaga-Refused"] == "csrf", stale.text
        foreign = client.post("/api/runs/r/actions/pause", json={"confirm": True},
                              headers={**auth, "X-Raysaga-CSRF": guard.csrf, "Origin": "http://evil.example"})
        assert foreign.status_code == 403 and foreign.headers["X-Raysaga-Refused"] == "origin", foreign.text
    finally:
        store.close()


# ---------------------------------------------------------------- the page (headless Chromium)


@pytest.fixture
def page(request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page of the module's Chromium that accepts every confirmation and records every dialog."""
    require_chromium()

    def answer(dialog: Dialog) -> None:
        DIALOGS.append((dialog.type, dialog.message))
        dialog.accept()

    DIALOGS.clear()
    with checked_page(request.getfixturevalue("browser"), answer) as pg:
        yield pg


DIALOGS: list[tuple[str, str]] = []
DAG_STATES = "gs => gs.map(g => [g.dataset.node, g.dataset.state, g.querySelector('.sub').textContent])"


def _browser(page: Page) -> Browser:
    browser = page.context.browser
    assert browser is not None
    return browser


def _fresh_dag(browser: Browser, base: str, run_id: str) -> list[list[str]]:
    """The DAG (step, state, subline) a page opened now draws."""
    from playwright.sync_api import expect

    context = browser.new_context()
    try:
        fresh = context.new_page()
        fresh.goto(f"{base}/#/runs/{run_id}")
        expect(fresh.locator("#live")).to_have_text("● live", timeout=TIMEOUT_MS)
        states: list[list[str]] = fresh.locator("svg.dag g.node").evaluate_all(DAG_STATES)
        return states
    finally:
        context.close()


def _shows(page: Page, dag: list[list[str]]) -> None:
    """The page draws ``dag``: each step's state and subline, as a page opened afresh does."""
    from playwright.sync_api import expect

    for step, state, sub in dag:
        node = page.locator(f'svg.dag g.node[data-node="{step}"]')
        expect(node).to_have_attribute("data-state", state)
        expect(node.locator(".sub")).to_have_text(sub)


def test_an_approval_with_a_large_payload_is_decided_from_its_form(page: Page, tmp_path: Path) -> None:
    """With a payload above 16 KB the panel showed neither Approve nor Reject."""
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _run(bigask, "bigask", url, "big41")
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/{run_id}?node=gate")
            panel = page.locator("#panel")
            expect(panel.locator(".prompt")).to_have_text("Pay 5 to ACME?")
            expect(panel.locator("text=may decide: alice")).to_be_visible()
            amount = panel.locator('input[name="amount"]')
            expect(amount).to_have_value("5")  # pre-filled from the payload
            panel.locator("button.load").click()  # the payload whole, on demand
            expect(panel.locator("button.load")).to_have_count(0)
            loaded = panel.locator("pre", has_text='"blob"').first.text_content()
            assert loaded is not None and loaded.count("x") == BIG and '"approval"' not in loaded
            amount.fill("7")
            page.locator("#actor").fill("alice")  # the only approver
            panel.locator("button.approve").click()
            expect(page.locator("#run-head .reason")).to_contain_text("gate approved by alice")
        assert flows.drive(bigask, run_id, url).output == {"pay": 7}  # approved with the edit
    finally:
        store.close()


def test_retry_from_the_page_shows_the_reset_nodes_live(page: Page, tmp_path: Path) -> None:
    """After Retry the run said running while its failed items and skipped step stayed so until
    the page was reloaded; a fan-out's label left the pending items out."""
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _run(patchy, "patchy", url, "patchy-page")
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/{run_id}")
            expect(page.locator("#live")).to_have_text("● live")
            expect(page.locator('svg.dag g.node[data-node="work"] .sub')).to_have_text("30 items ✓27 ✗3")
            page.locator("button[data-verb=retry]").click()
            expect(page.locator("#live")).to_have_text("Retry: sent")
            dag = _fresh_dag(_browser(page), base, run_id)
            # nobody drives the retried run until a worker or a resume takes it up (stop 49): pending
            assert ["work", "pending", "30 items ✓27 ○3"] in dag and ["total", "pending", ""] in dag, dag
            _shows(page, dag)
    finally:
        store.close()


def test_cancel_from_the_page_shows_the_gate_cancelled_live(page: Page, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = flows.start(flows.gated, "gated", {"items": 2}, url, run_id="gated-page")
    flows.drive(flows.gated, run_id, url)
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/{run_id}")
            expect(page.locator("#live")).to_have_text("● live")
            page.locator("button[data-verb=cancel]").click()
            expect(page.locator("#live")).to_have_text("Cancel: sent")
            dag = _fresh_dag(_browser(page), base, run_id)
            assert ["gate", "cancelled", ""] in dag, dag
            _shows(page, dag)
    finally:
        store.close()


def test_a_mapped_agent_s_turns_count_every_item_from_the_loaded_count(page: Page, tmp_path: Path) -> None:
    """Counted by node id (`research@1`, every item's alike) and from zero: two items of two turns
    each showed "2 turns" live, where a reload said 4."""
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _run(agents, "agents", url, "agents41")  # each item's first turn asks for its tool call
    store = SqlStore(url)
    try:
        waiting = store.waiting_approvals(run_id=run_id)
        assert len(waiting) == 2, waiting
        with serving(store) as base:
            page.goto(f"{base}/#/runs/{run_id}")
            expect(page.locator("#live")).to_have_text("● live")
            research = page.locator('svg.dag g.node[data-node="research"] .sub')
            expect(research).to_contain_text("2 turns")
            with raysaga.Client(store) as client:
                for w in waiting:
                    client.approve(run_id, w.node, fan_index=w.fan_index, by="ada")
            assert raysaga.resume(agents, run_id, store=url, executor="inline").status.value == "completed"
            dag = _fresh_dag(_browser(page), base, run_id)
            assert any(step == "research" and "4 turns" in sub for step, _, sub in dag), dag
            _shows(page, dag)
    finally:
        store.close()


def test_an_open_page_acts_after_the_dashboard_restarts(page: Page, tmp_path: Path) -> None:
    """The CSRF value is the process's, written into the page: after a restart the page's stream
    reconnected and said live, and every action was a 403."""
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = flows.start(flows.gated, "gated", {"items": 2}, url, run_id="restarted")
    flows.drive(flows.gated, run_id, url)
    store = SqlStore(url)
    port = free_port()
    try:
        with serving(store, port=port) as base:
            page.goto(f"{base}/#/runs/{run_id}")
            expect(page.locator("#live")).to_have_text("● live")
            before = page.locator('meta[name="raysaga-csrf"]').get_attribute("content")
        expect(page.locator("#live")).to_have_text("reconnecting…")
        with serving(store, port=port):
            expect(page.locator("#live")).to_have_text("● live")  # the same page, its stream back
            assert page.locator('meta[name="raysaga-csrf"]').get_attribute("content") == before
            page.locator("button[data-verb=pause]").click()
            expect(page.locator("#run-head .badge").first).to_contain_text("paused")
        assert store.get_run(run_id).status.value == "paused"
        assert [kind for kind, _ in DIALOGS] == ["confirm"], DIALOGS  # no alert of a 403
    finally:
        store.close()

"""Stop 38, an adversarial review of the dashboard: steps named like a JavaScript object's members
(``constructor``, ``toString``, ``__proto__``) broke the whole run page; malformed node labels were
a 500 with a traceback; a run deleted (or replaced under the same id) while its page was open kept
showing live; control characters in an action's text were recorded; a failed run's page offered
actions its state refuses; an unknown run was answered three different ways.

The browser tests use Debian's ``/usr/bin/chromium`` (skipped without it, unless
``RAYSAGA_REQUIRE_BROWSER=1``).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

import httpx
import pytest
from fastapi.testclient import TestClient

import raysaga
from raysaga import Permanent, Workflow
from raysaga.orchestrator.dashboard import app as dashboard_app
from raysaga.orchestrator.dashboard.server import build
from raysaga.orchestrator.runner import create_run
from raysaga.state import SqlStore
from tests.support import dashboard_flows as flows
from tests.support.dashboard_serving import serving

if TYPE_CHECKING:
    from playwright.sync_api import Page

BASE = "http://127.0.0.1:8765"
MODULE = "tests.dashboard.test_dashboard_review_stop38"

# ---------------------------------------------------------------- workflows (valid raysaga names)

proto = Workflow("proto38", version="1")


def _constructor(input: dict[str, Any]) -> list[int]:
    return list(range(int(input["items"])))


def _proto(constructor: int) -> int:
    return constructor * 2


def _to_string(__proto__: list[int]) -> int:
    return sum(__proto__)


def _value_of(toString: int, constructor: list[int]) -> str:
    return f"{toString}/{len(constructor)}"


_constructor.__name__, _proto.__name__, _to_string.__name__, _value_of.__name__ = (
    "constructor", "__proto__", "toString", "valueOf")
proto.step()(_constructor)
proto.map("constructor")(_proto)  # a fan-out named __proto__
proto.step()(_to_string)
proto.step()(_value_of)
PROTO_STEPS = ["constructor", "__proto__", "toString", "valueOf"]

broken = Workflow("broken38", version="1")


@broken.step()
def doomed(input: dict[str, Any]) -> int:
    raise Permanent("no such account")


def _app(store: SqlStore) -> tuple[TestClient, str]:
    app, guard = build(store)
    return TestClient(app, base_url=BASE, raise_server_exceptions=False), guard.csrf


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str, str, SqlStore]]:
    """(client, CSRF value, run id, store): a `gated` run waiting at its approval `gate`."""
    url = f"sqlite:///{tmp_path_factory.mktemp('gated38') / 'raysaga.db'}"
    run_id = flows.start(flows.gated, "gated", {"items": 3}, url, run_id="g38")
    flows.drive(flows.gated, run_id, url)
    store = SqlStore(url)
    client, csrf = _app(store)
    yield client, csrf, run_id, store
    store.close()


# ---------------------------------------------------------------- 2. malformed node labels


@pytest.mark.parametrize("label", ["x@", "@", "a@b", "a@1.2.3", "fetch@", "fetch[³]", "fetch[٣]", "fetch[-1]",
                                   "fetch[99999999999]", "gate:undo", "a]b"])
@pytest.mark.parametrize("tail", ["", "/output"])
def test_a_malformed_node_label_is_a_400_naming_it(gated: tuple[TestClient, str, str, SqlStore], label: str,
                                                   tail: str) -> None:
    """`x@` reached `NodeKey.parse` (`int('')`) and `fetch[³]` `int('³')` (`'³'.isdigit()` holds):
    each a 500 and a traceback in the server's log."""
    client, _, run_id, _ = gated
    response = client.get(f"/api/runs/{run_id}/nodes/{quote(label, safe='')}{tail}")
    assert response.status_code == 400, (label, response.status_code, response.text)
    assert response.json()["error"].startswith(f"node {label!r} is not a node label"), response.text


@pytest.mark.parametrize("label", ["gate[³]", "gate[٣]"])
def test_an_approval_naming_a_malformed_node_is_a_400(gated: tuple[TestClient, str, str, SqlStore],
                                                      label: str) -> None:
    client, csrf, run_id, _ = gated
    response = client.post(f"/api/runs/{run_id}/actions/approve", json={"confirm": True, "by": "ada", "node": label},
                           headers={"X-Raysaga-CSRF": csrf})
    assert response.status_code == 400 and repr(label) in response.json()["error"], response.text


@pytest.mark.parametrize("label", ["plan", "fetch[0]", "gate", "fetch@2", "fetch@2.1", "plan:compensate",
                                   "fetch:compensate[1]", "nope"])
def test_every_label_a_node_can_have_still_opens(gated: tuple[TestClient, str, str, SqlStore], label: str) -> None:
    client, _, run_id, _ = gated
    response = client.get(f"/api/runs/{run_id}/nodes/{quote(label, safe='')}")
    if label in ("plan", "fetch[0]", "gate"):
        assert response.status_code == 200 and response.json()["node"] == label, response.text
    else:  # well-formed, but no node of this run: a 404 naming it (stop 49), never a 400
        assert response.status_code == 404 and f"has no node {label!r}" in response.json()["error"], response.text


# ---------------------------------------------------------------- 4. control characters in an action


@pytest.mark.parametrize(("verb", "body", "field"), [
    ("pause", {"reason": "ok\x1b]0;owned\x07\x1b[2J"}, "reason"),
    ("pause", {"reason": "ok\rFAKE"}, "reason"),
    ("pause", {"reason": {"not": "text"}}, "reason"),
    ("pause", {"reason": "r" * 10_001}, "reason"),
    ("pause", {"reason": "del\x7f"}, "reason"),
    ("cancel", {"reason": "bell\x07"}, "reason"),
    ("approve", {"node": "gate", "comment": "fine\x1b[31m"}, "comment"),
    ("approve", {"node": "gate", "comment": "line\r\nline"}, "comment"),
    ("reject", {"node": "gate", "comment": "c1\x9b"}, "comment"),
    ("approve", {"node": "gate", "decision_id": "id\x1b"}, "decision_id"),
])
def test_control_characters_in_an_action_are_a_400_and_nothing_is_done(
        gated: tuple[TestClient, str, str, SqlStore], verb: str, body: dict[str, Any], field: str) -> None:
    """docs/dashboard.md promised it; only NUL was refused, and ESC, BEL and CR were recorded in the
    run's reason or the decision, from where `raysaga status` and `list` printed them raw."""
    client, csrf, run_id, store = gated
    response = client.post(f"/api/runs/{run_id}/actions/{verb}", json={"confirm": True, "by": "ada", **body},
                           headers={"X-Raysaga-CSRF": csrf})
    assert response.status_code == 400, (body, response.status_code, response.text)
    assert response.json()["error"].startswith(field), response.text
    assert store.get_run(run_id).status.value == "waiting_human"


def test_a_comment_and_a_reason_keep_their_lines_and_tabs_whole(tmp_path: Path) -> None:
    """As `raysaga approve --comment "$(cat review.txt)"` and `cancel --reason` record them:
    newlines and tabs are the text's, and text longer than 2,000 characters is no longer cut short
    silently (the CLI's limit is 10,000)."""
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = flows.start(flows.gated, "gated", {"items": 2}, url)
    flows.drive(flows.gated, run_id, url)
    comment = "looks right:\n\t- totals match\n" + "x" * 3000
    store = SqlStore(url)
    try:
        client, csrf = _app(store)
        response = client.post(f"/api/runs/{run_id}/actions/approve", headers={"X-Raysaga-CSRF": csrf},
                               json={"confirm": True, "by": "ada", "node": "gate", "comment": comment})
        assert response.status_code == 200, response.text
        assert response.json()["decision"]["comment"] == comment
        reason = "stop:\n\tthe totals are off\n" + "y" * 3000
        response = client.post(f"/api/runs/{run_id}/actions/cancel", headers={"X-Raysaga-CSRF": csrf},
                               json={"confirm": True, "by": "ada", "reason": reason})
        assert response.status_code == 200, response.text
        assert store.get_run(run_id).status_reason == reason
    finally:
        store.close()


# ---------------------------------------------------------------- 6. an unknown run, one answer


@pytest.mark.parametrize("path", ["", "/nodes/x", "/nodes/x/output", "/items/x", "/events", "/stream",
                                  "/nodes/x%5B2%5D/output", "/items/x?status=failed"])
def test_an_unknown_run_is_a_404_in_one_shape_everywhere(gated: tuple[TestClient, str, str, SqlStore],
                                                         path: str) -> None:
    """`/items` answered 200 with no items, `/nodes/N/output` 400, `/events` and `/stream` a 404
    with `{"detail": ...}` where every other refusal says `{"error": ...}`."""
    client = gated[0]
    response = client.get(f"/api/runs/nope38{path}")
    assert response.status_code == 404, (path, response.status_code, response.text)
    assert response.json() == {"error": "no run with id 'nope38': `raysaga list` shows the runs in this store"}


def test_a_route_that_does_not_exist_answers_in_the_same_shape(gated: tuple[TestClient, str, str, SqlStore]) -> None:
    response = gated[0].get("/api/runs/g38/nodes/gate/bogus")
    assert response.status_code == 404 and set(response.json()) == {"error"}, response.text


# ---------------------------------------------------------------- 3. the stream of a deleted or replaced run


class Stream:
    """A run's server-sent events read in a thread: (event, id, data) of each message."""

    def __init__(self, base: str, run_id: str, after: int) -> None:
        self.messages: list[tuple[str, str, dict[str, Any]]] = []
        self.opened = threading.Event()  # the server answered 200: the run was read, its identity kept
        self.ended = threading.Event()
        self.url = f"{base}/api/runs/{quote(run_id, safe='')}/stream?after={after}"
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        try:
            with httpx.stream("GET", self.url, timeout=30) as response:
                assert response.status_code == 200, response.status_code
                self.opened.set()
                fields: dict[str, str] = {}
                for line in response.iter_lines():
                    if line.startswith(":"):
                        continue
                    if line:
                        key, _, value = line.partition(":")
                        fields[key] = value.removeprefix(" ")
                    elif "data" in fields:
                        data = json.loads(fields["data"])
                        self.messages.append((fields.get("event", ""), fields.get("id", ""), data))
                        fields = {}
        except httpx.RemoteProtocolError:  # the server stopped at the test's end, the stream open
            pass
        finally:
            self.ended.set()

    def gone(self) -> dict[str, Any] | None:
        return next((data for event, _, data in self.messages if event == "gone"), None)


def _completed(url: str, run_id: str, name: str = "wide") -> int:
    """Run the flow ``name`` (of ``tests.support.dashboard_flows``) to rest as ``run_id``; its last event's seq."""
    wf = getattr(flows, name)
    flows.drive(wf, flows.start(wf, name, {"items": 2, "sku": "A1"}, url, run_id=run_id), url)
    with raysaga.Client(url) as client:
        return client.get_run(run_id).event_seq


def test_the_stream_of_a_deleted_run_says_so_and_ends(tmp_path: Path) -> None:
    """It polled the event log of a run no longer there forever: the page showed it live."""
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    seq = _completed(url, "nightly")
    store = SqlStore(url)
    try:
        with serving(store) as base:
            stream = Stream(base, "nightly", seq)
            assert stream.opened.wait(10), stream.messages
            assert store.prune(older_than=0).runs == 1
            assert stream.ended.wait(10), stream.messages
            assert stream.gone() == {"run_id": "nightly", "reason": "deleted", "message": "run 'nightly' was deleted"}
    finally:
        store.close()


def test_a_new_run_under_the_same_id_is_said_not_missed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A new run's event seqs restart at 1: the stream's cursor, past them, waited for events it
    never sent, then sent the new run's later events as if the old run went on."""
    monkeypatch.setattr(dashboard_app, "IDENTITY_SECONDS", 3600.0)  # only a change can tell here
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    seq = _completed(url, "nightly")
    store = SqlStore(url)
    try:
        with serving(store) as base:
            stream = Stream(base, "nightly", seq)
            assert stream.opened.wait(10), stream.messages
            store.prune(older_than=0)
            assert _completed(url, "nightly", "shop") > seq  # the new run's events pass the old cursor
            assert stream.ended.wait(10), stream.messages
            assert [e for e, _, _ in stream.messages] == ["gone"], stream.messages
            gone = stream.gone()
            assert gone is not None and gone["reason"] == "replaced", gone
    finally:
        store.close()


def test_a_cursor_past_the_run_s_last_event_is_another_run_s(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    seq = _completed(url, "nightly")
    store = SqlStore(url)
    try:
        with serving(store) as base:
            stream = Stream(base, "nightly", seq + 5)
            assert stream.ended.wait(10), stream.messages
            gone = stream.gone()
            assert gone is not None and gone["reason"] == "replaced", gone
            live = Stream(base, "nightly", seq)  # the run's own cursor: it stays open, quiet
            assert live.opened.wait(10)
            assert not live.ended.wait(1.5) and live.messages == []
    finally:
        store.close()


# ---------------------------------------------------------------- the page (headless Chromium)


def test_steps_named_like_object_members_draw_and_go_live(page: Page, tmp_path: Path) -> None:
    """`constructor`, `toString`, `valueOf` and a fan-out `__proto__` are valid step names: dagre's
    plain objects and `doc.steps[step]` read Object.prototype's members for them, and the page drew
    no DAG, no Gantt, and never opened its stream."""
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = create_run(proto, {"items": 3}, store=url, run_id="proto-1", workflow_ref=f"{MODULE}:proto").run_id
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/{run_id}")
            nodes = page.locator("svg.dag g.node")
            expect(nodes).to_have_count(len(PROTO_STEPS))
            assert sorted(nodes.evaluate_all("gs => gs.map(g => g.dataset.node)")) == sorted(PROTO_STEPS)
            expect(page.locator("svg.dag path.edge")).to_have_count(4)
            expect(page.locator("#live")).to_have_text("● live")
            raysaga.resume(proto, run_id, store=url, executor="inline")  # the page watches it advance
            for step in PROTO_STEPS:
                expect(page.locator(f'svg.dag g.node[data-node="{step}"]')).to_have_attribute("data-state",
                                                                                            "completed")
            expect(page.locator('svg.dag g.node[data-node="__proto__"]')).to_contain_text("3 items")
            expect(page.locator("#gantt svg.gantt")).to_be_visible()
            page.locator('svg.dag g.node[data-node="__proto__"]').click()
            expect(page.locator('#fan .items[data-step="__proto__"] .item')).to_have_count(3)
            expect(page.locator("#panel h2")).to_have_text("__proto__")
    finally:
        store.close()


def test_a_deleted_run_s_page_says_so_then_shows_a_new_run_under_its_id(page: Page, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    _completed(url, "nightly")
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/nightly")
            expect(page.locator("#live")).to_have_text("● live")
            expect(page.locator("svg.dag g.node")).to_have_count(3)
            store.prune(older_than=0)
            expect(page.locator("#live")).to_have_text("✗ run deleted")
            expect(page.locator("#run-gone")).to_contain_text("run 'nightly' was deleted while this page was open")
            expect(page.locator("svg.dag g.node")).to_have_count(0)  # not the old run's states
            flows.start(flows.wide, "wide", {"items": 2}, url, run_id="nightly")  # the page reads again every 5 s
            expect(page.locator("#run-head .badge").first).to_contain_text("pending", timeout=15_000)
            expect(page.locator("#live")).to_have_text("● live")
            expect(page.locator('svg.dag g.node[data-node="split"]')).to_have_attribute("data-state", "pending")
    finally:
        store.close()


def test_a_failed_run_offers_only_what_its_state_accepts(page: Page, tmp_path: Path) -> None:
    """Pause was always refused (400) and Cancel a 200 that changed nothing."""
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = create_run(broken, {}, store=url, run_id="failed-38", workflow_ref=f"{MODULE}:broken").run_id
    assert raysaga.resume(broken, run_id, store=url, executor="inline").status.value == "failed"
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/{run_id}")
            expect(page.locator("#run-head .actions button")).to_have_text(["Retry", "Compensate"])
            assert page.locator("#run-head .actions button").evaluate_all(
                "bs => bs.map(b => b.dataset.verb)") == ["retry", "compensate"]
    finally:
        store.close()

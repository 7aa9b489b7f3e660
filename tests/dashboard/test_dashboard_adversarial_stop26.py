"""Stop 26, the dashboard's HTTP API tried as a hostile or careless client would: run ids the CLI
accepts but a URL path splits, numbers the store cannot hold, filters that matched nothing
silently, and paging that stopped early."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient

from raysaga.orchestrator.dashboard.server import build
from raysaga.state import SqlStore
from tests.support import dashboard_flows as flows

BASE = "http://127.0.0.1:8765"
#: Ids `raysaga run --run-id` accepts (printable, 1-200 characters) that a path mangles. (Not
#: "." or "..": a browser, and httpx, resolve such a segment, even encoded, before sending.)
ODD_IDS = ["tenant/42", "a%2Fb", "...", "q?x=1#frag", "ü 🎉 sp ace", "back\\slash", "/lead", "trail/", "a//b"]


@pytest.fixture(scope="module")
def odd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestClient, str]]:
    """(client, the CSRF header value)."""
    # a store with a completed 5-item fan-out under each odd id
    url = f"sqlite:///{tmp_path_factory.mktemp('odd') / 'raysaga.db'}"
    for run_id in ODD_IDS:
        flows.drive(flows.wide, flows.start(flows.wide, "wide", {"items": 5}, url, run_id=run_id), url)
    store = SqlStore(url)
    app, guard = build(store)
    yield TestClient(app, base_url=BASE), guard.csrf
    store.close()


def _get(client: TestClient, url: str) -> Any:
    response = client.get(url)
    assert response.status_code == 200, (url, response.status_code, response.text)
    return response.json()


@pytest.mark.parametrize("run_id", ODD_IDS)
def test_every_run_page_and_its_parts_open_whatever_the_id(odd: tuple[TestClient, str], run_id: str) -> None:
    """The page links a run as `#/runs/` + encodeURIComponent(id) and fetches `/api/runs/` + the
    same: an id holding '/' was split by the router (404 "Not Found"), so such a run could be
    listed but never opened, its nodes never shown, its actions never taken."""
    client, csrf = odd
    enc = quote(run_id, safe="")
    page = _get(client, f"/api/runs/{enc}")
    assert page["run"]["run_id"] == run_id and page["run"]["status"] == "completed"
    assert [e["kind"] for e in _get(client, f"/api/runs/{enc}/events?limit=1")["events"]] == ["run_created"]
    node = _get(client, f"/api/runs/{enc}/nodes/{quote('square[3]', safe='')}")
    assert node["row"]["status"] == "completed" and node["node"] == "square[3]"
    assert _get(client, f"/api/runs/{enc}/nodes/total/output")["value"] == 0 + 1 + 4 + 9 + 16
    assert [i["index"] for i in _get(client, f"/api/runs/{enc}/items/square?limit=10")["items"]] == [0, 1, 2, 3, 4]
    response = client.post(f"/api/runs/{enc}/actions/pause", json={"confirm": True},
                           headers={"X-Raysaga-CSRF": csrf})
    # a completed run is not paused: the refusal names the run, never a routing 404
    assert response.status_code == 400, response.text
    assert repr(run_id) in response.json()["error"], response.text


def test_an_id_that_differs_only_by_encoding_is_another_run(odd: tuple[TestClient, str]) -> None:
    client, _ = odd
    assert _get(client, "/api/runs/a%252Fb")["run"]["run_id"] == "a%2Fb"
    assert _get(client, "/api/runs/tenant%2F42")["run"]["run_id"] == "tenant/42"
    missing = client.get("/api/runs/tenant%252F42")
    assert missing.status_code == 404 and "tenant%2F42" in missing.json()["error"]


@pytest.mark.parametrize(("url", "names"), [
    ("/api/runs/tenant%2F42/events?after=99999999999999999999", "after"),
    ("/api/runs/tenant%2F42/events?after=-99999999999999999999", "after"),
    ("/api/runs/tenant%2F42/items/square?after=99999999999999999999", "after"),
    ("/api/runs/tenant%2F42/stream?after=99999999999999999999", "after"),
    ("/api/runs?since=nan", "since"),
    ("/api/runs?until=NaN", "until"),
    ("/api/runs?since=inf", "since"),
    ("/api/runs?status=bogus", "status"),
    ("/api/runs?before=nan%7Cx", "before"),
])
def test_numbers_and_filters_out_of_range_are_a_400_naming_the_parameter(odd: tuple[TestClient, str], url: str,
                                                                         names: str) -> None:
    """`after` beyond 64 bits was a 500 Internal Server Error (OverflowError in the SQLite driver),
    and a stream given one failed on every poll; `since=nan` and `status=bogus` listed no runs, as
    if there were none."""
    client, _ = odd
    response = client.get(url)
    assert response.status_code == 400, (url, response.status_code, response.text)
    assert response.json()["error"].startswith(names + "="), response.text


def test_a_huge_last_event_id_is_refused_before_the_stream_starts(odd: tuple[TestClient, str]) -> None:
    client, _ = odd
    response = client.get("/api/runs/tenant%2F42/stream", headers={"Last-Event-ID": "9" * 30})
    assert response.status_code == 400 and response.json()["error"].startswith("Last-Event-ID="), response.text


@pytest.fixture(scope="module")
def wide_client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    """A completed run "big" whose fan-out has more items than one page holds (500)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('wide') / 'raysaga.db'}"
    flows.drive(flows.wide, flows.start(flows.wide, "wide", {"items": ITEMS}, url, run_id="big"), url)
    store = SqlStore(url)
    app, _ = build(store)
    yield TestClient(app, base_url=BASE)
    store.close()


ITEMS = 603


@pytest.mark.parametrize("limit", [-1, 0, 7, 1000])
def test_items_page_through_every_item_whatever_the_limit(wide_client: TestClient, limit: int) -> None:
    """`next` compared the rows read with the limit asked for, not the one used: a limit above 500
    (or below 1) made a full page look like the last one, and the items after it were never listed."""
    seen: list[int] = []
    after = -1
    for _ in range(ITEMS + 1):
        page = _get(wide_client, f"/api/runs/big/items/square?after={after}&limit={limit}")
        seen += [i["index"] for i in page["items"]]
        if page["next"] is None:
            break
        after = page["next"]
    assert seen == list(range(ITEMS))


def test_a_run_whose_id_holds_a_slash_opens_in_the_browser(tmp_path_factory: pytest.TempPathFactory) -> None:
    """From the run list, click `tenant/42`: the page draws its DAG live and its node panel (it
    said "404: Not Found" for every request the page made)."""
    import os

    chromium = "/usr/bin/chromium"
    if not os.path.exists(chromium):
        if os.environ.get("RAYSAGA_REQUIRE_BROWSER") == "1":
            raise RuntimeError(f"{chromium} is missing: apt-get install -y chromium")
        pytest.skip(f"{chromium} is missing")
    from playwright.sync_api import expect, sync_playwright

    from tests.support.dashboard_serving import serving

    url = f"sqlite:///{tmp_path_factory.mktemp('browser') / 'raysaga.db'}"
    run_id = "tenant/42 <b>x</b>"
    flows.drive(flows.gated, flows.start(flows.gated, "gated", {"items": 3}, url, run_id=run_id), url)
    store = SqlStore(url)
    errors: list[str] = []
    try:
        with serving(store) as base, sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--headless", "--no-sandbox", "--disable-gpu"])
            try:
                page = browser.new_page()
                page.set_default_timeout(20_000)
                page.on("pageerror", lambda e: errors.append(str(e)))
                page.goto(base + "/")
                page.locator(f'tr[data-run="{run_id}"] a').click()
                expect(page.locator('svg.dag [data-node="gate"]')).to_have_attribute("data-state", "waiting")
                expect(page.locator("#live")).to_have_text("● live")
                page.locator('svg.dag [data-node="plan"]').click()
                expect(page.locator("#panel")).to_contain_text("completed")
                assert "404" not in page.locator("#app").inner_text()
                assert page.locator("#app b").count() == 0  # the id is text, never markup
            finally:
                browser.close()
    finally:
        store.close()
    assert errors == [], errors


@pytest.mark.parametrize("by", [{"x": 1}, ["ada"], 7, "A" * 201, "ada\x1b[2J", "ada\nbob"])
def test_an_action_is_done_as_a_name_never_any_value(odd: tuple[TestClient, str], by: Any) -> None:
    """`by` was recorded as `str(...)` of whatever JSON the request sent, of any size (a dict, a
    list, 100 KB, control characters), in the event naming who acted."""
    client, csrf = odd
    response = client.post(f"/api/runs/{quote('ü 🎉 sp ace', safe='')}/actions/pause", json={"confirm": True, "by": by},
                           headers={"X-Raysaga-CSRF": csrf})
    assert response.status_code == 400 and response.json()["error"].startswith("by="), response.text


EXITS_ON_IMPORT = '''
import argparse

from raysaga import Workflow

wf = Workflow("exits26", version="1")


@wf.step()
def only() -> int:
    return 1


args = argparse.ArgumentParser().parse_args(["--not-an-option"])  # a script's argv parsing, run at import
'''


def test_a_workflow_module_that_exits_on_import_does_not_stop_the_dashboard(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The page imports a run's recorded workflow to draw its graph: a module that parses argv (or
    calls sys.exit) at import raised SystemExit in the request, a 500, and the server process ended
    with it; now the run is drawn from its rows and the page says why."""
    import importlib
    import sys

    from raysaga.orchestrator.runner import create_run

    module = tmp_path / "exits26_flow.py"
    module.write_text(EXITS_ON_IMPORT.replace('args = argparse', '# args = argparse'))
    monkeypatch.syspath_prepend(str(tmp_path))
    wf = importlib.import_module("exits26_flow").wf
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    create_run(wf, None, store=url, run_id="x1", workflow_ref="exits26_flow:wf")
    module.write_text(EXITS_ON_IMPORT)  # as the module reads now, where the dashboard runs
    monkeypatch.delitem(sys.modules, "exits26_flow")
    importlib.invalidate_caches()
    store = SqlStore(url)
    try:
        app, _ = build(store)
        client = TestClient(app, base_url=BASE)
        page = _get(client, "/api/runs/x1")
        assert "sys.exit(2)" in page["graph"]["note"], page["graph"]
        assert _get(client, "/api/runs")["runs"][0]["run_id"] == "x1"
    finally:
        store.close()


@pytest.mark.parametrize(("method", "url", "code", "starts"), [
    ("GET", "/api/runs?q=" + "a" * 60_000, 400, "q= is 60000 characters long"),
    ("GET", "/api/runs?q=a%00b", 400, "q="),
    ("GET", "/api/runs?workflow=%00", 400, "workflow="),
    ("GET", "/api/runs?before=1%7C%00", 400, "before="),
    ("GET", "/api/inbox?approver=%00", 400, "approver="),
    ("GET", "/api/runs/%00", 404, "no run with id"),
    ("GET", "/api/runs/" + "r" * 201, 404, "no run with id"),
    ("GET", "/api/runs/n26/nodes/%00", 400, "node "),
    ("GET", "/api/runs/n26/items/%00", 400, "step "),
    ("GET", "/api/runs/n26/events?after=0", 200, ""),
    ("POST", "/api/runs/n26/actions/pause", 400, "pause: the request holds a NUL"),
])
def test_text_a_store_cannot_hold_is_refused_not_a_500(store_url: str, method: str, url: str, code: int,
                                                       starts: str) -> None:
    """On PostgreSQL a NUL in `q`, `workflow`, `approver`, `before`, a run id or a node label was a
    500 (text cannot hold NUL); on SQLite a `q` above 50,000 characters was one (LIKE pattern too
    complex). Now each is a 400 naming the parameter (an id no run can have: 404)."""
    import uuid

    run_id = f"n26-{uuid.uuid4().hex[:8]}"  # the PostgreSQL database is the session's
    url = url.replace("/n26/", f"/{run_id}/")
    flows.drive(flows.wide, flows.start(flows.wide, "wide", {"items": 2}, store_url, run_id=run_id), store_url)
    store = SqlStore(store_url)
    try:
        app, guard = build(store)
        client = TestClient(app, base_url=BASE, raise_server_exceptions=False)
        if method == "POST":
            response = client.post(url, json={"confirm": True, "by": "ada", "reason": "a\x00b"},
                                   headers={"X-Raysaga-CSRF": guard.csrf})
        else:
            response = client.get(url)
        assert response.status_code == code, (url[:80], response.status_code, response.text[:300])
        if starts:
            assert response.json()["error"].startswith(starts), response.text[:300]
    finally:
        store.close()

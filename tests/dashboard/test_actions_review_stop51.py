"""The dashboard's actions, as a review of them found them (stop 51).

1. An approval's answer holding an integer beyond 2^53 (an account number) was pre-filled rounded
   by the browser's JSON and approved so: the run sent to another account. Refused in the page.
2. *Cancel and compensate* that a plain cancel reached first answered ok; the run ended cancelled,
   its effects standing. A 409 saying so.
3. *Compensate* on a compensation_failed run answered ok and did nothing: a 400 naming Retry.
4. A cancel of a run that ended answered ok: a 400, as the CLI's.
5. Two operators at once: the loser got a bare 500. A 409 now.
6. SQLite locked past its busy timeout: a bare 500 after 30 s. A 503 now.

Real inline runs on real SQLite files through the app (TestClient), and Debian's chromium. Where a
race or an outage is the edge (5, 6), ``Client``'s method is replaced by one raising what it raised.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import sqlalchemy.exc
from fastapi.testclient import TestClient

import raysaga
from raysaga import Client, Permanent, Workflow
from raysaga.errors import IllegalTransitionError
from raysaga.orchestrator.dashboard.server import build
from raysaga.state import RunStatus, SqlStore
from tests.support import dashboard_flows as flows
from tests.support.browser import checked_page, require_chromium
from tests.support.dashboard_serving import serving

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

BASE = "http://127.0.0.1:8765"


@pytest.fixture
def acting(tmp_path: Path) -> Iterator[tuple[Any, SqlStore, str]]:
    url = f"sqlite:///{tmp_path / 'act.db'}"
    store = SqlStore(url)
    app, guard = build(store)
    client = TestClient(app, base_url=BASE, raise_server_exceptions=False)

    def act(run_id: str, verb: str, **body: Any) -> Any:
        return client.post(f"/api/runs/{run_id}/actions/{verb}", json={"confirm": True, **body},
                           headers={"X-Raysaga-CSRF": guard.csrf})

    yield act, store, url
    store.close()


def _waiting(url: str) -> str:
    run_id = flows.start(flows.refund, "refund", {"amount": 5}, url)
    flows.drive(flows.refund, run_id, url)
    return run_id


def test_cancel_of_an_ended_run_is_refused(acting: tuple[Any, SqlStore, str]) -> None:
    act, _, url = acting
    run_id = _waiting(url)
    assert act(run_id, "cancel", by="ops").json()["status"] == "cancelled"
    for verb in ("cancel", "compensate"):
        answer = act(run_id, verb, by="ops")
        assert answer.status_code == 400 and "already cancelled: nothing to" in answer.json()["error"], answer.text


def test_compensate_that_a_plain_cancel_beat_is_a_conflict(acting: tuple[Any, SqlStore, str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    act, store, url = acting
    run_id = _waiting(url)
    real = Client.cancel

    def beaten(self: Client, run: str, *, compensate: bool = False, **kw: Any) -> Any:
        if compensate:  # another operator's plain cancel reaches the run first
            real(self, run, compensate=False, by="other")
        return real(self, run, compensate=compensate, **kw)

    monkeypatch.setattr(Client, "cancel", beaten)
    answer = act(run_id, "compensate", by="ops")
    assert answer.status_code == 409, answer.text
    assert "ended cancelled without a rollback" in answer.json()["error"]
    assert store.get_run(run_id).status == RunStatus.CANCELLED


def test_compensate_of_a_failed_rollback_names_retry(acting: tuple[Any, SqlStore, str]) -> None:
    act, store, url = acting
    wf = Workflow("cf51")

    @wf.step(effect=True)
    def charge(input: int) -> int:
        return input

    @wf.compensation("charge")
    def refund(output: int) -> None:
        raise Permanent("the refund service is down")

    @wf.step()
    def ship(charge: int) -> int:
        raise Permanent("no stock")

    del ship
    run = raysaga.run(wf, 1, store=url, run_id="cf", executor="inline")
    assert run.status == RunStatus.COMPENSATION_FAILED
    events = len(store.events("cf"))
    answer = act("cf", "compensate", by="ops")
    assert len(store.events("cf")) == events
    assert answer.status_code == 400 and "finished by Retry" in answer.json()["error"], answer.text


def test_a_lost_race_is_a_conflict_and_a_locked_store_a_503(acting: tuple[Any, SqlStore, str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    act, _, url = acting
    run_id = _waiting(url)

    def lost(self: Client, run: str, **kw: Any) -> Any:
        raise IllegalTransitionError(f"run {run!r} cannot go from compensating to running")

    monkeypatch.setattr(Client, "retry", lost)
    answer = act(run_id, "retry", by="ops")
    assert answer.status_code == 409 and "changed while this action was taken" in answer.json()["error"]

    def locked(self: Client, run: str, **kw: Any) -> Any:
        raise sqlalchemy.exc.OperationalError("UPDATE raysaga_runs", {}, Exception("database is locked"))

    monkeypatch.setattr(Client, "pause", locked)
    answer = act(run_id, "pause", by="ops")
    assert answer.status_code == 503, answer.text
    assert "pause was not done" in answer.json()["error"] and "database is locked" in answer.json()["error"]


@pytest.fixture
def browser_page() -> Iterator[Page]:
    require_chromium()
    from tests.support.browser import headless_chromium

    browser: Browser
    with headless_chromium() as browser, checked_page(browser, on_dialog=lambda d: d.accept()) as pg:
        yield pg


def test_an_answer_the_browser_would_round_is_refused_in_the_page(tmp_path: Path, browser_page: Page) -> None:
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'big.db'}"
    run_id = flows.start(flows.refund, "refund", {"amount": 2**53 + 1}, url)
    flows.drive(flows.refund, run_id, url)
    store = SqlStore(url)
    try:
        with serving(store) as base:
            browser_page.goto(f"{base}/#/runs/{run_id}?node=review")
            browser_page.fill("#actor", "bob")
            browser_page.dispatch_event("#actor", "change")
            panel = browser_page.locator("#panel")
            expect(panel.locator('.answer-form input[name="amount"]')).to_be_visible()
            panel.locator("button.approve").click()
            expect(panel).to_contain_text("beyond what a browser keeps exactly")
            browser_page.goto(f"{base}/#/")
            expect(browser_page.locator("#runs")).to_be_visible()
        assert [e for e in store.events(run_id) if e.kind == "decision"] == []  # nothing decided
    finally:
        store.close()

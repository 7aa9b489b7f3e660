"""The dashboard in a real headless Chromium (Debian's, driven by Playwright; never a downloaded
browser): the run list, a run advancing live, the node panel, approving and cancelling with
compensation from the page, a 2,000-node fan-out. Screenshots go to $RAYSAGA_TEST_ARTIFACTS (or
the test's tmp_path); docs/dashboard.md shows copies of them.

Chromium is ``/usr/bin/chromium`` (``apt-get install chromium``; ``.ci/run`` installs it). Without
it these tests skip, unless ``RAYSAGA_REQUIRE_BROWSER=1`` (set by ``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raysaga.state import SqlStore
from tests.support import dashboard_flows as flows
from tests.support.browser import checked_page, require_chromium
from tests.support.dashboard_serving import serving, wait_until

require_chromium()

from playwright.sync_api import Browser, Page, expect  # noqa: E402


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    with checked_page(browser, on_dialog=lambda d: d.accept()) as pg:  # every action is confirmed: the test says yes
        yield pg


class Worker:
    """Background drivers (the part a ``raysaga worker`` plays), joined at the end."""

    def __init__(self) -> None:
        self.threads: list[threading.Thread] = []

    def start(self, target: Any, *args: Any) -> None:
        self.threads.append(threading.Thread(target=target, args=args, daemon=True))
        self.threads[-1].start()

    def join(self) -> None:
        for t in self.threads:
            t.join(60)


def test_the_run_list_and_a_run_advancing_live(page: Page, demo: tuple[SqlStore, dict[str, str]],
                                               artifacts: Path) -> None:
    store = demo[0]
    url = store.url
    run_id = flows.start(flows.gated, "gated", {"items": 6}, url)
    flows.drive(flows.gated, run_id, url)  # rests at its approval
    worker = Worker()
    with serving(store) as base:
        page.goto(base + "/")
        expect(page.locator(f'tr[data-run="{run_id}"]')).to_be_visible()
        expect(page.locator("#inbox")).to_contain_text("Publish 6 items?")
        expect(page.locator("#counts")).to_contain_text("waiting_human 2")
        expect(page.locator("#figures")).to_contain_text("duplicates prevented")
        page.screenshot(path=str(artifacts / "run-list.png"), full_page=True)
        page.locator(f'tr[data-run="{run_id}"] a').click()
        gate = page.locator('svg.dag [data-node="gate"]')
        expect(gate).to_have_attribute("data-state", "waiting")
        expect(page.locator('svg.dag [data-node="fetch"]')).to_contain_text("6 items")
        expect(page.locator("#live")).to_have_text("● live")
        page.screenshot(path=str(artifacts / "run-waiting.png"), full_page=True)
        loaded = page.evaluate("performance.timeOrigin")
        worker.start(flows.approve_and_resume, flows.gated, run_id, "gate", url)
        expect(gate).to_have_attribute("data-state", "completed")  # no reload: the stream changed it
        expect(page.locator('svg.dag [data-node="report"]')).to_have_attribute("data-state", "completed")
        expect(page.locator("#run-head .badge").first).to_contain_text("completed")
        expect(page.locator("#timeline")).to_contain_text("run_completed")
        assert page.evaluate("performance.timeOrigin") == loaded  # the same page all along
        page.locator('svg.dag [data-node="report"]').click()
        expect(page.locator("#panel .input-link")).to_have_text(["gate", "plan"])  # its inputs, a click away
        page.check("#hide-completed")  # every node completed: nothing left to draw
        expect(page.locator("svg.dag [data-node]")).to_have_count(0)
        page.uncheck("#hide-completed")
        expect(page.locator("svg.dag [data-node]")).to_have_count(4)
        worker.join()


def test_node_panel_shows_a_ledger_row_and_a_model_turn(page: Page, demo: tuple[SqlStore, dict[str, str]],
                                                        artifacts: Path) -> None:
    store, runs = demo
    with serving(store) as base:
        page.goto(f"{base}/#/runs/{runs['helper']}")
        page.locator('svg.dag [data-node="restock"]').click()
        panel = page.locator("#panel")
        expect(panel.locator(".ledger-row")).to_contain_text("tool:order")
        expect(panel.locator(".ledger-row")).to_contain_text("committed")
        expect(panel.locator("tr.turn")).to_have_count(5)
        expect(panel.locator("tr.turn").first).to_contain_text("tool_use")
        expect(panel.locator("tr.turn").first).to_contain_text("10 / 10")
        page.screenshot(path=str(artifacts / "agent-panel.png"), full_page=True)
        page.goto(f"{base}/#/runs/{runs['gated']}?node=report")
        expect(panel).to_contain_text("[redacted]")
        assert flows.LEAKY not in page.content()


def test_approve_from_the_page_and_the_run_completes(page: Page, demo: tuple[SqlStore, dict[str, str]]) -> None:
    store, _ = demo
    run_id = flows.start(flows.refund, "refund", {"amount": 50}, store.url)
    flows.drive(flows.refund, run_id, store.url)
    worker = Worker()
    with serving(store) as base:
        page.goto(f"{base}/#/runs/{run_id}?node=review")
        page.fill("#actor", "bob")
        page.dispatch_event("#actor", "change")
        panel = page.locator("#panel")
        expect(panel).to_contain_text("Refund 50?")
        expect(panel).to_contain_text("may decide: alice, bob")
        amount = panel.locator('.answer-form input[name="amount"]')  # a form from the answer's schema
        expect(amount).to_have_value("50")  # pre-filled from the request: an approve with edits
        amount.fill("45")
        panel.locator("button.approve").click()
        expect(page.locator("#timeline")).to_contain_text("decision")  # streamed in, no reload
        decided = wait_until(lambda: [e for e in store.events(run_id) if e.kind == "decision"], "the decision")
        assert decided[0].data["by"] == "bob" and decided[0].data["verdict"] == "approve"
        worker.start(flows.drive, flows.refund, run_id, store.url)  # a worker takes the run up
        expect(page.locator('svg.dag [data-node="pay"]')).to_have_attribute("data-state", "completed")
        expect(page.locator("#run-head .badge").first).to_contain_text("completed")
        worker.join()
    assert store.get_run(run_id).output == {"pay": {"paid": 45, "by": ["bob"]}}


def test_cancel_and_compensate_from_the_page(page: Page, demo: tuple[SqlStore, dict[str, str]],
                                             artifacts: Path) -> None:
    store, _ = demo
    run_id = flows.start(flows.refund, "refund", {"amount": 60}, store.url)
    flows.drive(flows.refund, run_id, store.url)
    worker = Worker()
    with serving(store) as base:
        page.goto(f"{base}/#/runs/{run_id}")
        page.fill("#actor", "carol")
        page.dispatch_event("#actor", "change")
        page.locator('button[data-verb="compensate"]').click()
        wait_until(lambda: any(e.kind == "cancel_requested" for e in store.events(run_id)), "the cancel request")
        worker.start(flows.drive, flows.refund, run_id, store.url)  # the driver rolls the run back
        expect(page.locator("#run-head .badge").first).to_contain_text("compensated")
        timeline = page.locator("#timeline")
        expect(timeline).to_contain_text("hold:compensate")
        text = timeline.inner_text()
        assert text.index("note:compensate") < text.index("hold:compensate")  # reverse order of completion
        expect(page.locator('svg.dag [data-node="hold"]')).to_contain_text("undo completed")
        page.screenshot(path=str(artifacts / "run-compensated.png"), full_page=True)
        # two drivers: the first ran to the approval, the second rolled back; the second alone
        expect(page.locator("#segment option")).to_have_count(3)
        page.select_option("#segment", "2")
        bars = page.locator("svg.gantt .bar")
        expect(bars).to_have_count(2)
        assert bars.evaluate_all("els => els.map(e => e.dataset.node)") == ["note:compensate", "hold:compensate"]
        worker.join()
    requested = next(e for e in store.events(run_id) if e.kind == "cancel_requested")
    assert requested.data["by"] == "carol" and requested.data["compensate"] is True


def test_a_2000_node_fan_out_is_usable(page: Page, tmp_path: Path, artifacts: Path) -> None:
    url = f"sqlite:///{tmp_path / 'wide.db'}"
    run_id = flows.start(flows.wide, "wide", {"items": 2000}, url)
    flows.drive(flows.wide, run_id, url)
    store = SqlStore(url)
    try:
        with serving(store) as base:
            started = time.monotonic()
            page.goto(f"{base}/#/runs/{run_id}")
            square = page.locator('svg.dag [data-node="square"]')
            expect(square).to_contain_text("2000 items")
            first_render = time.monotonic() - started
            assert first_render < 5, first_render  # measured ~0.3 s here (docs/dashboard.md)
            square.click()
            expect(page.locator(".items .item")).to_have_count(500)  # a page of items, more on demand
            page.screenshot(path=str(artifacts / "fan-out-2000.png"), full_page=False)
            (artifacts / "fan-out-2000.txt").write_text(f"first render {first_render:.2f}s\n")
    finally:
        store.close()

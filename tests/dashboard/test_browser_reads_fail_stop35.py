"""A dashboard read that fails (the server stopped, restarted, or dropped the request) is said on
the page, never left as an unhandled promise rejection.

Found as a flake of ``test_browser.py::test_approve_from_the_page_and_the_run_completes``: its
server stopped while the run page was open, the page's read of the run's events (the second of
``load``'s two reads) failed with "Failed to fetch", and nothing caught it (the ``page`` fixture
fails a test on any page error). Here each read is made to fail at once (Playwright aborts the
request, as a connection refused or reset would end it), so each case fails without the fix.

Chromium is Debian's ``/usr/bin/chromium``, as in ``test_browser.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from urllib.parse import urlsplit

import pytest

from raysaga.state import SqlStore
from tests.support.browser import TIMEOUT_MS, require_chromium
from tests.support.dashboard_serving import serving

require_chromium()

from playwright.sync_api import Browser, Page, Route, expect  # noqa: E402


@pytest.fixture
def page(browser: Browser) -> Iterator[tuple[Page, list[str]]]:
    """A page and the errors it raised (uncaught exceptions and unhandled rejections)."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    pg.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    yield pg, errors
    context.close()


def _abort(route: Route) -> None:
    route.abort("connectionrefused")


def _path(test: Callable[[str], bool]) -> Callable[[str], bool]:
    """A URL matcher on the request's path (no glob: a query string or a ``?`` in it plays no part)."""
    return lambda url: test(urlsplit(url).path)


def test_a_run_page_whose_events_read_fails_says_so(page: tuple[Page, list[str]],
                                                    demo: tuple[SqlStore, dict[str, str]]) -> None:
    pg, errors = page
    store, runs = demo
    with serving(store) as base:
        # the run's document reads; its events do not
        pg.route(_path(lambda p: p.startswith("/api/runs/") and p.endswith("/events")), _abort)
        pg.goto(f"{base}/#/runs/{runs['shop']}")
        expect(pg.locator("#run-head .error")).to_be_visible()
        pg.wait_for_function("() => document.readyState === 'complete'")
    assert errors == [], errors


def test_a_fan_outs_items_read_that_fails_is_said_in_its_grid(page: tuple[Page, list[str]],
                                                              demo: tuple[SqlStore, dict[str, str]]) -> None:
    pg, errors = page
    store, runs = demo
    with serving(store) as base:
        pg.route(_path(lambda p: p.startswith("/api/runs/") and "/items/" in p), _abort)
        pg.goto(f"{base}/#/runs/{runs['wide']}")
        pg.locator('svg.dag [data-node="square"]').click()
        expect(pg.locator(".items p.error")).to_be_visible()
    assert errors == [], errors


@pytest.mark.parametrize("path", ["/api/stats", "/api/inbox"])
def test_the_run_lists_side_reads_that_fail_leave_the_list_working(
        page: tuple[Page, list[str]], demo: tuple[SqlStore, dict[str, str]], path: str) -> None:
    pg, errors = page
    store, runs = demo
    with serving(store) as base:
        failed: list[str] = []

        def abort(route: Route) -> None:
            failed.append(route.request.url)
            route.abort("connectionrefused")

        pg.route(_path(lambda p: p == path), abort)
        pg.goto(f"{base}/#/")
        expect(pg.locator(f'tr[data-run="{runs["shop"]}"]')).to_be_visible()  # the list's own read
        pg.wait_for_function("() => document.readyState === 'complete'")
        assert failed, f"the page never read {path}"
    assert errors == [], errors


def test_the_run_list_says_when_its_own_read_fails(page: tuple[Page, list[str]],
                                                   demo: tuple[SqlStore, dict[str, str]]) -> None:
    pg, errors = page
    store, _ = demo
    with serving(store) as base:
        pg.route(_path(lambda p: p == "/api/runs"), _abort)
        pg.goto(f"{base}/#/")
        expect(pg.locator("td.error")).to_be_visible()
    assert errors == [], errors


def test_a_run_page_whose_first_read_fails_says_why_and_reads_again(
        page: tuple[Page, list[str]], demo: tuple[SqlStore, dict[str, str]]) -> None:
    """The failure names the server, not only the browser's "Failed to fetch"; and the page reads
    again on its own, so a restarted server shows the run without a reload."""
    pg, errors = page
    store, runs = demo
    with serving(store) as base:
        refused: list[str] = []

        def refuse_once(route: Route) -> None:
            if refused:
                route.continue_()
            else:
                refused.append(route.request.url)
                route.abort("connectionrefused")

        pg.route(_path(lambda p: p == f"/api/runs/{runs['shop']}"), refuse_once)
        pg.goto(f"{base}/#/runs/{runs['shop']}")
        expect(pg.locator("#run-head .error")).to_contain_text("Cannot reach the dashboard server")
        expect(pg.locator("#run-head h1")).to_have_text(runs["shop"], timeout=TIMEOUT_MS)  # read again, no reload
        expect(pg.locator("#run-head .error")).to_have_count(0)
        assert len(refused) == 1
    assert errors == [], errors

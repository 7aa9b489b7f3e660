"""Stop 29, run labels in the dashboard page (headless Chromium, as tests/dashboard/test_browser.py):
each run of the list shows its labels, the label filter narrows the list (several ANDed, as
``raysaga list --label``), a label is text, never markup, the list's refresh keeps the filter, and
a run's page keeps showing its labels while the live stream updates it.

Chromium is ``/usr/bin/chromium``; without it these tests skip, unless ``RAYSAGA_REQUIRE_BROWSER=1``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga import RunOptions
from raysaga.orchestrator.runner import create_run
from raysaga.state import SqlStore
from tests.support import dashboard_flows as flows
from tests.support.browser import checked_page, require_chromium
from tests.support.dashboard_serving import serving

require_chromium()

from playwright.sync_api import Browser, Page, expect  # noqa: E402

#: The mark of a label filter's "stop filtering by it" link (U+00D7, the multiplication sign).
DROP = "\u00d7"
#: A label value that would run script, were it ever put in the page as HTML.
HOSTILE = "<script>window.__pwned=1</script><img src=x onerror=\"window.__pwned=2\">"



@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    with checked_page(browser) as pg:
        yield pg


def _run(url: str, labels: dict[str, str], wf_name: str = "wide") -> str:
    wf = getattr(flows, wf_name)
    return create_run(wf, {"items": 2}, store=url, workflow_ref=f"{flows.MODULE}:{wf_name}",
                      options=RunOptions(labels=labels)).run_id


def _shown(page: Page) -> list[str]:
    return sorted(page.locator("#runs tr[data-run]").evaluate_all("rows => rows.map(r => r.dataset.run)"))


def test_the_label_filter_narrows_the_list_and_labels_are_text(page: Page, tmp_path: Path, artifacts: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    prod = _run(url, {"team": "search", "env": "prod"})
    dev = _run(url, {"team": "search", "env": "dev"})
    hostile = _run(url, {"team": "billing", "note": HOSTILE})
    bare = create_run(flows.wide, {"items": 2}, store=url).run_id
    rows = page.locator("#runs tr[data-run]")
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(base + "/")
            expect(rows).to_have_count(4)
            assert _shown(page) == sorted([prod, dev, hostile, bare])
            note = page.locator(f'tr[data-run="{hostile}"] td.labels .chip').filter(has_text="note=")
            expect(note).to_have_text(f"note={HOSTILE}")  # the label as text, escaped
            assert page.locator("#runs script, #runs img").count() == 0
            assert page.evaluate("window.__pwned") is None
            expect(page.locator(f'tr[data-run="{bare}"] td.labels')).to_have_text("")

            page.fill("#label-filter", "team=search")
            page.locator("#filters button[type=submit]").click()
            expect(rows).to_have_count(2)
            assert _shown(page) == sorted([prod, dev])
            assert "label=team%3Dsearch" in page.evaluate("location.hash")
            expect(page.locator("#counts .chip").first).to_have_text("all 2")  # the counts obey it too
            expect(page.locator("#label-filters .chip")).to_have_text([f"{DROP} team=search"])

            # a label of a listed run, clicked, is ANDed with the filter
            page.locator(f'tr[data-run="{prod}"] td.labels a.chip[data-label="env=prod"]').click()
            expect(rows).to_have_count(1)
            assert _shown(page) == [prod]
            expect(page.locator("#label-filters .chip")).to_have_text([f"{DROP} team=search", f"{DROP} env=prod"])
            page.screenshot(path=str(artifacts / "run-list-labels.png"), full_page=True)

            # the list refreshes on its timer under the same filter: a new matching run comes in,
            # one created before it that does not match never does
            other = _run(url, {"team": "billing", "env": "prod"})
            newer = _run(url, {"team": "search", "env": "prod", "n": "2"})
            expect(page.locator(f'tr[data-run="{newer}"]')).to_be_visible(timeout=20_000)  # refreshed every 5 s
            assert _shown(page) == sorted([prod, newer])

            # removing one filter widens the list again
            page.locator('#label-filters .chip[data-label="team=search"] a.remove').click()
            expect(rows).to_have_count(3)
            assert _shown(page) == sorted([prod, newer, other])

            # a filter the API refuses says why in the page, instead of an empty list
            page.fill("#label-filter", "nokey")
            page.locator("#filters button[type=submit]").click()
            expect(page.locator("#runs td.error")).to_contain_text("label='nokey' is not KEY=VALUE")
    finally:
        store.close()


def test_a_runs_page_keeps_its_labels_while_it_updates_live(page: Page, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _run(url, {"team": "search", "note": HOSTILE}, "gated")
    padded = _run(url, {"team": "search "})  # another value: the trailing space is part of it
    flows.drive(flows.gated, run_id, url)  # rests at its approval
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/{run_id}")
            labels = page.locator("#run-labels .chip")
            expect(labels).to_have_text([f"note={HOSTILE}", "team=search"])
            expect(page.locator("#live")).to_have_text("● live")
            worker = threading.Thread(target=flows.approve_and_resume, args=(flows.gated, run_id, "gate", url),
                                      daemon=True)
            worker.start()
            expect(page.locator("#run-head .badge").first).to_contain_text("completed")  # streamed in
            worker.join(60)
            expect(labels).to_have_text([f"note={HOSTILE}", "team=search"])  # the live summary keeps them
            assert page.locator("#run-head script, #run-head img").count() == 0
            page.locator('#run-labels a.chip[data-label="team=search"]').click()  # the list, filtered by it
            expect(page.locator("#runs tr[data-run]")).to_have_count(1)
            expect(page.locator("#label-filters .chip")).to_have_text([f"{DROP} team=search"])
            assert _shown(page) == [run_id]
            page.locator("#label-filters a.remove").click()
            expect(page.locator("#runs tr[data-run]")).to_have_count(2)
            page.fill("#label-filter", "team=search ")  # typed as written: not trimmed
            page.locator("#filters button[type=submit]").click()
            expect(page.locator("#runs tr[data-run]")).to_have_count(1)
            assert _shown(page) == [padded]
    finally:
        store.close()

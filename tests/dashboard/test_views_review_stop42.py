"""Stop 42, a review of the run views: the dashboard's DAG drew a best-effort fan-out that
completed with a failed item as failed (its items' counts overrode the fan-out's own completed
row), where ``status`` said completed. Its row wins now; only items still in flight say more.

The browser test uses Debian's ``/usr/bin/chromium`` (skipped without it, unless
``RAYSAGA_REQUIRE_BROWSER=1``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import raysaga
from raysaga import BEST_EFFORT, Permanent, RetryPolicy, Workflow
from raysaga.orchestrator.runner import create_run
from raysaga.state import RunStatus, SqlStore
from tests.support.dashboard_serving import serving

if TYPE_CHECKING:
    from playwright.sync_api import Page

MODULE = "tests.dashboard.test_views_review_stop42"

bestfan = Workflow("bestfan42", version="1")


@bestfan.step()
def items(input: dict[str, Any]) -> list[int]:
    return list(range(10))


@bestfan.map("items", retry=RetryPolicy(max_attempts=1), policy=BEST_EFFORT)
def square(items: int) -> int:
    if items == 3:
        raise Permanent("bad item 3")
    return items * items


@bestfan.step()
def total(square: Any) -> int:
    return 1


def test_a_completed_best_effort_fan_out_is_drawn_completed(page: Page, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    create_run(bestfan, {}, store=url, run_id="be42", workflow_ref=f"{MODULE}:bestfan")
    assert raysaga.resume(bestfan, "be42", store=url, executor="inline").status == RunStatus.COMPLETED
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/be42")
            expect(page.locator("#live")).to_have_text("● live")
            node = page.locator('svg.dag g.node[data-node="square"]')
            expect(node.locator(".sub")).to_have_text("10 items ✓9 ✗1")
            expect(node).to_have_attribute("data-state", "completed")
    finally:
        store.close()

"""Stop 45: a run of thousands of distinct steps made its page unusable. The first read sent every
row twice (in ``rows`` and in ``steps[*].row``); dagre laid out every step (seconds: ~9 s for
10,000); every live message repainted every node, each looking itself and its inputs up with a
``find`` over the whole graph (O(n²) a message), then laid the whole page out to scroll the
timeline. The page showed a 10,000-step run completed 15 s after its driver had finished.

No timing is asserted: what the fix changes structurally is. The page sends each row once; above
``DAGRE_MAX`` steps the DAG is a grid that says so; one live message that completes one step
rewrites that step and its dependents only (counted with a MutationObserver), not every node.
The browser test uses Debian's ``/usr/bin/chromium`` (skipped without it, unless
``RAYSAGA_REQUIRE_BROWSER=1``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysaga import Workflow
from raysaga.orchestrator.dashboard import views
from raysaga.orchestrator.runner import create_run
from raysaga.state import SqlStore
from raysaga.state.models import Batch, Lease, NewEvent, NodeStatus, NodeWrite, RunStatus, RunUpdate
from tests.support.dashboard_serving import serving

if TYPE_CHECKING:
    from playwright.sync_api import Page

MODULE = "tests.dashboard.test_dashboard_scale_stop45"
#: Distinct steps: more than the page lays out with dagre (``DAGRE_MAX``, 1,000 in dag.ts).
STEPS = 2000
#: Each step ``s{i}`` runs after ``s{i - WIDTH}``: 20 chains side by side.
WIDTH = 20


def _one(input: Any) -> int:
    return 1


def _build(n: int) -> Workflow:
    wf = Workflow(f"many{n}", version="1")
    for i in range(n):
        wf.step(_one, name=f"s{i}", after=[f"s{i - WIDTH}"] if i >= WIDTH else [])
    return wf


many = _build(STEPS)


def _started(url: str, run_id: str) -> tuple[SqlStore, Lease]:
    """A run of ``many`` under way: s0 completed, held by a lease the test commits with."""
    create_run(many, {}, store=url, run_id=run_id, workflow_ref=f"{MODULE}:many")
    store = SqlStore(url)
    lease = store.claim(run_id, "test45", 120)
    store.commit(lease, Batch(nodes=[_done("s0")], events=[NewEvent(kind="node_completed", node_id="s0")],
                              run=RunUpdate(status=RunStatus.RUNNING)))
    return store, lease


def _done(step: str) -> NodeWrite:
    return NodeWrite(node_id=step, status=NodeStatus.COMPLETED, attempt=1, output=1)


def test_the_run_page_sends_each_row_once(tmp_path: Path) -> None:
    """``rows`` holds every row whole; ``steps`` says each step's own row's status and its first
    items' labels only (the rows were sent twice: a third of the payload)."""
    store, lease = _started(f"sqlite:///{tmp_path / 'raysaga.db'}", "once-1")
    try:
        store.commit(lease, Batch(nodes=[_done(f"s{i}") for i in range(1, 50)],
                                  events=[NewEvent(kind="node_completed", node_id=f"s{i}") for i in range(1, 50)]))
        doc = views.run_page(store, "once-1")
        rows = {r["node"]: r for r in doc["rows"]}
        assert len(rows) == 50 and rows["s7"]["status"] == "completed" and rows["s7"]["attempt"] == 1
        steps = doc["steps"]
        assert steps["s7"]["row"] == {"status": "completed"}
        assert all(st["row"] is None or st["row"].keys() == {"status"} for st in steps.values())
        assert all(all(isinstance(i, str) for i in st["items"]) for st in steps.values())
    finally:
        store.close()


#: Records every node group of the DAG a mutation touches (attributes, text, children).
OBSERVE = """() => {
  window.__touched = new Set();
  const note = (records) => { for (const r of records) {
    const el = r.target.nodeType === 1 ? r.target : r.target.parentElement;
    const g = el && el.closest('g[data-node]');
    if (g) window.__touched.add(g.dataset.node);
  } };
  window.__observer = new MutationObserver(note);
  window.__observer.observe(document.querySelector('#dag svg'),
    { subtree: true, attributes: true, childList: true, characterData: true });
  window.__note = note;
}"""

TOUCHED = "() => { window.__note(window.__observer.takeRecords()); return [...window.__touched].sort(); }"


def test_a_live_message_repaints_the_steps_it_touches_not_every_node(page: Page, tmp_path: Path) -> None:
    """One message completing s1 rewrites s1 and its dependent s21 (now in flight): every one of
    the 2,000 nodes was rewritten, each looked up by a scan of the whole graph."""
    from playwright.sync_api import expect

    store, lease = _started(f"sqlite:///{tmp_path / 'raysaga.db'}", "live-1")
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/live-1")
            expect(page.locator("#live")).to_have_text("● live", timeout=120_000)
            expect(page.locator("svg.dag g.node")).to_have_count(STEPS)
            # more steps than dagre lays out in good time: a grid, and the page says why
            expect(page.locator("#dag-grid-note")).to_contain_text("drawn as a grid")
            expect(page.locator('svg.dag g.node[data-node="s21"]')).to_have_attribute("data-state", "pending")
            page.evaluate(OBSERVE)
            store.commit(lease, Batch(nodes=[_done("s1")], events=[NewEvent(kind="node_completed", node_id="s1")]))
            seq = store.get_run("live-1").event_seq
            expect(page.locator("body")).to_have_attribute("data-seq", str(seq))
            assert page.evaluate(TOUCHED) == ["s1", "s21"]
            expect(page.locator('svg.dag g.node[data-node="s1"]')).to_have_attribute("data-state", "completed")
            expect(page.locator('svg.dag g.node[data-node="s21"]')).to_have_attribute("data-state", "running")
    finally:
        store.close()

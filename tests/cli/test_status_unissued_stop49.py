"""``raysaga status`` counts a fan-out's items that have no row yet (stop 49).

An effect fan-out's items are issued ``Executor.effect_window`` at a time
(``machine.effect_window``); the held ones have no node row and no ledger key until issued. Status
counted rows only: a 40-item effect fan-out on a 2-CPU Ray cluster read ``1 completed, 8 running``
(``node_counts``, ``--summary``'s step counts, the text view's fan-out line), and the 32 items
waiting to be issued were nowhere: nothing told a waiting run from a stuck one. Now they are
counted ``pending`` (a node with no row is pending: ``NodeStatus.PENDING``), from the fan-out's
size its ``fanout_expanded`` event stores less its item rows, as the dashboard already counted them.
Plain items, issued all at once with no row until they end or a quiet tick records them running,
are counted the same way: every item of the fan-out, whichever way it is recorded.
"""

from __future__ import annotations

import json
import os
import uuid
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from raysaga.orchestrator.dashboard import views
from raysaga.orchestrator.executor import RayExecutor
from raysaga.state import SqlStore
from tests.support import crash_driver as harness
from tests.support import held_items_flows as flows
from tests.support.browser import CHROMIUM, checked_page, headless_chromium, require_chromium
from tests.support.cli import invoke
from tests.support.dashboard_serving import serving

pytestmark = pytest.mark.ray

COUNT = 40
FLOWS = "tests.support.held_items_flows"


def _status(url: str, run_id: str, *options: str) -> str:
    code, out, err = invoke("status", run_id, "--db", url, *options)
    assert code == 0, err
    return out


def _status_json(url: str, run_id: str, *options: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_status(url, run_id, "--json", *options))
    schema = json.loads(resources.files("raysaga.orchestrator.dashboard").joinpath("status.schema.json").read_text())
    jsonschema.validate(doc, schema)
    return doc


def _step(doc: dict[str, Any], name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [s for s in doc["steps"] if s["step"] == name]
    assert len(found) == 1, doc["steps"]
    return found[0]


def _cpus() -> int:
    import ray

    return int(ray.cluster_resources()["CPU"])  # type: ignore[no-untyped-call]


def _started(control: Path, proc: Any, at_least: int) -> bool:
    return len(list(control.glob("started-*"))) >= at_least or proc.poll() is not None


def _dashboard_shows(store: SqlStore, run_id: str, step: str, rows: dict[str, int], no_row: int) -> None:
    """The run page in Chromium: the fan-out's node counts its items with no row (``○N``), and its
    item list, whose rows are all it can list, says how many more are pending with none."""
    if not Path(CHROMIUM).exists() and os.environ.get("RAYSAGA_REQUIRE_BROWSER") != "1":
        return  # (the JSON checks stand; .ci/run requires the browser)
    require_chromium()
    from playwright.sync_api import expect

    with headless_chromium() as browser, checked_page(browser) as page, serving(store) as base:
        page.goto(f"{base}/#/runs/{run_id}")
        node = page.locator(f'svg.dag [data-node="{step}"]')
        expect(node).to_contain_text(f"{sum(rows.values()) + no_row} items")
        expect(node).to_contain_text(f"○{no_row}")
        node.click()
        expect(page.locator(".items .item")).to_have_count(sum(rows.values()))
        expect(page.locator(f'[data-no-row="{no_row}"]')).to_contain_text(f"{no_row} more pending with no row yet")
        page.locator('select[aria-label="items in state"]').select_option("pending")
        expect(page.locator(f'[data-no-row="{no_row}"]')).to_be_visible()
        expect(page.locator(".items .item")).to_have_count(0)


def test_status_counts_the_items_an_effect_window_holds_back(ray_session: str, store_url: str,
                                                              tmp_path: Path) -> None:
    cpus = _cpus()
    window = RayExecutor.LANE_TASKS_PER_CPU * cpus
    held = COUNT - window
    assert held > 0
    control = tmp_path / "control"
    control.mkdir()
    run_id = f"held-{uuid.uuid4().hex[:8]}"
    proc = harness.spawn("held", store_url, run_id, executor="ray", flows=FLOWS,
                         run_input=flows.sample(str(control), COUNT))
    try:
        harness.wait_until(lambda: _started(control, proc, cpus), timeout=180, what=f"{cpus} items to start")
        assert proc.poll() is None, harness.finish(proc).describe()
        store = SqlStore(store_url)
        try:
            # the window's items issued (a 'running' row and a pending ledger row each), the rest held
            harness.wait_until(lambda: store.step_counts(run_id, ["charge"])["charge"] == {"running": window},
                               timeout=60, what=f"{window} items of charge recorded running")
            assert len(store.effects(run_id)) == window  # the held items have no key yet
            page = views.run_page(store, run_id)
            _dashboard_shows(store, run_id, "charge", {"running": window}, held)
        finally:
            store.close()

        doc = _status_json(store_url, run_id)
        assert doc["status"] == "running"
        assert doc["node_counts"] == {"completed": 1, "running": window, "pending": held}
        summary = _status_json(store_url, run_id, "--summary")
        assert summary["node_counts"] == doc["node_counts"]
        charge = _step(summary, "charge")
        assert charge["counts"] == {"running": window, "pending": held}
        assert charge["nodes"] == COUNT
        text = _status(store_url, run_id)
        assert (f"fan-out charge: {COUNT} items — {held} pending, {window} running ({held} with no row yet: "
                "not issued yet") in text, text
        # the dashboard's run page counts them alike (it did already)
        assert page["steps"]["charge"]["counts"] == {"running": window, "pending": held}
    finally:
        (control / "release").touch()
        finished = harness.finish(proc, timeout=180)
    assert finished.returncode == 0, finished.describe()
    assert finished.result is not None and finished.result["output"] == {"total": COUNT}

    done = _status_json(store_url, run_id, "--summary")  # the fan-out's own row is not one of its items
    assert done["node_counts"] == {"completed": 1 + 1 + COUNT + 1}
    assert _step(done, "charge")["counts"] == {"completed": 1 + COUNT} and _step(done, "charge")["nodes"] == 1 + COUNT
    assert "pending" not in _status(store_url, run_id)


def test_status_counts_every_item_of_a_plain_fan_out_in_flight(ray_session: str, sqlite_url: str,
                                                                tmp_path: Path) -> None:
    """Plain items have no row until they end or a quiet tick records them running: whichever it
    is when status reads them, every item is counted (as a running row, or pending with none)."""
    cpus = _cpus()
    control = tmp_path / "control"
    control.mkdir()
    run_id = f"plain-{uuid.uuid4().hex[:8]}"
    proc = harness.spawn("plain", sqlite_url, run_id, executor="ray", flows=FLOWS,
                         run_input=flows.sample(str(control), COUNT))
    try:
        harness.wait_until(lambda: _started(control, proc, cpus), timeout=180, what=f"{cpus} items to start")
        assert proc.poll() is None, harness.finish(proc).describe()
        summary = _status_json(sqlite_url, run_id, "--summary")
        square = _step(summary, "square")
        assert sum(square["counts"].values()) == COUNT == square["nodes"], square
        assert set(square["counts"]) <= {"running", "pending"}, square
        text = _status(sqlite_url, run_id)
        assert f"fan-out square: {COUNT} items — " in text, text
    finally:
        (control / "release").touch()
        finished = harness.finish(proc, timeout=180)
    assert finished.returncode == 0, finished.describe()
    assert _status_json(sqlite_url, run_id)["node_counts"] == {"completed": 1 + 1 + COUNT + 1}


def _closed_fan_out() -> Any:
    """A non-critical effect fan-out whose first item fails (policy ALL: the step fails at once, the
    items its window held never issued), then an approval the run rests at: running-ish, not ended."""
    import raysaga
    from raysaga import Permanent, Workflow

    wf = Workflow("stop49_closed_fan_out")

    @wf.step()
    def numbers() -> list[int]:
        return list(range(200))

    @wf.map("numbers", critical=False, effect=True)
    def charge(numbers: int) -> int:
        if numbers == 0:
            raise Permanent("card declined")
        return numbers

    @wf.approval()
    def ok(numbers: list[int]) -> str:
        return "go on?"

    del charge, ok
    return wf, raysaga


def _no_row_note_in_browser(store: SqlStore, run_id: str, no_row: int, words: str) -> None:
    if not Path(CHROMIUM).exists() and os.environ.get("RAYSAGA_REQUIRE_BROWSER") != "1":
        return
    require_chromium()
    from playwright.sync_api import expect

    with headless_chromium() as browser, checked_page(browser) as page, serving(store) as base:
        page.goto(f"{base}/#/runs/{run_id}")
        page.locator('svg.dag [data-node="charge"]').click()
        expect(page.locator(f'[data-no-row="{no_row}"]')).to_have_text(f"{no_row} more pending with no row: {words}")


def test_items_of_a_fan_out_that_ended_are_never_issued_in_a_run_that_goes_on(ray_session: str, sqlite_url: str
                                                                              ) -> None:
    """The items of a fan-out a failure stopped will not be issued by this run, whatever the run's
    own state: status and the dashboard said "not issued yet" while the run rested at an approval
    (the note read only the run's status), and the dashboard said so of an ended run too."""
    from raysaga.orchestrator.options import RunOptions
    from raysaga.state.models import RunStatus

    wf, raysaga = _closed_fan_out()
    run_id = f"closed-{uuid.uuid4().hex[:8]}"
    record = raysaga.run(wf, None, store=sqlite_url, run_id=run_id, executor="ray", address=ray_session,
                         options=RunOptions(release_after=0))
    assert record.status == RunStatus.WAITING_HUMAN, record.status_reason
    store = SqlStore(sqlite_url)
    try:
        counts = store.step_counts(run_id, ["charge"])["charge"]
        no_row = 200 - sum(counts.values())
        assert no_row > 0, counts  # the window held items back when the first one failed
        text = _status(sqlite_url, run_id)
        assert f"({no_row} never issued)" in text, text
        assert "not issued yet" not in text, text
        _no_row_note_in_browser(store, run_id, no_row, "never issued")
        raysaga.Client(sqlite_url).reject(run_id, "ok", by="ada")
        ended = raysaga.resume(wf, run_id, store=sqlite_url, executor="ray", address=ray_session)
        assert ended.status in (RunStatus.FAILED, RunStatus.COMPENSATED, RunStatus.CANCELLED), ended.status
        assert f"({no_row} never issued)" in _status(sqlite_url, run_id)
        _no_row_note_in_browser(store, run_id, no_row, "never issued")  # the dashboard said "not issued yet"
    finally:
        store.close()

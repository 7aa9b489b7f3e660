"""The dashboard and a run no driver drives; its DAG from ``--workflow``; an unknown node (stop 49).

1. A ``raysaga run`` interrupted with Ctrl-C (or killed) leaves its run ``running`` in the store, for
   a worker or a resume to take up. The dashboard showed a ``running`` badge and an attempt bar
   growing for ever. Now a run's summary (the list, the run, a live change) carries ``no_driver``,
   the list counts them, and the page heads the run "running, no driver" with the note (since
   when, why, the command that continues it), draws its work ``interrupted`` and its bars up to
   when its driver stopped. A driver killed while its page is open is seen without any event (the
   live stream checks with the run's identity).
2. The DAG panel of a run whose module does not import where the dashboard runs said "pass
   --workflow MODULE:WORKFLOW", which ``raysaga dashboard`` did not take: it does now (repeatable).
3. ``GET /api/runs/RUN/nodes/nosuch`` answered 200 with everything null: a 404 now, as an unknown
   run is; a step not started yet, or an item of a fan-out expanded, is still a node.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from fastapi.testclient import TestClient

from raysaga.orchestrator.dashboard.server import build
from raysaga.orchestrator.loader import load_workflow
from raysaga.orchestrator.status_text import clock
from raysaga.state import SqlStore
from tests.support import no_driver_flows as flows
from tests.support.browser import require_chromium
from tests.support.cli import invoke
from tests.support.dashboard_serving import serving

if TYPE_CHECKING:
    from playwright.sync_api import Page

BASE = "http://127.0.0.1:8765"
RUN = "nd-dash"


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SqlStore, str]]:
    """A SQLite store whose one run a real ``raysaga run`` left when Ctrl-C stopped it mid fan-out;
    (store, the note its views give)."""
    folder = tmp_path_factory.mktemp("nd")
    url = f"sqlite:///{folder / 'raysaga.db'}"
    proc = flows.start("plain", url, RUN, folder)
    try:
        flows.interrupt(proc, folder)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    store = SqlStore(url)
    stop = [e for e in store.events(RUN) if e.kind == "driver_interrupted"][-1]
    from raysaga.orchestrator.status_text import utc

    yield store, f"no driver: interrupted at {utc(stop.at)} by SIGINT; `raysaga resume {RUN}` continues it"
    store.close()


def _client(store: SqlStore, **options: Any) -> TestClient:
    return TestClient(build(store, **options)[0], base_url=BASE, raise_server_exceptions=False)


def test_a_run_nobody_drives_says_so_in_the_api(interrupted: tuple[SqlStore, str]) -> None:
    store, note = interrupted
    client = _client(store)
    page = client.get("/api/runs").json()
    assert page["counts"] == {"running": 1} and page["no_driver"] == 1
    (row,) = page["runs"]
    assert row["status"] == "running" and row["no_driver"]["why"] == "interrupted"
    assert row["no_driver"]["signal"] == "SIGINT" and row["no_driver"]["note"] == note
    assert row["no_driver"]["command"] == f"raysaga resume {RUN}"
    doc = client.get(f"/api/runs/{RUN}").json()
    assert doc["run"]["no_driver"] == row["no_driver"]
    assert client.get("/api/stats").json()["runs_without_driver"] == 1


def test_an_unknown_node_is_a_404_and_a_known_one_without_a_row_is_not(interrupted: tuple[SqlStore, str]) -> None:
    store, _ = interrupted
    client = _client(store)
    for label in ("nosuch", "work[6]", "plan@1", "work:compensate"):
        answer = client.get(f"/api/runs/{RUN}/nodes/{label}")
        assert answer.status_code == 404, (label, answer.text)
        assert answer.json() == {"error": f"run {RUN!r} has no node {label!r}: no row, event or ledger row names "
                                          "it, and it is neither a step of the run's DAG as drawn here nor an item "
                                          "of a fan-out it expanded"}
    assert client.get(f"/api/runs/{RUN}/nodes/nosuch/output").status_code == 404
    assert client.get(f"/api/runs/{RUN}/nodes/bad[x/output").status_code == 400  # a malformed label: still 400
    assert client.get("/api/runs/nope/nodes/x").status_code == 404
    # no row yet, all the same nodes of the run: a step not started, the fan-out, an item not issued
    for label in ("total", "work", "work[5]", "plan", "work[0]"):
        answer = client.get(f"/api/runs/{RUN}/nodes/{label}")
        assert answer.status_code == 200, (label, answer.text)


def test_the_pages_show_a_run_nobody_drives(interrupted: tuple[SqlStore, str], page: Page) -> None:
    from playwright.sync_api import expect

    store, note = interrupted
    with serving(store) as base:
        page.goto(f"{base}/#/")
        badge = page.locator(f'tr[data-run="{RUN}"] .badge')
        expect(badge).to_have_text("◌ running, no driver")
        expect(badge).to_have_attribute("data-no-driver", "interrupted")
        expect(page.locator(f'tr[data-run="{RUN}"] td.reason')).to_have_text(note)
        expect(page.locator("#no-driver-count")).to_have_text("◌ no driver 1")
        page.goto(f"{base}/#/runs/{RUN}")
        expect(page.locator("#no-driver")).to_have_text(note)
        expect(page.locator("#run-head .badge").first).to_have_text("◌ running, no driver")
        expect(page.locator('svg.dag [data-node="work"]')).to_have_attribute("data-state", "interrupted")
        expect(page.locator('svg.dag [data-node="work"] .state')).to_have_text("◌ interrupted")
        expect(page.locator('svg.dag [data-node="total"]')).to_have_attribute("data-state", "pending")
        page.goto(f"{base}/#/")  # (the run page's live stream closed before the server stops)
        expect(page.locator("#runs")).to_be_visible()


def test_a_driver_killed_under_an_open_page_is_seen_without_an_event(tmp_path: Path, page: Page) -> None:
    """The page follows the run live while its driver holds it (running, its bars to now); the
    driver is SIGKILLed (no event: its lease is left to expire); the page says nobody drives the
    run, and draws the attempts left running interrupted, up to the run's last write."""
    require_chromium()
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = "nd-killed"
    proc = flows.start("effect", url, run_id, tmp_path, "--lease-ttl", "60")
    store = SqlStore(url)
    try:
        with serving(store) as base:
            page.goto(f"{base}/#/runs/{run_id}")
            expect(page.locator("#live")).to_have_text("● live")
            held = page.locator('svg.gantt [data-node="work[3]"]')
            expect(held).to_have_attribute("data-state", "running")
            expect(page.locator("#no-driver")).to_have_count(0)
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
            expect(page.locator("#no-driver")).to_have_attribute("data-why", "gone")
            expect(page.locator("#no-driver")).to_contain_text(f"is gone (process not running); `raysaga resume "
                                                               f"{run_id}` takes it over at once")
            expect(page.locator('svg.dag [data-node="work"]')).to_have_attribute("data-state", "interrupted")
            expect(held).to_have_attribute("data-state", "interrupted")
            ended = clock(store.get_run(run_id).updated_at)  # the bars end there, not at the clock
            expect(page.locator("svg.gantt text.axis").last).to_contain_text(ended)
            page.goto(f"{base}/#/")
            expect(page.locator("#runs")).to_be_visible()
    finally:
        (tmp_path / "release").touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        store.close()


FLOW = '''
from raysaga import Workflow

wf = Workflow("nd49-dag")


@wf.step
def first(input: dict) -> int:
    return 1


@wf.step
def second(first: int) -> int:
    return first + 1
'''


def test_dashboard_workflow_draws_the_dag_of_a_run_started_elsewhere(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "nd49_dag_flow.py").write_text(FLOW)
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    done = subprocess.run([sys.executable, "-m", "raysaga", "run", "nd49_dag_flow.py:wf", "--db", url, "--run-id",
                           "elsewhere", "--executor", "inline", "--quiet", "--input", "{}"],
                          cwd=project, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    store = SqlStore(url)
    try:
        assert store.get_run("elsewhere").workflow_ref == "nd49_dag_flow:wf"
        graph = _client(store).get("/api/runs/elsewhere").json()["graph"]  # here, the module does not import
        assert graph["source"] == "rows" and graph["edges"] == []
        assert "start the dashboard with --workflow nd49_dag_flow:wf (repeatable" in graph["note"]
        assert "PYTHONPATH" in graph["note"]
        given = load_workflow(f"{project / 'nd49_dag_flow.py'}:wf")
        drawn = _client(store, workflows=[given]).get("/api/runs/elsewhere").json()["graph"]
        assert drawn["source"] == "workflow" and drawn["edges"] == [["first", "second"]]
        assert drawn.get("note") is None
    finally:
        store.close()
    code, out, _ = invoke("dashboard", "--help")
    assert code == 0 and "--workflow" in out
    code, _, err = invoke("dashboard", "--db", url, "--port", "0", "--workflow", str(tmp_path / "missing.py") + ":wf")
    assert code == 2 and "no such file" in err, err

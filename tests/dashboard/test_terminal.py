"""The terminal's views of a run: the layered DAG, ``--watch`` in a pty until the run rests,
``events --follow``, ``--json`` against its published JSON Schema, and the exports coloured by
state (Mermaid, DOT, SVG)."""

from __future__ import annotations

import itertools
import json
import os
import pty
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app
from raysaga.state import SqlStore
from tests.support import REPO
from tests.support import dashboard_flows as flows
from tests.support.dashboard_serving import wait_until

runner = CliRunner()


def cli(*args: str) -> str:
    result = runner.invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


def schema() -> dict[str, Any]:
    text = resources.files("raysaga.orchestrator.dashboard").joinpath("status.schema.json").read_text()
    return dict(json.loads(text))


@pytest.mark.parametrize("flow", ["gated", "shop", "wide", "helper", "refund"])
def test_status_json_matches_its_published_schema(demo: tuple[SqlStore, dict[str, str]], flow: str) -> None:
    store, runs = demo
    for extra in ([], ["--summary"], ["--nodes-limit", "2"]):
        doc = json.loads(cli("status", runs[flow], "--db", store.url, "--json", *extra))
        jsonschema.validate(doc, schema())


def test_the_dag_layered_by_generation(demo: tuple[SqlStore, dict[str, str]]) -> None:
    store, runs = demo
    text = cli("status", runs["gated"], "--db", store.url, "--dag")
    dag = text[text.index("dag (by generation):"):].splitlines()[1:]
    assert [line.split()[:3] for line in dag] == [["0", "✓", "plan"], ["1", "✓", "fetch"], ["2", "✓", "gate"],
                                                  ["3", "✓", "report"]]
    assert "4 items ✓4" in dag[1] and "← plan" in dag[1] and "approval" in dag[2]
    agent = cli("status", runs["helper"], "--db", store.url, "--dag")
    assert "restock  completed, 1 attempt, 3 turns, 60 tokens, agent" in agent
    shop = cli("status", runs["shop"], "--db", store.url, "--dag")
    assert "✗ ship  failed" in shop and "effect, undo completed" in shop


def test_exports_coloured_by_state(demo: tuple[SqlStore, dict[str, str]]) -> None:
    store, runs = demo
    mermaid = cli("status", runs["refund"], "--db", store.url, "--format", "mermaid")
    assert mermaid.startswith("flowchart TD") and "    class review waiting" in mermaid
    assert "    hold --> note" in mermaid and "classDef waiting fill:#fbefff" in mermaid
    dot = cli("status", runs["refund"], "--db", store.url, "--format", "dot")
    assert '"review" [label="review\\n◷ waiting' in dot and '"hold" -> "review";' in dot
    svg = ET.fromstring(cli("status", runs["shop"], "--db", store.url, "--format", "svg"))
    states = {g.get("data-node"): g.get("data-state") for g in svg.iter("{http://www.w3.org/2000/svg}g")}
    assert states == {"reserve": "completed", "charge": "completed", "ship": "failed"}
    bad = runner.invoke(app, ["status", runs["shop"], "--db", store.url, "--format", "png"])
    assert bad.exit_code == 2 and "mermaid, dot, svg" in bad.output


class Pty:
    """A command in a pseudo-terminal, its output read as it comes."""

    def __init__(self, args: list[str]) -> None:
        master, slave = pty.openpty()
        env = {**os.environ, "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}
        self.proc = subprocess.Popen(args, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=env)
        os.close(slave)
        self.master = master
        self.chunks: list[bytes] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self.master, 65536)
            except OSError:
                return
            if not data:
                return
            self.chunks.append(data)

    def text(self) -> str:
        """What was shown, without the terminal's control sequences."""
        return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(self.chunks).decode(errors="replace"))


def test_watch_in_a_pty_until_the_run_completes(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'watch.db'}"
    run_id = flows.start(flows.wide, "wide", {"items": 5}, url)
    term = Pty([sys.executable, "-m", "raysaga", "status", run_id, "--db", url, "--watch", "--interval", "0.1"])
    try:
        wait_until(lambda: f"run {run_id} (wide v1): pending" in term.text(), "the first frame", 60)
        assert term.proc.poll() is None  # still watching a pending run
        flows.drive(flows.wide, run_id, url)
        assert term.proc.wait(60) == 0
        term.reader.join(10)
        assert f"run {run_id} (wide v1): completed" in term.text()
        assert "fan-out square: 5 items" in term.text()
    finally:
        if term.proc.poll() is None:
            term.proc.kill()
        os.close(term.master)


def test_watch_into_a_pipe_prints_each_change_once(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'pipe.db'}"
    run_id = flows.start(flows.wide, "wide", {"items": 2}, url)
    proc = subprocess.Popen([sys.executable, "-m", "raysaga", "status", run_id, "--db", url, "--watch",
                             "--interval", "0.05"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().startswith(f"run {run_id} (wide v1): pending")
        # the run left unchanged for ~10 polls, which must print nothing more: a pause, not a
        # synchronisation (the test passes whatever the watcher did meanwhile, if it printed right)
        time.sleep(0.5)
        flows.drive(flows.wide, run_id, url)
        rest = proc.stdout.read()
        assert proc.wait(60) == 0
        header = f"run {run_id} (wide v1): "
        views = [header + view for view in rest.split(header)[1:]]
        # each view printed differs from the one before (the driver line's countdown aside). The
        # same state may be printed twice: the lease's claim changes a pending run's "updated" time.
        keys = [[line for line in view.splitlines() if not line.startswith("driver:")] for view in views]
        assert all(a != b for a, b in itertools.pairwise(keys)), rest
        assert [v.splitlines()[0] for v in views].count(header + "completed") == 1
        assert views[-1].startswith(header + "completed")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_events_follow_until_the_run_rests(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'follow.db'}"
    run_id = flows.start(flows.wide, "wide", {"items": 3}, url)
    proc = subprocess.Popen([sys.executable, "-m", "raysaga", "events", run_id, "--db", url, "--follow",
                             "--interval", "0.1"], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert proc.stdout is not None
        first = json.loads(proc.stdout.readline())
        assert first["kind"] == "run_created"  # printed, and still following
        flows.drive(flows.wide, run_id, url)
        rest = [json.loads(line) for line in proc.stdout]
        assert proc.wait(60) == 0
        assert rest[-1]["kind"] == "run_completed"
        assert [e["seq"] for e in [first, *rest]] == list(range(1, len(rest) + 2))  # each once, in order
    finally:
        if proc.poll() is None:
            proc.kill()

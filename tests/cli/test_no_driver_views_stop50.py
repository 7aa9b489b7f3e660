"""Every view of a run no driver drives agrees (stop 50; stop 49 began it).

A killed driver's effect fan-out read ``interrupted`` in ``status``'s table and ``4 running`` on
the ``fan-out`` line under it; ``status --json`` counted ``{"running": 4}`` in ``node_counts`` and
``--summary`` ``work {"running": 4}``. Now what the store records running counts as
``NoDriver.in_flight`` (``interrupted``) in each, ``--json``'s ``nodes`` too (the status schema's
node states take ``interrupted``). ``raysaga list`` read
``running`` with an empty reason and its ``--json`` had no ``no_driver``: now ``running, no
driver``, why and what continues it, and ``no_driver`` as ``status --json`` has it. Plain
``raysaga stats`` left ``runs_without_driver`` out (only ``--json`` and ``--prometheus`` had it).
"""

from __future__ import annotations

import json
import signal
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from raysaga.orchestrator.status_text import utc
from raysaga.state import SqlStore
from tests.support import no_driver_flows as flows
from tests.support.cli import invoke


def _ok(*args: str) -> str:
    code, out, err = invoke(*args)
    assert code == 0, err
    return out


def _status_json(url: str, run_id: str, *options: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_ok("status", run_id, "--db", url, "--json", *options))
    schema = json.loads(resources.files("raysaga.orchestrator.dashboard").joinpath("status.schema.json").read_text())
    jsonschema.validate(doc, schema)
    return doc


def _list_line(url: str, run_id: str) -> str:
    rows = [line for line in _ok("list", "--db", url).splitlines() if line.split()[:1] == [run_id]]
    assert len(rows) == 1, rows
    return rows[0]


def _list_json(url: str) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: r for r in json.loads(_ok("list", "--db", url, "--json"))}


def _killed(url: str, tmp_path: Path) -> tuple[str, dict[str, int]]:
    """An effect fan-out whose driver was SIGKILLed (reaped: its pid runs nothing, its lease runs
    on: ``gone``); its run id and its work's counts as the views should show them."""
    run_id = "nd-views"
    proc = flows.start("effect", url, run_id, tmp_path, "--lease-ttl", "30")
    try:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)
    finally:
        (tmp_path / "release").touch()
    store = SqlStore(url)
    try:
        counts = store.step_counts(run_id, ["work"])["work"]
    finally:
        store.close()
    done, running = counts.get("completed", 0), counts.get("running", 0)
    assert running > 0 and set(counts) <= {"completed", "running"}, counts
    unissued = 6 - done - running  # no row: counted pending
    return run_id, {k: n for k, n in (("completed", done), ("interrupted", running), ("pending", unissued)) if n}


def test_a_killed_drivers_fan_out_line_counts_what_the_table_lists(own_store_url: str, tmp_path: Path) -> None:
    run_id, work = _killed(own_store_url, tmp_path)
    text = _ok("status", run_id, "--db", own_store_url)
    fan = [line for line in text.splitlines() if line.startswith("fan-out work: ")]
    assert len(fan) == 1, text
    assert fan[0].startswith("fan-out work: 6 items — " + ", ".join(f"{n} {k}" for k, n in work.items())), text
    assert "running" not in fan[0], text
    assert all(line.split()[1] == "interrupted" for line in text.splitlines() if line.startswith("work[")), text


def test_a_killed_drivers_json_and_summary_count_nothing_running(own_store_url: str, tmp_path: Path) -> None:
    url = own_store_url
    run_id, work = _killed(url, tmp_path)
    doc = _status_json(url, run_id)  # still valid by the status schema
    assert doc["no_driver"]["why"] == "gone" and doc["no_driver"]["in_flight"] == "interrupted"
    assert doc["node_counts"] == {**work, "completed": 1 + work.get("completed", 0)}, doc["node_counts"]  # (plan's)
    # the rows recorded running are listed as the table lists them: interrupted, none running
    listed = [n["status"] for n in doc["nodes"] if n["step"] == "work"]
    assert len(listed) == work.get("completed", 0) + work["interrupted"], listed
    assert sorted(set(listed)) == sorted({"interrupted", *(["completed"] if "completed" in work else [])}), listed
    steps = {s["step"]: s["counts"] for s in _status_json(url, run_id, "--summary")["steps"]}
    assert steps == {"plan": {"completed": 1}, "work": work}, steps


def test_list_marks_a_killed_drivers_run_and_not_a_driven_one(own_store_url: str, tmp_path: Path) -> None:
    url = own_store_url
    run_id, _ = _killed(url, tmp_path)
    live = tmp_path / "live"
    live.mkdir()
    other = flows.start("plain", url, "nd-live", live)
    try:
        line = _list_line(url, run_id)
        assert "  running, no driver  " in line, line
        assert line.endswith(f"is gone (process not running); `raysaga resume {run_id}` takes it over at once"), line
        found = _list_json(url)
        assert found[run_id]["status"] == "running"
        assert found[run_id]["no_driver"] == _status_json(url, run_id)["no_driver"], found[run_id]
        assert found["nd-live"]["no_driver"] is None, found["nd-live"]
        driven = _list_line(url, "nd-live")
        assert driven.split()[3] == "running" and "no driver" not in driven, driven
    finally:
        (live / "release").touch()
        _, err = other.communicate(timeout=120)
    assert other.returncode == 0, err


def test_an_interrupted_run_is_marked_in_list_and_counted_by_stats_text(own_store_url: str, tmp_path: Path) -> None:
    url, run_id = own_store_url, "nd-count"
    proc = flows.start("plain", url, run_id, tmp_path)
    try:
        # while its driver holds the lease: no line of runs without a driver, no mark in the list
        assert "no driver" not in _ok("stats", "--db", url)
        assert _list_json(url)[run_id]["no_driver"] is None
        flows.interrupt(proc, tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    store = SqlStore(url)
    try:
        stop = [e for e in store.events(run_id) if e.kind == "driver_interrupted"][-1]
    finally:
        store.close()

    lines = _ok("stats", "--db", url).splitlines()
    assert lines[0] == "runs: running 1", lines
    assert lines[1].startswith("runs no driver drives: 1 (running or compensating, their lease released or "
                               "expired: `raysaga resume RUN` continues each"), lines
    assert json.loads(_ok("stats", "--db", url, "--json"))["runs_without_driver"] == 1

    line = _list_line(url, run_id)
    assert "  running, no driver  " in line, line
    assert line.endswith(f"interrupted at {utc(stop.at)} by SIGINT; `raysaga resume {run_id}` continues it"), line
    listed = _list_json(url)[run_id]
    assert listed["no_driver"] == _status_json(url, run_id)["no_driver"]
    assert listed["no_driver"]["why"] == "interrupted" and listed["no_driver"]["signal"] == "SIGINT"

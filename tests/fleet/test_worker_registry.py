"""The worker fleet made visible: each ``raysaga worker`` has a row in ``raysaga_workers``
(``raysaga workers``, ``Client.workers``) saying it is alive and what it serves, and ``raysaga
status`` of a submitted run that waits for the fleet says whether a live worker serves it.

Before, a run submitted for a definition no worker had sat ``pending`` and ``status`` said only
"no live driver since ...": nothing told whether any worker was alive or what the fleet served.
Real worker processes, on SQLite and PostgreSQL; the beat is 0.2 s (``RAYSAGA_WORKER_BEAT``), so
a killed worker drops out of the live list within a second, and tests wait for it with ``wait_until``.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from raysaga import Client
from raysaga.orchestrator import versions
from raysaga.orchestrator.dashboard import views
from raysaga.state import RunStatus, ServedWorkflow, WorkerRecord
from tests.support.cli import invoke
from tests.support.crash_driver import wait_until
from tests.support.fleet_view_flows import alpha, alpha_v2, beta, gate
from tests.support.registry_workers import FLOWS, start_registered
from tests.support.worker_procs import stop


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    """Workers a test starts: killed at its end if it left them running."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)


def _mine(client: Client, proc: subprocess.Popen[str], *, include_gone: bool = False) -> WorkerRecord | None:
    found = [w for w in client.workers(include_gone=include_gone) if w.pid == proc.pid]
    return found[0] if found else None


def _live(client: Client, *started: subprocess.Popen[str]) -> list[WorkerRecord]:
    """The live rows of ``started``, once every one of them has registered."""
    def look() -> list[WorkerRecord] | None:
        rows = [_mine(client, p) for p in started]
        return None if None in rows else [r for r in rows if r is not None]

    return wait_until(look, timeout=60, what=f"workers {[p.pid for p in started]} to register")


def _status(db: str, run_id: str) -> str:
    code, out, err = invoke("status", run_id, "--db", db)
    assert code == 0, err
    return out


def _status_json(db: str, run_id: str) -> dict[str, Any]:
    code, out, err = invoke("status", run_id, "--db", db, "--json")
    assert code == 0, err
    doc: dict[str, Any] = json.loads(out)
    schema = json.loads(resources.files("raysaga.orchestrator.dashboard").joinpath("status.schema.json").read_text())
    jsonschema.validate(doc, schema)
    return doc


def _served(wf: Any) -> ServedWorkflow:
    return ServedWorkflow(name=wf.name, version=wf.version, definition_hash=wf.definition_hash,
                          legacy_hash=versions.legacy_hash(wf))


def test_two_workers_serving_different_workflows_are_both_listed_with_what_they_serve(
        fleet_url: str, procs: list[subprocess.Popen[str]]) -> None:
    procs += [start_registered(fleet_url, "alpha", concurrency=2), start_registered(fleet_url, "beta")]
    with Client(fleet_url) as client:
        a, b = _live(client, *procs)
    assert (a.workflows, a.slots, b.workflows, b.slots) == ([_served(alpha)], 2, [_served(beta)], 1)
    for row, proc in ((a, procs[0]), (b, procs[1])):
        assert (row.host, row.pid, row.queues, row.busy, row.stopped_at) == (socket.gethostname(), proc.pid,
                                                                             ["*"], 0, None)
        assert row.worker_id.startswith(f"{socket.gethostname()}:{proc.pid}:")  # its owner id
        assert row.started_at <= row.beat_at <= time.time() + 1
    code, out, err = invoke("workers", "--db", fleet_url)
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["HOST", "PID"] and len(lines) == 3, out
    by_pid = {line.split()[1]: line for line in lines[1:]}
    assert f"view_alpha v1 ({alpha.definition_hash[:12]})" in by_pid[str(procs[0].pid)], out
    assert "0/2 busy" in by_pid[str(procs[0].pid)] and "any" in by_pid[str(procs[0].pid)], out
    assert f"view_beta v1 ({beta.definition_hash[:12]})" in by_pid[str(procs[1].pid)], out
    code, out, err = invoke("workers", "--db", fleet_url, "--json")
    assert code == 0, err
    listed = {w["pid"]: w for w in json.loads(out)}
    assert {pid: w["state"] for pid, w in listed.items()} == {procs[0].pid: "live", procs[1].pid: "live"}
    assert listed[procs[1].pid]["workflows"] == [_served(beta).model_dump()]


def test_a_killed_worker_drops_out_of_the_live_list_once_its_beat_is_older_than_the_bound(
        fleet_url: str, procs: list[subprocess.Popen[str]]) -> None:
    procs += [start_registered(fleet_url, "alpha"), start_registered(fleet_url, "beta")]
    with Client(fleet_url) as client:
        _live(client, *procs)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(timeout=60)
        wait_until(lambda: _mine(client, procs[0]) is None, timeout=30, what="the killed worker to drop out")
        now = time.time()
        gone = _mine(client, procs[0], include_gone=True)
        assert gone is not None and gone.stopped_at is None and gone.state(now) == "silent"
        assert now > gone.live_until() == gone.beat_at + 3 * gone.beat_every  # the stated bound, 3 beats
        assert _mine(client, procs[1]) is not None  # the other still beats
    code, out, err = invoke("workers", "--db", fleet_url, "--all")
    assert code == 0, err
    state = {line.split()[1]: line.split()[2] for line in out.splitlines()[1:]}
    assert state == {str(procs[0].pid): "silent", str(procs[1].pid): "live"}, out


def test_a_clean_stop_records_stopped_at(fleet_url: str, procs: list[subprocess.Popen[str]]) -> None:
    procs.append(start_registered(fleet_url, "alpha"))
    with Client(fleet_url) as client:
        _live(client, procs[0])
        before = time.time()
        code, _, err = stop(procs[0], signal.SIGTERM)
        assert code == 0, err
        assert _mine(client, procs[0]) is None
        row = _mine(client, procs[0], include_gone=True)
        assert row is not None and row.stopped_at is not None and before <= row.stopped_at <= time.time()
        assert row.state(time.time()) == "stopped"
    code, out, err = invoke("workers", "--db", fleet_url)
    assert code == 0 and out.startswith("no live worker"), (out, err)
    code, out, err = invoke("workers", "--db", fleet_url, "--all")
    assert code == 0 and f" {procs[0].pid} " in out and "stopped" in out, (out, err)


def test_status_of_a_submitted_run_no_live_worker_serves_says_so_and_names_the_command(
        fleet_url: str, procs: list[subprocess.Popen[str]]) -> None:
    with Client(fleet_url) as client:
        run = client.submit(alpha_v2, 5, workflow_ref=f"{FLOWS}:alpha_v2")
        command = f"raysaga worker -w {FLOWS}:alpha_v2"
        what = f"view_alpha v2 (hash {alpha_v2.definition_hash[:12]}) on queue 'default'"
        fleet = [line for line in _status(fleet_url, run.run_id).splitlines() if line.startswith("fleet: ")]
        assert fleet == [f"fleet: no live worker serves {what}: no registered worker is live (`raysaga workers "
                         "--all` shows recent ones; workers of raysaga before 0.3.0 do not register); start one: "
                         f"{command}"]
        procs += [start_registered(fleet_url, "alpha"), start_registered(fleet_url, "beta")]  # v1 of alpha: not it
        _live(client, *procs)
        out = _status(fleet_url, run.run_id)
        assert (f"fleet: no live worker serves {what}: the 2 live workers serve view_alpha v1 (hash "
                f"{alpha.definition_hash[:12]}), view_beta v1 (hash {beta.definition_hash[:12]}); start one that "
                f"does: {command}") in out, out
        doc = _status_json(fleet_url, run.run_id)["fleet"]
        assert {k: doc[k] for k in ("live_workers", "serving", "queue", "command")} == {
            "live_workers": 2, "serving": 0, "queue": "default", "command": command}
        page = views.run_page(client.store, run.run_id)["run"]["fleet"]  # the dashboard's run carries it too
        assert (page["serving"], page["command"]) == (0, command)
        assert client.get_run(run.run_id).status == RunStatus.PENDING


def test_status_of_a_submitted_run_live_workers_serve_says_how_many(
        fleet_url: str, procs: list[subprocess.Popen[str]], tmp_path: Path) -> None:
    release = tmp_path / "release"
    procs += [start_registered(fleet_url, "gate"), start_registered(fleet_url, "gate")]
    with Client(fleet_url) as client:
        _live(client, *procs)
        held = [client.submit(gate, str(release), workflow_ref=f"{FLOWS}:gate").run_id for _ in procs]
        wait_until(lambda: all(client.get_run(r).status == RunStatus.RUNNING for r in held), timeout=60,
                   what="each worker's one slot to hold a run")
        wait_until(lambda: [w.busy for w in _live(client, *procs)] == [1, 1], timeout=30, what="busy slots")
        waiting = client.submit(gate, str(release), workflow_ref=f"{FLOWS}:gate")
        out = _status(fleet_url, waiting.run_id)
        assert (f"fleet: 2 live workers serve view_gate v1 (hash {gate.definition_hash[:12]}) on queue "
                "'default': it is claimed once one has a free slot") in out, out
        doc = _status_json(fleet_url, waiting.run_id)["fleet"]
        assert (doc["live_workers"], doc["serving"], doc["command"]) == (2, 2, None)
        release.touch()
        wait_until(lambda: all(client.get_run(r).status == RunStatus.COMPLETED for r in [*held, waiting.run_id]),
                   timeout=60, what="the runs to complete")
        assert "fleet: " not in _status(fleet_url, waiting.run_id)  # no longer waiting for the fleet


def test_a_failing_beat_is_a_warning_and_the_worker_drives_on(fleet_url: str, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The registry is for people: with its table gone (every beat fails) the worker still claims
    and drives runs, and its stop ends it cleanly."""
    import threading

    from raysaga import Worker
    from raysaga.state import SqlStore

    monkeypatch.setenv("RAYSAGA_WORKER_BEAT", "0.05")
    store = SqlStore(fleet_url)
    worker = Worker([alpha], store, concurrency=1, executor="inline", poll=0.05)
    ended: list[object] = []
    thread = threading.Thread(target=lambda: ended.append(worker.run()), daemon=True)
    with Client(fleet_url) as client:
        try:
            thread.start()
            wait_until(lambda: [w for w in client.workers() if w.worker_id == worker.presence.worker_id],
                       timeout=30, what="the worker to register")
            with store.engine.begin() as conn:
                conn.exec_driver_sql("DROP TABLE raysaga_workers")
            wait_until(lambda: "could not beat in the worker registry" in caplog.text, timeout=30,
                       what="the failed beat's warning")
            run = client.submit(alpha, 21)
            done = wait_until(lambda: (r if (r := client.get_run(run.run_id)).status == RunStatus.COMPLETED
                                       else None), timeout=60, what="the run to complete")
            assert done.output == {"double": 42} and thread.is_alive()
        finally:
            worker.stop()
            thread.join(timeout=60)
            store.close()
    assert not thread.is_alive() and len(ended) == 1 and worker.failure is None

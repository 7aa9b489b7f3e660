"""A run no driver drives reads so in every view (stop 49).

A ``raysaga run`` interrupted with Ctrl-C releases its lease, records ``driver_interrupted`` and
prints "`raysaga resume X` continues it"; one killed leaves its lease to expire. Either way the run
stays ``running`` in the store (a worker or a resume takes it up), and the views said so as if it
were at work, for ever: ``status`` read ``running … (12.1m so far)`` with its fan-out in flight,
``stats`` counted it running, and the event and the advice showed nowhere. Now ``status`` heads it
``running, no driver — interrupted at T by SIGINT; `raysaga resume X` continues it``, lists its
work ``interrupted``, ``--json`` has ``no_driver`` (why, since, signal, driver, command, note),
``--dag`` draws it ``◌ interrupted``, and ``stats`` counts it apart (``runs_without_driver``).
A killed driver's run reads ``is gone`` at once on its host, ``died: its lease expired at T`` once
it has.

Also: a fan-out under way (its own row is written when it ends) has a row of its own in
``status``'s table, as ``--dag`` draws it; it was missing (only the ``fan-out`` line below said it).
"""

from __future__ import annotations

import json
import signal
import time
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from raysaga.orchestrator.status_text import utc
from raysaga.state import SqlStore
from tests.support import no_driver_flows as flows
from tests.support.cli import invoke
from tests.support.crash_driver import wait_lease_expired, wait_until


def _status(url: str, run_id: str, *options: str) -> str:
    code, out, err = invoke("status", run_id, "--db", url, *options)
    assert code == 0, err
    return out


def _status_json(url: str, run_id: str, *options: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(_status(url, run_id, "--json", *options))
    schema = json.loads(resources.files("raysaga.orchestrator.dashboard").joinpath("status.schema.json").read_text())
    jsonschema.validate(doc, schema)
    return doc


def _stats(url: str, *options: str) -> str:
    code, out, err = invoke("stats", "--db", url, *options)
    assert code == 0, err
    return out


def _table_row(text: str, node: str) -> list[str]:
    rows = [line.split() for line in text.splitlines() if line.split()[:1] == [node]]
    assert len(rows) == 1, text
    return rows[0]


def test_an_interrupted_run_says_nobody_drives_it_and_what_continues_it(own_store_url: str, tmp_path: Path) -> None:
    store_url = own_store_url  # (stats counts the whole store's runs)
    run_id = "nd-int"
    proc = flows.start("plain", store_url, run_id, tmp_path)
    try:
        # while its driver holds the lease, the run is at work: no word of a missing driver
        live = _status_json(store_url, run_id)
        assert live["status"] == "running" and live["no_driver"] is None
        assert "no driver" not in _status(store_url, run_id).splitlines()[0]
        assert json.loads(_stats(store_url, "--json"))["runs_without_driver"] == 0
        err = flows.interrupt(proc, tmp_path)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert f"`raysaga resume {run_id}` continues it" in err, err

    store = SqlStore(store_url)
    try:
        run = store.get_run(run_id)
        stop = [e for e in store.events(run_id) if e.kind == "driver_interrupted"][-1]
        done = store.step_counts(run_id, ["work"])["work"].get("completed", 0)
    finally:
        store.close()
    assert run.status.value == "running" and run.lease_owner is None  # the store's state is unchanged
    assert 0 < done < 6

    text = _status(store_url, run_id)
    note = f"interrupted at {utc(stop.at)} by SIGINT; `raysaga resume {run_id}` continues it"
    assert text.splitlines()[0] == f"run {run_id} (no-driver v1): running, no driver — {note}", text
    # the fan-out under way has its own row, interrupted, as --dag draws it
    assert _table_row(text, "work")[:2] == ["work", "interrupted"], text
    assert f"fan-out work: 6 items — {done} completed, {6 - done} pending ({6 - done} with no row: not issued, " \
           "or in flight when its driver stopped; a resume issues them)" in text, text
    assert "◌ work  interrupted, 6 items" in _status(store_url, run_id, "--dag")

    doc = _status_json(store_url, run_id, "--workflow", f"{flows.MODULE}:plain")
    assert doc["status"] == "running"
    assert doc["no_driver"] == {"why": "interrupted", "since": stop.at, "signal": "SIGINT", "driver":
                                doc["no_driver"]["driver"], "command": f"raysaga resume {run_id}",
                                "note": f"no driver: {note}", "in_flight": "interrupted"}
    assert doc["no_driver"]["driver"].startswith("pid ")
    assert {n["status"] for n in doc["nodes"]} <= {"completed", "pending"}  # nothing listed running
    assert doc["node_counts"] == {"completed": 1 + done, "pending": 6 - done}

    figures = json.loads(_stats(store_url, "--json"))
    assert figures["runs_by_state"]["running"] == 1 and figures["runs_without_driver"] == 1
    assert "raysaga_runs_without_driver 1" in _stats(store_url, "--prometheus").splitlines()


def test_a_killed_drivers_run_reads_gone_then_its_lease_expired(own_store_url: str, tmp_path: Path) -> None:
    """SIGKILL: no event, the lease left to expire. On its host the driver is provably gone at
    once; once the lease expires, the run reads "died" and ``stats`` counts it. Its items recorded
    running (an effect's, before each call) show interrupted."""
    store_url = own_store_url  # (stats counts the whole store's runs)
    run_id = "nd-kill"
    proc = flows.start("effect", store_url, run_id, tmp_path, "--lease-ttl", "10")
    try:
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=60)  # reaped: its pid runs nothing
    finally:
        (tmp_path / "release").touch()
    store = SqlStore(store_url)
    try:
        running = store.step_counts(run_id, ["work"])["work"].get("running", 0)
        owner = store.get_run(run_id).lease_owner
        assert running > 0 and owner is not None
        pid = owner.split(":")[-5]

        # its lease runs for seconds yet (renewed every few): the driver is gone all the same
        assert _status_json(store_url, run_id)["no_driver"]["why"] == "gone"
        text = _status(store_url, run_id)
        assert f": running, no driver — its driver (pid {pid} on " in text.splitlines()[0], text
        assert f"is gone (process not running); `raysaga resume {run_id}` takes it over at once" in text, text
        run = wait_lease_expired(store, run_id)
        assert run.lease_expires_at is not None
        wait_until(lambda: time.time() > (run.lease_expires_at or 0.0), timeout=10, what="the clock past the lease")
    finally:
        store.close()
    text = _status(store_url, run_id)
    assert text.splitlines()[0].endswith(f"died: its lease expired at {utc(run.lease_expires_at)}; "
                                         f"`raysaga resume {run_id}` continues it"), text
    rows = [line.split() for line in text.splitlines() if line.startswith("work[")]
    assert len(rows) == running and all(r[1] == "interrupted" for r in rows), text
    assert "recorded running; nobody runs it: a resume runs it again" in text
    doc = _status_json(store_url, run_id)
    assert doc["no_driver"]["why"] == "expired" and doc["no_driver"]["since"] == run.lease_expires_at
    assert json.loads(_stats(store_url, "--json"))["runs_without_driver"] == 1


def test_a_fan_out_under_way_has_a_row_of_its_own(sqlite_url: str, tmp_path: Path) -> None:
    """Items recorded (an effect's are, before each call), the fan-out's own row not yet (it is
    written when the fan-out ends): the table listed no ``work`` row, and only the ``fan-out`` line
    below it said where it stood."""
    proc = flows.start("effect", sqlite_url, "nd-fan", tmp_path)
    try:
        text = _status(sqlite_url, "nd-fan")
        assert _table_row(text, "work")[:2] == ["work", "running"], text
        assert "fan-out: 6 items, counted below" in text, text
        assert "fan-out work: 6 items — " in text, text
    finally:
        (tmp_path / "release").touch()
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    done = _status(sqlite_url, "nd-fan")
    assert _table_row(done, "work")[:3] == ["work", "completed", "1"], done  # its own row, once it ended
    assert "counted below" not in done

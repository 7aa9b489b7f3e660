"""CLI defects found by QA, each pinned: numbers beyond a column's range, a half-written
``status --json``, malformed Ray addresses, a second Ctrl-C that did not stop an inline run,
``status --workflow`` of another workflow, ``resume``/``retry`` importing code for a run at rest,
``--input null`` on an existing run, and small edge messages (depth, broken pipe, durations,
``--input @``, a directory as the store). Real SQLite and PostgreSQL; real subprocesses where a
signal, a pipe or a hang is involved."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raysaga.state import open_store
from tests.support.child_signals import sigint_default, sigint_ignored
from tests.support.cli import invoke, one_line_error

EXE = Path(sys.executable).with_name("raysaga")

FLOW = textwrap.dedent('''
    from pathlib import Path
    from pydantic import BaseModel
    from raysaga import Permanent, Workflow

    Path(__file__).with_name("imported").write_text("yes")  # proof that this code was imported

    wf = Workflow("fixes", version="1")

    @wf.step()
    def fetch() -> list[int]:
        return [1, 2, 3]

    @wf.map("fetch")
    def score(fetch: int) -> int:
        return fetch * 10

    other = Workflow("other", version="1")

    @other.step()
    def alone() -> int:
        return 1

    broken = Workflow("broken", version="1")

    @broken.step()
    def fail() -> int:
        raise Permanent("no")

    free = Workflow("free", version="1")

    @free.step()
    def echo(input: dict | list | None) -> int:
        return 1

    class Order(BaseModel):
        sku: str

    orders = Workflow("orders", version="1")

    @orders.step()
    def take(input: Order) -> str:
        return input.sku
''')

SLOW = textwrap.dedent('''
    import time
    from pathlib import Path
    from raysaga import Workflow

    wf = Workflow("slow", version="1")
    HERE = Path(__file__).parent

    @wf.step()
    def first() -> int:
        (HERE / "started").write_text("yes")
        while not (HERE / "go").exists():  # never created before the driver is gone
            time.sleep(0.01)
        return 1

    @wf.step()
    def second(first: int) -> int:
        return first + 1
''')


@pytest.fixture
def flow(tmp_path: Path) -> Path:
    path = tmp_path / "fixes_flow.py"
    path.write_text(FLOW)
    return path




def run_ids(url: str) -> list[str]:
    store = open_store(url)
    try:
        return [r.run_id for r in store.list_runs()]
    finally:
        store.close()


# ------------------------------------------------------------------ 1. numbers beyond a column's range


def test_out_of_range_numbers_are_usage_errors_on_every_store(flow: Path, store_url: str) -> None:
    run_id = f"nums-{abs(hash(store_url)) % 100_000}-{time.time_ns()}"
    code, _, err = invoke("run", f"{flow}:wf", "--db", store_url, "--executor", "inline", "--run-id", run_id,
                          "--retry-budget", "2147483647")  # the largest an Integer column holds
    assert code == 0, err
    before = run_ids(store_url)
    for budget in ("2147483648", "9223372036854775808", "99999999999999999999"):
        code, _, err = invoke("run", f"{flow}:wf", "--db", store_url, "--executor", "inline",
                              "--retry-budget", budget)
        one_line_error(code, err, f"--retry-budget must be from 0 to 2147483647, got {budget}")
    assert run_ids(store_url) == before
    for after in ("9223372036854775808", "99999999999999999999"):
        code, out, err = invoke("events", run_id, "--db", store_url, "--after", after)
        one_line_error(code, err, f"--after must be from 0 to 9223372036854775807, got {after}")
        assert out == ""
    code, out, err = invoke("events", run_id, "--db", store_url, "--after", "9223372036854775807")
    assert (code, out) == (0, ""), err
    code, _, err = invoke("events", run_id, "--db", store_url, "--limit", "99999999999999999999")
    one_line_error(code, err, "--limit must be from 1 to 9223372036854775807")
    code, _, err = invoke("status", run_id, "--db", store_url, "--json", "--nodes-limit", "99999999999999999999")
    one_line_error(code, err, "--nodes-limit must be from 1 to 9223372036854775807")
    for label in ("score[99999999999999999999]", "score[2147483648]"):
        code, out, err = invoke("status", run_id, "--db", store_url, "--node", label)
        one_line_error(code, err, f"--node {label!r}: a fan-out index is 0 to 2147483647")
        code, out, err = invoke("status", run_id, "--db", store_url, "--json", "--nodes-after", label)
        one_line_error(code, err, f"--nodes-after {label!r}: a fan-out index is 0 to 2147483647")
        assert out == ""
    code, _, err = invoke("status", run_id, "--db", store_url, "--node", "score[2147483647]")
    one_line_error(code, err, "has no node 'score[2147483647]'")


# ------------------------------------------------------------------ 2. status --json writes nothing it must retract


def test_status_json_checks_nodes_after_before_writing(flow: Path, sqlite_url: str) -> None:
    assert invoke("run", f"{flow}:wf", "--db", sqlite_url, "--executor", "inline", "--run-id", "page")[0] == 0
    for summary in ([], ["--summary"]):
        code, out, err = invoke("status", "page", "--db", sqlite_url, "--json", "--nodes-after", "nonexist[99]",
                                *summary)
        one_line_error(code, err, "--nodes-after 'nonexist[99]' is not a node of this run")
        assert out == ""
    code, out, err = invoke("status", "page", "--db", sqlite_url, "--json", "--nodes-after", "score[0]")
    assert code == 0, err
    assert [n["node"] for n in json.loads(out)["nodes"]] == ["score[1]", "score[2]"]


def test_a_corrupt_node_row_names_its_run(flow: Path, sqlite_url: str, tmp_path: Path) -> None:
    assert invoke("run", f"{flow}:wf", "--db", sqlite_url, "--executor", "inline", "--run-id", "rot")[0] == 0
    with sqlite3.connect(tmp_path / "raysaga.db") as conn:
        # the item's own row, written by hand over what the run stored (a chunk of items, schema 12)
        conn.execute("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt, error) "
                     "SELECT run_key, 'score', 1, 'failed', 1, '{not json' FROM raysaga_runs WHERE run_id = 'rot' "
                     "ON CONFLICT DO UPDATE SET status = 'failed', error = '{not json'")
    for extra in (["--json"], [], ["--node", "score[1]"], ["--errors"], ["--json", "--summary"]):
        code, out, err = invoke("status", "rot", "--db", sqlite_url, *extra)
        one_line_error(code, err, "error: run 'rot': raysaga_nodes.error holds text that is not JSON")
        assert "changed outside raysaga" in err
    # the stream cannot be retracted: what was written before the bad chunk stays (documented)
    code, out, err = invoke("status", "rot", "--db", sqlite_url, "--json")
    assert code == 2 and out.startswith('{"schema_version": 1')
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


# ------------------------------------------------------------------ 3. malformed Ray addresses


@pytest.mark.parametrize(("address", "message"), [
    ("127.0.0.1:-5", "is not HOST:PORT with a port from 1 to 65535"),
    ("127.0.0.1:+5", "is not HOST:PORT with a port from 1 to 65535"),
    (":", "is not HOST:PORT"),
    ("bogus", "is not HOST:PORT"),
    ("ray://127.0.0.1:10001", "Ray Client (ray://) is not supported"),
])
def test_a_malformed_address_is_refused_at_once(flow: Path, tmp_path: Path, address: str, message: str) -> None:
    url = f"sqlite:///{tmp_path / 'addr.db'}"
    proc = subprocess.run([str(EXE), "run", f"{flow}:wf", "--db", url, "--address", address],
                          capture_output=True, text=True, timeout=120)  # this used to hang for ever
    one_line_error(proc.returncode, proc.stderr, message)
    assert not (tmp_path / "addr.db").exists()  # refused before the store is opened
    for command in (["resume", "r1"], ["retry", "r1"], ["cancel", "r1"]):
        code, _, err = invoke(*command, "--db", url, "--address", address)
        one_line_error(code, err, message)


# ------------------------------------------------------------------ 4. a second signal stops an inline run at once


def _start_slow(tmp_path: Path, ignore_sigint: bool) -> tuple[subprocess.Popen[str], str]:
    (tmp_path / "slow_flow.py").write_text(SLOW)
    db = f"sqlite:///{tmp_path / 'slow.db'}"
    # ignored: what `cmd &` in a non-interactive shell does to the child; else SIGINT's default,
    # whatever this test run inherited (a background run passes SIGINT on ignored)
    proc = subprocess.Popen([str(EXE), "run", "slow_flow.py:wf", "--executor", "inline", "--run-id", "slow-1",
                             "--db", db, "--lease-ttl", "600"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_ignored if ignore_sigint else sigint_default)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the first step never started"
        time.sleep(0.05)
    return proc, db


@pytest.mark.parametrize(("signum", "ignore_sigint"), [
    (signal.SIGTERM, True), (signal.SIGINT, False), (signal.SIGTERM, False)])
def test_a_second_signal_stops_an_inline_step_at_once(tmp_path: Path, signum: int, ignore_sigint: bool) -> None:
    """A driver started with SIGINT ignored (a background job) keeps it ignored: a Ctrl-C at the
    terminal is meant for the foreground job. Sent first, it is not acted on: the first signal the
    driver handles is the SIGTERM after it (a handled SIGINT, number 2, would run first)."""
    proc, db = _start_slow(tmp_path, ignore_sigint)
    name = signal.Signals(signum).name
    if ignore_sigint:
        proc.send_signal(signal.SIGINT)
    proc.send_signal(signum)
    assert proc.stderr is not None
    seen = ""
    while f"{name} received" not in seen:  # the driver logs the first signal once it has handled it
        ready, _, _ = select.select([proc.stderr], [], [], 60)
        assert ready, f"no word of the first {name}: {seen!r}"
        line = proc.stderr.readline()
        assert line, f"the driver exited: {seen!r}"
        seen += line
    assert "SIGINT" not in seen or not ignore_sigint, seen
    proc.send_signal(signum)
    try:  # the step waits for a file that never appears: only a stop at once ends the process
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum, (out, seen + err)
    assert f"interrupted by {name} again: stopped at once" in err and "`raysaga resume slow-1`" in err
    assert "Traceback" not in err
    store = open_store(db)
    try:
        assert store.get_run("slow-1").lease_owner is not None  # still held by the dead process
    finally:
        store.close()
    (tmp_path / "go").write_text("go")
    # the owner is provably gone: resume takes the lease over at once (its TTL is 600 s)
    resumed = subprocess.run([str(EXE), "resume", "slow-1", "--db", db, "--executor", "inline",
                              "--workflow", "slow_flow.py:wf"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    store = open_store(db)
    try:
        assert "lease_taken_over" in [e.kind for e in store.events("slow-1")]
    finally:
        store.close()


# ------------------------------------------------------------------ 5. status --workflow of another workflow


def test_status_refuses_a_workflow_that_is_not_the_runs(flow: Path, sqlite_url: str) -> None:
    assert invoke("run", f"{flow}:wf", "--db", sqlite_url, "--executor", "inline", "--run-id", "mine")[0] == 0
    for extra in ([], ["--json"]):
        code, out, err = invoke("status", "mine", "--db", sqlite_url, "--workflow", f"{flow}:other", *extra)
        one_line_error(code, err, "run 'mine' belongs to workflow 'fixes', not 'other'")
        assert out == ""
    code, out, err = invoke("status", "mine", "--db", sqlite_url, "--workflow", f"{flow}:wf")
    assert code == 0, err


# ------------------------------------------------------------------ 6. a run at rest imports no code


def test_resume_retry_cancel_of_a_run_at_rest_import_no_code(flow: Path, sqlite_url: str, tmp_path: Path) -> None:
    marker = tmp_path / "imported"
    assert invoke("run", f"{flow}:wf", "--db", sqlite_url, "--executor", "inline", "--run-id", "done")[0] == 0
    assert invoke("run", f"{flow}:broken", "--db", sqlite_url, "--executor", "inline", "--run-id", "bad")[0] == 1
    store = open_store(sqlite_url)
    events_before = {r: len(store.events(r)) for r in ("done", "bad")}
    store.close()
    marker.unlink()
    code, out, err = invoke("resume", "done", "--db", sqlite_url, "--workflow", f"{flow}:wf")
    assert code == 0, err
    assert out.startswith("run done (fixes v1): completed") and "nothing to resume" in err
    code, out, err = invoke("resume", "done", "--db", sqlite_url, "--workflow", f"{flow}:wf", "--json")
    assert code == 0 and json.loads(out)["status"] == "completed", err
    code, out, err = invoke("resume", "bad", "--db", sqlite_url, "--workflow", f"{flow}:broken")
    assert code == 1 and "failed" in out.splitlines()[0], err
    code, _, err = invoke("retry", "done", "--db", sqlite_url, "--workflow", f"{flow}:wf")
    one_line_error(code, err, "run 'done' is completed: only a failed run can be retried")
    code, _, err = invoke("retry", "bad", "--db", sqlite_url, "--workflow", f"{flow}:broken", "--compensations")
    one_line_error(code, err, "run 'bad' is failed: only a compensation_failed run can be retried")
    code, out, _ = invoke("cancel", "done", "--db", sqlite_url, "--compensate", "--workflow", f"{flow}:wf")
    assert code == 1 and "already completed: nothing to cancel" in out
    assert not marker.exists(), "the workflow's code was imported for a run at rest"
    store = open_store(sqlite_url)
    try:
        assert {r: len(store.events(r)) for r in ("done", "bad")} == events_before
    finally:
        store.close()


# ------------------------------------------------------------------ 7. --input null is an input


def test_input_null_on_an_existing_run_is_compared_and_no_input_resumes(flow: Path, sqlite_url: str) -> None:
    code, _, err = invoke("run", f"{flow}:free", "--db", sqlite_url, "--executor", "inline", "--run-id", "n1",
                          "--input", '{"a": 1}')
    assert code == 0, err
    code, _, err = invoke("run", f"{flow}:free", "--db", sqlite_url, "--executor", "inline", "--run-id", "n1",
                          "--input", "null")
    one_line_error(code, err, "run 'n1' exists with a different input")
    code, out, err = invoke("run", f"{flow}:free", "--db", sqlite_url, "--executor", "inline", "--run-id", "n1")
    assert code == 0 and "completed" in out, err
    # a workflow whose input is required: an existing run resumes without --input
    code, _, err = invoke("run", f"{flow}:orders", "--db", sqlite_url, "--executor", "inline", "--run-id", "o1",
                          "--input", '{"sku": "a"}')
    assert code == 0, err
    code, out, err = invoke("run", f"{flow}:orders", "--db", sqlite_url, "--executor", "inline", "--run-id", "o1")
    assert code == 0 and "completed" in out, err
    code, _, err = invoke("run", f"{flow}:orders", "--db", sqlite_url, "--executor", "inline", "--run-id", "o2")
    one_line_error(code, err, "--input is required")


# ------------------------------------------------------------------ 8. small edges


def test_input_depth_is_the_stores_limit(flow: Path, sqlite_url: str, tmp_path: Path) -> None:
    from raysaga.state.jsoncodec import MAX_DEPTH

    deep = tmp_path / "deep.json"
    deep.write_text("[" * MAX_DEPTH + "]" * MAX_DEPTH)
    code, _, err = invoke("run", f"{flow}:free", "--input", f"@{deep}", "--db", sqlite_url, "--executor", "inline",
                          "--run-id", "deep")
    assert code == 0, err
    deep.write_text("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1))
    code, _, err = invoke("run", f"{flow}:free", "--input", f"@{deep}", "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, f"nested {MAX_DEPTH + 1} levels deep, at most {MAX_DEPTH} are accepted")
    assert run_ids(sqlite_url) == ["deep"]


def test_text_output_to_a_closed_pipe_exits_141(flow: Path, sqlite_url: str) -> None:
    assert invoke("run", f"{flow}:wf", "--db", sqlite_url, "--executor", "inline", "--run-id", "piped")[0] == 0
    for args in (["status", "piped"], ["list"], ["status", "piped", "--json"], ["events", "piped"]):
        read, write = os.pipe()
        os.close(read)  # the reader is gone before the first byte (`| head -0`)
        try:
            proc = subprocess.run([str(EXE), *args, "--db", sqlite_url], stdout=write, stderr=subprocess.PIPE,
                                  text=True, timeout=120)
        finally:
            os.close(write)
        assert proc.returncode == 141, (args, proc.stderr)
        assert proc.stderr == "", (args, proc.stderr)


def test_small_edges_have_clear_messages(flow: Path, sqlite_url: str, tmp_path: Path) -> None:
    open_store(sqlite_url).close()
    code, _, err = invoke("prune", "--older-than", "99999999999999999999w", "--db", sqlite_url)
    one_line_error(code, err, "--older-than '99999999999999999999w' is longer than 1000 years")
    code, out, err = invoke("prune", "--older-than", "999y", "--db", sqlite_url)
    assert code == 2 and "is not a duration" in err
    code, out, err = invoke("prune", "--older-than", "52000w", "--db", sqlite_url, "--dry-run")
    assert code == 0 and "(bad time)" not in out, err
    code, _, err = invoke("run", f"{flow}:free", "--input", "@", "--db", sqlite_url)
    one_line_error(code, err, "--input @ needs a file name (or @- for stdin)")
    folder = tmp_path / "folder"
    folder.mkdir()
    for command in (["status", "r1"], ["list"], ["events", "r1"], ["resume", "r1"], ["prune", "--older-than", "1d"]):
        code, _, err = invoke(*command, "--db", str(folder))
        one_line_error(code, err, f"the store {folder} is a directory, not a database file")

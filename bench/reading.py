"""Reading a big store: ``raysaga status RUN --json`` of a 10,000-node run, ``raysaga list`` over
100,000 runs, and the dashboard's run page JSON (``GET /api/runs/RUN``) of a 2,000-node run.

Every figure is the wall time of what a user runs: a CLI command in a fresh process (interpreter
start and imports included), or an HTTP request to ``raysaga dashboard`` serving the store.

The runs: fan-outs (``plan -> item x N -> sink``) driven inline into one SQLite store. The
100,000 runs: one real run of a 3-step chain, then copied with direct SQL into the same file
(a copy used for nothing else): ``INSERT INTO raysaga_runs SELECT ... FROM raysaga_runs, n``
over a recursive counter ``n``, new ``run_id`` and ``created_at`` (one second apart) per copy,
and the same for its nodes and events; one transaction, a few seconds for 100,000 runs.
"""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import flows
from table import Report, Samples, spread

import raysaga
from raysaga.state import SqlStore

BIN = Path(sys.executable).parent


def _drive(path: Path, wf: raysaga.Workflow, value: object) -> str:
    store = SqlStore(f"sqlite:///{path}")
    try:
        record = raysaga.run(wf, value, store=store, executor="inline")
        if record.status != raysaga.RunStatus.COMPLETED:
            raise RuntimeError(f"setup run ended {record.status.value}")
        return record.run_id
    finally:
        store.close()


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]


def clone_runs(path: Path, run_id: str, copies: int) -> float:
    """``copies`` copies of ``run_id`` (its run row, nodes and events) by direct SQL; seconds taken."""
    start = time.perf_counter()
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        counter = f"WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {copies}) "
        new_id = "'copy-' || printf('%06d', n.i)"
        # run_key NULL: the store's trigger gives each copy a key; node rows carry it (schema 8)
        key_of = "(SELECT run_key FROM raysaga_runs WHERE run_id = {})"
        replaced = {"run_id": new_id, "run_key": "NULL", "created_at": "created_at - n.i",
                    "updated_at": "updated_at - n.i"}
        keyed = ("raysaga_nodes", "raysaga_item_chunks")  # by run_key (schemas 8 and 12)
        for table in ("raysaga_runs", *keyed, "raysaga_events"):
            cols = _columns(conn, table)
            select = ", ".join(replaced.get(c, c) if table == "raysaga_runs" or c == "run_id" else
                               key_of.format(new_id) if c == "run_key" else c for c in cols)
            owner = f"{table}.run_key = {key_of.format('?')}" if table in keyed else f"{table}.run_id = ?"
            conn.execute(f"{counter}INSERT INTO {table} ({', '.join(cols)}) SELECT {select} "
                         f"FROM {table}, n WHERE {owner}", (run_id,))
        conn.execute("COMMIT")
        conn.execute("ANALYZE")
    finally:
        conn.close()
    return time.perf_counter() - start


def _cli(args: list[str], db: Path | None) -> tuple[float, int]:
    """Wall seconds and stdout bytes of ``raysaga ARGS --db DB`` in a fresh process."""
    where = ["--db", f"sqlite:///{db}"] if db is not None else []
    start = time.perf_counter()
    proc = subprocess.run([str(BIN / "raysaga"), *args, *where], capture_output=True, timeout=600)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"raysaga {' '.join(args)} exited {proc.returncode}: {proc.stderr.decode()[-2000:]}")
    return took, len(proc.stdout)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def dashboard(db: Path) -> Iterator[str]:
    """``raysaga dashboard`` over ``db`` on a free loopback port; stopped (SIGTERM, then SIGKILL) on exit."""
    port = _free_port()
    proc = subprocess.Popen([str(BIN / "raysaga"), "dashboard", "--db", f"sqlite:///{db}", "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{base}/api/stats", timeout=5):
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start")
            time.sleep(0.1)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def _get(url: str) -> tuple[float, int]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as resp:
        body = resp.read()
    return time.perf_counter() - start, len(body)


def run(status_items: int, list_runs: int, page_items: int, reps: int, tmp: Path,
        log: Callable[[str], None]) -> Report:
    tmp.mkdir(parents=True, exist_ok=True)
    big = tmp / "reading.db"
    log(f"reading: driving a {status_items:,}-item and a {page_items:,}-item fan-out inline")
    status_run = _drive(big, flows.fanout(), status_items)
    page_run = _drive(big, flows.fanout(), page_items)
    many = tmp / "many-runs.db"
    seed = _drive(many, flows.chain(3), None)
    log(f"reading: copying a 3-step run {list_runs - 1:,} times by direct SQL")
    cloned = clone_runs(many, seed, list_runs - 1)
    times, sizes = Samples(), Samples()
    commands: list[tuple[str, list[str], Path | None]] = [
        (f"status --json, {status_items + 2:,}-node run", ["status", status_run, "--json"], big),
        (f"status --json --summary, {status_items + 2:,}-node run", ["status", status_run, "--json", "--summary"], big),
        (f"status (text), {status_items + 2:,}-node run", ["status", status_run], big),
        (f"list (newest 50), {list_runs:,} runs", ["list"], many),
        (f"list --status completed, {list_runs:,} runs", ["list", "--status", "completed"], many),
        (f"list --json --limit 1000, {list_runs:,} runs", ["list", "--json", "--limit", "1000"], many),
        ("raysaga --version (the CLI's floor)", ["--version"], None),
    ]
    page = f"dashboard GET /api/runs/RUN, {page_items + 2:,}-node run"
    page_cold = f"{page} (first request)"
    runs_page = f"dashboard GET /api/runs, {list_runs:,} runs"
    with dashboard(big) as base, dashboard(many) as base_many:
        t, b = _get(f"{base}/api/runs/{page_run}")
        times.add(page_cold, t)
        sizes.add(page_cold, b)
        for rep in range(reps):
            log(f"reading: rep {rep + 1}/{reps}")
            for label, args, db in commands:
                t, b = _cli(args, db)
                times.add(label, t)
                sizes.add(label, b)
            t, b = _get(f"{base}/api/runs/{page_run}")
            times.add(page, t)
            sizes.add(page, b)
            t, b = _get(f"{base_many}/api/runs")
            times.add(runs_page, t)
            sizes.add(runs_page, b)
    r = Report()
    r.heading(f"Reading: the CLI (a fresh process each) and the dashboard's JSON ({reps} reps)")
    rows = [[label, spread(v), f"{int(sizes[label][0]):,}"] for label, v in times.values.items()]
    r.table(["", "wall s median (min-max)", "bytes out"], rows, [58, 24, 12])
    r.p(f"  ({list_runs - 1:,} runs copied by direct SQL in {cloned:.1f}s; databases: "
        f"{big.stat().st_size:,} and {many.stat().st_size:,} bytes)")
    return r

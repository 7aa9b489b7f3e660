#!/usr/bin/env python
"""raysaga's performance bench: the driver's cost next to raw Ray, side by side in one run.

    python bench/bench.py            # full: chain 200, fan-outs 1,000 and 10,000, 5 reps
    python bench/bench.py --quick    # smoke: chain 50, fan-outs 200 and 1,000, 1 rep

What it prints (medians over ``--reps``):

* Chain: ms per node of a 200-node chain of no-op steps, for ``executor="ray"`` and
  ``"inline"``, next to raw Ray (200 dependent ``ray.get(f.remote())``) and the floor
  "one Ray task + one fsync'd SQLite commit (WAL, synchronous=FULL) per node".
  Target: raysaga-ray / floor <= 1.2x.
* Fan-out: nodes/s of ``plan -> N x item -> sink`` next to raw Ray submitting N no-op tasks
  and one ``ray.get``. Target: raysaga / raw >= 0.8x. Next to it, raw Ray *batched* the way
  raysaga's executor batches fan-out items (``RayExecutor.MAX_CHUNK`` = 64 items per task):
  N / 64 tasks each calling the no-op 64 times, one ``ray.get``. Target (issue 11, "lean
  fan-out"): raysaga / batched raw Ray >= 0.5x at the big size.
* DB size: bytes per node of the SQLite file (+ ``-wal``) after ``wal_checkpoint(TRUNCATE)``,
  gross and net of the empty migrated database. Targets: < 1 KiB/node net, and linear (net
  bytes/node about the same at the two fan-out sizes).
* With ``RAYSAGA_BENCH_PG_URL`` set: the chain on PostgreSQL too.

This is a script, not a test: it exits 0 whether targets pass or not (``--fail-on-miss``
changes that). One ``ray.init(num_cpus=2)`` per process; raysaga reuses that Ray.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import logging
import os
import platform
import pstats
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # `import flows` here and on Ray workers (see start_ray)
    sys.path.insert(0, str(HERE))

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Bytecode cached as an installed package has it (pip compiles at install; the peers' modules in
# site-packages are): the VMs set PYTHONDONTWRITEBYTECODE=1, with which every process a bench starts
# (a relaunched driver, a CLI read, a Ray worker) compiled raysaga from source, ~70 ms of CPU each.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import flows  # noqa: E402

import raysaga  # noqa: E402
from raysaga.state import SqlStore  # noqa: E402

PG_ENV = "RAYSAGA_BENCH_PG_URL"

TARGET_CHAIN_RATIO = 1.2  # raysaga-ray / (raw Ray round trip + one commit), at most
TARGET_FANOUT_RATIO = 0.8  # raysaga / raw Ray nodes per second, at least
TARGET_BATCHED_RATIO = 0.5  # raysaga / raw Ray batched in raysaga's chunks, nodes per second, at least (big fan-out)
TARGET_BYTES_PER_NODE = 1024  # SQLite bytes per node net of the empty schema, below
TARGET_LINEAR_TOLERANCE = 0.25  # net bytes/node of the big fan-out within +-25% of the small one


@dataclass(frozen=True)
class Sizes:
    chain: int
    fanouts: tuple[int, int]
    reps: int


FULL = Sizes(chain=200, fanouts=(1_000, 10_000), reps=5)  # 5: on a shared 2-core VM a chain rep varies by ±30 %
QUICK = Sizes(chain=50, fanouts=(200, 1_000), reps=1)


@dataclass(frozen=True)
class Timing:
    """One measured run: wall seconds, and CPU seconds of this (driver) process, every thread."""

    wall: float
    cpu: float


@contextlib.contextmanager
def timed() -> Iterator[list[Timing]]:
    """``with timed() as t: ...`` then ``t[0]`` is the block's Timing."""
    box: list[Timing] = []
    wall, cpu = time.perf_counter(), time.process_time()
    yield box
    box.append(Timing(time.perf_counter() - wall, time.process_time() - cpu))


@dataclass
class Results:
    """Every figure kept per rep; the report reads medians.

    The driver's CPU is reported next to wall time: on a shared, loaded machine it is the steadier
    figure, and in a fan-out every CPU millisecond the driver spends is taken from the workers.
    """

    chain: dict[str, list[float]] = field(default_factory=dict)  # label -> wall seconds per node
    chain_cpu: dict[str, list[float]] = field(default_factory=dict)  # label -> driver CPU seconds per node
    fanout: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # (label, n) -> nodes/s
    fanout_cpu: dict[tuple[str, int], list[float]] = field(default_factory=dict)  # (label, n) -> CPU s/node
    db: dict[str, dict[str, float]] = field(default_factory=dict)  # scenario -> sizes
    empty_db_bytes: int = 0

    def add_chain(self, label: str, n: int, t: Timing) -> None:
        self.chain.setdefault(label, []).append(t.wall / n)
        self.chain_cpu.setdefault(label, []).append(t.cpu / n)

    def add_fanout(self, label: str, n: int, t: Timing) -> None:
        self.fanout.setdefault((label, n), []).append(n / t.wall)
        self.fanout_cpu.setdefault((label, n), []).append(t.cpu / n)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------------------- Ray


def start_ray(address: str | None, temp_dir: Path) -> Any:
    """One Ray per process: a fresh local ``num_cpus=2`` cluster, or ``--address``.

    Workers get this folder (and the driver's ``sys.path``) on ``PYTHONPATH`` so they can
    import ``flows`` and ``raysaga``, as ``RayExecutor`` does when it starts Ray itself.
    """
    import ray

    paths = [str(HERE), os.getcwd(), *sys.path]
    pythonpath = os.pathsep.join(dict.fromkeys(p for p in paths if p and os.path.isdir(p)))
    kwargs: dict[str, Any] = {}
    if address is None:
        # a fresh local cluster of our own ("local"), never one that RAY_ADDRESS or
        # /tmp/ray/ray_current_cluster points at; its own temp dir, so concurrent clusters on
        # this machine cannot race on /tmp/ray/session_latest
        address = "local"
        kwargs.update(num_cpus=2, _temp_dir=str(temp_dir))
    for attempt in range(3):
        try:
            ray.init(address=address, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False,
                     configure_logging=True, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, **kwargs)
            return ray
        except Exception as exc:  # GCS start-up races with other clusters starting on a busy machine
            if attempt == 2:
                raise
            print(f"[bench] ray.init failed ({exc}); retrying", file=sys.stderr, flush=True)
            with contextlib.suppress(Exception):
                ray.shutdown()
            time.sleep(1.0)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------- SQLite helpers


def sqlite_url(path: Path) -> str:
    return f"sqlite:///{path}"


def db_bytes(path: Path) -> int:
    """Size of the database file plus its ``-wal`` after ``PRAGMA wal_checkpoint(TRUNCATE)``."""
    conn = sqlite3.connect(path)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        if busy:
            raise RuntimeError(f"{path}: wal_checkpoint(TRUNCATE) was blocked by another connection")
        total = path.stat().st_size
        wal = Path(f"{path}-wal")
        if wal.exists():
            total += wal.stat().st_size
        return total
    finally:
        conn.close()


def node_rows(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        # the view: a chunk's items (schema 12) each a node, as readers count them
        return int(conn.execute("SELECT count(*) FROM raysaga_node_rows").fetchone()[0])
    finally:
        conn.close()


@contextlib.contextmanager
def fresh_store(tmp: Path, name: str) -> Iterator[tuple[SqlStore, Path]]:
    """A migrated SqlStore on a new SQLite file; closed (pool disposed) on exit."""
    path = tmp / f"{name}-{uuid.uuid4().hex[:8]}.db"
    store = SqlStore(sqlite_url(path))
    try:
        yield store, path
    finally:
        store.close()


def empty_db_bytes(tmp: Path) -> int:
    with fresh_store(tmp, "empty") as (_, path):
        pass
    return db_bytes(path)


# ---------------------------------------------------------------------------- raw baselines


def raw_ray_chain(ray: Any, task: Any, n: int) -> Timing:
    """``n`` dependent round trips ``ray.get(f.remote())``."""
    with timed() as t:
        for _ in range(n):
            ray.get(task.remote())
    return t[0]


def _open_floor_db(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)  # explicit BEGIN/COMMIT below
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS checkpoints (run_id TEXT, node_id TEXT, status TEXT, "
                 "output TEXT, at REAL, PRIMARY KEY (run_id, node_id))")
    return conn


def _commit_one(conn: sqlite3.Connection, run_id: str, i: int) -> None:
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT INTO checkpoints VALUES (?, ?, 'completed', 'null', ?)", (run_id, f"s{i:04d}", time.time()))
    conn.execute("COMMIT")


def floor_chain(ray: Any, task: Any, n: int, tmp: Path) -> Timing:
    """One Ray round trip + one fsync'd SQLite commit (WAL, FULL) per node."""
    conn = _open_floor_db(tmp / f"floor-{uuid.uuid4().hex[:8]}.db")
    run_id = uuid.uuid4().hex
    try:
        with timed() as t:
            for i in range(n):
                ray.get(task.remote())
                _commit_one(conn, run_id, i)
        return t[0]
    finally:
        conn.close()


def commit_only(n: int, tmp: Path) -> Timing:
    """``n`` fsync'd SQLite commits alone (the floor's other half)."""
    conn = _open_floor_db(tmp / f"commit-{uuid.uuid4().hex[:8]}.db")
    run_id = uuid.uuid4().hex
    try:
        with timed() as t:
            for i in range(n):
                _commit_one(conn, run_id, i)
        return t[0]
    finally:
        conn.close()


def raw_ray_fanout(ray: Any, task: Any, n: int) -> Timing:
    """Submit ``n`` no-op tasks, one ``ray.get`` over all of them."""
    with timed() as t:
        ray.get([task.remote() for _ in range(n)])
    return t[0]


def noop_chunk(size: int) -> None:
    """The batched baseline's task body: ``size`` no-op items, as a raysaga chunk runs them."""
    for _ in range(size):
        flows.noop()


def raw_ray_fanout_batched(ray: Any, chunk_task: Any, n: int) -> Timing:
    """``n`` no-op items in tasks of ``RayExecutor.MAX_CHUNK`` (raysaga's chunk), one ``ray.get``."""
    from raysaga.orchestrator.executor import RayExecutor

    size = RayExecutor.MAX_CHUNK
    with timed() as t:
        ray.get([chunk_task.remote(min(size, n - i)) for i in range(0, n, size)])
    return t[0]


def raw_ray_fanout_dag(ray: Any, tasks: tuple[Any, Any, Any], n: int) -> Timing:
    """raysaga's fan-out DAG written in plain Ray, in the same chunks: a ``plan`` task, its list
    sliced into tasks of ``RayExecutor.MAX_CHUNK`` items, a ``sink`` task given every chunk's
    outputs (Ray passes them), one ``ray.get`` of its result. Nothing is recorded: it is what the
    DAG's shape costs on Ray (three tasks in sequence), which ``raw_ray_fanout_batched`` leaves out."""
    from raysaga.orchestrator.executor import RayExecutor

    plan_task, chunk_task, join_task = tasks
    size = RayExecutor.MAX_CHUNK
    with timed() as t:
        items = ray.get(plan_task.remote(n))
        chunks = [chunk_task.remote(items[i:i + size]) for i in range(0, len(items), size)]
        joined = ray.get(join_task.remote(*chunks))
    if joined != n:
        raise RuntimeError(f"the raw Ray DAG joined {joined} items, not {n}")
    return t[0]


# ---------------------------------------------------------------------------- raysaga


def run_raysaga(store: Any, workflow: Any, value: Any, executor: str) -> Timing:
    """One ``raysaga.run`` (create the run, claim it, drive it to completion)."""
    with timed() as t:
        record = raysaga.run(workflow, value, store=store, executor=executor)
    if record.status != raysaga.RunStatus.COMPLETED:
        raise RuntimeError(f"bench run {record.run_id} ended {record.status.value}: {record.error}")
    return t[0]


def raysaga_chain(n: int, executor: str, tmp: Path) -> tuple[Timing, Path]:
    with fresh_store(tmp, f"chain-{executor}") as (store, path):
        timing = run_raysaga(store, flows.chain(n), None, executor)
    return timing, path


def raysaga_fanout(n: int, tmp: Path, *, local_glue: bool = False) -> tuple[Timing, Path]:
    """The fan-out on Ray; ``local_glue``: its planner and join run in the driver (``local=True``)."""
    with fresh_store(tmp, f"fanout-{n}{'-local' if local_glue else ''}") as (store, path):
        timing = run_raysaga(store, flows.fanout(local_glue), n, "ray")
    return timing, path


def record_db(results: Results, scenario: str, path: Path) -> None:
    size = db_bytes(path)
    rows = node_rows(path)
    results.db[scenario] = {"nodes": rows, "bytes": size, "per_node": size / rows,
                            "net_per_node": (size - results.empty_db_bytes) / rows}


# ---------------------------------------------------------------------------- PostgreSQL (optional)


def _pg_admin(url: str, sql: str) -> None:
    import psycopg

    plain = url.replace("postgresql+psycopg://", "postgresql://").replace("postgres://", "postgresql://")
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(sql.encode())


@contextlib.contextmanager
def pg_database(base_url: str) -> Iterator[str]:
    """A fresh database next to ``base_url``'s, dropped afterwards; ``base_url`` itself if that fails."""
    name = "raysaga_bench_" + uuid.uuid4().hex[:10]
    head = base_url.rpartition("/")[0]
    try:
        _pg_admin(base_url, f'CREATE DATABASE "{name}"')
    except Exception:
        yield base_url
        return
    try:
        yield f"{head}/{name}"
    finally:
        with contextlib.suppress(Exception):
            _pg_admin(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def raysaga_chain_pg(n: int, url: str) -> Timing:
    store = SqlStore(url)
    try:
        return run_raysaga(store, flows.chain(n), None, "ray")
    finally:
        store.close()


def floor_chain_pg(ray: Any, task: Any, n: int, url: str) -> Timing:
    """One Ray round trip + one synchronous PostgreSQL commit per node (psycopg 3)."""
    import psycopg

    plain = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(plain) as conn:
        conn.execute("CREATE TEMP TABLE checkpoints (run_id text, node_id text, status text, output text, "
                     "at double precision, PRIMARY KEY (run_id, node_id))")
        conn.commit()
        run_id = uuid.uuid4().hex
        with timed() as t:
            for i in range(n):
                ray.get(task.remote())
                conn.execute("INSERT INTO checkpoints VALUES (%s, %s, 'completed', 'null', %s)",
                             (run_id, f"s{i:04d}", time.time()))
                conn.commit()
        return t[0]


# ---------------------------------------------------------------------------- the bench


def warm_up(ray: Any, task: Any, tmp: Path) -> None:
    """Start the workers and let them import raysaga and flows before anything is timed."""
    ray.get([task.remote() for _ in range(20)])
    for _ in range(2):
        raysaga_chain(10, "ray", tmp)
        raysaga_fanout(20, tmp)
    raysaga_chain(10, "inline", tmp)


def bench(ray: Any, sizes: Sizes, tmp: Path, pg_url: str | None, log: Callable[[str], None]) -> Results:
    results = Results()
    task = ray.remote(max_retries=0)(flows.noop)
    chunk_task = ray.remote(max_retries=0)(noop_chunk)
    results.empty_db_bytes = empty_db_bytes(tmp)
    log("warming up")
    warm_up(ray, task, tmp)
    n = sizes.chain
    for rep in range(sizes.reps):
        log(f"rep {rep + 1}/{sizes.reps}: chain of {n}")
        results.add_chain("raw_ray", n, raw_ray_chain(ray, task, n))
        results.add_chain("floor", n, floor_chain(ray, task, n, tmp))
        results.add_chain("commit_only", n, commit_only(n, tmp))
        timing, path = raysaga_chain(n, "ray", tmp)
        results.add_chain("raysaga_ray", n, timing)
        if rep == 0:
            record_db(results, f"chain {n}", path)
        timing, _ = raysaga_chain(n, "inline", tmp)
        results.add_chain("raysaga_inline", n, timing)
        for fan in sizes.fanouts:
            log(f"rep {rep + 1}/{sizes.reps}: fan-out of {fan:,}")
            results.add_fanout("raw_ray", fan, raw_ray_fanout(ray, task, fan))
            results.add_fanout("raw_ray_batched", fan, raw_ray_fanout_batched(ray, chunk_task, fan))
            timing, path = raysaga_fanout(fan, tmp)
            results.add_fanout("raysaga", fan, timing)
            if rep == 0:
                record_db(results, f"fan-out {fan:,}", path)
    if pg_url:
        with pg_database(pg_url) as url:
            for rep in range(sizes.reps):
                log(f"rep {rep + 1}/{sizes.reps}: chain of {n} on PostgreSQL")
                results.add_chain("pg_floor", n, floor_chain_pg(ray, task, n, url))
                results.add_chain("pg_raysaga_ray", n, raysaga_chain_pg(n, url))
    return results


# ---------------------------------------------------------------------------- report


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:8.3f}"


def _loadavg() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        return "n/a"


def report(results: Results, sizes: Sizes, *, pg: bool) -> tuple[str, list[tuple[str, bool, str]]]:
    import ray

    from raysaga.orchestrator.executor import RayExecutor

    out = io.StringIO()

    def p(line: str = "") -> None:
        out.write(line + "\n")

    c = {k: median(v) for k, v in results.chain.items()}
    cc = {k: median(v) for k, v in results.chain_cpu.items()}
    p(f"raysaga bench: ray {ray.__version__}, Python {platform.python_version()}, SQLite {sqlite3.sqlite_version}, "
      f"{os.cpu_count()} CPUs, reps={sizes.reps} (medians), load average {_loadavg()}")
    p()
    p(f"== Chain: {sizes.chain} dependent no-op nodes ==")
    p(f"  {'':50} {'ms/node':>8}  {'vs floor':>8}  {'driver CPU ms/node':>18}")
    rows = [
        ("raw Ray: ray.get(f.remote()) in a loop", "raw_ray", "floor"),
        ("SQLite commit alone (WAL, synchronous=FULL)", "commit_only", None),
        ("floor: raw Ray round trip + one fsync'd commit", "floor", "floor"),
        ("raysaga executor=ray", "raysaga_ray", "floor"),
        ("raysaga executor=inline", "raysaga_inline", "floor"),
    ]
    if pg:
        rows += [("PostgreSQL floor: raw Ray + one commit", "pg_floor", "pg_floor"),
                 ("raysaga executor=ray on PostgreSQL", "pg_raysaga_ray", "pg_floor")]
    for title, key, against in rows:
        ratio = f"{c[key] / c[against]:7.2f}x" if against else ""
        p(f"  {title:50} {_ms(c[key])}  {ratio:>8}  {_ms(cc[key]):>18}")
    p(f"  raysaga-ray overhead over raw Ray: {_ms(c['raysaga_ray'] - c['raw_ray']).strip()} ms/node wall, "
      f"{_ms(cc['raysaga_ray'] - cc['raw_ray']).strip()} ms/node driver CPU")
    if pg:
        p("  (PostgreSQL rows are compared with the PostgreSQL floor)")
    p()
    p("== Fan-out: plan -> N no-op items -> sink (executor=ray) ==")
    p(f"  {'N':>8}  {'raw Ray tasks/s':>16}  {'raw batched items/s':>20}  {'raysaga nodes/s':>16}  {'ratio':>7}  "
      f"{'/batched':>8}  {'driver CPU ms/node: raw':>24}  {'raysaga':>8}")
    f = {k: median(v) for k, v in results.fanout.items()}
    fc = {k: median(v) for k, v in results.fanout_cpu.items()}
    for n in sizes.fanouts:
        raw, batched, ours = f[("raw_ray", n)], f[("raw_ray_batched", n)], f[("raysaga", n)]
        p(f"  {n:>8,}  {raw:16,.0f}  {batched:20,.0f}  {ours:16,.0f}  {ours / raw:6.2f}x  "
          f"{ours / batched:7.2f}x  {_ms(fc[('raw_ray', n)]):>24}  {_ms(fc[('raysaga', n)])}")
    p(f"  (raw batched: N / {RayExecutor.MAX_CHUNK} Ray tasks of {RayExecutor.MAX_CHUNK} no-op items each, "
      "raysaga's largest chunk)")
    p()
    p("== DB size: SQLite file + -wal after PRAGMA wal_checkpoint(TRUNCATE) ==")
    p(f"  empty migrated database: {results.empty_db_bytes:,} bytes (net = total - empty)")
    p(f"  {'scenario':<18} {'node rows':>10} {'bytes':>12} {'bytes/node':>11} {'net bytes/node':>15}")
    for scenario, d in results.db.items():
        p(f"  {scenario:<18} {int(d['nodes']):>10,} {int(d['bytes']):>12,} {d['per_node']:>11,.0f} "
          f"{d['net_per_node']:>15,.0f}")
    p()

    targets: list[tuple[str, bool, str]] = []
    chain_ratio = c["raysaga_ray"] / c["floor"]
    targets.append((f"chain {sizes.chain}: raysaga-ray / (raw Ray + one commit) <= {TARGET_CHAIN_RATIO}x",
                    chain_ratio <= TARGET_CHAIN_RATIO, f"{chain_ratio:.2f}x"))
    for n in sizes.fanouts:
        fanout_ratio = f[("raysaga", n)] / f[("raw_ray", n)]
        targets.append((f"fan-out {n:,}: raysaga / raw Ray nodes/s >= {TARGET_FANOUT_RATIO}x",
                        fanout_ratio >= TARGET_FANOUT_RATIO, f"{fanout_ratio:.2f}x"))
    wide = sizes.fanouts[1]
    batched_ratio = f[("raysaga", wide)] / f[("raw_ray_batched", wide)]
    targets.append((f"fan-out {wide:,}: raysaga / raw Ray batched in chunks of {RayExecutor.MAX_CHUNK} "
                    f">= {TARGET_BATCHED_RATIO}x", batched_ratio >= TARGET_BATCHED_RATIO, f"{batched_ratio:.2f}x"))
    worst_name, worst = max(results.db.items(), key=lambda kv: kv[1]["net_per_node"])
    targets.append((f"DB net bytes/node < {TARGET_BYTES_PER_NODE:,} (worst: {worst_name})",
                    worst["net_per_node"] < TARGET_BYTES_PER_NODE, f"{worst['net_per_node']:,.0f} B/node"))
    small, big = (results.db[f"fan-out {n:,}"]["net_per_node"] for n in sizes.fanouts)
    growth = big / small
    targets.append((f"DB growth linear: net bytes/node at {sizes.fanouts[1]:,} / at {sizes.fanouts[0]:,} "
                    f"within 1 +- {TARGET_LINEAR_TOLERANCE}", abs(growth - 1) <= TARGET_LINEAR_TOLERANCE,
                    f"{growth:.2f}"))
    p("== Targets ==")
    for title, ok, value in targets:
        p(f"  {'PASS' if ok else 'MISS'}  {title}: {value}")
    return out.getvalue(), targets


# ---------------------------------------------------------------------------- profiling


def profile(sizes: Sizes, tmp: Path, outdir: Path, top: int) -> str:
    """cProfile one raysaga chain and one big fan-out on Ray (driver thread only)."""
    outdir.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    cases: list[tuple[str, Callable[[], object]]] = [
        (f"chain-{sizes.chain}-ray", lambda: raysaga_chain(sizes.chain, "ray", tmp)),
        (f"chain-{sizes.chain}-inline", lambda: raysaga_chain(sizes.chain, "inline", tmp)),
        (f"fanout-{sizes.fanouts[1]}-ray", lambda: raysaga_fanout(sizes.fanouts[1], tmp)),
    ]
    for name, fn in cases:
        prof = cProfile.Profile()
        start = time.perf_counter()
        prof.runcall(fn)
        wall = time.perf_counter() - start
        dest = outdir / f"{name}.prof"
        prof.dump_stats(dest)
        for sort in ("tottime", "cumulative"):
            text.write(f"\n== profile {name} (wall {wall:.2f}s under cProfile), top {top} by {sort}; "
                       f"saved to {dest} ==\n")
            stats = pstats.Stats(prof, stream=text)
            stats.strip_dirs().sort_stats(sort).print_stats(top)
    return text.getvalue()


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smoke sizes: chain 50, fan-outs 200/1,000, 1 rep")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per figure (default 5; 1 with --quick)")
    parser.add_argument("--chain", type=int, default=None, help="chain length (default 200; 50 with --quick)")
    parser.add_argument("--fanouts", type=int, nargs=2, default=None, metavar=("SMALL", "BIG"),
                        help="fan-out sizes (default 1000 10000; 200 1000 with --quick)")
    parser.add_argument("--address", default=None,
                        help="join this Ray cluster instead of starting a local num_cpus=2 one")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help="after the bench, cProfile the raysaga driver and write .prof files to DIR")
    parser.add_argument("--profile-top", type=int, default=30, help="functions shown per profile listing")
    parser.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    parser.add_argument("--fail-on-miss", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)

    base = QUICK if args.quick else FULL
    sizes = Sizes(chain=args.chain or base.chain, fanouts=tuple(args.fanouts or base.fanouts),
                  reps=args.reps or base.reps)
    if sizes.reps < 1 or sizes.chain < 1 or min(sizes.fanouts) < 1:
        parser.error("--reps, --chain and --fanouts must be positive")
    pg_url = os.environ.get(PG_ENV) or None

    def log(msg: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    tmp = Path(tempfile.mkdtemp(prefix="raysaga-bench-"))
    started = time.perf_counter()
    try:
        log("starting Ray" if args.address is None else f"joining Ray at {args.address}")
        ray = start_ray(args.address, tmp / "ray")
        results = bench(ray, sizes, tmp, pg_url, log)
        text, targets = report(results, sizes, pg=bool(pg_url))
        print(text, end="")
        print(f"  (bench wall time {time.perf_counter() - started:.1f}s)", flush=True)
        if args.json is not None:
            args.json.write_text(json.dumps({
                "sizes": sizes.__dict__,
                "chain_s_per_node": results.chain,
                "chain_cpu_s_per_node": results.chain_cpu,
                "fanout_nodes_per_s": {f"{label}:{n}": v for (label, n), v in results.fanout.items()},
                "fanout_cpu_s_per_node": {f"{label}:{n}": v for (label, n), v in results.fanout_cpu.items()},
                "db": results.db,
                "empty_db_bytes": results.empty_db_bytes,
                "targets": [{"target": t, "pass": ok, "value": v} for t, ok, v in targets],
            }, indent=2))
        if args.profile is not None:
            log(f"profiling into {args.profile}")
            print(profile(sizes, tmp, args.profile, args.profile_top), flush=True)
        missed = [t for t, ok, _ in targets if not ok]
        return 1 if missed and args.fail_on_miss else 0
    finally:
        with contextlib.suppress(Exception):
            import ray as _ray

            if _ray.is_initialized():
                _ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

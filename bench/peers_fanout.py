"""Fan-outs of no-op items and a join, and of CPU-spinning items, raysaga next to its peers
(bench/suite.py runs it; the I/O-bound one, 200 x 50 ms waits, is bench/io_fanout.py).

No-op fan-out of N items (``plan -> item x N -> sink``): raysaga on Ray (a fresh migrated SQLite
store per run); raw Ray one task per item (``bench.raw_ray_fanout``); raw Ray batched into the
chunks raysaga's fan-out lane sends once items are measured short (``RayExecutor.MAX_CHUNK``
items per task, the fair comparison: ``bench.raw_ray_fanout_batched``; the targets are against
it); the same chunks inside raysaga's DAG in plain Ray, a ``plan`` task before them and a ``sink``
task after (``bench.raw_ray_fanout_dag``: what the DAG's shape costs on Ray, shown beside, no
target); raysaga with its planner and join declared ``local=True`` (run in the driver, as the raw
Ray rows plan and gather in the driver: a user's choice for such glue, printed beside the default,
with its own ratio to raw Ray batched); LangGraph ``Send`` + SqliteSaver (``durability="sync"``);
DBOS ``asyncio.gather`` of async steps and DBOS's queue (one child workflow per item, polled
every 50 ms) on its default SQLite system database. Figures are items/s (N / wall); the ratio
is raysaga's items/s over the row's, pair by pair.

CPU fan-out: 200 items that each spin 50 ms of CPU. Ideal: N x 50 ms / the cluster's CPUs.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import dbos_peer
import flows
import lg_peer
from machine_cpu import children_cpu, spent
from table import Report, Runner, Samples, Target, interleave, med, pair_ratios, ratio_target, spread

import bench
import raysaga
from raysaga.orchestrator.executor import RayExecutor

TARGET_VS_BATCHED = 0.5  # raysaga items/s / raw Ray batched items/s, at least
TARGET_VS_PEERS = 5.0  # raysaga items/s / LangGraph's and DBOS's, at least
WARM_TASKS = 4  # untimed no-op tasks before each Ray row's run (``on_ray``)

RAYSAGA = "raysaga on Ray"
RAYSAGA_LOCAL = "raysaga on Ray, plan and join local=True"
RAW = "raw Ray: one task per item"
BATCHED = f"raw Ray batched ({RayExecutor.MAX_CHUNK} items per task)"
DAG = "raw Ray batched, plan -> chunks -> join"
LANGGRAPH = "LangGraph Send + SqliteSaver (sync)"
DBOS_GATHER = "DBOS asyncio.gather (SQLite)"
DBOS_QUEUE = "DBOS queue (SQLite)"


def _fresh(tmp: Path, name: str) -> Path:
    return tmp / f"{name}-{uuid.uuid4().hex[:8]}.db"


def rows_for(ray: Any, n: int, tmp: Path, sizes: Samples, cpus: Samples, queue_max: int, limit: float,
             log: Callable[[str], None]) -> list[tuple[str, Runner]]:
    task = ray.remote(max_retries=0)(flows.noop)
    batch = ray.remote(max_retries=0)(bench.noop_chunk)
    dag = tuple(ray.remote(max_retries=0)(f) for f in (flows.plan, flows.items_chunk, flows.sink_chunks))

    def on_ray(label: str, run: Callable[[], bench.Timing]) -> Runner:
        """``run``, its CPU kept in ``cpus``: this process's and its Ray processes' (the machine's).

        Each starts on warm workers: a few no-op tasks first, untimed. The rows run in a fixed
        order, and the first on Ray after a peer's seconds-long run (raysaga's) found Ray's idle
        workers slow to wake: a Ray task after 20 ms idle costs ~2x one back to back here, after
        200 ms ~4.5x, and a 1,000-item raysaga run took 67 ms in that place against 40 ms warm."""
        def go() -> float:
            ray.get([task.remote() for _ in range(WARM_TASKS)])
            before = children_cpu()
            timing = run()
            ray_cpu = spent(before, children_cpu())
            if ray_cpu is not None:
                cpus.add(label, timing.cpu + ray_cpu)
            return timing.wall
        return go

    def ours(local_glue: bool) -> Callable[[], bench.Timing]:
        def go() -> bench.Timing:
            timing, path = bench.raysaga_fanout(n, tmp, local_glue=local_glue)
            sizes.add(RAYSAGA_LOCAL if local_glue else RAYSAGA, bench.db_bytes(path))
            return timing
        return go

    def langgraph() -> float:
        path = _fresh(tmp, "lg-fan")
        took = lg_peer.run_fanout(n, flows.noop, lg_peer.sqlite_saver(path))
        sizes.add(LANGGRAPH, bench.db_bytes(path))
        return took

    def dbos(kind: str, label: str) -> Runner:
        def go() -> float:
            path = _fresh(tmp, "dbos-fan")
            took = dbos_peer.run_child(kind, dbos_peer.sqlite_url(path, wal=False), n, limit)
            sizes.add(label, bench.db_bytes(path))
            return took
        return go

    rows: list[tuple[str, Runner]] = [
        (RAYSAGA, on_ray(RAYSAGA, ours(False))),
        (RAYSAGA_LOCAL, on_ray(RAYSAGA_LOCAL, ours(True))),
        (RAW, on_ray(RAW, lambda: bench.raw_ray_fanout(ray, task, n))),
        (BATCHED, on_ray(BATCHED, lambda: bench.raw_ray_fanout_batched(ray, batch, n))),
        (DAG, on_ray(DAG, lambda: bench.raw_ray_fanout_dag(ray, dag, n))),
    ]
    if lg_peer.available():
        rows.append((LANGGRAPH, langgraph))
    else:
        log("fan-out: langgraph not installed, skipped")
    if dbos_peer.available():
        rows.append((DBOS_GATHER, dbos("gather", DBOS_GATHER)))
        if n <= queue_max:
            rows.append((DBOS_QUEUE, dbos("queue", DBOS_QUEUE)))
        else:
            log(f"fan-out {n:,}: DBOS queue left out (the suite runs it up to {queue_max:,} items: "
                "~15 ms an item here)")
    else:
        log("fan-out: dbos not installed, skipped")
    return rows


def run_noop(ray: Any, sizes_n: Sequence[int], reps: int, tmp: Path, queue_max: int, limit: float,
             log: Callable[[str], None]) -> tuple[Report, dict[int, Samples]]:
    """Every size, interleaved per rep; returns the report and DB bytes per size per row.

    DBOS runs in a child process per measurement, killed after ``limit`` seconds (a row that
    times out is not run again and is printed as such)."""
    r = Report()
    r.heading(f"Fan-out: plan -> N no-op items -> join ({reps} reps, interleaved)")
    storage: dict[int, Samples] = {}
    for n in sizes_n:
        sizes, cpus = Samples(), Samples()
        rows = rows_for(ray, n, tmp, sizes, cpus, queue_max, limit, log)
        log(f"fan-out {n:,}: warming up")
        for label, run in rows:  # one small untimed pass: workers start, modules import
            if label in (RAYSAGA, RAYSAGA_LOCAL, RAW, BATCHED, DAG):
                run()
        sizes.values.clear()
        cpus.values.clear()
        times = Samples()
        interleave(rows, reps, times, log, f"fan-out {n:,}")
        storage[n] = sizes
        r.p(f"  N = {n:,}")
        table = []
        for label, values in times.values.items():
            rate = [n / v for v in values]
            vs = spread(pair_ratios(values, times[RAYSAGA]), "{:.2f}") if label != RAYSAGA else ""
            table.append([label, spread(rate, "{:,.0f}"), spread(values, "{:.3f}"), vs,
                          f"{med(cpus[label]):.3f}" if label in cpus else "",
                          f"{int(med(sizes[label])):,}" if label in sizes else ""])
        ours = times[RAYSAGA]
        for label, cap in times.timed_out.items():
            if label not in times:
                table.append([label, f"< {n / cap:,.0f}", f"> {cap:.0f} (timed out)",
                              f"> {cap / med(ours):.0f}" if ours else "", "", ""])
        r.table(["", "items/s median (min-max)", "wall s", "raysaga items/s / this", "machine CPU s", "DB bytes"],
                table, [40, 28, 22, 22, 14, 12])
        # the ratio of items/s is the inverse of the ratio of wall times: this_wall / raysaga_wall
        r.target(ratio_target(f"fan-out {n:,}: raysaga >= {TARGET_VS_BATCHED}x {BATCHED}",
                              pair_ratios(times[BATCHED], ours), at_least=TARGET_VS_BATCHED))
        r.target(ratio_target(f"fan-out {n:,}: {RAYSAGA_LOCAL} >= {TARGET_VS_BATCHED}x {BATCHED}",
                              pair_ratios(times[BATCHED], times[RAYSAGA_LOCAL]), at_least=TARGET_VS_BATCHED))
        for peer in (LANGGRAPH, DBOS_GATHER, DBOS_QUEUE):
            if peer in times.timed_out and peer not in times and ours:
                bound = times.timed_out[peer] / med(ours)
                r.target(Target(f"fan-out {n:,}: raysaga >= {TARGET_VS_PEERS}x {peer}", bound >= TARGET_VS_PEERS,
                                f"> {bound:.0f}x ({peer} timed out at {times.timed_out[peer]:.0f} s)"))
            r.target(ratio_target(f"fan-out {n:,}: raysaga >= {TARGET_VS_PEERS}x {peer}",
                                  pair_ratios(times[peer], ours), at_least=TARGET_VS_PEERS))
    r.p("  (ratios pair by pair; items/s ratio = the row's wall time / raysaga's; machine CPU s: this process's")
    r.p("  and its Ray processes' CPU during the run, every thread, medians; on 2 cores wall time follows it)")
    return r, storage


# ---------------------------------------------------------------------------- CPU-bound items


def run_cpu(ray: Any, n: int, secs: float, reps: int, tmp: Path, log: Callable[[str], None]) -> Report:
    """N items that each spin ``secs`` of CPU: wall time per system and against the ideal."""
    cpus = int(ray.cluster_resources().get("CPU", 1))
    ideal = n * secs / cpus
    spin = ray.remote(max_retries=0)(flows.spin_item)

    def ours() -> float:
        with bench.fresh_store(tmp, "cpu") as (store, _):
            with bench.timed() as t:
                record = raysaga.run(flows.cpu_fanout(), {"n": n, "wait": secs}, store=store, executor="ray")
            if record.status != raysaga.RunStatus.COMPLETED:
                raise RuntimeError(f"cpu fan-out ended {record.status.value}: {record.error}")
            return t[0].wall

    def raw() -> float:
        start = time.perf_counter()
        ray.get([spin.remote(secs) for _ in range(n)])
        return float(time.perf_counter() - start)

    rows: list[tuple[str, Runner]] = [(RAYSAGA, ours), (RAW, raw)]
    if lg_peer.available():
        rows.append(("LangGraph Send + SqliteSaver (threads)", lambda: lg_peer.run_fanout(
            n, lambda: flows.spin(secs), lg_peer.sqlite_saver(_fresh(tmp, "lg-cpu")))))
    if dbos_peer.available():
        rows.append(("DBOS asyncio.gather (SQLite)", lambda: dbos_peer.run_child(
            "spin", dbos_peer.sqlite_url(_fresh(tmp, "dbos-cpu"), wal=False), n, 600, secs)))
    log(f"cpu fan-out {n} x {secs * 1000:.0f} ms: warming up")
    ours()
    times = Samples()
    interleave(rows, reps, times, log, f"cpu fan-out {n}")
    r = Report()
    r.heading(f"Fan-out: {n} items x {secs * 1000:.0f} ms of CPU each ({reps} reps, interleaved; "
              f"{cpus} Ray CPUs)")
    table = [["ideal: N x CPU time / Ray CPUs", f"{ideal:.3f}", "1.00", ""]]
    for label, values in times.values.items():
        table.append([label, spread(values), f"{med(values) / ideal:.2f}",
                      spread(pair_ratios(times[RAYSAGA], values), "{:.2f}") if label != RAYSAGA else ""])
    r.table(["", "wall s median (min-max)", "x ideal", "raysaga wall / this"], table, [40, 26, 8, 20])
    r.p("  (LangGraph's branches run in threads and DBOS's async steps on one event loop: the GIL serialises")
    r.p("   both; the I/O-bound fan-out, 200 x 50 ms waits, is bench/io_fanout.py)")
    return r


# ---------------------------------------------------------------------------- PostgreSQL


def run_postgres(ray: Any, base_url: str, n: int, reps: int, log: Callable[[str], None]) -> Report:
    """The no-op fan-out of N on PostgreSQL: raysaga on Ray, LangGraph + PostgresSaver, DBOS gather."""
    import peers_chain

    from raysaga.state import SqlStore

    with peers_chain.pg_databases(base_url, ["raysaga", "langgraph", "dbos"]) as dbs:
        def ours() -> float:
            store = SqlStore(peers_chain.sqlalchemy_url(dbs["raysaga"]))
            try:
                return bench.run_raysaga(store, flows.fanout(), n, "ray").wall
            finally:
                store.close()

        batch = ray.remote(max_retries=0)(bench.noop_chunk)
        rows: list[tuple[str, Runner]] = [(RAYSAGA, ours),
                                          (BATCHED, lambda: bench.raw_ray_fanout_batched(ray, batch, n).wall)]
        if lg_peer.available(postgres=True):
            saver = lg_peer.postgres_saver(dbs["langgraph"])
            rows.append(("LangGraph Send + PostgresSaver (sync)", lambda: lg_peer.run_fanout(n, flows.noop, saver)))
        if dbos_peer.available():
            rows.append(("DBOS asyncio.gather (PostgreSQL)",
                         lambda: dbos_peer.run_child("gather", dbs["dbos"], n, 600)))
        log(f"fan-out {n:,} on PostgreSQL: warming up")
        for _, run in rows:
            run()
        times = Samples()
        interleave(rows, reps, times, log, f"fan-out {n:,} on PostgreSQL")
    r = Report()
    r.heading(f"Fan-out: {n:,} no-op items on PostgreSQL ({reps} reps, interleaved; one database per system)")
    table = []
    for label, values in times.values.items():
        vs = spread(pair_ratios(values, times[RAYSAGA]), "{:.2f}") if label != RAYSAGA else ""
        table.append([label, spread([n / v for v in values], "{:,.0f}"), spread(values), vs])
    r.table(["", "items/s median (min-max)", "wall s", "raysaga items/s / this"], table, [40, 28, 22, 22])
    for label in times.values:
        if label not in (RAYSAGA, BATCHED):
            r.target(ratio_target(f"fan-out {n:,} on PostgreSQL: raysaga >= {TARGET_VS_PEERS}x {label}",
                                  pair_ratios(times[label], times[RAYSAGA]), at_least=TARGET_VS_PEERS))
    return r

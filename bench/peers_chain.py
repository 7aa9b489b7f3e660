"""The chain of N no-op steps, durable, raysaga next to its peers (bench/suite.py runs it).

On SQLite: raysaga inline and on Ray (a fresh migrated store per run), LangGraph + SqliteSaver
(``durability="sync"``), DBOS on its default SQLite system database (rollback journal) and on one
in WAL mode, raw Ray (N dependent round trips) and the floor (one Ray round trip + one fsync'd
commit per node: ``bench.floor_chain``). Every system gets a fresh database file per rep; its
size after the run is the scenario's storage figure.

On PostgreSQL (``RAYSAGA_BENCH_PG_URL``): raysaga inline and on Ray, LangGraph + PostgresSaver,
DBOS, and the PostgreSQL floor (``bench.floor_chain_pg``), each system on a fresh database.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dbos_peer
import flows
import lg_peer
from table import Report, Runner, Samples, interleave, med, pair_ratios, ratio_target, spread

import bench
from raysaga.state import SqlStore

TARGET_INLINE_VS_PEER = 0.5  # raysaga inline ms/node / peer ms/node, at most
TARGET_RAY_VS_FLOOR = 1.1  # raysaga on Ray / (raw Ray round trip + one fsync'd commit), at most
TARGET_STORAGE_VS_LANGGRAPH = 0.1  # raysaga DB bytes / LangGraph's, at most

RAYSAGA_INLINE = "raysaga inline"
RAYSAGA_RAY = "raysaga on Ray"
LANGGRAPH = "LangGraph + SqliteSaver (sync)"
DBOS = "DBOS, SQLite default journal"
DBOS_WAL = "DBOS, SQLite WAL"
RAW_RAY = "raw Ray: N dependent round trips"
FLOOR = "floor: Ray round trip + fsync'd commit"


def _fresh(tmp: Path, name: str) -> Path:
    return tmp / f"{name}-{uuid.uuid4().hex[:8]}.db"


def _raysaga(n: int, executor: str, tmp: Path, sizes: Samples, label: str) -> Runner:
    def run() -> float:
        timing, path = bench.raysaga_chain(n, executor, tmp)
        sizes.add(label, bench.db_bytes(path))
        return timing.wall

    return run


def _langgraph(n: int, tmp: Path, sizes: Samples) -> Runner:
    def run() -> float:
        path = _fresh(tmp, "lg-chain")
        took = lg_peer.run_chain(n, lg_peer.sqlite_saver(path))
        sizes.add(LANGGRAPH, bench.db_bytes(path))
        return took

    return run


def _dbos(n: int, tmp: Path, sizes: Samples, *, wal: bool) -> Runner:
    label = DBOS_WAL if wal else DBOS

    def run() -> float:
        path = _fresh(tmp, "dbos-chain")
        took = dbos_peer.run_chain(dbos_peer.sqlite_url(path, wal=wal), n)
        sizes.add(label, bench.db_bytes(path))
        return took

    return run


def sqlite_rows(ray: Any, n: int, tmp: Path, sizes: Samples, log: Callable[[str], None]) -> list[tuple[str, Runner]]:
    task = ray.remote(max_retries=0)(flows.noop)
    rows: list[tuple[str, Runner]] = [
        (RAYSAGA_INLINE, _raysaga(n, "inline", tmp, sizes, RAYSAGA_INLINE)),
        (RAYSAGA_RAY, _raysaga(n, "ray", tmp, sizes, RAYSAGA_RAY)),
    ]
    if lg_peer.available():
        rows.append((LANGGRAPH, _langgraph(n, tmp, sizes)))
    else:
        log("chain: langgraph / langgraph-checkpoint-sqlite not installed, skipped")
    if dbos_peer.available():
        rows += [(DBOS, _dbos(n, tmp, sizes, wal=False)), (DBOS_WAL, _dbos(n, tmp, sizes, wal=True))]
    else:
        log("chain: dbos not installed, skipped")
    rows += [(RAW_RAY, lambda: bench.raw_ray_chain(ray, task, n).wall),
             (FLOOR, lambda: bench.floor_chain(ray, task, n, tmp).wall)]
    return rows


def warm(rows: list[tuple[str, Runner]]) -> None:
    """One untimed pass (workers import raysaga and flows, DBOS and LangGraph import their modules)."""
    for _, run in rows:
        run()


def run_sqlite(ray: Any, n: int, reps: int, tmp: Path, log: Callable[[str], None], *,
               warm_up: bool = True) -> tuple[Report, Samples, Samples]:
    """The chain on SQLite; returns the report, seconds per run per row, and DB bytes per row."""
    sizes = Samples()
    rows = sqlite_rows(ray, n, tmp, sizes, log)
    if warm_up:
        log(f"chain {n}: warming up")
        warm(rows)
    sizes.values.clear()
    times = Samples()
    interleave(rows, reps, times, log, f"chain {n}")
    return report(f"Chain: {n} no-op steps, durable on SQLite ({reps} reps, interleaved)", n, times, sizes,
                  RAYSAGA_INLINE, [LANGGRAPH, DBOS, DBOS_WAL], RAYSAGA_RAY, FLOOR), times, sizes


def report(title: str, n: int, times: Samples, sizes: Samples, inline: str, peers: list[str], on_ray: str,
           floor: str) -> Report:
    r = Report()
    r.heading(title)
    rows = []
    for label, values in times.values.items():
        per_node = [v / n * 1000 for v in values]
        vs_inline = spread(pair_ratios(times[inline], values), "{:.2f}") if label != inline else ""
        vs_floor = spread(pair_ratios(values, times[floor]), "{:.2f}") if floor in times else ""
        rows.append([label, spread(per_node), vs_inline, vs_floor,
                     f"{int(med(sizes[label])):,}" if label in sizes else ""])
    r.table(["", "ms/node median (min-max)", "raysaga inline / this", "this / floor", "DB bytes"], rows,
            [40, 26, 22, 20, 11])
    r.p("  (ratios pair by pair: rep i of one row over rep i of the other; median (min-max))")
    for peer in peers:
        r.target(ratio_target(f"chain {n}: raysaga inline <= {TARGET_INLINE_VS_PEER}x {peer} per node",
                              pair_ratios(times[inline], times[peer]), at_most=TARGET_INLINE_VS_PEER))
    r.target(ratio_target(f"chain {n}: {on_ray} <= {TARGET_RAY_VS_FLOOR}x {floor}",
                          pair_ratios(times[on_ray], times[floor]), at_most=TARGET_RAY_VS_FLOOR))
    return r


# ---------------------------------------------------------------------------- PostgreSQL


PG_RAYSAGA_INLINE = "raysaga inline (PostgreSQL)"
PG_RAYSAGA_RAY = "raysaga on Ray (PostgreSQL)"
PG_LANGGRAPH = "LangGraph + PostgresSaver (sync)"
PG_DBOS = "DBOS (PostgreSQL)"
PG_FLOOR = "floor: Ray round trip + PostgreSQL commit"


def sqlalchemy_url(url: str) -> str:
    return url.replace("postgresql://", "postgresql+psycopg://", 1) if url.startswith("postgresql://") else url


def plain_url(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://", 1)


@contextlib.contextmanager
def pg_databases(base: str, names: list[str]) -> Iterator[dict[str, str]]:
    """A fresh database per name next to ``base``'s (``bench.pg_database``), dropped on exit."""
    with contextlib.ExitStack() as stack:
        yield {name: plain_url(stack.enter_context(bench.pg_database(base))) for name in names}


def _raysaga_pg(n: int, url: str, executor: str) -> Runner:
    def run() -> float:
        store = SqlStore(sqlalchemy_url(url))
        try:
            return bench.run_raysaga(store, flows.chain(n), None, executor).wall
        finally:
            store.close()

    return run


def pg_rows(ray: Any, n: int, dbs: dict[str, str], log: Callable[[str], None]) -> list[tuple[str, Runner]]:
    task = ray.remote(max_retries=0)(flows.noop)
    rows: list[tuple[str, Runner]] = [(PG_RAYSAGA_INLINE, _raysaga_pg(n, dbs["raysaga"], "inline")),
                                      (PG_RAYSAGA_RAY, _raysaga_pg(n, dbs["raysaga"], "ray"))]
    if lg_peer.available(postgres=True):
        saver = lg_peer.postgres_saver(dbs["langgraph"])
        rows.append((PG_LANGGRAPH, lambda: lg_peer.run_chain(n, saver)))
    else:
        log("chain on PostgreSQL: langgraph-checkpoint-postgres not installed, skipped")
    if dbos_peer.available():
        rows.append((PG_DBOS, lambda: dbos_peer.run_chain(dbs["dbos"], n)))
    rows.append((PG_FLOOR, lambda: bench.floor_chain_pg(ray, task, n, dbs["floor"]).wall))
    return rows


def run_postgres(ray: Any, base_url: str, n: int, reps: int, log: Callable[[str], None]) -> Report:
    with pg_databases(base_url, ["raysaga", "langgraph", "dbos", "floor"]) as dbs:
        rows = pg_rows(ray, n, dbs, log)
        log(f"chain {n} on PostgreSQL: warming up")
        warm(rows)
        times = Samples()
        interleave(rows, reps, times, log, f"chain {n} on PostgreSQL")
    return report(f"Chain: {n} no-op steps on PostgreSQL ({reps} reps, interleaved; one database per system)",
                  n, times, Samples(), PG_RAYSAGA_INLINE, [PG_LANGGRAPH, PG_DBOS], PG_RAYSAGA_RAY, PG_FLOOR)

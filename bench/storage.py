"""Storage tables of the peer suite: the database bytes each system left after the chain and the
fan-outs (measured by bench/peers_chain.py and bench/peers_fanout.py on fresh SQLite files, after
``wal_checkpoint(TRUNCATE)``), and raysaga's bytes per node as the run grows (bench/rss.py).

``python bench/storage.py [SIZE ...]``: bytes a node row takes by the size of its output, on a new
store's pages and on 4 KiB pages (the page-size trade-off in docs/storage.md)."""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import uuid
from collections.abc import Sequence
from pathlib import Path

import peers_chain
import peers_fanout
from rss import Measured
from table import Report, Samples, Target, med

TARGET_VS_LANGGRAPH = 0.1  # raysaga's bytes / LangGraph's, at most
TARGET_LINEAR = 0.25  # net bytes/node of the largest run within +-25 % of the 2,000-item one


def _row(label: str, size: float, nodes: int, ours: float) -> list[str]:
    return [label, f"{size:,.0f}", f"{size / nodes:,.0f}", f"{ours / size:.3f}"]


def by_scenario(chain_n: int, chain: Samples, fanouts: dict[int, Samples]) -> Report:
    r = Report()
    r.heading("Storage: database bytes after one run of each scenario (fresh SQLite files)")
    rows: list[list[str]] = []
    scenarios: list[tuple[str, int, Samples, str, list[str]]] = [
        (f"chain {chain_n}", chain_n, chain, peers_chain.RAYSAGA_INLINE,
         [peers_chain.RAYSAGA_RAY, peers_chain.LANGGRAPH, peers_chain.DBOS, peers_chain.DBOS_WAL])]
    for n, sizes in fanouts.items():
        scenarios.append((f"fan-out {n:,}", n + 2, sizes, peers_fanout.RAYSAGA,
                          [peers_fanout.LANGGRAPH, peers_fanout.DBOS_GATHER, peers_fanout.DBOS_QUEUE]))
    for name, nodes, sizes, ours_label, others in scenarios:
        if ours_label not in sizes:
            continue
        ours = med(sizes[ours_label])
        rows.append([f"{name}: {ours_label}", f"{ours:,.0f}", f"{ours / nodes:,.0f}", "1.000"])
        for label in others:
            if label in sizes:
                rows.append(_row(f"{name}: {label}", med(sizes[label]), nodes, ours))
        if peers_chain.LANGGRAPH in sizes or peers_fanout.LANGGRAPH in sizes:
            lg = med(sizes[peers_chain.LANGGRAPH if name.startswith("chain") else peers_fanout.LANGGRAPH])
            r.target(Target(f"storage, {name}: raysaga bytes <= {TARGET_VS_LANGGRAPH}x LangGraph's",
                            ours <= TARGET_VS_LANGGRAPH * lg, f"{ours / lg:.3f}x ({ours:,.0f} / {lg:,.0f} B)"))
    r.table(["scenario: system", "bytes", "bytes/node", "raysaga / this"], rows, [58, 13, 11, 15])
    r.p("  (bytes: the file + -wal after wal_checkpoint(TRUNCATE), the empty schema included;")
    r.p("   nodes: the chain's steps, the fan-out's items + plan + join; DBOS's queue keeps a workflow per item)")
    return r


def scaling(measured: Sequence[Measured]) -> Report:
    r = Report()
    r.heading("Storage: raysaga bytes per node as the fan-out grows (SQLite, one run per database)")
    rows = []
    for m in sorted(measured, key=lambda m: m.items):
        net = m.db_bytes - m.empty_db_bytes
        rows.append([f"{m.items:,} items", f"{m.nodes:,}", f"{m.db_bytes:,}", f"{m.db_bytes / m.nodes:,.0f}",
                     f"{net / m.nodes:,.0f}"])
    r.table(["fan-out", "node rows", "bytes", "bytes/node", "net bytes/node"], rows, [16, 10, 13, 11, 15])
    empty = measured[0].empty_db_bytes if measured else 0
    r.p(f"  (net: less the empty migrated database, {empty:,} bytes)")
    ordered = sorted(measured, key=lambda m: m.items)
    base = next((m for m in ordered if m.items >= 2_000), None)
    if base is not None and ordered[-1].items > base.items:
        top = ordered[-1]
        def net_per_node(m: Measured) -> float:
            return (m.db_bytes - m.empty_db_bytes) / m.nodes

        growth = net_per_node(top) / net_per_node(base)
        r.target(Target(f"storage linear: net bytes/node at {top.items:,} / at {base.items:,} within 1 +- "
                        f"{TARGET_LINEAR}", abs(growth - 1) <= TARGET_LINEAR, f"{growth:.2f}"))
    return r


OUTPUT_SIZES = (0, 100, 180, 200, 400, 700, 1_000, 1_500, 2_000, 3_000, 4_000, 6_000)
STEPS = 500  # completed steps of one run, committed 50 at a time


def node_bytes(tmp: Path, output_bytes: int, page_size: int | None) -> float:
    """Net bytes a completed node row with an output of ``output_bytes`` takes: ``STEPS`` of them
    in one run, on a fresh store (``page_size``: the file made with it first; None, raysaga's)."""
    import bench
    from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore

    path = tmp / f"rows-{uuid.uuid4().hex[:8]}.db"
    if page_size is not None:
        conn = sqlite3.connect(path)
        conn.execute(f"PRAGMA page_size={page_size}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.close()
    store = SqlStore(bench.sqlite_url(path))
    try:
        store.create_run(NewRun(run_id="r", workflow_name="w", workflow_version="1", definition_hash="0" * 64,
                                trace_id="t"))
        empty = bench.db_bytes(path)
        lease = store.claim("r", "bench", 60)
        for first in range(0, STEPS, 50):
            store.commit(lease, Batch(nodes=[
                NodeWrite(node_id=f"s{i:04d}", status=NodeStatus.COMPLETED, attempt=1, started_at=1.7e9 + i,
                          finished_at=1.7e9 + i + 0.5, output="x" * max(output_bytes - 2, 0))
                for i in range(first, first + 50)]))
    finally:
        store.close()
    return (bench.db_bytes(path) - empty) / STEPS


def main(argv: list[str]) -> int:
    sizes = [int(a) for a in argv] or list(OUTPUT_SIZES)
    with tempfile.TemporaryDirectory(prefix="raysaga-rows-") as tmp:
        print(f"{'output bytes':>12}  {'4 KiB pages':>11}  {'new store':>9}  ratio")
        for size in sizes:
            big, ours = node_bytes(Path(tmp), size, 4096), node_bytes(Path(tmp), size, None)
            print(f"{size:>12,}  {big:>11,.0f}  {ours:>9,.0f}  {ours / big:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

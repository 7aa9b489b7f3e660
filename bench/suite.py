#!/usr/bin/env python
"""raysaga next to the durable peers a user would otherwise pick (LangGraph, DBOS) and raw Ray:
every scenario in one invocation, the systems interleaved rep by rep, tables and PASS/MISS.

    python bench/suite.py                 # full (~20-30 min on the 2-core VM)
    python bench/suite.py --quick         # smoke sizes, 1 rep (< 60 s; tests/bench/test_suite_smoke.py)
    python bench/suite.py --only chain,fanout --reps 3
    RAYSAGA_BENCH_PG_URL=postgresql://postgres@127.0.0.1:5432/test python bench/suite.py --only pg

Sections (``--only``): ``chain`` (peers_chain.py), ``fanout`` and ``cpu`` (peers_fanout.py),
``pg`` (both on PostgreSQL, with RAYSAGA_BENCH_PG_URL), ``storage`` (storage.py: the bytes chain
and fanout measured, and raysaga's bytes per node up to 100,000 nodes), ``rss`` (rss.py),
``resume`` (resume.py), ``reading`` (reading.py). Figures: median (min-max) over the reps; ratios
pair by pair (rep i against rep i). Peers not installed are skipped with a note on stderr (the
``bench`` extra installs them). Exit 0 whether targets pass or not, unless ``--fail-on-miss``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import peers_chain  # noqa: E402
import peers_fanout  # noqa: E402
import reading  # noqa: E402
import resume  # noqa: E402
import rss  # noqa: E402
import storage  # noqa: E402
from table import Report, Samples, Target, loadavg, target_lines  # noqa: E402

import bench  # noqa: E402

SECTIONS = ("chain", "fanout", "cpu", "pg", "storage", "rss", "resume", "reading")


@dataclass(frozen=True)
class Plan:
    chain: int = 200
    chain_reps: int = 5
    warm: bool = True  # an untimed pass of every chain row first
    fanouts: tuple[int, ...] = (1_000, 10_000)
    fan_reps: int = 3
    dbos_queue_max: int = 1_000
    dbos_limit: float = 120.0  # seconds a DBOS fan-out may take before its process is killed
    cpu_items: int = 200
    cpu_secs: float = 0.05
    cpu_reps: int = 3
    storage_sizes: tuple[int, ...] = (200, 2_000, 10_000, 100_000)
    rss_sizes: tuple[int, ...] = (10_000, 100_000)
    resume_secs: float = 0.2
    resume_reps: int = 3
    resume_ray: bool = True
    status_items: int = 10_000
    list_runs: int = 100_000
    page_items: int = 2_000
    read_reps: int = 5
    pg_fanout: int = 1_000
    pg_reps: int = 3


FULL = Plan()
QUICK = Plan(chain=20, chain_reps=1, warm=False, fanouts=(100,), fan_reps=1, dbos_queue_max=0, cpu_items=8,
             cpu_secs=0.01, cpu_reps=1, storage_sizes=(200,), rss_sizes=(200,), resume_secs=0.05, resume_reps=1,
             resume_ray=False, status_items=200, list_runs=1_000, page_items=100, read_reps=1, pg_fanout=100,
             pg_reps=1)


def versions() -> str:
    def v(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    names = ("ray", "langgraph", "langgraph-checkpoint-sqlite", "langgraph-checkpoint-postgres", "dbos",
             "sqlalchemy", "psycopg")
    import raysaga

    return (", ".join(f"{n} {v(n)}" for n in names) +
            f", SQLite {sqlite3.sqlite_version}, Python {platform.python_version()}, {os.cpu_count()} CPUs; "
            f"raysaga imported from {Path(raysaga.__file__).parent}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke sizes, 1 rep, no Ray resume rows")
    parser.add_argument("--only", default=",".join(SECTIONS), help=f"comma-separated sections of {SECTIONS}")
    parser.add_argument("--reps", type=int, default=None, help="reps of every timed section")
    parser.add_argument("--out", type=Path, default=None, help="also write the tables to this file")
    parser.add_argument("--fail-on-miss", action="store_true")
    args = parser.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(only) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {SECTIONS}")
    plan = QUICK if args.quick else FULL
    if args.reps:
        plan = replace(plan, chain_reps=args.reps, fan_reps=args.reps, cpu_reps=args.reps, resume_reps=args.reps,
                       read_reps=args.reps, pg_reps=args.reps)
    pg_url = os.environ.get(bench.PG_ENV) or None

    def log(msg: str) -> None:
        print(f"[suite {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    out: list[str] = []
    targets: list[Target] = []

    def emit(report: Report) -> None:
        text = report.text()
        print(text, flush=True)
        out.append(text)
        targets.extend(report.targets)

    header = (f"raysaga peer suite, {'quick' if args.quick else 'full'}: {versions()}\n"
              f"  started {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, load average {loadavg()}\n")
    print(header, flush=True)
    out.append(header)
    tmp = Path(tempfile.mkdtemp(prefix="rsb-suite-"))
    started = time.perf_counter()
    chain_sizes, fan_sizes = Samples(), dict[int, Samples]()
    measured: list[rss.Measured] = []
    rss_report: Report | None = None
    try:
        if {"chain", "fanout", "cpu", "pg", "storage", "rss"} & set(only):
            log("starting Ray (local, num_cpus=2)")
            ray = bench.start_ray(None, tmp / "ray")
            try:
                if "chain" in only:
                    report, _, chain_sizes = peers_chain.run_sqlite(ray, plan.chain, plan.chain_reps, tmp, log,
                                                                           warm_up=plan.warm)
                    emit(report)
                if "fanout" in only:
                    report, fan_sizes = peers_fanout.run_noop(ray, plan.fanouts, plan.fan_reps, tmp,
                                                              plan.dbos_queue_max, plan.dbos_limit, log)
                    emit(report)
                if "cpu" in only:
                    emit(peers_fanout.run_cpu(ray, plan.cpu_items, plan.cpu_secs, plan.cpu_reps, tmp, log))
                if "pg" in only:
                    if pg_url:
                        emit(peers_chain.run_postgres(ray, pg_url, plan.chain, plan.pg_reps, log))
                        emit(peers_fanout.run_postgres(ray, pg_url, plan.pg_fanout, plan.pg_reps, log))
                    else:
                        log(f"pg: {bench.PG_ENV} is not set, skipped")
                if "storage" in only or "rss" in only:  # driver processes of their own, joining this Ray
                    sizes = sorted(set(plan.storage_sizes if "storage" in only else ()) |
                                   set(plan.rss_sizes if "rss" in only else ()))
                    rss_report, measured = rss.run(sizes, plan.rss_sizes, log,
                                                   ray.get_runtime_context().gcs_address)
            finally:
                ray.shutdown()
        if "storage" in only:
            if chain_sizes.values or fan_sizes:
                emit(storage.by_scenario(plan.chain, chain_sizes, fan_sizes))
            emit(storage.scaling([m for m in measured if m.items in plan.storage_sizes]))
        if "rss" in only and rss_report is not None:
            emit(rss_report)
        if "resume" in only:
            emit(resume.run(plan.resume_reps, plan.resume_secs, tmp / "resume", log, with_ray=plan.resume_ray))
        if "reading" in only:
            emit(reading.run(plan.status_items, plan.list_runs, plan.page_items, plan.read_reps, tmp / "reading", log))
        summary = Report()
        summary.heading("Targets (ratios from this run)")
        summary.lines += target_lines(targets)
        summary.p(f"  (suite wall time {time.perf_counter() - started:.0f}s)")
        emit(summary)
        if args.out is not None:
            args.out.write_text("".join(out))
        return 1 if args.fail_on_miss and not all(t.ok for t in targets) else 0
    finally:
        with contextlib.suppress(Exception):
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""raysaga fan-outs of N no-op items, each in a fresh process: the driver's peak RSS, wall time,
and the SQLite store's size (bench/storage.py reads the bytes per node from here).

    python rss.py --child N TMPDIR [ADDRESS]    # one measurement, printed as one JSON line

The child joins the Ray cluster at ADDRESS (the suite's, when it is up) or starts a local one
(``num_cpus=2``): either way the driver is a process of its own, and Ray's processes are not
in its RSS. It warms it with a 20-item fan-out, records its RSS
(``VmRSS``: Python, raysaga, Ray's client), resets the kernel's high-water mark (``5`` into
``/proc/self/clear_refs``), runs ``plan -> item x N -> sink`` on a fresh migrated store, and
reports the run's peak (``VmHWM``, every thread), the whole process's peak (``ru_maxrss``,
``ray.init`` included) and the store's bytes after ``wal_checkpoint(TRUNCATE)``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from table import Report, Target  # noqa: E402

TARGET_RSS_MB = 500.0  # driver peak RSS of the 100,000-item fan-out, at most


@dataclass(frozen=True)
class Measured:
    items: int
    nodes: int
    wall: float
    rss_start_mb: float  # VmRSS before the run
    rss_peak_mb: float  # VmHWM during the run (the high-water mark reset just before it)
    process_peak_mb: float  # ru_maxrss: the whole process's peak, ray.init and the warm-up included
    db_bytes: int
    empty_db_bytes: int


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # Linux >= 4.0: VmHWM := VmRSS


def child(n: int, tmp: Path, address: str | None) -> Measured:
    import bench

    ray = bench.start_ray(address, tmp / "ray")
    try:
        bench.raysaga_fanout(20, tmp)
        empty = bench.empty_db_bytes(tmp)
        start_mb = _status_mb("VmRSS")
        _reset_peak()
        timing, path = bench.raysaga_fanout(n, tmp)
        return Measured(items=n, nodes=bench.node_rows(path), wall=timing.wall, rss_start_mb=start_mb,
                        rss_peak_mb=_status_mb("VmHWM"), process_peak_mb=_maxrss_mb(),
                        db_bytes=bench.db_bytes(path), empty_db_bytes=empty)
    finally:
        ray.shutdown()


def measure(n: int, log: Callable[[str], None], address: str | None = None) -> Measured:
    """One child process for one size."""
    log(f"rss: fan-out of {n:,} in a fresh process")
    with tempfile.TemporaryDirectory(prefix="rsb-rss-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(n), tmp,
                               *([address] if address else [])],
                              capture_output=True, text=True, timeout=1800, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"rss child for {n:,} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return Measured(**json.loads(proc.stdout.strip().splitlines()[-1]))


def run(sizes: Sequence[int], rss_sizes: Sequence[int], log: Callable[[str], None],
        address: str | None = None) -> tuple[Report, list[Measured]]:
    got = [measure(n, log, address) for n in sizes]
    r = Report()
    r.heading("Driver peak RSS: raysaga fan-outs on Ray, each in a fresh process")
    rows = []
    for m in got:
        if m.items in rss_sizes:
            rows.append([f"{m.items:,} items", f"{m.rss_start_mb:,.0f}", f"{m.rss_peak_mb:,.0f}",
                         f"{m.rss_peak_mb - m.rss_start_mb:,.0f}", f"{m.process_peak_mb:,.0f}", f"{m.wall:.2f}",
                         f"{m.items / m.wall:,.0f}"])
    r.table(["fan-out", "RSS before MB", "run's peak MB", "growth MB", "process peak MB", "wall s", "items/s"],
            rows, [18, 14, 14, 10, 16, 8, 9])
    r.p("  (before: VmRSS after ray.init and a 20-item warm-up run; run's peak: VmHWM, reset just before")
    r.p("   the run; process peak: ru_maxrss since the process started, ray.init included)")
    biggest = max(got, key=lambda m: m.items)
    if biggest.items >= 100_000:
        r.target(Target(f"fan-out {biggest.items:,}: driver peak RSS <= {TARGET_RSS_MB:.0f} MB",
                        biggest.rss_peak_mb <= TARGET_RSS_MB, f"{biggest.rss_peak_mb:,.0f} MB"))
    return r, got


def main(argv: list[str]) -> int:
    if len(argv) in (3, 4) and argv[0] == "--child":
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        started = time.perf_counter()
        m = child(int(argv[1]), Path(argv[2]), argv[3] if len(argv) == 4 else None)
        print(f"[rss child] {m.items:,} items in {time.perf_counter() - started:.1f}s", file=sys.stderr)
        print(json.dumps(m.__dict__))
        return 0
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

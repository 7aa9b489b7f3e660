#!/usr/bin/env python
"""Micro-measurement behind the I/O pool's design: N calls that each wait W seconds, on a 2-CPU Ray.

    python bench/io_micro.py [--items 200] [--wait 0.05] [--reps 3]

Compares, in one process on one local Ray (``num_cpus=2``), medians over ``--reps``:

* ``task cpu=1``: one Ray task per call, Ray's default of one CPU each (raysaga before ``io_bound``);
* ``task cpu=0``: one zero-CPU task per call (Ray starts a worker process per concurrent task);
* ``pool AxT``: A threaded actors (``num_cpus=0``, ``max_concurrency=T``), calls spread over them
  (actor start-up excluded, shown on its own line);
* ``ideal``: ceil(N / concurrency) x W.

Numbers go to stdout; this is a script, not a test.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import statistics
import sys
import time
from typing import Any, cast

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def wait_call(seconds: float) -> float:
    time.sleep(seconds)  # stands for a model call or an HTTP tool: the thread waits, no CPU
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--items", type=int, default=200)
    parser.add_argument("--wait", type=float, default=0.05)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--zero-cpu", action="store_true", help="also measure zero-CPU tasks (slow: ~minutes)")
    args = parser.parse_args(argv)
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.ERROR, log_to_driver=False)
    n, w = args.items, args.wait
    task = ray.remote(max_retries=0)(wait_call)

    @ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
    class Pool:
        def call(self, seconds: float) -> float:
            return wait_call(seconds)

    def run_tasks(cpus: float) -> float:
        t = time.perf_counter()
        ray.get([task.options(num_cpus=cpus).remote(w) for _ in range(n)])
        return time.perf_counter() - t

    def run_pool(actors: list[Any], per: int) -> float:
        # at most `per` calls per actor in flight, the rest queued in the driver (as the executor does)
        t = time.perf_counter()
        inflight: dict[Any, int] = {}
        load = [0] * len(actors)
        left = n
        while left or inflight:
            for i, a in enumerate(actors):
                while left and load[i] < per:
                    inflight[a.call.remote(w)] = i
                    load[i] += 1
                    left -= 1
            ready, _ = ray.wait(list(inflight), num_returns=1)
            more, _ = ray.wait(list(inflight), num_returns=len(inflight), timeout=0)
            for ref in {*ready, *more}:
                load[inflight.pop(ref)] -= 1
        return time.perf_counter() - t

    results: dict[str, list[float]] = {}
    ray.get([task.remote(0) for _ in range(4)])
    shapes = [(1, 64), (2, 32), (4, 16), (8, 8)]
    pools = {}
    for a, t in shapes:
        start = time.perf_counter()
        # mypy keeps a class's own type under a class decorator: at run time Pool is Ray's ActorClass
        actors = [cast(Any, Pool).options(max_concurrency=t).remote() for _ in range(a)]
        ray.get([x.call.remote(0) for x in actors])
        print(f"pool {a}x{t}: actor start-up {time.perf_counter() - start:.2f}s", flush=True)
        pools[(a, t)] = actors
    for _ in range(args.reps):
        results.setdefault("task cpu=1", []).append(run_tasks(1))
        if args.zero_cpu:
            results.setdefault("task cpu=0", []).append(run_tasks(0))
        for (a, t), actors in pools.items():
            results.setdefault(f"pool {a}x{t}", []).append(run_pool(actors, t))
    ideal = math.ceil(n / 64) * w
    print(f"{n} calls x {w * 1000:.0f} ms wait, 2-CPU local Ray, medians of {args.reps}; ideal at 64 in flight "
          f"{ideal:.3f}s")
    for label, values in results.items():
        med = statistics.median(values)
        print(f"  {label:14} {med:7.3f}s  {med / ideal:6.2f}x ideal")
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""DBOS as a peer of the suite (bench/suite.py): a chain of sequential steps, a fan-out by
``asyncio.gather`` of async steps and by a queue (one child workflow per item), and CPU-spinning
items, each on a fresh system database (SQLite in its default rollback journal or in WAL, or
PostgreSQL).

DBOS is one global instance per process: ``on(url)`` configures and launches it on ``url`` and
destroys it on exit (the decorated functions stay registered), so the rows of a rep can each
use a database of their own. Nothing here works without the ``dbos`` package (``available()``).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, TypeVar, cast

from table import TimedOut

F = TypeVar("F", bound=Callable[..., Any])
QUEUE = "raysaga_bench_fan"
APP = "raysaga_bench"


def available() -> bool:
    try:
        import dbos  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Fns:
    chain: Callable[[int], int]
    gather: Callable[[int], Coroutine[Any, Any, int]]
    queued: Callable[[int], int]
    spin_gather: Callable[[int, float], Coroutine[Any, Any, int]]
    wait_gather: Callable[[int, float], Coroutine[Any, Any, int]]


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@cache
def _define() -> Fns:
    """The workflows and steps, decorated once per process."""
    from dbos import DBOS

    # DBOS's decorators keep the signature; typed here so mypy sees the same with dbos absent
    step = cast(Callable[[F], F], DBOS.step())
    workflow = cast(Callable[[F], F], DBOS.workflow())

    @step
    def noop_step(i: int) -> None:
        return None

    @workflow
    def chain(n: int) -> int:
        for i in range(n):
            noop_step(i)
        return n

    @step
    async def noop_async(i: int) -> None:
        return None

    @workflow
    async def gather(n: int) -> int:
        return len(await asyncio.gather(*[noop_async(i) for i in range(n)]))

    @workflow
    def item_wf(i: int) -> None:
        noop_step(i)

    @workflow
    def queued(n: int) -> int:
        queue = DBOS.retrieve_queue(QUEUE)
        assert queue is not None
        handles = [queue.enqueue(item_wf, i) for i in range(n)]
        return len([h.get_result() for h in handles])

    @step
    async def spin_async(seconds: float) -> None:
        spin(seconds)

    @workflow
    async def spin_gather(n: int, seconds: float) -> int:
        return len(await asyncio.gather(*[spin_async(seconds) for _ in range(n)]))

    @step
    async def wait_async(seconds: float) -> None:
        await asyncio.sleep(seconds)

    @workflow
    async def wait_gather(n: int, seconds: float) -> int:
        return len(await asyncio.gather(*[wait_async(seconds) for _ in range(n)]))

    return Fns(chain=chain, gather=gather, queued=queued, spin_gather=spin_gather, wait_gather=wait_gather)


def sqlite_url(path: Path, *, wal: bool) -> str:
    """A SQLite system database; ``wal``: the file is created in WAL mode first (the mode persists)."""
    if wal:
        conn = sqlite3.connect(path)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
        finally:
            conn.close()
    return f"sqlite:///{path}"


@contextmanager
def on(url: str) -> Iterator[Fns]:
    """DBOS launched on the system database ``url``; destroyed on exit."""
    from dbos import DBOS

    fns = _define()
    DBOS(config={"name": APP, "system_database_url": url, "log_level": "ERROR"})
    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.ERROR)
    DBOS.register_queue(QUEUE, polling_interval_sec=0.05)  # DBOS's default poll is 1 s
    try:
        yield fns
    finally:
        DBOS.destroy(destroy_registry=False)


def timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def run_chain(url: str, n: int) -> float:
    with on(url) as f:
        return timed(lambda: _check(f.chain(n), n))


def run_gather(url: str, n: int) -> float:
    with on(url) as f:
        return timed(lambda: _check(asyncio.run(f.gather(n)), n))


def run_queue(url: str, n: int) -> float:
    with on(url) as f:
        return timed(lambda: _check(f.queued(n), n))


def run_spin(url: str, n: int, seconds: float) -> float:
    with on(url) as f:
        return timed(lambda: _check(asyncio.run(f.spin_gather(n, seconds)), n))


def run_wait(url: str, n: int, seconds: float) -> float:
    with on(url) as f:
        return timed(lambda: _check(asyncio.run(f.wait_gather(n, seconds)), n))


def _check(got: int, n: int) -> None:
    if got != n:
        raise RuntimeError(f"DBOS workflow returned {got}, expected {n}")


# ---------------------------------------------------------------------------- in a child process


KINDS = ("gather", "queue", "spin", "wait")


def run_child(kind: str, url: str, n: int, limit: float, seconds: float = 0.0) -> float:
    """One fan-out measured in a fresh process (``python dbos_peer.py KIND URL N SECONDS``), killed
    after ``limit`` seconds: DBOS's fan-outs slow down sharply with N, and its threads cannot be
    stopped from inside. The figure is the child's own timing of the workflow (launch excluded)."""
    cmd = [sys.executable, __file__, kind, url, str(n), str(seconds)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 30)
    except subprocess.TimeoutExpired:
        raise TimedOut(limit) from None
    if proc.returncode != 0:
        raise RuntimeError(f"DBOS {kind} child exited {proc.returncode}: {proc.stderr[-2000:]}")
    took = float(proc.stdout.strip().splitlines()[-1])
    if took > limit:
        raise TimedOut(limit)
    return took


def _child(argv: list[str]) -> int:
    kind, url, n, seconds = argv[0], argv[1], int(argv[2]), float(argv[3])
    if kind == "gather":
        took = run_gather(url, n)
    elif kind == "queue":
        took = run_queue(url, n)
    elif kind == "wait":
        took = run_wait(url, n, seconds)
    else:
        took = run_spin(url, n, seconds)
    print(took, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))

"""The workflows and raw Ray task bodies the bench runs.

A module of its own, not ``bench.py``'s ``__main__``: Ray workers unpickle step functions by
reference, so they must be able to ``import flows`` (``bench.py`` puts this folder on the
workers' ``PYTHONPATH``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

from raysaga import StepContext, Workflow


def noop() -> None:
    """A chain step, and the raw Ray baseline's task body: does nothing."""
    return None


def plan(input: int) -> list[int]:
    """The fan-out's planner: ``input`` items to map over."""
    return list(range(input))


def item(plan: int) -> None:
    """One fan-out item: does nothing."""
    return None


def sink(item: list[None]) -> int:
    """Joins the fan-out: receives every item's output as one list."""
    return len(item)


def items_chunk(items: list[int]) -> list[None]:
    """The raw Ray DAG baseline's chunk task: ``item`` on each of a slice of the plan."""
    out: list[None] = []
    for i in items:
        item(i)
        out.append(None)
    return out


def sink_chunks(*chunks: list[None]) -> int:
    """The raw Ray DAG baseline's join task: every chunk's outputs, joined as ``sink`` joins them."""
    return sink([out for chunk in chunks for out in chunk])


@cache
def chain(n: int) -> Workflow:
    """``s0000 -> s0001 -> ... -> s{n-1}``: ``n`` no-op steps ordered with ``after=``."""
    wf = Workflow(f"bench-chain-{n}")
    prev: str | None = None
    for i in range(n):
        name = f"s{i:04d}"
        wf.step(noop, name=name, after=(prev,) if prev else ())
        prev = name
    return wf.validate()


@cache
def fanout(local_glue: bool = False) -> Workflow:
    """``plan -> item[0..N-1] -> sink`` where N is the run's input. ``local_glue``: ``plan`` and
    ``sink`` declared ``local=True`` (run in the driver, as the raw Ray baselines run their own
    planning and gathering), the items on Ray either way."""
    wf = Workflow("bench-fanout-local-glue" if local_glue else "bench-fanout")
    wf.step(plan, local=local_glue)
    wf.map("plan")(item)
    wf.step(sink, local=local_glue)
    return wf.validate()


def waits(input: dict[str, float]) -> list[float]:
    """The I/O fan-out's planner: ``input["n"]`` items, each to wait ``input["wait"]`` seconds."""
    return [float(input["wait"])] * int(input["n"])


def wait_item(waits: float) -> None:
    """One I/O-bound item: waits like a model call or an HTTP tool (the thread sleeps, no CPU)."""
    import time

    time.sleep(waits)


def wait_sink(wait_item: list[None]) -> int:
    return len(wait_item)


@cache
def io_fanout(io_bound: bool) -> Workflow:
    """``waits -> wait_item[0..N-1] (io_bound or not) -> wait_sink``; input ``{"n": N, "wait": S}``."""
    wf = Workflow(f"bench-io-fanout-{'io' if io_bound else 'cpu'}")
    wf.step(waits)
    wf.map("waits", io_bound=io_bound)(wait_item)
    wf.step(wait_sink)
    return wf.validate()


def spin(seconds: float) -> None:
    """Busy CPU for ``seconds`` (holds the GIL: a CPU-bound item)."""
    import time

    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def spin_item(waits: float) -> None:
    """One CPU-bound item: spins ``waits`` seconds."""
    spin(waits)


def spin_sink(spin_item: list[None]) -> int:
    return len(spin_item)


@cache
def cpu_fanout() -> Workflow:
    """``waits -> spin_item[0..N-1] -> spin_sink``; input ``{"n": N, "wait": S}`` (S of CPU each)."""
    wf = Workflow("bench-cpu-fanout")
    wf.step(waits)
    wf.map("waits")(spin_item)
    wf.step(spin_sink)
    return wf.validate()


def slow_step(ctx: StepContext, input: dict[str, Any]) -> None:
    """A resume-bench step: appends ``start``/``end`` lines (time, node, pid) to ``input["log"]``
    around a ``input["secs"]`` sleep, so the bench sees what ran, when, and in which process."""
    import os
    import time

    def log(what: str) -> None:
        with open(str(input["log"]), "a") as f:
            f.write(f"{time.time():.6f} {what} {ctx.node_id} {os.getpid()}\n")

    log("start")
    time.sleep(float(input["secs"]))
    log("end")


@cache
def slow_chain(n: int) -> Workflow:
    """``r00 -> r01 -> ... -> r{n-1}``, each a ``slow_step``; input ``{"log": PATH, "secs": S}``."""
    wf = Workflow(f"bench-slow-chain-{n}")
    prev: str | None = None
    for i in range(n):
        name = f"r{i:02d}"
        wf.step(slow_step, name=name, after=(prev,) if prev else ())
        prev = name
    return wf.validate()


slow_chain_20 = slow_chain(20)  # `raysaga run flows:slow_chain_20` (bench/resume.py)

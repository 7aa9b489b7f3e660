"""The workflows and raw Ray task bodies the bench runs.

A module of its own, not ``bench.py``'s ``__main__``: Ray workers unpickle step functions by
reference, so they must be able to ``import flows`` (``bench.py`` puts this folder on the
workers' ``PYTHONPATH``).
"""

from __future__ import annotations

from functools import cache

from raysaga import Workflow


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
def fanout() -> Workflow:
    """``plan -> item[0..N-1] -> sink`` where N is the run's input."""
    wf = Workflow("bench-fanout")
    wf.step(plan)
    wf.map("plan")(item)
    wf.step(sink)
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

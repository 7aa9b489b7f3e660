"""The pure ready-set: DAG + outcomes -> ready nodes, with O(1) work per completion.

No store, no executor: the ``Scheduler`` is driven by hand the way the driver drives it.
The complexity test counts executed Python lines (``sys.settrace``) instead of timing, so
it is deterministic and independent of the machine's speed.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import pytest

from raysaga import Workflow
from raysaga.orchestrator.scheduler import Scheduler


def _noop() -> int:
    return 0


def _dag(name: str, edges: dict[str, list[str]], map_over: dict[str, str] | None = None) -> Workflow:
    """A workflow whose step ``s`` waits for ``edges[s]`` (ordering deps via ``after=``).

    A fan-out step gets a real parameter named after the step it maps over.
    """
    wf = Workflow(name)
    for step, deps in edges.items():
        over = (map_over or {}).get(step)
        if over is None:
            wf.step(name=step, after=deps)(_noop)
            continue
        namespace: dict[str, Any] = {}
        exec(f"def fn({over}):\n    return {over}\n", namespace)  # a parameter named after the upstream
        wf.step(name=step, after=[d for d in deps if d != over], map_over=over)(namespace["fn"])
    return wf.validate()


def _drain(sched: Scheduler) -> list[tuple[str, int]]:
    return sched.pop_ready()


def test_diamond_ready_order() -> None:
    wf = _dag("diamond", {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"]})
    sched = Scheduler(wf)
    assert _drain(sched) == [("a", -1)]
    assert _drain(sched) == []  # popping empties the ready set
    assert sched.complete(("a", -1)) == ["a"]
    assert sorted(_drain(sched)) == [("b", -1), ("c", -1)]
    assert sched.complete(("b", -1)) == ["b"]
    assert _drain(sched) == []  # d still waits for c
    assert not sched.settled()
    assert sched.complete(("c", -1)) == ["c"]
    assert _drain(sched) == [("d", -1)]
    assert sched.complete(("d", -1)) == ["d"]
    assert sched.settled()
    assert sched.completed == {"a", "b", "c", "d"}


def test_roots_are_ready_at_once_in_deterministic_order() -> None:
    wf = _dag("roots", {"zeta": [], "alpha": [], "mid": ["zeta", "alpha"]})
    assert Scheduler(wf).pop_ready() == Scheduler(wf).pop_ready()
    assert sorted(Scheduler(wf).pop_ready()) == [("alpha", -1), ("zeta", -1)]


def test_completing_twice_is_idempotent() -> None:
    wf = _dag("twice", {"a": [], "b": ["a"], "c": ["a", "b"]})
    sched = Scheduler(wf)
    sched.pop_ready()
    assert sched.complete(("a", -1)) == ["a"]
    assert sched.complete(("a", -1)) == []  # a replayed completion must not decrement again
    assert _drain(sched) == [("b", -1)]
    sched.complete(("b", -1))
    assert _drain(sched) == [("c", -1)]


def test_push_puts_a_node_back() -> None:
    wf = _dag("push", {"a": []})
    sched = Scheduler(wf)
    assert _drain(sched) == [("a", -1)]
    sched.push(("a", -1))  # a retry whose timer fired
    assert _drain(sched) == [("a", -1)]


def test_fan_out_with_zero_items_completes_at_once() -> None:
    wf = _dag("fan0", {"plan": [], "item": ["plan"], "after": ["item"]}, map_over={"item": "plan"})
    sched = Scheduler(wf)
    assert _drain(sched) == [("plan", -1)]
    sched.complete(("plan", -1))
    assert _drain(sched) == [("item", -1)]
    assert sched.expand("item", 0) == ["item"]
    assert "item" in sched.completed
    assert _drain(sched) == [("after", -1)]
    sched.complete(("after", -1))
    assert sched.settled()


def test_fan_out_completes_with_its_last_item() -> None:
    wf = _dag("fan3", {"plan": [], "item": ["plan"], "after": ["item"]}, map_over={"item": "plan"})
    sched = Scheduler(wf)
    sched.pop_ready()
    sched.complete(("plan", -1))
    sched.pop_ready()
    assert sched.expand("item", 3) == []
    assert sorted(_drain(sched)) == [("item", 0), ("item", 1), ("item", 2)]
    assert sched.complete(("item", 2)) == []
    assert sched.items_left("item") == 2
    assert sched.complete(("item", 0)) == []
    assert _drain(sched) == []
    assert sched.complete(("item", 1)) == ["item"]
    assert _drain(sched) == [("after", -1)]


def test_close_skips_descendants_only() -> None:
    wf = _dag("close", {
        "root": [],
        "bad": ["root"], "child": ["bad"], "grandchild": ["child"],
        "good": ["root"], "good2": ["good"],
        "join": ["good2", "child"],  # reachable from both branches: skipped
        "side": [],  # unrelated root
    })
    sched = Scheduler(wf)
    assert sorted(_drain(sched)) == [("root", -1), ("side", -1)]
    sched.complete(("root", -1))
    assert sorted(_drain(sched)) == [("bad", -1), ("good", -1)]
    skipped = sched.close("bad")
    assert set(skipped) == {"child", "grandchild", "join"}
    # topological order: child before its descendants
    assert skipped.index("child") < skipped.index("grandchild") and skipped.index("child") < skipped.index("join")
    assert sched.closed == {"bad", "child", "grandchild", "join"}
    assert not sched.settled()
    sched.complete(("good", -1))
    assert _drain(sched) == [("good2", -1)]
    sched.complete(("good2", -1))
    assert _drain(sched) == []  # join is skipped, never ready
    sched.complete(("side", -1))
    assert sched.settled()
    assert sched.completed == {"root", "good", "good2", "side"}
    # completing a closed step later (a late result) changes nothing
    assert sched.complete(("bad", -1)) == []
    assert _drain(sched) == []


def test_close_of_a_leaf_skips_nothing() -> None:
    wf = _dag("leaf", {"a": [], "b": ["a"]})
    sched = Scheduler(wf)
    sched.pop_ready()
    sched.complete(("a", -1))
    assert sched.close("b") == []
    assert sched.settled()


def test_close_does_not_skip_an_already_completed_step() -> None:
    wf = _dag("done-first", {"a": [], "b": [], "c": ["a"]})
    sched = Scheduler(wf)
    sched.pop_ready()
    sched.complete(("a", -1))
    assert sched.close("b") == []
    assert "a" not in sched.closed


# ---------------------------------------------------------------------------- cost per completion


@contextmanager
def _count_lines() -> Iterator[Callable[[], int]]:
    """Count every Python line executed (in any module) inside the block."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
        return local

    def global_(frame: FrameType, event: str, arg: Any) -> Any:
        return local

    previous = sys.gettrace()
    sys.settrace(global_)
    try:
        yield lambda: count
    finally:
        sys.settrace(previous)


def _chain(n: int) -> Workflow:
    return _dag(f"chain{n}", {f"s{i:05d}": [f"s{i - 1:05d}"] if i else [] for i in range(n)})


def _lines_to_complete(wf: Workflow, sched: Scheduler) -> int:
    with _count_lines() as lines:
        done = 0
        while ready := sched.pop_ready():
            for key in ready:
                done += len(sched.complete(key))
        settled = sched.settled()
    assert done == len(wf.steps) and settled
    return lines()


@pytest.mark.parametrize("shape", ["chain", "star"])
def test_completion_work_is_linear_in_nodes(shape: str) -> None:
    """2000 nodes must cost ~10x the lines of 200 nodes, not ~100x (a rescan per completion)."""

    def build(n: int) -> Workflow:
        if shape == "chain":
            return _chain(n)
        return _dag(f"star{n}", {"hub": [], **{f"leaf{i:05d}": ["hub"] for i in range(n - 1)}})

    small, large = build(200), build(2000)
    small_lines = _lines_to_complete(small, Scheduler(small))
    large_lines = _lines_to_complete(large, Scheduler(large))
    per_node_small = small_lines / 200
    per_node_large = large_lines / 2000
    assert per_node_large <= 1.3 * per_node_small, (small_lines, large_lines)
    assert per_node_large < 60, f"{per_node_large:.1f} lines per completion"

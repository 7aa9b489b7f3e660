"""LangGraph as a peer of the suite (bench/suite.py): a chain of no-op nodes and a ``Send`` fan-out,
checkpointed with SqliteSaver or PostgresSaver, ``durability="sync"`` (each checkpoint committed
before the next step starts, as raysaga commits a node before it is acted on).

No ``from __future__ import annotations``: LangGraph reads the hints of the graph's functions and
state at build time (see peers.py). Everything is None / skipped when langgraph is not installed.
"""

import operator
import sqlite3
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from functools import cache
from pathlib import Path
from typing import Annotated, Any, TypedDict

Body = Callable[[], None]


def available(postgres: bool = False) -> bool:
    try:
        import langgraph.checkpoint.sqlite
        from langgraph.graph import StateGraph  # noqa: F401

        if postgres:
            import langgraph.checkpoint.postgres  # noqa: F401
    except ImportError:
        return False
    return True


class ChainState(TypedDict):
    last: str


class FanState(TypedDict):
    n: int
    done: Annotated[int, operator.add]


@cache
def chain_graph(n: int) -> Any:
    """``s0000 -> ... -> s{n-1}``: each node writes its name (a fixed-size state)."""
    from langgraph.graph import END, START, StateGraph

    g = StateGraph(ChainState)
    prev = START
    for i in range(n):
        name = f"s{i:04d}"

        def node(state: ChainState, _name: str = name) -> dict[str, Any]:
            return {"last": _name}

        g.add_node(name, node)
        g.add_edge(prev, name)
        prev = name
    g.add_edge(prev, END)
    return g


def fan_graph(body: Body) -> Any:
    """``plan`` sends ``n`` branches of ``item`` (each runs ``body``), joined by ``sink``."""
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    def plan(state: FanState) -> dict[str, Any]:
        return {}

    def fan(state: FanState) -> list[Any]:
        return [Send("item", {"i": i}) for i in range(state["n"])]

    def item(state: Any) -> dict[str, Any]:
        body()
        return {"done": 1}

    def sink(state: FanState) -> dict[str, Any]:
        return {}

    g = StateGraph(FanState)
    g.add_node("plan", plan)
    g.add_node("item", item)
    g.add_node("sink", sink)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", fan, ["item"])
    g.add_edge("item", "sink")
    g.add_edge("sink", END)
    return g


# ---------------------------------------------------------------------------- checkpointers

SaverFactory = Callable[[], AbstractContextManager[Any]]


def sqlite_saver(path: Path) -> SaverFactory:
    """A SqliteSaver on ``path`` (a fresh file per use: its size is the scenario's storage)."""
    @contextmanager
    def open_saver() -> Iterator[Any]:
        from langgraph.checkpoint.sqlite import SqliteSaver

        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            yield SqliteSaver(conn)
        finally:
            conn.close()

    return open_saver


_PG_READY: set[str] = set()


def postgres_saver(url: str) -> SaverFactory:
    """A PostgresSaver on ``url`` (``setup()`` once per database, untimed at the first use)."""
    @contextmanager
    def open_saver() -> Iterator[Any]:
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(url) as saver:
            if url not in _PG_READY:
                saver.setup()
                _PG_READY.add(url)
            yield saver

    return open_saver


# ---------------------------------------------------------------------------- runners


def _invoke(graph: Any, saver: SaverFactory, state: dict[str, Any], concurrency: int | None) -> tuple[float, Any]:
    with saver() as cp:
        compiled = graph.compile(checkpointer=cp)
        config: dict[str, Any] = {"configurable": {"thread_id": uuid.uuid4().hex}}
        if concurrency is not None:
            config["max_concurrency"] = concurrency
        start = time.perf_counter()
        out = compiled.invoke(state, config, durability="sync")
        return time.perf_counter() - start, out


def run_chain(n: int, saver: SaverFactory) -> float:
    took, out = _invoke(chain_graph(n), saver, {"last": ""}, None)
    if out["last"] != f"s{n - 1:04d}":
        raise RuntimeError(f"LangGraph chain ended at {out['last']!r}")
    return float(took)


def run_fanout(n: int, body: Body, saver: SaverFactory, concurrency: int | None = None) -> float:
    took, out = _invoke(fan_graph(body), saver, {"n": n, "done": 0}, concurrency)
    if out["done"] != n:
        raise RuntimeError(f"LangGraph fan-out joined {out['done']} of {n} branches")
    return float(took)

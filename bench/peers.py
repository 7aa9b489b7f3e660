"""The peers of bench/io_fanout.py: LangGraph ``Send`` + SqliteSaver, DBOS ``asyncio.gather``.

No ``from __future__ import annotations`` here: LangGraph reads the type hints of the graph's
functions and state at build time, and string annotations of local names would not resolve.
Each runner is None when its package is not installed (``pip install langgraph
langgraph-checkpoint-sqlite dbos``, the ``bench`` extra).
"""

import asyncio
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

# the signature of both DBOS functions below: DBOS's decorators keep it
_AsyncIntFn = Callable[[int], Coroutine[Any, Any, int]]


def langgraph_runner(n: int, wait: float, tmp: Path, concurrency: int | None) -> Callable[[], float] | None:
    """A LangGraph ``Send`` fan-out with a SqliteSaver; None when langgraph is not installed."""
    try:
        import operator
        import sqlite3
        from typing import Annotated, TypedDict

        from langchain_core.runnables import RunnableConfig  # installed with langgraph
        from langgraph.checkpoint.sqlite import SqliteSaver
        from langgraph.graph import END, START, StateGraph
        from langgraph.types import Send
    except ImportError:
        return None

    class State(TypedDict):
        n: int
        done: Annotated[list[int], operator.add]

    def plan(state: State) -> dict[str, Any]:
        return {}

    def fan(state: State) -> list[Send]:
        return [Send("item", {"i": i}) for i in range(state["n"])]

    def item(state: Any) -> dict[str, Any]:
        time.sleep(wait)
        return {"done": [state["i"]]}

    def sink(state: State) -> dict[str, Any]:
        return {}

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("item", item)
    g.add_node("sink", sink)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", fan, ["item"])
    g.add_edge("item", "sink")
    g.add_edge("sink", END)

    def run() -> float:
        conn = sqlite3.connect(tmp / f"lg-{uuid.uuid4().hex[:8]}.db", check_same_thread=False)
        try:
            graph = g.compile(checkpointer=SqliteSaver(conn))
            config: RunnableConfig = {"configurable": {"thread_id": uuid.uuid4().hex}}
            if concurrency is not None:
                config["max_concurrency"] = concurrency
            start_state: State = {"n": n, "done": []}
            start = time.perf_counter()
            out = graph.invoke(start_state, config)
            took = time.perf_counter() - start
            assert len(out["done"]) == n, out
            return took
        finally:
            conn.close()

    return run


def dbos_runner(n: int, wait: float, tmp: Path) -> Callable[[], float] | None:
    """A DBOS workflow gathering N async steps; None when dbos is not installed."""
    try:
        from dbos import DBOS
    except ImportError:
        return None
    import logging

    DBOS(config={"name": "raysaga_io_bench", "system_database_url": f"sqlite:///{tmp / 'dbos.sqlite'}",
                 "log_level": "ERROR"})

    # typed here so the functions stay typed when dbos is absent (mypy then sees DBOS as Any)
    step: Callable[[_AsyncIntFn], _AsyncIntFn] = DBOS.step()
    workflow: Callable[[_AsyncIntFn], _AsyncIntFn] = DBOS.workflow()

    @step
    async def dbos_item(i: int) -> int:
        await asyncio.sleep(wait)
        return i

    @workflow
    async def dbos_fanout(count: int) -> int:
        done = await asyncio.gather(*[dbos_item(i) for i in range(count)])
        return len(done)

    DBOS.launch()
    logging.getLogger("dbos").setLevel(logging.ERROR)

    def run() -> float:
        async def go() -> float:
            start = time.perf_counter()
            assert await dbos_fanout(n) == n
            return time.perf_counter() - start

        return asyncio.run(go())

    return run

"""The in-process peers of bench/io_fanout.py (LangGraph ``Send`` + SqliteSaver; its DBOS peer runs
in a child process: ``dbos_peer``) and of bench/agents_fanout.py (LangGraph ``Send`` of tool-use
loops on the ``anthropic`` SDK).

No ``from __future__ import annotations`` here: LangGraph reads the type hints of the graph's
functions and state at build time, and string annotations of local names would not resolve.
Each runner is None when its package is not installed (``pip install langgraph
langgraph-checkpoint-sqlite dbos``, the ``bench`` extra).
"""

import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any


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


# ---------------------------------------------------------------------------- agents (bench/agents_fanout.py)

Message = dict[str, Any]


def _call_model(client: Any, request: dict[str, Any], messages: list[Message]) -> tuple[Message, list[Message], str]:
    """One model call: the assistant message, the tool calls it asks for ([]: a final answer), its text."""
    msg = client.messages.create(**request, messages=messages)
    content = [block.model_dump(mode="json", exclude_none=True) for block in msg.content]
    uses = [b for b in content if b.get("type") == "tool_use"] if msg.stop_reason == "tool_use" else []
    text = "".join(str(b.get("text", "")) for b in content if b.get("type") == "text")
    return {"role": "assistant", "content": content}, uses, text


def _run_tools(uses: list[Message], tools: dict[str, Callable[..., Any]]) -> Message:
    """The user message answering ``uses``: one tool_result per call, run here, in this thread."""
    return {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": u["id"], "content": str(tools[u["name"]](**u["input"]))}
        for u in uses]}


def langgraph_agents_runner(prompts: list[str], client: Any, request: dict[str, Any],
                            tools: dict[str, Callable[..., Any]], max_turns: int, tmp: Path,
                            concurrency: int | None, subgraph: bool) -> Callable[[], float] | None:
    """``plan`` sends one branch per prompt, each a tool-use loop on the ``anthropic`` SDK, then ``join``;
    checkpointed to a fresh SQLite file. None when langgraph is not installed.

    ``request``: the fixed part of every ``client.messages.create`` call (model, max_tokens, system,
    tools); ``tools``: name -> function, run in the branch's thread. ``subgraph=False``: a branch is
    one node running the whole loop (checkpointed when it ends); ``subgraph=True``: a branch is a
    ReAct subgraph ``model <-> tools``, checkpointed after each model call and each tool step, as
    raysaga makes each turn durable.
    """
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
        prompts: list[str]
        answers: Annotated[list[str], operator.add]

    class Branch(TypedDict):
        prompt: str

    class Loop(TypedDict, total=False):
        prompt: str
        messages: list[Message]
        uses: list[Message]
        answers: Annotated[list[str], operator.add]

    def plan(state: State) -> dict[str, Any]:
        return {}

    def fan(state: State) -> list[Send]:
        return [Send("agent", {"prompt": p}) for p in state["prompts"]]

    def agent_in_one_node(state: Branch) -> dict[str, Any]:
        messages: list[Message] = [{"role": "user", "content": state["prompt"]}]
        for _ in range(max_turns):
            said, uses, text = _call_model(client, request, messages)
            if not uses:
                return {"answers": [text]}
            messages += [said, _run_tools(uses, tools)]
        raise RuntimeError(f"no final answer in {max_turns} turns")

    def model(state: Loop) -> dict[str, Any]:
        messages = state.get("messages") or [{"role": "user", "content": state["prompt"]}]
        if sum(1 for m in messages if m["role"] == "assistant") >= max_turns:
            raise RuntimeError(f"no final answer in {max_turns} turns")
        said, uses, text = _call_model(client, request, messages)
        return {"messages": [*messages, said], "uses": uses, **({} if uses else {"answers": [text]})}

    def run_tools(state: Loop) -> dict[str, Any]:
        return {"messages": [*state["messages"], _run_tools(state["uses"], tools)], "uses": []}

    def route(state: Loop) -> str:
        return "tools" if state.get("uses") else END

    def join(state: State) -> dict[str, Any]:
        return {}

    agent_node: Any = agent_in_one_node
    if subgraph:
        loop = StateGraph(Loop)
        loop.add_node("model", model)
        loop.add_node("tools", run_tools)
        loop.add_edge(START, "model")
        loop.add_conditional_edges("model", route, ["tools", END])
        loop.add_edge("tools", "model")
        agent_node = loop.compile()  # checkpointed by the parent's saver, in a namespace of its own

    g = StateGraph(State)
    g.add_node("plan", plan)
    g.add_node("agent", agent_node)
    g.add_node("join", join)
    g.add_edge(START, "plan")
    g.add_conditional_edges("plan", fan, ["agent"])
    g.add_edge("agent", "join")
    g.add_edge("join", END)

    def run() -> float:
        conn = sqlite3.connect(tmp / f"lg-agents-{uuid.uuid4().hex[:8]}.db", check_same_thread=False)
        try:
            graph = g.compile(checkpointer=SqliteSaver(conn))
            config: RunnableConfig = {"configurable": {"thread_id": uuid.uuid4().hex}}
            if concurrency is not None:
                config["max_concurrency"] = concurrency
            start_state: State = {"prompts": list(prompts), "answers": []}
            start = time.perf_counter()
            out = graph.invoke(start_state, config)
            took = time.perf_counter() - start
            if len(out["answers"]) != len(prompts):
                raise RuntimeError(f"LangGraph returned {len(out['answers'])} answers for {len(prompts)} branches")
            return took
        finally:
            conn.close()

    return run

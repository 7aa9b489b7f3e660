"""An agent node's loop, driven for real (inline executor, SQLite): tools, answers, limits, loops.

The model is a ``raysaga.testing.RecordingModel`` (every request it receives is recorded): the
tests check the exact conversation the model sees, which the driver rebuilds from the store
each turn (and again after a resume). Tools count their calls in module-level lists (the
inline executor runs them in this process).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
from pydantic import BaseModel

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.agents import Agent, LoopPolicy, text_reply, tool, tool_reply
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import EventRecord, NodeRecord, NodeStatus, RunRecord, SqlStore
from raysaga.testing import CrashAt, RecordingModel, SimulatedCrash
from tests.support.models import Recorded

#: The journal every RecordingModel of this module records into.
JOURNAL = "test_agent_loop"
#: Every request a RecordingModel received, in order: (the conversation's prompt, its messages).
SEEN = Recorded(JOURNAL, lambda r: (str(r.messages[0]["content"]), r.messages))
#: A RecordingModel that records into SEEN.
recording = functools.partial(RecordingModel, journal=JOURNAL)
#: Every call a tool actually ran with: (tool name, arguments).
CALLS: list[tuple[str, dict[str, Any]]] = []


@pytest.fixture(autouse=True)
def _fresh_records() -> None:
    SEEN.clear()
    CALLS.clear()


class Total(BaseModel):
    total: int


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    CALLS.append(("add", {"a": a, "b": b}))
    return a + b


@tool
def search(q: str) -> str:
    """Search the notes."""
    CALLS.append(("search", {"q": q}))
    return f"nothing about {q}"


def agent_workflow(agent: Agent) -> Workflow:
    wf = Workflow(f"loop-{agent.name}")

    @wf.agent(agent)
    def solve(input: str) -> str:
        return f"task: {input}"

    return wf


def drive(url: str, wf: Workflow, input: str = "x", *, faults: CrashAt | None = None,
          run_id: str | None = None) -> tuple[RunRecord, dict[str, NodeRecord], list[EventRecord]]:
    """Create (unless ``run_id``) and drive a run to rest; return it with its node rows and events."""
    if run_id is None:
        run_id = raysaga.create_run(wf, input, store=url).run_id
    store = SqlStore(url)
    try:
        final = Driver(wf, store, InlineExecutor(), run_id, faults=faults).drive()
        nodes = {n.node_id: n for n in store.nodes(run_id)}
        events = store.events(run_id)
    finally:
        store.close()
    return final, nodes, events


def model_nodes(nodes: dict[str, NodeRecord]) -> list[str]:
    return sorted(n for n in nodes if "@" in n and "." not in n.partition("@")[2])


def last_user(messages: list[dict[str, Any]]) -> Any:
    assert messages[-1]["role"] == "user"
    return messages[-1]["content"]


def tool_use_block(name: str, args: dict[str, Any], k: int = 0) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{k:02d}_{name}", "name": name, "input": args}


# ---------------------------------------------------------------------- the basic loop


def test_tool_loop_completes_with_validated_output_and_exact_messages(sqlite_url: str) -> None:
    model = recording(default=(tool_reply(("add", {"a": 2, "b": 3})), text_reply('The answer: {"total": 5}')))
    agent = Agent(name="calc", model=model, system="You add.", tools=(add,), output_type=Total)
    final, nodes, _ = drive(sqlite_url, agent_workflow(agent), "2+3")

    assert final.status == RunStatus.COMPLETED, final.error
    assert final.output == {"solve": {"total": 5}}  # validated against Total, as JSON
    assert nodes["solve"].status == NodeStatus.COMPLETED and nodes["solve"].output == {"total": 5}
    assert CALLS == [("add", {"a": 2, "b": 3})]
    # the conversation, exactly as the model saw it on each turn
    prompt = {"role": "user", "content": "task: 2+3"}
    assert [m for _, m in SEEN] == [
        [prompt],
        [prompt, {"role": "assistant", "content": [tool_use_block("add", {"a": 2, "b": 3})]},
         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_00_add", "content": "5",
                                       "is_error": False}]}],
    ]
    assert model_nodes(nodes) == ["solve@0", "solve@1"]


def test_parallel_tool_calls_in_one_turn_each_get_their_result(sqlite_url: str) -> None:
    model = recording(default=(tool_reply(("add", {"a": 1, "b": 1}), ("search", {"q": "sums"})),
                                    text_reply("done")))
    agent = Agent(name="two", model=model, tools=(add, search))
    final, _, _ = drive(sqlite_url, agent_workflow(agent))

    assert final.status == RunStatus.COMPLETED, final.error
    assert sorted(CALLS) == [("add", {"a": 1, "b": 1}), ("search", {"q": "sums"})]
    assert last_user(SEEN[1][1]) == [
        {"type": "tool_result", "tool_use_id": "toolu_00_add", "content": "2", "is_error": False},
        {"type": "tool_result", "tool_use_id": "toolu_01_search", "content": "nothing about sums",
         "is_error": False},
    ]


# ---------------------------------------------------------------------- the final answer


def test_invalid_final_answer_is_fed_back_until_it_validates(sqlite_url: str) -> None:
    model = recording(default=(text_reply("It is five."), text_reply('{"total": "many"}'),
                                    text_reply('```json\n{"total": 5}\n```')))
    agent = Agent(name="fix", model=model, output_type=Total, max_output_retries=2)
    final, _, events = drive(sqlite_url, agent_workflow(agent))

    assert final.status == RunStatus.COMPLETED, final.error
    assert final.output == {"solve": {"total": 5}}
    feedback = [e for e in events if e.kind == "agent_feedback"]
    assert [(e.node_id, e.data["turn"]) for e in feedback] == [("solve", 0), ("solve", 1)]
    assert "no JSON object" in feedback[0].data["problem"]
    assert "total" in feedback[1].data["problem"]
    # the model is told, in the next request's last user message, what was wrong
    assert len(SEEN) == 3
    first, second = last_user(SEEN[1][1]), last_user(SEEN[2][1])
    assert isinstance(first, str) and "must be only JSON" in first and "no JSON object" in first
    assert isinstance(second, str) and "must be only JSON" in second and "total" in second
    assert "Input should be a valid integer" in second  # the validation problem itself, not "Continue."


def test_invalid_output_fails_after_max_output_retries(sqlite_url: str) -> None:
    model = recording(default=(text_reply("no idea"),))
    agent = Agent(name="stubborn", model=model, output_type=Total, max_output_retries=2, max_turns=10)
    final, nodes, events = drive(sqlite_url, agent_workflow(agent))

    assert final.status == RunStatus.FAILED
    assert nodes["solve"].status == NodeStatus.FAILED
    assert nodes["solve"].error is not None
    assert nodes["solve"].error["type"] == "InvalidOutput"
    assert "3 tries" in nodes["solve"].error["message"]
    assert final.error is not None
    assert final.error["type"] == "InvalidOutput"
    assert len(SEEN) == 3  # the first answer + max_output_retries corrections, then no more calls
    assert sum(e.kind == "agent_feedback" for e in events) == 2


def test_max_turns_exceeded_fails_the_node(sqlite_url: str) -> None:
    # every turn asks for another (different) search: the agent never answers
    turns = [tool_reply(("search", {"q": f"topic {i}"})) for i in range(10)]
    agent = Agent(name="endless", model=recording(default=tuple(turns)), tools=(search,), max_turns=3)
    final, nodes, _ = drive(sqlite_url, agent_workflow(agent))

    assert final.status == RunStatus.FAILED
    assert nodes["solve"].error is not None
    assert nodes["solve"].error["type"] == "MaxTurns"
    assert final.error is not None
    assert final.error["type"] == "MaxTurns"
    assert len(SEEN) == 3 and len(CALLS) == 3
    assert model_nodes(nodes) == ["solve@0", "solve@1", "solve@2"]


# ---------------------------------------------------------------------- loop detection


def repeating_agent(then: str) -> Agent:
    same = tool_reply(("search", {"q": "the same thing"}))
    return Agent(name=f"parrot-{then}", model=recording(default=(same,)), tools=(search,), max_turns=20,
                 loop=LoopPolicy(window=6, repeats=3, then=then))


def check_warned_once() -> None:
    """Calls 1 and 2 ran; call 3 was answered with a warning (not run); call 4 stopped the node."""
    assert CALLS == [("search", {"q": "the same thing"})] * 2
    assert len(SEEN) == 4
    warning = last_user(SEEN[3][1])
    assert len(warning) == 1 and warning[0]["is_error"] is True
    assert warning[0]["content"].startswith("You are repeating search with the same arguments")
    for _, messages in SEEN[:3]:  # no earlier warning
        assert "You are repeating" not in str(messages)


def test_repeating_tool_calls_warn_once_then_fail(sqlite_url: str) -> None:
    final, nodes, _ = drive(sqlite_url, agent_workflow(repeating_agent("fail")))

    assert final.status == RunStatus.FAILED
    assert nodes["solve"].error is not None
    assert nodes["solve"].error["type"] == "LoopDetected"
    assert "search" in nodes["solve"].error["message"]
    check_warned_once()
    assert nodes["solve@2.0"].output["loop"] is True  # the warning is durable as the call's result


def test_repeating_tool_calls_warn_once_then_pause(sqlite_url: str) -> None:
    final, nodes, _ = drive(sqlite_url, agent_workflow(repeating_agent("pause")))

    assert final.status == RunStatus.PAUSED
    assert final.status_reason is not None and final.status_reason.startswith("loop")
    assert nodes["solve"].status == NodeStatus.RUNNING  # not failed: a human decides
    check_warned_once()  # and no model call was made after the pause was decided
    assert model_nodes(nodes) == ["solve@0", "solve@1", "solve@2", "solve@3"]


def test_same_tool_with_different_arguments_is_no_loop(sqlite_url: str) -> None:
    turns = [tool_reply(("search", {"q": f"angle {i}"})) for i in range(8)] + [text_reply("found it")]
    agent = Agent(name="explorer", model=recording(default=tuple(turns)), tools=(search,), max_turns=12,
                  loop=LoopPolicy(window=6, repeats=3, then="fail"))
    final, _, _ = drive(sqlite_url, agent_workflow(agent))

    assert final.status == RunStatus.COMPLETED, final.error
    assert final.output == {"solve": "found it"}
    assert len(CALLS) == 8
    assert not any("You are repeating" in str(m) for _, m in SEEN)


def test_repeats_spread_wider_than_the_window_are_no_loop(sqlite_url: str) -> None:
    # the same call 3 times, but never 3 times within the last 3 calls
    names = ["a", "b", "a", "c", "d", "a", "e"]
    turns = [tool_reply(("search", {"q": n})) for n in names] + [text_reply("ok")]
    agent = Agent(name="spread", model=recording(default=tuple(turns)), tools=(search,), max_turns=12,
                  loop=LoopPolicy(window=3, repeats=3, then="fail"))
    final, _, _ = drive(sqlite_url, agent_workflow(agent))
    assert final.status == RunStatus.COMPLETED, final.error
    assert len(CALLS) == len(names)


# ---------------------------------------------------------------------- rebuilt from the store


@pytest.mark.parametrize("speculative", [False, True], ids=["sent-tools", "speculative-tools"])
def test_resumed_driver_rebuilds_the_same_conversation(sqlite_url: str, speculative: bool) -> None:
    script = (tool_reply(("add", {"a": 1, "b": 2})), tool_reply(("search", {"q": "three"})), text_reply('{"total": 3}'))
    agent = Agent(name="resumable", model=recording(default=script), tools=(add, search), output_type=Total,
                  speculative_tools=speculative)
    wf = agent_workflow(agent)

    reference, _, _ = drive(sqlite_url, wf, "1+2")
    assert reference.status == RunStatus.COMPLETED, reference.error
    uninterrupted, calls = [m for _, m in SEEN], list(CALLS)
    SEEN.clear()
    CALLS.clear()

    # die right after turn 1's response is durable (its tool's result not yet), then resume
    run_id = raysaga.create_run(wf, "1+2", store=sqlite_url).run_id
    with pytest.raises(SimulatedCrash):  # a driver's death at that point, in-process so the test goes on
        drive(sqlite_url, wf, faults=CrashAt("after_commit", "solve@1"), run_id=run_id)
    # speculative: turn 1's call ran `search` with the response, but its result was not durable yet
    assert len(SEEN) == 2
    assert calls[:2 if speculative else 1] == CALLS
    final, _, _ = drive(sqlite_url, wf, run_id=run_id)

    assert final.status == RunStatus.COMPLETED, final.error
    assert final.output == reference.output
    assert [m for _, m in SEEN] == uninterrupted  # turn 1 was not asked again; turn 2 saw the same history
    # the lost speculative `search` ran again (a non-effect tool is at-least-once); nothing else did
    assert ([*calls, calls[1]] if speculative else calls) == CALLS


def test_recorder_sees_system_and_tool_definitions(sqlite_url: str) -> None:
    spy = recording(default=(text_reply("hi"),))
    agent = Agent(name="spy", model=spy, system="Be brief.", tools=(add,), max_tokens=77)
    final, _, _ = drive(sqlite_url, agent_workflow(agent))
    assert final.status == RunStatus.COMPLETED
    (request,) = [r.model_dump() for r in spy.requests]
    assert request["system"] == "Be brief." and request["max_tokens"] == 77 and request["model"] == "scripted"
    assert [t["name"] for t in request["tools"]] == ["add"]
    assert request["tools"][0]["input_schema"]["required"] == ["a", "b"]

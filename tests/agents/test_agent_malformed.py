"""Property tests: malformed model output never crashes the driver and never loops unbounded.

Hypothesis writes scripts of bad model turns (tool calls whose input is not an object, is
truncated JSON text, misses or mistypes fields, names no tool, is NaN or nested 10,000 deep;
final answers that are empty, cut off at max_tokens or not the declared JSON), followed by a
turn where the model recovers. Each example drives a real run (inline executor, one SQLite
file for the module) and checks: ``drive`` returns; the run ends completed (the model
recovered in time) or failed with a clear error type on the agent node; the model was asked at
most ``max_turns`` times; no tool ran on bad arguments; and the model was told, in its next
request, what was wrong. Deep values are drawn as a depth and built iteratively in the test,
so nothing on the test's side recurses either.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.agents import Agent, LoopPolicy, ModelResponse, Usage, text_reply, tool
from raysaga.agents.agent import EMPTY_REPLY
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import NodeStatus, RunRecord, SqlStore
from raysaga.state.jsoncodec import MAX_DEPTH
from raysaga.testing import RecordingModel
from tests.support.models import Recorded

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: The journal every RecordingModel of this module records into.
JOURNAL = "test_agent_malformed"
#: Requests the model received (messages), and the calls tools really ran, in this example.
SEEN = Recorded(JOURNAL, lambda r: r.messages)
CALLS: list[tuple[int, int]] = []


class Total(BaseModel):
    total: int


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    CALLS.append((a, b))
    return a + b


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SqlStore]:
    s = SqlStore(f"sqlite:///{tmp_path_factory.mktemp('malformed') / 'raysaga.db'}")
    yield s
    s.close()


def run_script(store: SqlStore, script: list[ModelResponse], **agent_options: Any) -> tuple[RunRecord, Any]:
    """Drive one run of an agent answering with ``script``; return the run and the agent node's row."""
    SEEN.clear()
    CALLS.clear()
    model = RecordingModel(journal=JOURNAL, default=tuple(script))
    agent = Agent(name="fragile", model=model, tools=(add,), **agent_options)
    wf = Workflow("malformed")

    @wf.agent(agent)
    def solve(input: str) -> str:
        return f"task: {input}"

    run_id = raysaga.create_run(wf, "add 1 and 2", store=store).run_id
    final = Driver(wf, store, InlineExecutor(), run_id).drive()  # must return, whatever the model said
    (node,) = [n for n in store.nodes(run_id) if n.node_id == "solve"]
    return final, node


# ---------------------------------------------------------------------- building bad turns


def nested(depth: int, kind: str) -> Any:
    """A value ``depth`` containers deep, built without recursion."""
    value: Any = 0
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


def response(*blocks: dict[str, Any], stop_reason: str | None = "tool_use") -> ModelResponse:
    return ModelResponse(content=list(blocks), stop_reason=stop_reason, usage=Usage(input_tokens=5, output_tokens=5),
                         model="scripted")


def use(name: Any, args: Any, k: int = 0) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_bad_{k}", "name": name, "input": args}


json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) \
    | st.text(max_size=12)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)
not_an_int = (st.text(alphabet="xyz -", min_size=1, max_size=6) | st.lists(st.integers(), max_size=2)
              | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
              | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not f.is_integer()))
TRUNCATED = '{"a": 1, "b": 2}'


@dataclass(frozen=True)
class BadCall:
    """A malformed tool call, and the words the model must be answered with."""

    kind: str
    name: Any
    args: Any = None
    depth: int = 0

    def block(self, k: int) -> dict[str, Any]:
        args = nested(self.depth, self.args) if self.kind == "deep" else self.args
        if self.kind == "deep-field":
            args = {"a": nested(self.depth, "list"), "b": 1}
        return use(self.name, args, k)

    @property
    def expect(self) -> str:
        return {"not-object": "must be a JSON object", "truncated": "must be a JSON object",
                "missing-field": "Field required", "wrong-type": "invalid arguments for add",
                "unknown-tool": "there is no tool named", "deep": f"nested deeper than {MAX_DEPTH} levels",
                "deep-field": f"nested deeper than {MAX_DEPTH} levels", "nan": "NaN"}[self.kind]


bad_calls = st.one_of(
    json_values.filter(lambda v: not isinstance(v, dict)).map(lambda v: BadCall("not-object", "add", v)),
    st.integers(1, len(TRUNCATED) - 1).map(lambda n: BadCall("truncated", "add", TRUNCATED[:n])),
    st.dictionaries(st.text(max_size=4).filter(lambda key: key not in ("a", "b")), json_values, max_size=3)
    .map(lambda d: BadCall("missing-field", "add", d)),
    st.tuples(not_an_int, st.booleans()).map(
        lambda t: BadCall("wrong-type", "add", {"a": t[0], "b": 2} if t[1] else {"a": 1, "b": t[0]})),
    st.text(max_size=20).filter(lambda n: n != "add").map(lambda n: BadCall("unknown-tool", n, {"a": 1, "b": 2})),
    st.builds(BadCall, kind=st.just("deep"), name=st.just("add"), args=st.sampled_from(["list", "dict"]),
              depth=st.sampled_from([MAX_DEPTH + 1, 1000, 10_000])),
    st.sampled_from([MAX_DEPTH + 1, 10_000]).map(lambda d: BadCall("deep-field", "add", depth=d)),
    st.sampled_from([math.nan, math.inf, -math.inf]).map(lambda f: BadCall("nan", "add", {"a": f, "b": 1})),
)
# one bad turn: 1-2 bad calls, sometimes cut off (stop_reason max_tokens, as a truncated call is)
bad_turns = st.tuples(st.lists(bad_calls, min_size=1, max_size=2), st.sampled_from(["tool_use", "max_tokens"]))

RECOVERY = [response(use("add", {"a": 1, "b": 2})), text_reply('{"total": 3}')]


# ---------------------------------------------------------------------- properties


@SETTINGS
@given(turns=st.lists(bad_turns, min_size=1, max_size=3), max_turns=st.integers(1, 6))
def test_malformed_tool_calls_are_answered_and_the_run_ends_clearly(
        store: SqlStore, turns: list[tuple[list[BadCall], str]], max_turns: int) -> None:
    script = [response(*(c.block(k) for k, c in enumerate(calls)), stop_reason=stop) for calls, stop in turns]
    script += RECOVERY
    final, node = run_script(store, script, output_type=Total, max_turns=max_turns,
                             loop=LoopPolicy(window=10, repeats=10))  # loops are another test's matter

    needed = len(script)
    assert len(SEEN) == min(needed, max_turns)  # bounded: never more requests than max_turns
    if needed <= max_turns:
        assert final.status == RunStatus.COMPLETED, final.error
        assert final.output == {"solve": {"total": 3}}
        assert CALLS == [(1, 2)]
    else:
        assert final.status == RunStatus.FAILED
        assert node.status == NodeStatus.FAILED and node.error["type"] == "MaxTurns"
        assert CALLS in ([], [(1, 2)])  # the tool never ran on the bad input
    # every bad call the model was answered about: an error result naming the problem
    for t, (calls, _) in enumerate(turns):
        if t + 1 >= len(SEEN):
            break
        results = SEEN[t + 1][-1]["content"]
        assert [r["tool_use_id"] for r in results] == [f"toolu_bad_{k}" for k in range(len(calls))]
        for call, result in zip(calls, results, strict=True):
            assert result["is_error"] is True
            assert call.expect in result["content"], (call.kind, result["content"])


class BadAnswer:
    EMPTY = "empty"
    BLOCKS_ONLY = "no-text"
    CUT_OFF = "max_tokens"
    NOT_JSON = "not-json"
    WRONG_SCHEMA = "wrong-schema"


bad_answers = st.one_of(
    st.sampled_from(["end_turn", None, "tool_use", "stop_sequence"]).map(
        lambda s: (BadAnswer.EMPTY, response(stop_reason=s))),
    st.sampled_from([{"type": "thinking", "thinking": "hmm"}, {"type": "image"}, {"no": "type"}]).map(
        lambda b: (BadAnswer.BLOCKS_ONLY, response(b, stop_reason="end_turn"))),
    st.text(max_size=30).map(
        lambda t: (BadAnswer.CUT_OFF, response({"type": "text", "text": '{"total": 3' + t}, stop_reason="max_tokens"))),
    st.text(alphabet="abc xyz.!", min_size=1, max_size=30).filter(str.strip)
    .map(lambda t: (BadAnswer.NOT_JSON, text_reply(t))),
    st.one_of(not_an_int.map(lambda v: {"total": v}),
              st.dictionaries(st.sampled_from(["sum", "Total"]), st.integers(), min_size=1))
    .map(lambda d: (BadAnswer.WRONG_SCHEMA, text_reply(json.dumps(d)))),
)
FEEDBACK = {BadAnswer.EMPTY: "empty", BadAnswer.BLOCKS_ONLY: "empty", BadAnswer.CUT_OFF: "cut off (max_tokens)",
            BadAnswer.NOT_JSON: "must be only JSON", BadAnswer.WRONG_SCHEMA: "must be only JSON"}


@SETTINGS
@given(answers=st.lists(bad_answers, min_size=1, max_size=4), max_turns=st.integers(1, 6),
       retries=st.integers(0, 3))
def test_malformed_final_answers_are_fed_back_a_bounded_number_of_times(
        store: SqlStore, answers: list[tuple[str, ModelResponse]], max_turns: int, retries: int) -> None:
    script = [r for _, r in answers] + [text_reply('{"total": 3}')]
    final, node = run_script(store, script, output_type=Total, max_turns=max_turns, max_output_retries=retries)

    # the oracle: walk the script as the loop should
    expected, asked = "completed", 0
    for t in range(len(script)):
        if t >= max_turns:
            expected = "MaxTurns"
            break
        asked += 1
        if t < len(answers) and t + 1 > retries:
            expected = "InvalidOutput"
            break
    assert len(SEEN) == asked <= max_turns
    if expected == "completed":
        assert final.status == RunStatus.COMPLETED, final.error
        assert final.output == {"solve": {"total": 3}}
    else:
        assert final.status == RunStatus.FAILED
        assert node.status == NodeStatus.FAILED and node.error["type"] == expected
    for t in range(1, len(SEEN)):  # each correction names what was wrong with the answer before
        problem = SEEN[t][-1]["content"]
        assert isinstance(problem, str) and FEEDBACK[answers[t - 1][0]] in problem, problem


anything_at_all = st.one_of(
    bad_turns.map(lambda t: response(*(c.block(k) for k, c in enumerate(t[0])), stop_reason=t[1])),
    bad_answers.map(lambda a: a[1]),
    st.just(response(use("add", {"a": 1, "b": 2}), use("add", {"a": 1, "b": 2}, 1))),  # fine, and repeated
)


@SETTINGS
@given(script=st.lists(anything_at_all, max_size=6), max_turns=st.integers(1, 8), retries=st.integers(0, 2),
       then=st.sampled_from(["fail", "pause"]))
def test_any_mix_of_malformed_turns_ends_in_a_clear_state(
        store: SqlStore, script: list[ModelResponse], max_turns: int, retries: int, then: str) -> None:
    final, node = run_script(store, [*script, *RECOVERY], output_type=Total, max_turns=max_turns,
                             max_output_retries=retries, loop=LoopPolicy(window=6, repeats=3, then=then))

    assert 1 <= len(SEEN) <= max_turns
    assert set(CALLS) <= {(1, 2)}  # tools only ever ran on valid arguments
    if final.status == RunStatus.COMPLETED:
        assert final.output == {"solve": {"total": 3}}
    elif final.status == RunStatus.PAUSED:
        assert then == "pause" and final.status_reason is not None and final.status_reason.startswith("loop")
    else:
        assert final.status == RunStatus.FAILED, final.status
        assert node.status == NodeStatus.FAILED
        assert node.error["type"] in {"MaxTurns", "InvalidOutput", "LoopDetected"}, node.error
        assert final.error is not None
        assert node.error is not None
        assert final.error["type"] == node.error["type"]
    for messages in SEEN[1:]:  # every tool_use the model made was answered, in order
        assistant, answer = messages[-2]["content"], messages[-1]["content"]
        uses = [b["id"] for b in assistant if b.get("type") == "tool_use"]
        if uses:
            assert [r["tool_use_id"] for r in answer] == uses
        else:
            assert isinstance(answer, str) and answer


# ---------------------------------------------------------------------- single cases worth naming


def test_ten_thousand_deep_tool_input_is_refused_by_name(store: SqlStore) -> None:
    script = [response(use("add", nested(10_000, "list"))), *RECOVERY]
    final, _ = run_script(store, script, output_type=Total)
    assert final.status == RunStatus.COMPLETED, final.error
    (result,) = SEEN[1][-1]["content"]
    assert result["is_error"] is True
    assert result["content"].startswith("your input for add was not valid JSON")
    assert f"nested deeper than {MAX_DEPTH} levels" in result["content"]
    assert len(result["content"]) < 500
    # what was persisted is the marker, not the 10,000-deep value
    assert SEEN[1][1]["content"][0]["input"] == {"$raysaga_invalid_input": result["content"].split(": ", 1)[1]}


def test_deep_value_outside_a_tool_input_fails_the_node_clearly(store: SqlStore) -> None:
    """Not a tool input (which is answered): nothing to tell the model, so the node fails
    permanently, at once (no transport retries), with an error that says why."""
    deep_text = response({"type": "text", "text": "hi", "citations": nested(10_000, "list")}, stop_reason="end_turn")
    final, node = run_script(store, [deep_text, text_reply('{"total": 3}')], output_type=Total)
    assert final.status == RunStatus.FAILED
    assert node.error["type"] == "ModelCallFailed"  # the model answered: it is not unavailable
    assert "depth" in node.error["message"]
    assert len(SEEN) == 1


def test_stop_reason_max_tokens_with_no_content_is_fed_back(store: SqlStore) -> None:
    final, _ = run_script(store, [response(stop_reason="max_tokens"), text_reply('{"total": 3}')], output_type=Total)
    assert final.status == RunStatus.COMPLETED
    assert "cut off (max_tokens)" in SEEN[1][-1]["content"]
    # a placeholder, not an empty text block: the Messages API refuses that with a 400
    assert SEEN[1][1] == {"role": "assistant", "content": [{"type": "text", "text": EMPTY_REPLY}]}

"""Shared memory between agents: a per-run blackboard written by compare-and-set.

Two agents fanned out over a plan race to append to one key: exactly one write wins, the
other agent is told of the conflict as an ``is_error`` tool result, reads again, merges, and
writes over the new version. The store's ``memory_cas`` is also tested directly: a resumed
driver re-issuing its own write succeeds (same writer key), and a stale lease cannot write.
Runs use the inline executor on SQLite and PostgreSQL (``store_url``).
"""

from __future__ import annotations

import copy
import json
import uuid
from dataclasses import dataclass
from typing import Any

import pytest

import raysaga
from raysaga import LeaseLostError, RunStatus, Workflow
from raysaga.agents import Agent, ModelRequest, ModelResponse, Usage, text_reply, tool_reply
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import RunRecord, SqlStore
from raysaga.testing import CrashAt, RecordingModel, SimulatedCrash

#: Requests each agent's model received, by the agent's note.
SEEN: dict[str, list[list[dict[str, Any]]]] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    SEEN.clear()


@dataclass(frozen=True)
class BlackboardModel:
    """A model that appends its note to the shared list ``notes``: read, then write what it read
    plus its note at the version it read; on a conflict read again. Deterministic, but it reacts
    to what it is told, as a real model would (a fixed script could not know who wins)."""

    name: str = "blackboard"

    def complete(self, request: ModelRequest) -> ModelResponse:
        messages = request.messages
        note = str(messages[0]["content"]).removeprefix("note: ")
        SEEN.setdefault(note, []).append(copy.deepcopy(messages))
        if len(messages) == 1:
            return tool_reply(("memory_read", {"key": "notes"}))
        call, result = messages[-2]["content"][0], messages[-1]["content"][0]
        if call["name"] == "memory_read":
            seen = json.loads(result["content"])
            return tool_reply(("memory_write", {"key": "notes", "value": [*(seen["value"] or []), note],
                                                "expected_version": seen["version"]}))
        if result["is_error"]:
            return tool_reply(("memory_read", {"key": "notes"}))
        return text_reply(f"filed {note}")

    def cost(self, usage: Usage) -> float:
        return 0.0


def fanout_workflow(model: Any) -> Workflow:
    agent = Agent(name="scribe", model=model, shared_memory=True, max_turns=8)
    wf = Workflow("memory-fanout")

    @wf.step()
    def plan(input: list[str]) -> list[str]:
        return input

    @wf.agent(agent, map_over="plan")
    def scribe(plan: str) -> str:
        return f"note: {plan}"

    return wf


def drive(url: str, wf: Workflow, run_id: str, faults: CrashAt | None = None) -> RunRecord:
    store = SqlStore(url)
    try:
        return Driver(wf, store, InlineExecutor(), run_id, faults=faults).drive()
    finally:
        store.close()


def tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    content = messages[-1]["content"]
    assert isinstance(content, list)
    return content


def test_parallel_agents_conflict_once_then_merge(store_url: str) -> None:
    wf = fanout_workflow(BlackboardModel())
    run_id = raysaga.create_run(wf, ["alpha", "beta"], store=store_url).run_id
    final = drive(store_url, wf, run_id)

    assert final.status == RunStatus.COMPLETED, final.error
    assert final.output == {"scribe": ["filed alpha", "filed beta"]}
    # both read the key while it was absent (version 0) ...
    for note in ("alpha", "beta"):
        first_read = json.loads(tool_results(SEEN[note][1])[0]["content"])
        assert first_read == {"key": "notes", "value": None, "version": 0}
    # ... and both wrote with expected_version=0: exactly one won
    outcomes = {note: tool_results(SEEN[note][2])[0] for note in ("alpha", "beta")}
    winners = [n for n, r in outcomes.items() if not r["is_error"]]
    losers = [n for n, r in outcomes.items() if r["is_error"]]
    assert len(winners) == 1 and len(losers) == 1
    (winner,), (loser,) = winners, losers
    assert json.loads(outcomes[winner]["content"]) == {"ok": True, "key": "notes", "version": 1}
    conflict = outcomes[loser]["content"]
    assert "conflict" in conflict and "version 1" in conflict and "expected_version=1" in conflict
    # the loser read again, saw the winner's note, and wrote over version 1
    assert len(SEEN[winner]) == 3 and len(SEEN[loser]) == 5
    reread = json.loads(tool_results(SEEN[loser][3])[0]["content"])
    assert reread == {"key": "notes", "value": [winner], "version": 1}
    assert json.loads(tool_results(SEEN[loser][4])[0]["content"]) == {"ok": True, "key": "notes", "version": 2}

    store = SqlStore(store_url)
    try:
        entry = store.memory_get(run_id, "notes")
        rows = store.nodes(run_id)
    finally:
        store.close()
    assert (entry.value, entry.version) == ([winner, loser], 2)  # both contributions, nothing lost
    # every answer the models saw is durable (a resume replays it), the conflict included
    tool_rows = [n for n in rows if "." in n.node_id.partition("@")[2]]
    assert len(tool_rows) == 2 + 4 and all(n.status == "completed" for n in tool_rows)
    assert {n.node_id for n in rows if n.fan_index >= 0 and "@" not in n.node_id} == {"scribe"}
    assert all(n.status == "completed" for n in rows if n.node_id == "scribe")
    conflict_rows = [n for n in rows if isinstance(n.output, dict) and n.output.get("conflict")]
    assert len(conflict_rows) == 1 and conflict_rows[0].fan_index == ["alpha", "beta"].index(loser)


def test_memory_is_per_run(store_url: str) -> None:
    wf = fanout_workflow(BlackboardModel())
    first = raysaga.create_run(wf, ["one"], store=store_url).run_id
    second = raysaga.create_run(wf, ["two"], store=store_url).run_id
    assert drive(store_url, wf, first).status == RunStatus.COMPLETED
    assert drive(store_url, wf, second).status == RunStatus.COMPLETED
    store = SqlStore(store_url)
    try:
        assert store.memory_get(first, "notes").value == ["one"]
        assert store.memory_get(second, "notes").value == ["two"]
    finally:
        store.close()


# ---------------------------------------------------------------------- a resumed write


def test_resumed_driver_reissuing_its_write_gets_success_not_conflict(store_url: str) -> None:
    wf = fanout_workflow(BlackboardModel())
    run_id = raysaga.create_run(wf, ["solo"], store=store_url).run_id
    # the write is in the store; its result (the tool call's row) is not yet durable
    with pytest.raises(SimulatedCrash):  # the driver's death at that point, in-process
        drive(store_url, wf, run_id, faults=CrashAt("before_commit", "scribe@1.0[0]"))
    store = SqlStore(store_url)
    try:
        assert store.memory_get(run_id, "notes").version == 1
        assert "scribe@1.0" not in {n.node_id for n in store.nodes(run_id)}
    finally:
        store.close()
    SEEN.clear()

    final = drive(store_url, wf, run_id)
    assert final.status == RunStatus.COMPLETED, final.error
    (after,) = SEEN["solo"]  # only turn 2 was asked: the write's outcome came from the store
    assert json.loads(tool_results(after)[0]["content"]) == {"ok": True, "key": "notes", "version": 1}
    store = SqlStore(store_url)
    try:
        entry = store.memory_get(run_id, "notes")
    finally:
        store.close()
    assert (entry.value, entry.version) == (["solo"], 1)  # written once


# ---------------------------------------------------------------------- store.memory_cas


@pytest.fixture
def leased(store_url: str) -> Any:
    wf = Workflow("memory-unit")

    @wf.step()
    def noop(input: int) -> int:
        return input

    store = SqlStore(store_url)
    run_id = raysaga.create_run(wf, 1, store=store).run_id
    yield store, run_id, store.claim(run_id, "driver-a", 30.0)
    store.close()


def test_memory_cas_creates_then_refuses_a_stale_version(leased: Any) -> None:
    store, run_id, lease = leased
    assert store.memory_get(run_id, "k").model_dump() == {"key": "k", "value": None, "version": 0, "writer": None}
    created = store.memory_cas(lease, "k", {"n": 1}, 0, "w1")
    assert (created.value, created.version, created.writer) == ({"n": 1}, 1, "w1")
    stale = store.memory_cas(lease, "k", {"n": 99}, 0, "w2")
    assert (stale.value, stale.version, stale.writer) == ({"n": 1}, 1, "w1")  # the entry that won
    updated = store.memory_cas(lease, "k", {"n": 2}, 1, "w2")
    assert (updated.version, updated.writer) == (2, "w2")
    assert store.memory_get(run_id, "k").value == {"n": 2}
    # a new key written with a non-zero expected version is refused too
    absent = store.memory_cas(lease, "other", 1, 3, "w3")
    assert (absent.version, absent.writer) == (0, None)
    assert store.memory_get(run_id, "other").version == 0


def test_memory_cas_reissued_by_the_same_writer_is_a_success(leased: Any) -> None:
    store, run_id, lease = leased
    first = store.memory_cas(lease, "k", ["a"], 0, "writer-key-1")
    again = store.memory_cas(lease, "k", ["a"], 0, "writer-key-1")  # a resumed driver's re-issue
    assert (again.version, again.writer, again.value) == (1, "writer-key-1", ["a"]) == \
        (first.version, first.writer, first.value)
    assert store.memory_get(run_id, "k").version == 1  # applied once
    # after another writer moved on, the first write's re-issue is told the truth: it is not the latest
    store.memory_cas(lease, "k", ["a", "b"], 1, "writer-key-2")
    other = store.memory_cas(lease, "k", ["a"], 0, "writer-key-3")
    assert (other.version, other.writer) == (2, "writer-key-2")


def test_memory_cas_with_a_stale_fence_raises_lease_lost(leased: Any) -> None:
    store, run_id, lease = leased
    store.memory_cas(lease, "k", "before", 0, "w1")
    store.release(lease)
    newer = store.claim(run_id, "driver-b", 30.0)  # another driver took the run: a higher fence
    assert newer.fence > lease.fence
    with pytest.raises(LeaseLostError):
        store.memory_cas(lease, "k", "from a zombie", 1, "w-zombie")
    assert store.memory_get(run_id, "k").value == "before"
    assert store.memory_cas(newer, "k", "after", 1, "w2").version == 2


def test_memory_cas_after_the_lease_expired_and_was_taken_raises(leased: Any) -> None:
    store, run_id, _ = leased
    store.release(_)
    expired = store.claim(run_id, "slow-driver", -1.0)  # a lease already past its expiry
    taker = store.claim(run_id, "driver-c", 30.0)
    with pytest.raises(LeaseLostError):
        store.memory_cas(expired, "k", 1, 0, f"w-{uuid.uuid4().hex}")
    assert store.memory_get(run_id, "k").version == 0
    assert store.memory_cas(taker, "k", 1, 0, "w").version == 1


# ---------------------------------------------------------------------- malformed memory calls


@pytest.mark.parametrize(("call", "problem"), [
    (("memory_read", {}), "needs a string 'key'"),
    (("memory_read", {"key": 7}), "needs a string 'key'"),
    (("memory_write", {"key": "k", "value": 1}), "integer 'expected_version'"),
    (("memory_write", {"key": "k", "value": 1, "expected_version": "0"}), "integer 'expected_version'"),
    (("memory_write", ["k", 1, 0]), "needs a string 'key'"),
])
def test_malformed_memory_calls_are_answered_with_the_problem(sqlite_url: str, call: Any, problem: str) -> None:
    spy = RecordingModel(default=(tool_reply(call), text_reply("ok")))
    agent = Agent(name="sloppy", model=spy, shared_memory=True)
    wf = Workflow("memory-malformed")

    @wf.agent(agent)
    def solo(input: str) -> str:
        return input

    run_id = raysaga.create_run(wf, "go", store=sqlite_url).run_id
    assert drive(sqlite_url, wf, run_id).status == RunStatus.COMPLETED
    (result,) = tool_results(spy.requests[1].messages)
    assert result["is_error"] is True and problem in result["content"]
    store = SqlStore(sqlite_url)
    try:
        assert store.memory_get(run_id, "k").version == 0
    finally:
        store.close()

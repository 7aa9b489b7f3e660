"""Shared memory's malformed and oversized values, and the retry of a failed agent (review, stop 46).

A ``memory_write`` without ``value`` was run anyway and overwrote the key with null (the model
told ok); ``expected_version: true`` passed the integer check (the model told "not True"). Both
are refused now, as other malformed calls are, and nothing is written.

A value longer than the agent's ``max_tool_result_chars`` came back from ``memory_read`` cut
mid-JSON, so a read-merge-write lost the tail without a conflict. A write whose read would not
fit is refused (split it over keys); a read of a value too long for the reader (an agent shown
more wrote it) is an error saying so, never a cut value.

``raysaga retry`` of a run whose agent failed on what its stored turns decide (MaxTurns,
LoopDetected...) reopened it and failed it again at once, with no model call. It is refused
before anything changes, naming ``raysaga fork``; a definition that decides otherwise (a larger
``max_turns`` under ``--allow-changed``) goes on.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Client, RunOptions, Workflow
from raysaga.agents import Agent, LoopPolicy, tool
from raysaga.errors import UserError
from raysaga.state import RunRecord, RunStatus, SqlStore
from raysaga.testing import RecordingModel, ScriptedModel, text_reply, tool_reply
from tests.support.cli import invoke, project_folder


def _results(model: RecordingModel, conversation: str, turn: int) -> list[dict[str, Any]]:
    """The tool results turn ``turn`` of ``conversation`` was shown (those of the turn before)."""
    content = model.conversations()[conversation][turn].messages[-1]["content"]
    assert isinstance(content, list)
    return content


def _memory(url: str, run_id: str, key: str) -> tuple[int, Any]:
    store = SqlStore(url)
    try:
        entry = store.memory_get(run_id, key)
        return entry.version, entry.value
    finally:
        store.close()


def _two_agents(writer: Agent, reader: Agent, name: str) -> Workflow:
    wf = Workflow(name)

    @wf.agent(writer)
    def first(input: str) -> str:
        return "first"

    @wf.agent(reader, after=["first"])
    def second(input: str) -> str:
        return "second"

    return wf


# ---------------------------------------------------------------------- malformed writes


@pytest.mark.parametrize(("call", "problem"), [
    ({"key": "notes", "expected_version": 1}, "a 'value'"),
    ({"key": "notes", "value": ["mine"], "expected_version": True}, "integer 'expected_version' >= 0"),
    ({"key": "notes", "value": ["mine"], "expected_version": -1}, "integer 'expected_version' >= 0"),
    ({"key": "notes", "expected_version": "1"}, "integer 'expected_version' >= 0"),
])
def test_a_malformed_write_over_a_key_is_refused_and_leaves_it(sqlite_url: str, call: dict[str, Any],
                                                             problem: str) -> None:
    seed = [tool_reply(("memory_write", {"key": "notes", "value": ["precious"], "expected_version": 0})),
            text_reply("seeded")]
    sloppy = [tool_reply(("memory_read", {"key": "notes"})), tool_reply(("memory_write", call)), text_reply("done")]
    model = RecordingModel({"first": seed, "second": sloppy})
    agent = Agent(name="m", model=model, shared_memory=True)
    wf = _two_agents(agent, agent, "stop46-malformed-write")

    run_id = raysaga.create_run(wf, "go", store=sqlite_url).run_id
    assert raysaga.resume(wf, run_id, store=sqlite_url, executor="inline").status == RunStatus.COMPLETED
    (result,) = _results(model, "second", 2)
    assert result["is_error"] is True, result
    assert problem in result["content"] and "nothing was written" in result["content"]
    assert _memory(sqlite_url, run_id, "notes") == (1, ["precious"])


def test_an_explicit_null_value_is_still_written(sqlite_url: str) -> None:
    model = RecordingModel(default=(tool_reply(("memory_write", {"key": "k", "value": None, "expected_version": 0})),
                                    text_reply("ok")))
    wf = Workflow("stop46-null-value")

    @wf.agent(Agent(name="m", model=model, shared_memory=True))
    def solo(input: str) -> str:
        return input

    run_id = raysaga.create_run(wf, "go", store=sqlite_url).run_id
    assert raysaga.resume(wf, run_id, store=sqlite_url, executor="inline").status == RunStatus.COMPLETED
    (result,) = _results(model, "go", 1)
    assert result["is_error"] is False and json.loads(result["content"])["version"] == 1
    assert _memory(sqlite_url, run_id, "k") == (1, None)


# ---------------------------------------------------------------------- values too long to read


CAP = 400


def _fitting(key: str, version: int, cap: int) -> list[str]:
    """A list whose memory_read at ``version`` is exactly ``cap`` characters."""
    bare = len(json.dumps({"key": key, "value": ["a", ""], "version": version}))
    value = ["a", "x" * (cap - bare)]
    assert len(json.dumps({"key": key, "value": value, "version": version})) == cap
    return value


def test_a_write_too_long_to_read_back_is_refused_and_one_that_fits_is_read_whole(sqlite_url: str) -> None:
    fits = _fitting("doc", 1, CAP)
    too_long = [*fits[:-1], fits[-1] + "x"]
    writes = [tool_reply(("memory_write", {"key": "doc", "value": too_long, "expected_version": 0})),
              tool_reply(("memory_write", {"key": "doc", "value": fits, "expected_version": 0})),
              text_reply("wrote")]
    reads = [tool_reply(("memory_read", {"key": "doc"})), text_reply("read")]
    model = RecordingModel({"first": writes, "second": reads})
    agent = Agent(name="m", model=model, shared_memory=True, max_tool_result_chars=CAP)
    wf = _two_agents(agent, agent, "stop46-write-cap")

    run_id = raysaga.create_run(wf, "go", store=sqlite_url).run_id
    assert raysaga.resume(wf, run_id, store=sqlite_url, executor="inline").status == RunStatus.COMPLETED
    (refused,) = _results(model, "first", 1)
    assert refused["is_error"] is True and "Split the value over several keys" in refused["content"]
    assert f"{CAP + 1:,} characters" in refused["content"]
    (written,) = _results(model, "first", 2)
    assert written["is_error"] is False and json.loads(written["content"])["version"] == 1
    (read,) = _results(model, "second", 1)  # exactly the cap: shown whole, and it parses
    assert read["is_error"] is False and json.loads(read["content"])["value"] == fits
    assert _memory(sqlite_url, run_id, "doc") == (1, fits)


def test_a_value_too_long_for_the_reader_is_an_error_never_a_cut_value(sqlite_url: str) -> None:
    big = [f"item-{i:05d}" for i in range(200)]  # ~3,000 characters
    writes = [tool_reply(("memory_write", {"key": "doc", "value": big, "expected_version": 0})), text_reply("wrote")]
    reads = [tool_reply(("memory_read", {"key": "doc"})), text_reply("read")]
    model = RecordingModel({"first": writes, "second": reads})
    wf = _two_agents(Agent(name="wide", model=model, shared_memory=True, max_tool_result_chars=None),
                     Agent(name="narrow", model=model, shared_memory=True, max_tool_result_chars=CAP),
                     "stop46-read-cap")

    run_id = raysaga.create_run(wf, "go", store=sqlite_url).run_id
    assert raysaga.resume(wf, run_id, store=sqlite_url, executor="inline").status == RunStatus.COMPLETED
    (read,) = _results(model, "second", 1)
    assert read["is_error"] is True, read
    assert "is not shown" in read["content"] and "max_tool_result_chars" in read["content"]
    assert "[raysaga: this result was cut" not in read["content"] and "item-00000" not in read["content"]
    assert _memory(sqlite_url, run_id, "doc") == (1, big)


# ---------------------------------------------------------------------- retry of a failed agent


@tool
def poll(job: str) -> str:
    """Poll a job."""
    return "pending"


def _polling(name: str, agent: Agent) -> Workflow:
    wf = Workflow(name)

    @wf.agent(agent)
    def watch(input: str) -> str:
        return "watch"

    return wf


def _fails_max_turns(max_turns: int) -> Workflow:
    """Polls three different jobs, then answers: over two turns it fails ``MaxTurns``."""
    model = ScriptedModel({"watch": [*(tool_reply(("poll", {"job": f"j{i}"})) for i in range(3)), text_reply("done")]})
    return _polling("stop46-max-turns", Agent(name="poller", model=model, tools=(poll,), max_turns=max_turns))


def test_retry_of_an_agent_over_its_max_turns_is_refused_and_a_larger_max_turns_goes_on(sqlite_url: str) -> None:
    wf = _fails_max_turns(2)
    run_id = raysaga.create_run(wf, "go", store=sqlite_url).run_id
    failed = raysaga.resume(wf, run_id, store=sqlite_url, executor="inline")
    assert failed.status == RunStatus.FAILED and failed.error is not None and failed.error.type == "MaxTurns"
    store = SqlStore(sqlite_url)
    try:
        before = (sorted((n.node_id, n.status.value, n.attempt) for n in store.nodes(run_id)),
                  store.get_run(run_id).version)
        retries: list[Callable[[], RunRecord]] = [
            lambda: raysaga.retry(wf, run_id, store=sqlite_url, executor="inline"),
            lambda: raysaga.retry(wf, run_id, store=sqlite_url, executor="inline",
                                  options=RunOptions(allow_changed=True)),
            lambda: Client(sqlite_url).retry(run_id),  # no code to judge with: by the kind
        ]
        for retry in retries:
            with pytest.raises(UserError) as refused:
                retry()
            message = str(refused.value)
            assert "MaxTurns" in message and f"raysaga fork {run_id} --from watch@T" in message, message
            assert "max_turns" in message
        # nothing was reopened
        assert (sorted((n.node_id, n.status.value, n.attempt) for n in store.nodes(run_id)),
                store.get_run(run_id).version) == before
    finally:
        store.close()

    # a larger max_turns decides the stored turns otherwise: the retry goes on and asks the model
    done = raysaga.retry(_fails_max_turns(5), run_id, store=sqlite_url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"watch": "done"}


FLOW = """
from raysaga import Workflow
from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply

@tool
def poll(job: str) -> str:
    \"\"\"Poll a job.\"\"\"
    return "pending"

model = ScriptedModel(default=(tool_reply(("poll", {"job": "j1"})), tool_reply(("poll", {"job": "j2"})),
                               text_reply("done")))
wf = Workflow("stop46-cli-max-turns")

@wf.agent(Agent(name="poller", model=model, tools=(poll,), max_turns=MAX_TURNS))
def watch(input: str) -> str:
    return "watch"
"""


def test_cli_retry_of_an_agent_over_its_max_turns_is_refused_then_goes_on_with_more_turns(
        sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = project_folder(tmp_path, monkeypatch, "stop46flow", FLOW.replace("MAX_TURNS", "1"))
    code, out, err = invoke("run", "stop46flow:wf", "--db", sqlite_url, "--executor", "inline", "--json",
                            "--run-id", "mt-1", "--input", "\"go\"")
    assert code == 1, (out, err)
    code, _, err = invoke("retry", "mt-1", "--db", sqlite_url, "--executor", "inline")
    assert code == 2 and "MaxTurns" in err and "raysaga fork mt-1 --from watch@T" in err, err
    # another length: a rewrite within the same second is not taken for the cached bytecode
    (folder / "stop46flow.py").write_text(FLOW.replace("MAX_TURNS", "10"))
    sys.modules.pop("stop46flow", None)
    code, out, err = invoke("retry", "mt-1", "--db", sqlite_url, "--executor", "inline", "--json")
    assert code == 0, (out, err)
    assert json.loads(out)["status"] == "completed"


def test_retry_of_a_looping_agent_is_refused(sqlite_url: str) -> None:
    model = ScriptedModel(default=(tool_reply(("poll", {"job": "j1"})),))
    wf = _polling("stop46-loop", Agent(name="poller", model=model, tools=(poll,), loop=LoopPolicy(window=4)))
    run_id = raysaga.create_run(wf, "go", store=sqlite_url).run_id
    failed = raysaga.resume(wf, run_id, store=sqlite_url, executor="inline")
    assert failed.error is not None and failed.error.type == "LoopDetected"
    with pytest.raises(UserError, match=r"LoopDetected.*raysaga fork .*--from watch@T.*LoopPolicy"):
        raysaga.retry(wf, run_id, store=sqlite_url, executor="inline")


def test_retry_of_a_fanned_out_agent_that_failed_its_run_is_refused(sqlite_url: str) -> None:
    model = ScriptedModel({"b": [tool_reply(("poll", {"job": f"j{i}"})) for i in range(3)]},
                          default=(text_reply("fine"),))
    wf = Workflow("stop46-fanout-max-turns")

    @wf.step()
    def plan(input: list[str]) -> list[str]:
        return input

    @wf.agent(Agent(name="poller", model=model, tools=(poll,), max_turns=2), map_over="plan")
    def watch(plan: str) -> str:
        return plan

    run_id = raysaga.create_run(wf, ["a", "b"], store=sqlite_url).run_id
    failed = raysaga.resume(wf, run_id, store=sqlite_url, executor="inline")
    assert failed.status == RunStatus.FAILED, failed
    with pytest.raises(UserError, match=r"'watch\[1\]' failed MaxTurns.*--from 'watch@T\[1\]'"):
        raysaga.retry(wf, run_id, store=sqlite_url, executor="inline")
    with pytest.raises(UserError, match=r"'watch\[1\]' failed MaxTurns"):
        Client(sqlite_url).retry(run_id)


class InvalidOutput(Exception):
    """A step's own exception that happens to bear an agent failure's name (a parser's, an SDK's)."""


def test_client_retry_takes_a_plain_step_whose_exception_bears_an_agent_failure_name(
        sqlite_url: str, tmp_path: Path) -> None:
    """A diff review of the retry refusal: without code, ``Client.retry`` refused any failure named
    like an agent's (InvalidOutput, MaxTurns...), a plain step's own exception too, whose retry succeeds."""
    ready = tmp_path / "ready"
    wf = Workflow("plain_named46")

    @wf.step()
    def parse(input: str) -> str:
        if not ready.exists():
            raise InvalidOutput("upstream file not ready")
        return "parsed"

    run_id = raysaga.create_run(wf, "go", store=sqlite_url).run_id
    failed = raysaga.resume(wf, run_id, store=sqlite_url, executor="inline")
    assert failed.status == RunStatus.FAILED and failed.error is not None and failed.error.type == "InvalidOutput"
    ready.touch()  # the cause is fixed outside: a retry succeeds
    assert Client(sqlite_url).retry(run_id).status == RunStatus.RUNNING  # reopened, for a worker (or resume)
    assert raysaga.resume(wf, run_id, store=sqlite_url, executor="inline").output == {"parse": "parsed"}

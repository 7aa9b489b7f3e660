"""The agents research example does what its README says.

- Offline (no ``ANTHROPIC_API_KEY``) it says so on stderr, runs on a ``ScriptedModel`` and is
  deterministic: the same answer and token usage every time, inline and on Ray.
- Each of the four researchers files exactly one report: four idempotency keys, each effective
  once at the provider, each a committed ``tool:file_report`` effect in the ledger.
- Killed after the reports were filed but before their results were durable, the resumed run
  re-issues them under the same keys (the provider dedupes) and ends as an uninterrupted one.
- With a key set and ``RAYSAGA_FORBID_REAL_API=1``, the real-API path is refused by
  ``AnthropicModel``'s guard before any client exists, with an error that says why.
- Through the real ``anthropic`` SDK against the local Messages API stand-in, the same
  conversation gives the same answer; a 529 is retried invisibly and no answered request repeats.

Plus regression tests for bugs found while writing it (fixed in ``orchestrator/agentloop.py``):
an agent's call restored in the middle of its retry backoff was issued at once and again when
the timer fired; two calls of an effect tool with one key in one turn both went out and the
second's refusal marked the committed effect failed; a run paused for a loop re-paused on every
resume.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import raysaga
from examples.agents_research import script
from examples.agents_research import workflow as example
from raysaga.agents import Agent, LoopPolicy, tool
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from raysaga.testing import FORBID_ENV, ScriptedModel, forbid_real_api, text_reply, tool_reply
from tests.support import REPO
from tests.support import messages_server as ms
from tests.support.services import FakeServices

QUESTION = example.DEFAULT_QUESTION
SUBS = script.sub_questions(QUESTION)
REPORTS = [script.findings(sub) for sub in SUBS]
ANSWER = script.final_answer(QUESTION, SUBS, REPORTS)
TOKENS = sum(r.usage.total for turns in script.conversations(QUESTION).values() for r in turns)
MODEL_CALLS = 1 + 3 * len(SUBS) + 1  # planner, three turns per researcher, writer
LINE = re.compile(r"^  research\[(\d)\]\s+report\s+(\S+)\s+raw=(\d+) effective=(\d+)$", re.M)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RAYSAGA_FAULTS", "RAYSAGA_DB", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL")}
    return {**env, **extra}


def _answer(stdout: str) -> str:
    match = re.search(r"\nfinal answer:\n\n(.*)\n\ntokens used: ", stdout, re.S)
    assert match, stdout
    return match.group(1)


def _filed(stdout: str) -> dict[int, tuple[str, int, int]]:
    """The provider log as printed: researcher index → (key, raw, effective)."""
    return {int(i): (key, int(raw), int(eff)) for i, key, raw, eff in LINE.findall(stdout)}


def _check_demo_output(stdout: str, run_id: str) -> dict[int, tuple[str, int, int]]:
    assert stdout.startswith(f"run {run_id}: completed\n"), stdout
    assert _answer(stdout) == ANSWER
    assert f"tokens used: {TOKENS} (cost $0.0000)" in stdout
    filed = _filed(stdout)
    assert sorted(filed) == [0, 1, 2, 3], stdout
    assert len({key for key, _, _ in filed.values()}) == 4
    return filed


def _check_ledger(store: SqlStore, run_id: str, keys: set[str]) -> None:
    effects = [e for e in store.effects(run_id) if e.effect_name == "tool:file_report"]
    assert {e.idempotency_key for e in effects} == keys
    assert sorted(e.fan_index for e in effects) == [0, 1, 2, 3]
    assert all(e.status == EffectStatus.COMMITTED for e in effects)


# ---------------------------------------------------------------------- offline, deterministic


def test_offline_demo_inline(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    url = f"sqlite:///{tmp_path / 'demo.db'}"
    assert example.main(["--executor", "inline", "--db", url, "--run-id", "ar-1"]) == 0
    out, err = capsys.readouterr()
    assert example.NO_KEY_NOTICE in err
    filed = _check_demo_output(out, "ar-1")
    assert all((raw, eff) == (1, 1) for _, raw, eff in filed.values())

    store = SqlStore(url)
    try:
        _check_ledger(store, "ar-1", {key for key, _, _ in filed.values()})
        nodes = {n.label: n for n in store.nodes("ar-1")}
        assert [nodes[f"research[{i}]"].status for i in range(4)] == [NodeStatus.COMPLETED] * 4
        assert nodes["plan"].output == SUBS
        model_rows = [n for n in nodes.values() if re.fullmatch(r"\w+@\d+(\[\d\])?", n.label)]
        assert len(model_rows) == MODEL_CALLS and all(n.attempt == 1 for n in model_rows)  # none asked twice
        assert store.get_run("ar-1").tokens_used == TOKENS
    finally:
        store.close()


def test_each_researcher_files_exactly_one_report_and_runs_repeat(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'runs.db'}"
    outputs = []
    with FakeServices() as services:
        wf = example.build(script.scripted_model(), services.url)
        for run_id in ("ar-a", "ar-b"):
            record = raysaga.run(wf, {"question": QUESTION}, store=url, run_id=run_id, executor="inline")
            assert record.status == RunStatus.COMPLETED, record.status_reason
            outputs.append((record.output, record.tokens_used))
        log = services.log()
    assert outputs[0] == outputs[1] == ({"write": ANSWER}, TOKENS)  # deterministic offline
    assert len(log["effective"]) == 8 and set(log["effective"].values()) == {1}  # 4 reports per run
    assert set(log["raw"].values()) == {1}
    assert log["by_subject"] == {f"report:{sub}": 2 for sub in SUBS}  # one per sub-question per run
    store = SqlStore(url)
    try:
        for run_id in ("ar-a", "ar-b"):
            keys = {e.idempotency_key for e in store.effects(run_id)}
            assert len(keys) == 4 and keys <= set(log["effective"])
            _check_ledger(store, run_id, keys)
    finally:
        store.close()


@pytest.mark.ray
def test_offline_demo_on_ray(ray_address: str, tmp_path: Path) -> None:
    """The four researchers' turns and tools run as Ray tasks; the outcome is the same."""
    done = subprocess.run([sys.executable, "-m", "examples.agents_research.workflow", "--executor", "ray",
                           "--address", ray_address, "--db", f"sqlite:///{tmp_path / 'ray.db'}",
                           "--run-id", "ar-ray"],
                          cwd=REPO, env=_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    assert example.NO_KEY_NOTICE in done.stderr
    filed = _check_demo_output(done.stdout, "ar-ray")
    assert all((raw, eff) == (1, 1) for _, raw, eff in filed.values())


# ---------------------------------------------------------------------- a crash after the reports were filed


def test_killed_after_filing_resumes_without_filing_twice(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'crash.db'}"
    with FakeServices() as services:
        args = [sys.executable, "-m", "examples.agents_research.workflow", "--executor", "inline", "--db", db,
                "--services-url", services.url, "--run-id", "ar-crash", "--lease-ttl", "1"]
        # the report of researcher 2 came back, its result is not durable yet: SIGKILL
        killed = subprocess.run(args, cwd=REPO, env=_env(RAYSAGA_FAULTS="before_commit:research@1.0[2]"),
                                capture_output=True, text=True, timeout=120)
        assert killed.returncode == -9, killed.stdout + killed.stderr
        before = services.log()
        time.sleep(1.5)  # the dead driver's lease runs out
        done = subprocess.run(args, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=120)
        log = services.log()
    assert done.returncode == 0, done.stdout + done.stderr
    assert before["raw"] and set(before["effective"].values()) == {1}
    filed = _check_demo_output(done.stdout, "ar-crash")  # the same answer and usage as uninterrupted
    keys = {key for key, _, _ in filed.values()}
    assert set(log["effective"]) == keys and set(log["effective"].values()) == {1}
    # what was filed before the kill and not committed was re-issued under the same key, never under
    # a fresh one: researcher 2's report, whose commit the kill cut, once more; a report committed
    # before it never again (inline, each agent call's outcome is committed before the next runs)
    assert set(before["raw"]) <= keys
    cut = filed[2][0]
    assert log["raw"][cut] == before["raw"][cut] + 1
    assert all(log["raw"][key] - before["raw"].get(key, 0) in (0, 1) for key in keys)
    assert log["by_subject"] == {f"report:{sub}": 1 for sub in SUBS}


# ---------------------------------------------------------------------- the real-API path


def test_forbid_real_api_sets_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FORBID_ENV, raising=False)
    with forbid_real_api():
        assert os.environ[FORBID_ENV] == "1"
    assert FORBID_ENV not in os.environ
    guard = forbid_real_api()  # a plain call sets it too, until restored
    assert os.environ[FORBID_ENV] == "1"
    guard.restore()
    assert FORBID_ENV not in os.environ


def test_real_api_path_is_refused_by_the_guard(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    import anthropic

    secret = "sk-ant-test-0123456789-not-a-real-key"
    monkeypatch.setenv("ANTHROPIC_API_KEY", secret)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)  # so the call would go to api.anthropic.com

    def no_client(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("an Anthropic client was built: the guard did not stop the call first")

    monkeypatch.setattr(anthropic, "Anthropic", no_client)
    db = tmp_path / "guard.db"
    with forbid_real_api():
        started = time.monotonic()
        assert example.main(["--executor", "inline", "--db", f"sqlite:///{db}", "--run-id", "ar-guard"]) == 1
        assert time.monotonic() - started < 30
    out, err = capsys.readouterr()
    assert example.NO_KEY_NOTICE not in err
    assert f"using {example.DEFAULT_MODEL} through the Anthropic API" in err
    assert out.startswith("run ar-guard: failed — critical step 'planner' failed: model call for turn 0 failed: "
                          f"Permanent: {FORBID_ENV} is set: this process may not call the real Anthropic API"), out
    assert "tokens used: 0" in out and "(no calls)" in out
    store = SqlStore(f"sqlite:///{db}")
    try:
        nodes = {n.label: n for n in store.nodes("ar-guard")}
        assert nodes["planner@0"].status == NodeStatus.FAILED and nodes["planner@0"].attempt == 1  # not retried
        assert not any(label.startswith("research") for label in nodes)
    finally:
        store.close()
    stored = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.name.startswith("guard.db"))
    assert secret.encode() not in stored  # the key never reaches the store


# claude-sonnet-4-5 (the brief's default) is on the SDK's deprecation list (end of life 2026-11-30)
@pytest.mark.filterwarnings("ignore:The model 'claude-sonnet-4-5' is deprecated:DeprecationWarning")
def test_through_the_sdk_against_the_local_messages_server(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The AnthropicModel path end to end, with the scripted conversation served over HTTP."""
    def as_reply(response: Any) -> Any:
        blocks = [ms.text_block(b["text"]) if b["type"] == "text" else ms.tool_use_block(b["name"], b["input"])
                  for b in response.content]
        return ms.reply(blocks, usage=(response.usage.input_tokens, response.usage.output_tokens))

    scripts: dict[str, list[Any]] = {prompt: [as_reply(r) for r in turns]
                                     for prompt, turns in script.conversations(QUESTION).items()}
    flaky = example.researcher_prompt(QUESTION, SUBS[1])
    scripts[flaky][1] = [ms.fault(529), scripts[flaky][1]]  # overloaded once: retried, never shown to the model
    responder = ms.ScriptedResponder(scripts)
    with ms.MessagesServer(responder, api_key="test-key") as srv:
        monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", srv.base_url)  # not the real API: the guard lets it through
        code = example.main(["--executor", "inline", "--db", f"sqlite:///{tmp_path / 'sdk.db'}",
                             "--run-id", "ar-sdk"])
        out, err = capsys.readouterr()
        assert code == 0, out + err
        assert srv.repeated_requests() == []  # no answered request was asked again
        assert responder.arrivals(flaky, 1) == 2
        usage = srv.usage_totals()
        assert len([r for r in srv.requests if r.kind == "ok"]) == MODEL_CALLS
    assert _answer(out) == ANSWER
    assert usage.input_tokens + usage.output_tokens == TOKENS
    assert f"tokens used: {TOKENS} (cost $" in out and "(cost $0.0000)" not in out  # Sonnet has a price
    assert all((raw, eff) == (1, 1) for _, raw, eff in _filed(out).values())


def test_two_filings_with_one_key_in_one_turn_take_effect_once(tmp_path: Path) -> None:
    """A model asking for two reports on one question in one turn (reworded): one key, one call.
    Both used to go out; the provider refused the second (same key, other body) and that refusal
    overwrote the ledger row of the first, which said "failed" for a report that was filed."""
    with FakeServices() as services:
        researcher = example.build(script.scripted_model(), services.url).steps["research"].options["agent"]
        file_report = researcher.tool("file_report")
        model = ScriptedModel({"file twice": [
            tool_reply(("file_report", {"question": "q", "findings": "first wording"}),
                              ("file_report", {"question": "q", "findings": "second wording"})),
            text_reply("filed")]})
        wf = raysaga.Workflow("twice")

        assert file_report is not None

        @wf.agent(Agent("filer", model, tools=(file_report,)))
        def filer() -> str:
            return "file twice"

        url = f"sqlite:///{tmp_path / 'twice.db'}"
        record = raysaga.run(wf, None, store=url, run_id="twice", executor="inline")
        log = services.log()
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert list(log["raw"].values()) == [1] and list(log["effective"].values()) == [1]
    store = SqlStore(url)
    try:
        (effect,) = store.effects("twice")
        nodes = {n.label: n for n in store.nodes("twice")}
    finally:
        store.close()
    assert effect.status == EffectStatus.COMMITTED and effect.node_id == "filer@0.0"
    assert nodes["filer@0.1"].output["is_error"] and "same question" in nodes["filer@0.1"].output["content"]


# ---------------------------------------------------------------------- regression: a restored backoff

_BACKOFF_FLOW = '''
import os, random, sys, time
import raysaga
from raysaga import RetryPolicy, RunOptions, Workflow
from raysaga.agents import Agent, tool
from raysaga.orchestrator.driver import Driver
from raysaga.orchestrator.executor import InlineExecutor
from raysaga.testing import ScriptedModel, text_reply, tool_reply

LOG = sys.argv[2]

@tool(retry=RetryPolicy(max_attempts=3, base=3.0, cap=3.0))
def flaky(x: int) -> str:
    """Fails the first time it is ever called (a transient error), then answers."""
    calls = len(open(LOG).read().splitlines()) if os.path.exists(LOG) else 0
    with open(LOG, "a") as f:
        f.write(f"{time.time()}\\n")
    if calls == 0:
        raise ConnectionError("first call fails")
    return "ok"

@tool
def slow(x: int) -> str:
    """Outlasts flaky's backoff, so a stale retry timer would fire while the agent is past it."""
    time.sleep(4)
    return "slow ok"

model = ScriptedModel({"go": [tool_reply(("flaky", {"x": 1})), tool_reply(("slow", {"x": 2})), text_reply("done")]})
wf = Workflow("backoff")

@wf.agent(Agent("a", model, tools=(flaky, slow)))
def ask() -> str:
    return "go"

class Longest(random.Random):
    def uniform(self, a: float, b: float) -> float:
        return b

store = raysaga.open_store(sys.argv[1])
options = RunOptions(lease_ttl=1.0)
if sys.argv[3] == "start":
    raysaga.create_run(wf, None, store=store, run_id="b1", options=options)
print(Driver(wf, store, InlineExecutor(), "b1", options=options, rng=Longest()).drive().status.value)
'''


def test_tool_call_restored_mid_backoff_waits_and_runs_once(tmp_path: Path) -> None:
    """Killed while an agent's tool call waited out its retry backoff, the resumed driver used to
    call it at once (ignoring the backoff) and again when the restored timer fired, overwriting
    its committed result (for a model call: re-rolling an answered turn). Now: once, on time."""
    flow, log, db = tmp_path / "backoff_flow.py", tmp_path / "calls.log", f"sqlite:///{tmp_path / 'b.db'}"
    flow.write_text(_BACKOFF_FLOW)
    env = _env(PYTHONPATH=os.pathsep.join([str(REPO), *sys.path]))
    killed = subprocess.run([sys.executable, str(flow), db, str(log), "start"], env={
        **env, "RAYSAGA_FAULTS": "after_commit:ask@0.0"}, capture_output=True, text=True, timeout=60)
    assert killed.returncode == -9, killed.stdout + killed.stderr  # right after the retry became durable
    time.sleep(1.5)
    done = subprocess.run([sys.executable, str(flow), db, str(log), "resume"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "completed", done.stdout + done.stderr
    calls = [float(t) for t in log.read_text().split()]
    assert len(calls) == 2, calls  # the failed call and one retry
    store = SqlStore(db)
    try:
        row = next(n for n in store.nodes("b1") if n.node_id == "ask@0.0")
        retry = next(e for e in store.events("b1") if e.kind == "retry_scheduled")
    finally:
        store.close()
    assert row.status == NodeStatus.COMPLETED and row.attempt == 2
    assert calls[1] >= calls[0] + retry.data["delay"] - 0.05  # not before its backoff ended


# ---------------------------------------------------------------------- regression: a loop pause


@tool
def look(q: str) -> str:
    """Look something up (always the same answer)."""
    return "nothing new"


def test_a_run_paused_for_a_loop_can_be_resumed(tmp_path: Path) -> None:
    """``LoopPolicy(then="pause")``: the looping call was left unanswered, so every resume replayed
    to the same decision and paused again at once. Now it is answered with the warning (durable
    with the pause), and a resumed run lets the model go on."""
    same = tool_reply(("look", {"q": "x"}))
    model = ScriptedModel({"go": [same, same, same, same, text_reply("gave up looking")]})
    wf = raysaga.Workflow("loopy")

    @wf.agent(Agent("looper", model, tools=(look,), loop=LoopPolicy(then="pause")))
    def ask() -> str:
        return "go"

    url = f"sqlite:///{tmp_path / 'loop.db'}"
    paused = raysaga.run(wf, None, store=url, run_id="loop", executor="inline")
    assert paused.status == RunStatus.PAUSED and (paused.status_reason or "").startswith("loop: ")
    done = raysaga.resume(wf, "loop", store=url, executor="inline")
    assert done.status == RunStatus.COMPLETED and done.output == {"ask": "gave up looking"}
    store = SqlStore(url)
    try:
        results = {n.label: n.output for n in store.nodes("loop") if n.label.count(".") == 1}
    finally:
        store.close()
    # turns 0-1 ran the tool; turn 2 was warned; turn 3 (the pause) was answered with the warning
    assert [r["content"] == "nothing new" for _, r in sorted(results.items())] == [True, True, False, False]
    assert all(r.get("loop") for label, r in results.items() if label >= "ask@2")

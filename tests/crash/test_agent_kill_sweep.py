"""Invariants 1, 2 and 3 for an agent node under SIGKILL, through the real ``anthropic`` SDK.

The flow (``tests.support.agent_flows``): ``brief → research (agent) → publish``. The agent's model is
``AnthropicModel`` pointed at ``tests.support.messages_server``, whose script answers turn 0 with a
``search`` tool call, turn 1 with a ``file_report`` tool call (an effect through the ledger, filed
with the deduping fake provider under its idempotency key) and turn 2 with the final JSON answer.

A golden run goes uninterrupted. Then, for every kill point, a driver subprocess is started with
``RAYSAGA_FAULTS=<point>:<label>`` and dies of SIGKILL there; once its lease expired (polled in
the store) a new process resumes the run, and the test checks:

- no model re-roll: the server's ``repeated_requests()`` is empty, except at
  ``before_commit:research@N`` (the model had answered turn N, the answer was not yet durable):
  then exactly turn N's request, and nothing else, was asked again;
- the conversation equals the golden one: the same requests (messages, system, tools) in the
  same order, so no tool result, fault or replay left a trace in what the model saw;
- exactly-once effects: the provider saw one effective call under the golden key (a second
  *raw* call only at ``before_commit:research@1.0``, the call returned but not yet durable);
- the final status, output and node statuses equal the golden run's;
- tokens: ``status --json`` reports the golden ``tokens_used``, which is what the server billed
  for the golden run; a killed run was billed once more for exactly the repeated turn.

The kill points: ``after_commit`` of every agent node (model turns ``research@N``, tool calls
``research@N.k``, the agent node ``research`` itself), ``before_commit`` of every model turn and tool
call, ``before_pending``/``after_pending`` of the effect tool call, and ``before_transition``.
Inline, CI runs one case of each kind (``INLINE_CI_CASES``: 9 of 14), with Ray one point (a lost
middle answer on Ray: ``tests/chaos/test_ray_agent_sweep.py``); all of them, on both executors, with
``RAYSAGA_FULL_SWEEP=1``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore
from tests.support import agent_flows as af
from tests.support import crash_driver as harness
from tests.support import messages_server as ms
from tests.support.kill_sweep import FULL_SWEEP, LEASE_TTL, case_ids, kill_and_resume, rows, sweep_params
from tests.support.services import FakeServices, response_id

TEST_KEY = af.TEST_KEY
af.use_test_key()  # for the Ray workers: the key is never shipped with a task

RUN_ID = "agent-sweep-1"  # golden and killed runs share the id: their effect keys must match
S = af.STEP
MODEL_TURNS = (f"{S}@0", f"{S}@1", f"{S}@2")
TOOL_CALLS = (f"{S}@0.0", f"{S}@1.0")
EFFECT = f"{S}@1.0"
NODES = ("brief", *MODEL_TURNS, *TOOL_CALLS, S, "publish")


def kill_points() -> list[tuple[str, str]]:
    # `brief` and `publish` are plain steps, whose boundaries tests/crash/test_kill_sweep.py sweeps
    points = [("after_commit", label) for label in NODES if label not in ("brief", "publish")]
    points += [("before_commit", label) for label in (*MODEL_TURNS, *TOOL_CALLS)]
    points += [("before_pending", EFFECT), ("after_pending", EFFECT), ("before_transition", "*")]
    return points


def repeated_turn(point: str, label: str) -> int | None:
    """The turn whose answer a kill here loses (it was received, not yet durable), else None."""
    if point == "before_commit" and label in MODEL_TURNS:
        return int(label.rpartition("@")[2])
    return None


INLINE_CASES = kill_points()
#: CI's inline cases: a turn boundary, the effect call's and the agent node's, a middle and a final
#: answer lost at the kill, a plain and an effect tool result lost at the kill, the effect's pending
#: points (the other turns' and calls' boundaries and lost answers with ``RAYSAGA_FULL_SWEEP=1``, and
#: since 2026-11-29 the final transition: CI kills there in test_kill_sweep.py, test_fork_kill_sweep.py,
#: test_rollback_crash_sweep.py and test_approval_kill_sweep.py, after the agent's boundaries here).
INLINE_CI_CASES = [("after_commit", f"{S}@1"), ("after_commit", EFFECT), ("after_commit", S),
                   ("before_commit", f"{S}@1"), ("before_commit", f"{S}@2"), ("before_commit", f"{S}@0.0"),
                   ("before_commit", EFFECT), ("before_pending", EFFECT), ("after_pending", EFFECT)]
#: CI's Ray case: the effect's pending row. ``before_commit`` of a middle turn on Ray runs in the full
#: sweep since stop 28: CI checks it inline here (exactly) and on Ray in
#: ``tests/chaos/test_ray_agent_sweep.py`` (``before_commit:s2@1``, three agents at once).
RAY_CI_CASES = [("after_pending", EFFECT)]
RAY_FULL_CASES = [case for case in INLINE_CASES if case not in RAY_CI_CASES]


def test_the_sweep_covers_what_it_claims() -> None:
    assert len(INLINE_CASES) == len(set(INLINE_CASES)) == 14
    # the acceptance's points: each model answer persisted, the effect's pending row and commit,
    # and mid-turn (the tool call returned / the model answered, neither durable yet)
    assert {("after_commit", f"{S}@0"), ("after_commit", f"{S}@1"), ("after_commit", f"{S}@2"),
            ("after_pending", EFFECT), ("after_commit", EFFECT), ("before_commit", EFFECT),
            ("before_commit", f"{S}@1")} <= set(INLINE_CASES)
    assert [case for case in INLINE_CASES if repeated_turn(*case) is not None] == [
        ("before_commit", f"{S}@0"), ("before_commit", f"{S}@1"), ("before_commit", f"{S}@2")]
    assert set(RAY_CI_CASES) <= set(INLINE_CASES)


# ---------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def services() -> Iterator[Any]:
    """One fake provider for the module; its log is reset before each run."""
    with FakeServices() as fake:
        yield fake


@pytest.fixture(scope="module")
def model_server() -> Iterator[Any]:
    """One Messages API server for the module (its replies are pure); its log is cleared per run."""
    with ms.MessagesServer(af.reply_for) as srv:
        yield srv


@dataclass
class Golden:
    status: str
    output: Any
    nodes: dict[str, str]
    effect_key: str
    transcript: list[str]  # request keys of the ok requests, in order: what the model was asked
    turn_keys: dict[int, str]
    turn_usage: dict[int, int]
    billed: int  # the server's usage_totals(), input + output
    tokens_used: int  # `raysaga status --json`


@pytest.fixture(scope="module")
def goldens() -> dict[str, Golden]:
    return {}


def status_json(db: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["status", RUN_ID, "--db", db, "--json"])
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def billed(srv: Any) -> int:
    totals = srv.usage_totals()
    return int(totals.input_tokens + totals.output_tokens)


def spawn(db: str, srv: Any, services: Any, executor: str, **kwargs: Any) -> subprocess.Popen[str]:
    return af.spawn(db, RUN_ID, model_url=srv.base_url, services_url=services.url, api_key=TEST_KEY,
                    executor=executor, lease_ttl=LEASE_TTL[executor], **kwargs)


def golden_run(executor: str, srv: Any, services: Any, goldens: dict[str, Golden],
               tmp_path_factory: pytest.TempPathFactory) -> Golden:
    """The uninterrupted run (once per executor)."""
    if executor in goldens:
        return goldens[executor]
    db = f"sqlite:///{tmp_path_factory.mktemp(f'agent-golden-{executor}') / 'golden.db'}"
    srv.clear()
    services.reset()
    done = harness.finish(spawn(db, srv, services, executor))
    assert done.returncode == 0, done.describe()
    assert done.result is not None and done.result["status"] == "completed", done.describe()
    log = [r for r in srv.requests if r.kind == "ok"]
    assert [r.turn for r in srv.requests] == [0, 1, 2], "the golden run should ask each turn once"
    assert srv.repeated_requests() == []
    nodes, effects = rows(db, RUN_ID)
    assert sorted(nodes) == sorted(NODES) and set(nodes.values()) == {"completed"}, nodes
    [effect] = effects
    assert (effect.node_id, effect.status) == (EFFECT, EffectStatus.COMMITTED)
    provider = services.log()
    assert provider["raw"] == provider["effective"] == {effect.idempotency_key: 1}, provider
    status = status_json(db)
    golden = Golden(
        status=done.result["status"], output=done.result["output"], nodes=nodes,
        effect_key=effect.idempotency_key, transcript=[r.key for r in log],
        turn_keys={r.turn: r.key for r in log}, turn_usage={r.turn: sum(r.usage) for r in log},
        billed=billed(srv), tokens_used=status["tokens_used"])
    # the acceptance's token oracle: what the store counted is what the server billed
    assert golden.tokens_used == golden.billed == sum(i + o for i, o in af.TURN_USAGE.values())
    assert done.result["tokens_used"] == golden.tokens_used
    # the answer quotes the provider's receipt: the model saw the effect's real result
    assert golden.output["publish"]["receipt"] == response_id("report", golden.effect_key)
    goldens[executor] = golden
    return golden


# ---------------------------------------------------------------------- the check


def sweep_case(point: str, label: str, executor: str, golden: Golden, srv: Any, services: Any,
               tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'run.db'}"
    srv.clear()
    services.reset()

    def start(faults: str | None, resume: bool, go_file: Path | None) -> subprocess.Popen[str]:
        return spawn(db, srv, services, executor, faults=faults, resume=resume, go_file=go_file)

    def at_kill(kill: tuple[str, str], snap: Any) -> None:
        check_state_at_kill(point, label, snap, srv, services.log(), golden, executor)

    with kill_and_resume(start, db, RUN_ID, [(point, label)], tmp_path, at_kill=at_kill) as (resumed, store):
        result = resumed.result
        assert result is not None

        # invariant 1: resume equals uninterrupted
        assert (result["status"], result["output"]) == (golden.status, golden.output)
        assert {n.label: n.status.value for n in store.nodes(RUN_ID)} == golden.nodes

        # invariant 3: no model re-roll; only an answer lost before it was durable is asked again
        turn = repeated_turn(point, label)
        expected = [] if turn is None else [golden.turn_keys[turn]]
        assert srv.repeated_requests() == expected, [json.loads(k)["messages"] for k in srv.repeated_requests()]
        assert all(r.kind == "ok" for r in srv.requests)
        asked = list(dict.fromkeys(r.key for r in srv.requests))
        assert asked == golden.transcript, "the resumed conversation differs from the golden one"
        assert sorted(r.turn for r in srv.requests) == sorted([0, 1, 2] + ([] if turn is None else [turn]))

        # tokens: the store counts each durable answer once; the server billed the lost one too
        assert status_json(db)["tokens_used"] == golden.tokens_used == result["tokens_used"]
        assert billed(srv) == golden.billed + (0 if turn is None else golden.turn_usage[turn])

        # invariant 2: one effective call, under the golden key only
        provider = services.log()
        assert provider["effective"] == {golden.effect_key: 1}, provider
        assert set(provider["raw"]) == {golden.effect_key}, "a call carried a key the golden run never used"
        raw = provider["raw"][golden.effect_key]
        if executor == "inline":
            assert raw == (2 if (point, label) == ("before_commit", EFFECT) else 1), provider
        else:
            assert raw <= 2, provider
        effects = store.effects(RUN_ID)
        assert [(e.idempotency_key, e.status) for e in effects] == [(golden.effect_key, EffectStatus.COMMITTED)]


def check_state_at_kill(point: str, label: str, snap: Any, srv: Any, provider: dict[str, Any],
                        golden: Golden, executor: str = "inline") -> None:
    """The kill point meant what it says: what was durable, and what the services saw, at the kill."""
    nodes = {n.label: n.status for n in snap.nodes}
    ledger = {e.node_id: e.status for e in snap.effects}
    raw = provider["raw"].get(golden.effect_key, 0)
    answered = [r.turn for r in srv.requests if r.kind == "ok"]
    assert srv.repeated_requests() == [], "the first driver repeated a model call"
    if point == "after_commit":
        assert nodes.get(label) == NodeStatus.COMPLETED
    elif point == "before_commit" and label in MODEL_TURNS:
        turn = int(label.rpartition("@")[2])
        # the model answered, the answer is not durable, and no tool it asks for has run
        assert nodes.get(label) != NodeStatus.COMPLETED and answered[-1] == turn
        assert f"{label}.0" not in nodes
        assert snap.run.tokens_used == sum(golden.turn_usage[t] for t in range(turn))
        assert raw == (1 if turn == 2 else 0)
    elif point == "before_commit":
        assert nodes.get(label) != NodeStatus.COMPLETED
        if label == EFFECT:
            assert ledger.get(EFFECT) == EffectStatus.PENDING and raw == 1, "the call should have returned"
    elif point == "after_pending":
        assert ledger.get(EFFECT) == EffectStatus.PENDING and raw == 0, "the call must not have been made yet"
    elif point == "before_pending":
        assert EFFECT not in ledger and raw == 0
    elif point == "before_transition":
        # every node completed; on Ray the last step's (publish's) outcome is in the end's write
        # (Driver._loop, stop 33), and with it the agent node's own row (settled once its last
        # turn was durable, written with the next batch): both still running at this fault point,
        # every turn and tool call durable
        last = {"publish", S} if executor == "ray" else set()
        assert snap.run.status == RunStatus.RUNNING
        assert {n for n, status in nodes.items() if status != NodeStatus.COMPLETED} <= last, nodes
        assert answered == [0, 1, 2]


# ---------------------------------------------------------------------- a kill during a backoff


class FailsTurnOnce:
    """``agent_flows.reply_for``, except that the first request for ``turn`` is answered 529."""

    def __init__(self, turn: int) -> None:
        self.turn = turn
        self.lock = threading.Lock()
        self.failed = False

    def __call__(self, request: dict[str, Any]) -> Any:
        with self.lock:
            fail = ms.turn_of(request) == self.turn and not self.failed
            self.failed = self.failed or fail
        return ms.fault(529) if fail else af.reply_for(request)


BACKOFF = 5.0  # the ceiling of the model calls' transport backoff in this test


def test_kill_during_a_model_calls_backoff_keeps_the_wait_and_asks_once(
        model_server: Any, services: Any, goldens: dict[str, Golden], tmp_path_factory: pytest.TempPathFactory,
        tmp_path: Path) -> None:
    """Turn 1's first request gets a 529; the driver commits the retry's durable timer and is
    killed right there. The resumed driver must wait out the rest of that backoff and then ask
    turn 1 once: not at once, and not a second time when the restored timer fires."""
    golden = golden_run("inline", model_server, services, goldens, tmp_path_factory)
    wait = af.backoff_draw(BACKOFF)
    assert 2.0 < wait < BACKOFF  # long enough for the resumer to start inside the backoff
    db = f"sqlite:///{tmp_path / 'run.db'}"
    go = tmp_path / "go"
    env = {af.BACKOFF_ENV: str(BACKOFF)}
    wall = time.time() - time.monotonic()  # the server logs monotonic arrival times
    services.reset()
    store = SqlStore(db)
    with ms.MessagesServer(FailsTurnOnce(1)) as srv:
        resumer = spawn(db, srv, services, "inline", resume=True, go_file=go, extra_env=env)
        try:
            killed = harness.finish(spawn(db, srv, services, "inline", faults=f"after_commit:{S}@1", extra_env=env))
            assert killed.returncode == -signal.SIGKILL, killed.describe()
            row = {n.label: n for n in store.nodes(RUN_ID)}[f"{S}@1"]
            assert row.status == NodeStatus.RETRYING and row.error is not None
            assert row.error["type"] == "OverloadedError" and row.not_before is not None
            assert row.finished_at is not None
            assert row.not_before == pytest.approx(row.finished_at + wait, abs=0.2)

            harness.wait_lease_expired(store, RUN_ID)
            assert time.time() < row.not_before - 0.5, "the test was too slow to resume inside the backoff"
            go.touch()
            resumed = harness.finish(resumer)
        finally:
            harness.stop(resumer)
        assert resumed.returncode == 0, resumed.describe()
        assert resumed.result is not None
        assert (resumed.result["status"], resumed.result["output"]) == (golden.status, golden.output)

        log = srv.requests
        assert [(r.turn, r.kind) for r in log] == [(0, "ok"), (1, "fault"), (1, "ok"), (2, "ok")]
        assert srv.repeated_requests() == []
        assert [r.key for r in log if r.kind == "ok"] == golden.transcript
        retried = log[2]
        assert retried.arrived + wall >= row.not_before - 0.05, "the resumed driver did not wait out the backoff"
    try:
        events = [e for e in store.events(RUN_ID) if e.kind == "retry_scheduled"]
        assert [(e.node_id, e.data["error"]["type"]) for e in events] == [(f"{S}@1", "OverloadedError")]
        assert store.get_run(RUN_ID).tokens_used == golden.tokens_used
    finally:
        store.close()
    assert services.log()["effective"] == {golden.effect_key: 1}


# ---------------------------------------------------------------------- the sweeps


@pytest.mark.parametrize(("point", "label"), sweep_params(INLINE_CASES, INLINE_CI_CASES, "CI: INLINE_CI_CASES"))
def test_agent_kill_sweep_inline(point: str, label: str, model_server: Any, services: Any,
                                 goldens: dict[str, Golden], tmp_path_factory: pytest.TempPathFactory,
                                 tmp_path: Path) -> None:
    golden = golden_run("inline", model_server, services, goldens, tmp_path_factory)
    sweep_case(point, label, "inline", golden, model_server, services, tmp_path)


@pytest.mark.ray
@pytest.mark.parametrize(("point", "label"), RAY_CI_CASES, ids=case_ids(RAY_CI_CASES))
def test_agent_kill_sweep_ray(point: str, label: str, ray_address: str, model_server: Any, services: Any,
                              goldens: dict[str, Golden], tmp_path_factory: pytest.TempPathFactory,
                              tmp_path: Path) -> None:
    golden = golden_run("ray", model_server, services, goldens, tmp_path_factory)
    sweep_case(point, label, "ray", golden, model_server, services, tmp_path)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not FULL_SWEEP, reason="the full Ray sweep runs with RAYSAGA_FULL_SWEEP=1")
@pytest.mark.parametrize(("point", "label"), RAY_FULL_CASES, ids=case_ids(RAY_FULL_CASES))
def test_agent_kill_sweep_ray_full(point: str, label: str, ray_address: str, model_server: Any, services: Any,
                                   goldens: dict[str, Golden], tmp_path_factory: pytest.TempPathFactory,
                                   tmp_path: Path) -> None:
    golden = golden_run("ray", model_server, services, goldens, tmp_path_factory)
    sweep_case(point, label, "ray", golden, model_server, services, tmp_path)


@pytest.mark.ray
def test_agent_goldens_agree_across_executors(ray_address: str, model_server: Any, services: Any,
                                              goldens: dict[str, Golden],
                                              tmp_path_factory: pytest.TempPathFactory) -> None:
    """An inline run and a Ray run: the same conversation, output, effect key and token count."""
    inline = golden_run("inline", model_server, services, goldens, tmp_path_factory)
    ray = golden_run("ray", model_server, services, goldens, tmp_path_factory)
    assert (ray.output, ray.nodes, ray.effect_key, ray.transcript, ray.tokens_used) == (
        inline.output, inline.nodes, inline.effect_key, inline.transcript, inline.tokens_used)

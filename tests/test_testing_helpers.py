"""``raysaga.testing``'s helpers for users' own tests: ``RecordingModel``, ``FakeProvider``,
``CrashAt``/``SimulatedCrash`` and ``drive_inline``, each on its own and then together, the way a
user would test a workflow of their own (inline executor, a SQLite file).
"""

from __future__ import annotations

import copy
import pickle  # noqa: TID251 - in transit (a Ray task's model, a crash from a worker), never at rest
import signal
import subprocess
import sys
import textwrap
import threading
from typing import Any

import pytest

import raysaga
from raysaga import Permanent, RunStatus, StepContext, Workflow
from raysaga.agents import Agent, ModelRequest, tool
from raysaga.state import SqlStore
from raysaga.testing import (
    CRASH_POINTS,
    FAULTS_ENV,
    CrashAt,
    FakeProvider,
    RecordingModel,
    ScriptedModel,
    SimulatedCrash,
    drive_inline,
    text_reply,
    tool_reply,
)


def request(prompt: str, *turns: tuple[str, str]) -> ModelRequest:
    """A request for the turn after ``turns`` (assistant text, user reply) of conversation ``prompt``."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt}]
    for said, answer in turns:
        messages += [{"role": "assistant", "content": [{"type": "text", "text": said}]},
                     {"role": "user", "content": answer}]
    return ModelRequest(model="scripted", messages=messages)


# ---------------------------------------------------------------------- RecordingModel


def test_recording_model_answers_like_a_scripted_model_and_keeps_each_request() -> None:
    script = {"hi": [text_reply("one"), text_reply("two")]}
    model, scripted = RecordingModel(script), ScriptedModel(script)
    asked = [request("hi"), request("hi", ("one", "more")), request("hi")]
    assert [model.complete(r) for r in asked] == [scripted.complete(r) for r in asked]
    assert model.requests == asked
    assert [len(r.messages) for r in model.conversations()["hi"]] == [1, 3, 1]


def test_recorded_requests_are_copies_and_the_list_is_a_snapshot() -> None:
    model = RecordingModel(default=(text_reply("ok"),))
    asked = request("q")
    model.complete(asked)
    asked.messages[0]["content"] = "changed after the call"
    snapshot = model.requests
    snapshot.clear()
    assert [r.messages[0]["content"] for r in model.requests] == ["q"]


def test_a_conversation_without_a_script_is_recorded_then_refused() -> None:
    model = RecordingModel({"known": [text_reply("ok")]})
    with pytest.raises(Permanent, match="no script"):
        model.complete(request("unknown"))
    assert [r.messages[0]["content"] for r in model.requests] == ["unknown"]


def test_models_on_one_journal_share_it_and_clear_empties_it() -> None:
    journal = "test_testing_helpers-shared"
    first = RecordingModel(default=(text_reply("a"),), journal=journal)
    second = RecordingModel(default=(text_reply("b"),), journal=journal)
    first.complete(request("x"))
    second.complete(request("y"))
    assert [r.messages[0]["content"] for r in RecordingModel(journal=journal).requests] == ["x", "y"]
    first.clear()
    assert second.requests == [] and RecordingModel().requests == []  # a fresh model: its own journal


def test_a_copy_or_a_pickled_model_records_into_the_same_journal() -> None:
    model = RecordingModel(default=(text_reply("ok"),))
    copy.deepcopy(model).complete(request("copied"))
    pickle.loads(pickle.dumps(model)).complete(request("pickled"))
    assert [r.messages[0]["content"] for r in model.requests] == ["copied", "pickled"]


def test_recording_is_thread_safe() -> None:
    model = RecordingModel(default=(text_reply("ok"),))
    threads = [threading.Thread(target=lambda i=i: [model.complete(request(f"t{i}")) for _ in range(50)])
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(model.requests) == 400
    assert {k: len(v) for k, v in model.conversations().items()} == {f"t{i}": 50 for i in range(8)}


# ---------------------------------------------------------------------- FakeProvider


def test_the_first_call_under_a_key_takes_effect_and_a_repeat_is_deduped() -> None:
    provider = FakeProvider()
    first = provider.call("charge", "k1", {"amount": 5}, subject="order-1")
    again = provider.call("charge", "k1", {"amount": 5}, subject="order-1")
    assert first["duplicate"] is False and again["duplicate"] is True
    assert {k: v for k, v in again.items() if k != "duplicate"} == {k: v for k, v in first.items() if k != "duplicate"}
    assert (provider.raw("k1"), provider.effective("k1")) == (2, 1)
    assert [c.duplicate for c in provider.calls] == [False, True]
    assert [c.key for c in provider.effects("charge")] == ["k1"] and provider.effects("refund") == []
    assert provider.effects_by_subject() == {"order-1": 1}
    provider.assert_effects_once()


def test_a_key_reused_for_another_request_is_refused_and_takes_no_effect() -> None:
    provider = FakeProvider()
    provider.call("charge", "k1", {"amount": 5})
    with pytest.raises(Permanent, match="used for another request"):
        provider.call("charge", "k1", {"amount": 6})
    with pytest.raises(Permanent, match="used for another request"):
        provider.call("refund", "k1", {"amount": 5})
    assert (provider.raw("k1"), provider.effective("k1")) == (3, 1)
    assert [c.refused for c in provider.calls] == [False, True, True]


def test_a_call_without_a_key_is_refused() -> None:
    with pytest.raises(Permanent, match="needs an idempotency key"):
        FakeProvider().call("charge", None, {})
    assert FakeProvider().calls == []


def test_two_effects_on_one_subject_fail_assert_effects_once() -> None:
    provider = FakeProvider()
    provider.call("charge", "k1", {}, subject="order-1")
    provider.call("charge", "k2", {}, subject="order-1")  # a re-issue under a fresh key
    provider.call("charge", "k3", {}, subject="order-2")
    with pytest.raises(AssertionError, match="order-1"):
        provider.assert_effects_once()
    provider.assert_effects_once(["order-2"])
    with pytest.raises(AssertionError, match="order-3"):
        provider.assert_effects_once(["order-3"])  # an effect that never happened


def test_a_lost_answer_still_took_effect_and_the_retry_gets_it() -> None:
    provider = FakeProvider()
    provider.lose_next_answers(1)
    with pytest.raises(ConnectionError):
        provider.call("charge", "k1", {"amount": 5})
    assert provider.effective("k1") == 1 and provider.calls[0].answered is False
    retried = provider.call("charge", "k1", {"amount": 5})
    assert retried["duplicate"] is True and provider.effective("k1") == 1 and provider.raw("k1") == 2


def test_concurrent_calls_under_one_key_take_effect_once() -> None:
    provider = FakeProvider()
    threads = [threading.Thread(target=provider.call, args=("charge", "k1", {"amount": 5})) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (provider.raw("k1"), provider.effective("k1")) == (16, 1)


def test_reset_forgets_calls_and_keys() -> None:
    provider = FakeProvider()
    provider.call("charge", "k1", {"amount": 5})
    provider.lose_next_answers(3)
    provider.reset()
    assert provider.calls == [] and provider.effects_by_subject() == {}
    assert provider.call("charge", "k1", {"amount": 6})["duplicate"] is False  # the key is new again


# ---------------------------------------------------------------------- CrashAt


def test_crash_at_refuses_an_unknown_point_and_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="before_commit"):
        CrashAt("after_everything", "x")
    assert {"before_pending", "after_pending", "before_commit", "after_commit", "before_transition"} == CRASH_POINTS


def test_crash_at_fires_once_at_the_first_match() -> None:
    crash = CrashAt("before_commit", "charge")
    crash.hit("after_commit", ["charge"])  # another point
    crash.hit("before_commit", ["reserve"])  # another node
    assert not crash.fired
    with pytest.raises(SimulatedCrash) as caught:
        crash.hit("before_commit", ["reserve", "charge"])
    assert (caught.value.point, caught.value.label, crash.fired) == ("before_commit", "charge", True)
    crash.hit("before_commit", ["charge"])  # once only


def test_a_star_label_matches_any_node() -> None:
    with pytest.raises(SimulatedCrash):
        CrashAt("before_transition").hit("before_transition", ["*"])
    with pytest.raises(SimulatedCrash):
        CrashAt("after_commit", "*").hit("after_commit", ["anything"])


def test_crash_at_says_how_to_crash_a_driver_process() -> None:
    crash = CrashAt("after_pending", "charge")
    assert crash.spec == "after_pending:charge"
    assert crash.env() == {FAULTS_ENV: "after_pending:charge"} and FAULTS_ENV == "RAYSAGA_FAULTS"


def test_simulated_crash_survives_pickling() -> None:
    again = pickle.loads(pickle.dumps(SimulatedCrash("before_commit", "charge")))
    assert (again.point, again.label) == ("before_commit", "charge")
    assert str(again) == "simulated crash at before_commit:charge"


def test_kill_sigkills_the_process() -> None:
    code = textwrap.dedent("""
        from raysaga.testing import CrashAt
        CrashAt("after_commit", "charge", kill=True).hit("after_commit", ["charge"])
        print("still alive")
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL and "still alive" not in done.stdout, done.stderr


# ---------------------------------------------------------------------- together, as a user would


PAYMENTS = FakeProvider()


def payment_flow() -> Workflow:
    wf = Workflow("testing-helpers-order")

    @wf.step(effect=True)
    def charge(ctx: StepContext, input: dict[str, Any]) -> str:
        answer = PAYMENTS.call("charge", ctx.idempotency_key, {"cents": input["cents"]}, subject=input["order"])
        return str(answer["id"])

    @wf.step()
    def receipt(charge: str) -> str:
        return f"paid: {charge}"

    return wf


@pytest.fixture
def payments() -> FakeProvider:
    PAYMENTS.reset()
    return PAYMENTS


@pytest.mark.parametrize("point", ["after_pending", "before_commit", "after_commit"])
def test_a_crash_around_an_effect_then_a_resume_takes_the_effect_once(sqlite_url: str, payments: FakeProvider,
                                                                      point: str) -> None:
    wf = payment_flow()
    run_id = raysaga.create_run(wf, {"order": "o-1", "cents": 1999}, store=sqlite_url).run_id
    with pytest.raises(SimulatedCrash):
        drive_inline(wf, run_id, store=sqlite_url, crash_at=CrashAt(point, "charge"))
    store = SqlStore(sqlite_url)
    try:
        assert store.get_run(run_id).status == RunStatus.RUNNING  # as a crash there leaves it
    finally:
        store.close()

    final = raysaga.resume(wf, run_id, store=sqlite_url, executor="inline")
    assert final.status == RunStatus.COMPLETED, final.error
    (effect,) = payments.effects()
    assert final.output is not None and final.output["receipt"].startswith("paid: charge_")
    payments.assert_effects_once(["o-1"])
    # only a call that had returned without its result being durable is re-issued, under the same key
    assert payments.raw(effect.key) == (2 if point == "before_commit" else 1)


def test_drive_inline_without_a_crash_point_runs_to_rest_on_an_open_store(sqlite_url: str,
                                                                          payments: FakeProvider) -> None:
    wf = payment_flow()
    store = SqlStore(sqlite_url)
    try:
        run_id = raysaga.create_run(wf, {"order": "o-2", "cents": 5}, store=store).run_id
        final = drive_inline(wf, run_id, store=store)
        assert final.status == RunStatus.COMPLETED
        assert store.get_run(run_id).status == RunStatus.COMPLETED  # the store is still open
    finally:
        store.close()
    payments.assert_effects_once()


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_a_resumed_agent_is_not_asked_an_answered_turn_again(sqlite_url: str) -> None:
    model = RecordingModel(default=(tool_reply(("add", {"a": 1, "b": 2})), text_reply("3")))
    wf = Workflow("testing-helpers-agent")

    @wf.agent(Agent(name="adder", model=model, tools=(add,)))
    def solve(input: str) -> str:
        return input

    run_id = raysaga.create_run(wf, "add 1 and 2", store=sqlite_url).run_id
    with pytest.raises(SimulatedCrash):  # turn 0's answer is durable, its tool call not yet run
        drive_inline(wf, run_id, store=sqlite_url, crash_at=CrashAt("after_commit", "solve@0"))
    assert len(model.requests) == 1
    final = drive_inline(wf, run_id, store=sqlite_url)
    assert final.status == RunStatus.COMPLETED, final.error
    asked = model.requests
    assert len(asked) == 2 and len(asked[1].messages) == 3  # turn 1 only, after the tool's result
    assert asked[1].messages[-1]["content"][0]["content"] == "3"

"""Invariants 1, 2, 3 and 5 on random DAGs: a driver faulted anywhere and resumed ends as the golden run.

Hypothesis draws workflows (``tests.support.chaos_gen``: 5-50 steps, effects, compensations,
fan-outs with partial-failure policies, non-critical steps, permanent and transient failures,
agents on the real ``anthropic`` SDK against ``tests.support.messages_server`` with plain,
effect and compensated tools, and approvals the harness approves or rejects whenever the run
rests for them, the same way in every run);
per DAG a golden run goes uninterrupted in a driver process, then each case faults a driver
at a (point, node) pair the golden run passes, drawn at random, and a new process resumes the
run to rest. ``tests.support.chaos_sweep.check`` compares it with the golden run: status,
output, error, node statuses, ledger keys (none pending), one effective call per golden key
and no other key, repeats only of calls uncertain at the fault, the compensations' order, no
model turn asked again once its answer was durable (inline: exactly the answers lost at the
fault, once each), each agent asked the golden requests, the golden token count (nodes that
raced a failure may differ, within limits: see ``chaos_sweep.raced``; the sweep counts the
cases where some did).

Most faults are SIGKILLs; one in four raises ``FaultInjected`` out of the driver instead. The
inline executor: CI one drawn DAG of 5-20 steps, the same each time (derandomised), and ``MIXED``;
``RAYSAGA_FULL_SWEEP=1`` 200 random DAGs of 5-50 steps (``RAYSAGA_CHAOS_DAGS`` and
``RAYSAGA_CHAOS_KILLS`` override the counts). The Ray executor (the session's local cluster):
the fixed DAG ``RAY_MIXED`` (an agent with every kind of tool beside an effect fan-out, then
a failure: a rollback) SIGKILLed once the model answered a turn, before the answer is durable
(full sweep only since the seventh pass: CI runs that kill on Ray in ``test_ray_agent_sweep.py``);
full 20 random DAGs of 5-50 steps (``RAYSAGA_CHAOS_RAY_DAGS``). The inline sweep has the fixed
DAG ``MIXED`` (an agent, two approvals, one rejected, a rollback) as an explicit example, so CI
always has agents, approvals and a rollback whatever the generator draws. A failing example prints
its spec and its golden run.

The second generator (``dag_specs(fanned=True)``, ``test_random_fanned_dags_...``) adds the shapes
the first one leaves out: agents fanned out over a plan (with a partial-failure policy), approvals
fanned out over a plan (``map_over``, an item rejected now and then), agents calling tools that
raise (a ``ToolError``, an effect failing for good, a tool whose attempts all fail transiently),
and ``act_lost``, an effect failing transiently *after* its call took effect (its reply lost: the
retry re-sends the key, the provider dedupes; the oracle's allowance for that planned call is
``chaos_record.planned_calls``). CI runs its fixed DAG ``FANNED`` (one of each, then a rejected
item: a rollback) x 2 faults inline; ``RAYSAGA_FULL_SWEEP=1`` adds ``RAY_FANNED`` (a smaller one,
with ``act_lost``) on Ray, killed once after the lost reply, before its failure is durable (in CI
until 2026-11-29: CI's Ray chaos case is ``test_ray_agent_sweep.py``'s ``RAY_AGENTS``), 50
random DAGs of 5-50 steps inline (``RAYSAGA_CHAOS_FANNED_DAGS``) and 10 on Ray
(``RAYSAGA_CHAOS_RAY_FANNED_DAGS``).

The third generator (``dag_specs(fanned=True, ending=True)``, ``test_random_ending_dags_...``) adds
agents that end on their own (max turns, a loop, answers never valid, an answer refused once,
a turn the API refuses, a turn the API is overloaded for at every attempt; in fan-outs with
partial-failure policies too), transport faults of the Messages server (429, 500, 529, a
dropped connection) before some answers, tools failing transiently once then succeeding (a
plain one and an effect), tools declared ``requires_approval`` (approved or rejected by the
harness, some of them with edited arguments), ``speculative_tools`` agents, and approvals asking a
quorum of two approvers and taking an answer, and agents whose loop pauses the run
(``LoopPolicy(then="pause")``; the harness unpauses it). CI runs its five fixed DAGs (``ENDS``,
``MODEL_FAULTS``, ``GATED``, ``QUORUM``, ``PAUSES``), each faulted at one chosen point (two with
``RAYSAGA_FULL_SWEEP=1``); ``RAYSAGA_FULL_SWEEP=1`` adds 50
random DAGs inline (``RAYSAGA_CHAOS_ENDING_DAGS``) and 10 on Ray (``RAYSAGA_CHAOS_RAY_ENDING_DAGS``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tests.support import chaos_flows, chaos_model
from tests.support.chaos_dags import STATS, sweep_dag
from tests.support.chaos_gen import dag_specs
from tests.support.chaos_sweep import Kill
from tests.support.kill_sweep import FULL_SWEEP
from tests.support.messages_server import MessagesServer
from tests.support.services import FakeServices
from tests.support.sweep import full_sweep_only

# The agents' API key, for the driver processes and for the Ray workers, which read it from the
# raylet's environment: the session's Ray head starts after collection, inheriting this.
os.environ[chaos_flows.KEY_ENV] = chaos_flows.TEST_KEY

LONG = 4 * 3600  # seconds: a full sweep's own time limit
# CI: one drawn DAG beside the explicit MIXED example (CI's time); the full sweep 200
DAGS = int(os.environ.get("RAYSAGA_CHAOS_DAGS", "200" if FULL_SWEEP else "1"))
RAY_DAGS = int(os.environ.get("RAYSAGA_CHAOS_RAY_DAGS", "20" if FULL_SWEEP else "1"))
KILLS = int(os.environ.get("RAYSAGA_CHAOS_KILLS", "2"))
MAX_STEPS = 50 if FULL_SWEEP else 20
#: An agent (plain, effect and compensated tools) and an approved approval on one branch, an
#: effect fan-out on the other, then an approval the harness rejects: the run rolls back.
MIXED: dict[str, Any] = {"name": "chaos_mixed", "steps": [
    {"name": "s0", "kind": "step", "deps": [], "effect": True, "compensate": True},
    {"name": "s1", "kind": "plan", "deps": ["s0"], "items": 2},
    {"name": "s2", "kind": "agent", "deps": ["s0"], "turns": [["lookup", "act_undone"], ["act"]]},
    {"name": "s3", "kind": "approval", "deps": ["s2"], "verdict": "approve"},
    {"name": "s4", "kind": "map", "over": "s1", "deps": ["s1"], "effect": True, "compensate": True,
     "fail_items": [], "policy": {"kind": "all"}},
    {"name": "s5", "kind": "approval", "deps": ["s3", "s4"], "verdict": "reject"},
]}
MIXED_SEED = 7
#: ``MIXED`` without its approvals (their decisions are the driver's, whatever the executor:
#: each costs a Ray driver more in CI), the rollback from a step failing for good.
RAY_MIXED: dict[str, Any] = {"name": "chaos_ray_mixed", "steps": [
    *MIXED["steps"][:3], MIXED["steps"][4],
    {"name": "s5", "kind": "step", "deps": ["s2", "s4"], "fate": "fail"},
]}
RAY_CI_FAULT = (("before_commit", "s2@1"), "kill")
FANNED_DAGS = int(os.environ.get("RAYSAGA_CHAOS_FANNED_DAGS", "50" if FULL_SWEEP else "0"))
#: The second generator's shapes, one of each: an agent per element of a plan calling the tools
#: that raise, an agent whose effect tool fails for good, an approval per element whose item 2
#: the harness rejects: the run rolls back (the agents' undone calls, the compensated step).
FANNED: dict[str, Any] = {"name": "chaos_fanned", "steps": [
    {"name": "s0", "kind": "plan", "deps": [], "items": 3},
    {"name": "s1", "kind": "agent", "over": "s0", "deps": ["s0"], "policy": {"kind": "all"},
     "turns": [["lookup", "broken"], ["act_undone", "unreachable"]]},
    {"name": "s2", "kind": "step", "deps": ["s0"], "effect": True, "compensate": True},
    {"name": "s3", "kind": "agent", "deps": ["s2"], "turns": [["act_broken", "act"]]},
    {"name": "s4", "kind": "approval", "over": "s0", "deps": ["s0", "s1", "s3"], "reject_items": [2]},
]}
FANNED_SEED = 11
RAY_FANNED_DAGS = int(os.environ.get("RAYSAGA_CHAOS_RAY_FANNED_DAGS", "10" if FULL_SWEEP else "0"))
#: The second generator's shapes on Ray, kept small for CI: an agent per element of a plan calling
#: a tool that raises and the tool whose first reply is lost (``act_lost``: the call took effect,
#: then the tool raised; its retry re-sends the key), beside a compensated effect; an agent whose
#: effect tool fails for good; then an approval per element whose item 1 the harness rejects: the
#: run rolls back (the agents' ``act_undone`` calls and the compensated step; ``act_lost`` has no undo).
RAY_FANNED: dict[str, Any] = {"name": "chaos_ray_fanned", "steps": [
    {"name": "s0", "kind": "plan", "deps": [], "items": 2},
    {"name": "s1", "kind": "agent", "over": "s0", "deps": ["s0"], "policy": {"kind": "all"},
     "turns": [["broken", "act_lost"], ["act_undone"]]},
    {"name": "s2", "kind": "step", "deps": ["s0"], "effect": True, "compensate": True},
    {"name": "s3", "kind": "agent", "deps": ["s2"], "turns": [["act_broken", "act"]]},
    {"name": "s4", "kind": "approval", "over": "s0", "deps": ["s0", "s1", "s3"], "reject_items": [1]},
]}
#: Killed once item 0's ``act_lost`` call took effect and raised, before that failure is durable:
#: the resume's call is its planned retry (the same key, deduped), not a repeat.
RAY_FANNED_FAULT = (("before_commit", "s1@0.1[0]"), "kill")
ENDING_SEED = 13
ENDING_DAGS = int(os.environ.get("RAYSAGA_CHAOS_ENDING_DAGS", "50" if FULL_SWEEP else "0"))
RAY_ENDING_DAGS = int(os.environ.get("RAYSAGA_CHAOS_RAY_ENDING_DAGS", "10" if FULL_SWEEP else "0"))
#: The third generator's agents that end on their own: an agent per element of a plan whose item
#: 1 loops (``LoopDetected``), best effort; an agent never answering valid JSON (non-critical,
#: its failure handed on), then one whose first answer is refused (it completes); then an agent
#: that never stops asking for tools (``MaxTurns``, critical: the run rolls back).
ENDS: dict[str, Any] = {"name": "chaos_ends", "steps": [
    {"name": "s0", "kind": "step", "deps": [], "effect": True, "compensate": True},
    {"name": "s1", "kind": "plan", "deps": ["s0"], "items": 3},
    {"name": "s2", "kind": "agent", "over": "s1", "deps": ["s1"], "policy": {"kind": "best_effort"},
     "turns": [["act_undone"]], "end": "loop", "end_items": [1]},
    {"name": "s3", "kind": "agent", "deps": ["s0"], "turns": [["lookup"]], "end": "invalid", "critical": False,
     "on_failure": "pass"},
    {"name": "s4", "kind": "agent", "deps": ["s3"], "turns": [["lookup"]], "end": "fixed"},
    {"name": "s5", "kind": "agent", "deps": ["s2", "s4"], "turns": [["act_undone"], ["lookup"]], "end": "max_turns"},
]}
#: Model-side faults: a fan-out of agents meeting a 429, and a 500 then a 529, before answers; an
#: agent whose first turn stalls past the client's timeout (then answered), meeting a dropped
#: connection, then overloaded at every attempt of its last turn
#: (``ModelUnavailable``, non-critical: its dependent skipped); a fan-out under ``quorum(1)``
#: whose item 0 the API refuses (400: ``ModelCallFailed``).
MODEL_FAULTS: dict[str, Any] = {"name": "chaos_model_faults", "steps": [
    {"name": "s0", "kind": "plan", "deps": [], "items": 2},
    {"name": "s1", "kind": "agent", "over": "s0", "deps": ["s0"], "policy": {"kind": "all"},
     "turns": [["lookup"], ["act"]], "model_faults": {"0": ["429"], "2": ["500", "529"]}},
    {"name": "s2", "kind": "agent", "deps": ["s1"], "turns": [["act_undone"]],
     "model_faults": {"0": ["stall"], "1": ["drop"]}, "end": "model_down", "critical": False, "on_failure": "skip"},
    {"name": "s3", "kind": "step", "deps": ["s2"], "effect": True},
    {"name": "s4", "kind": "agent", "over": "s0", "deps": ["s0", "s1"], "policy": {"kind": "quorum", "k": 1},
     "turns": [["lookup"]], "end": "model_400", "end_items": [0]},
]}
#: Tools failing once then succeeding, tools a human must allow, speculative agents: an agent
#: calling the flaky tools, then two gated effects (the second rejected); an agent per element
#: calling a gated effect, then the flaky lookup, its second turn meeting a 529 first; both
#: speculative; then an approval the harness rejects: the run rolls back the allowed calls.
GATED: dict[str, Any] = {"name": "chaos_gated", "steps": [
    {"name": "s0", "kind": "plan", "deps": [], "items": 2},
    {"name": "s1", "kind": "agent", "deps": [], "turns": [["lookup_flaky", "act_flaky"], ["act_gated", "act_gated"]],
     "reject_calls": ["1.1"], "speculative": True},
    {"name": "s2", "kind": "agent", "over": "s0", "deps": ["s0"], "policy": {"kind": "all"},
     "turns": [["act_gated"], ["lookup_flaky", "lookup"]], "model_faults": {"1": ["529"]}, "speculative": True},
    {"name": "s3", "kind": "approval", "deps": ["s1", "s2"], "verdict": "reject"},
]}
#: Approvals asking two approvers, with answers; gated calls approved with edited arguments: a
#: quorum-of-two approval with an answer each (the second's wins) and one per element of a plan,
#: both feeding a step; an agent whose two gated calls run with edited arguments (beside a
#: lookup); an effect, then a quorum-of-two approval the first approver rejects: the run rolls
#: back the edited calls and the effect.
QUORUM: dict[str, Any] = {"name": "chaos_quorum", "steps": [
    {"name": "s0", "kind": "plan", "deps": [], "items": 2},
    {"name": "s1", "kind": "approval", "deps": ["s0"], "verdict": "approve", "quorum": 2, "answer": True},
    {"name": "s2", "kind": "approval", "over": "s0", "deps": ["s0"], "reject_items": [], "quorum": 2, "answer": True},
    {"name": "s3", "kind": "step", "deps": ["s1", "s2"]},
    {"name": "s4", "kind": "agent", "deps": ["s0"], "turns": [["act_gated", "lookup"], ["act_gated"]],
     "reject_calls": [], "edit_calls": ["0.0", "1.0"]},
    {"name": "s5", "kind": "step", "deps": ["s3", "s4"], "effect": True, "compensate": True},
    {"name": "s6", "kind": "approval", "deps": ["s5"], "verdict": "reject", "quorum": 2},
]}
#: An agent's loop that pauses the run (``LoopPolicy(then="pause")``): the harness unpauses it as
#: an operator would, and the model answers; an undone effect before it, an effect after it.
PAUSES: dict[str, Any] = {"name": "chaos_pauses", "steps": [
    {"name": "s0", "kind": "step", "deps": [], "effect": True, "compensate": True},
    {"name": "s1", "kind": "agent", "deps": ["s0"], "turns": [["act_undone"]], "end": "loop_pause"},
    {"name": "s2", "kind": "step", "deps": ["s1"], "effect": True},
]}
#: Each fixed DAG of the third generator with the faults CI gives it (point, label, mode).
ENDING_CI: dict[str, tuple[dict[str, Any], list[tuple[Kill, str]]]] = {
    # the loop's failing turn answered, not durable (asked again); the last turn before MaxTurns
    "ends": (ENDS, [(("before_commit", "s2@4[1]"), "kill"), (("before_commit", "s5@5"), "raise")]),
    # a 429 lost with its driver (the retry gets the next planned reply); the 400 lost (asked again)
    "model_faults": (MODEL_FAULTS, [(("before_commit", "s1@0[0]"), "kill"), (("before_commit", "s4@1[0]"), "raise")]),
    # the flaky effect's failed first attempt; a gated effect's call sent, its outcome not durable
    "gated": (GATED, [(("before_commit", "s1@0.1"), "raise"), (("after_pending", "s2@0.0[1]"), "kill")]),
    # both approvals of the quorum consumed with the node's outcome, not durable; an edited call sent
    "quorum": (QUORUM, [(("before_commit", "s1"), "kill"), (("after_pending", "s4@1.0"), "kill")]),
    "pauses": (PAUSES, [(("before_commit", "s1@4"), "kill"), (("before_commit", "s1@5"), "raise")]),
}
@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        yield fake


@pytest.fixture(scope="module")
def model() -> Iterator[MessagesServer]:
    """The agents' Messages API: replies pure in the request (``chaos_model.reply_for``) but for
    the planned transport faults (``chaos_model.ChaosModel``: counted from each run's reset)."""
    with MessagesServer(chaos_model.ChaosModel(), backlog=128) as srv:
        yield srv


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    for executor, stats in STATS.items():
        if stats["dags"]:
            print(f"\nrandom kill sweep ({executor}): {stats}")


@pytest.mark.timeout(LONG if FULL_SWEEP else 300)  # the suite-wide 300 s stops a full sweep
@settings(max_examples=DAGS, deadline=None, derandomize=not FULL_SWEEP, database=None,
          phases=[Phase.explicit, Phase.generate],  # no shrinking: each example is real processes
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=dag_specs(5, MAX_STEPS, agents=True, approvals=True), seed=st.integers(0, 2**32 - 1))
@example(spec=MIXED, seed=MIXED_SEED)
def test_random_dags_faulted_anywhere_end_as_golden(spec: dict[str, Any], seed: int, services: FakeServices,
                                                    model: MessagesServer,
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    sweep_dag(spec, seed, KILLS, "inline", services, model, tmp_path_factory)


@pytest.mark.timeout(LONG if FULL_SWEEP else 300)
@settings(max_examples=max(FANNED_DAGS, 1), deadline=None, database=None,
          phases=[Phase.explicit, Phase.generate] if FANNED_DAGS else [Phase.explicit],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=dag_specs(5, MAX_STEPS, agents=True, approvals=True, fanned=True), seed=st.integers(0, 2**32 - 1))
@example(spec=FANNED, seed=FANNED_SEED)
def test_random_fanned_dags_faulted_anywhere_end_as_golden(spec: dict[str, Any], seed: int, services: FakeServices,
                                                           model: MessagesServer,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The second generator's shapes (agents and approvals in fan-outs, tools that raise), inline."""
    sweep_dag(spec, seed, KILLS, "inline", services, model, tmp_path_factory, group="fanned")


@pytest.mark.parametrize("shape", sorted(ENDING_CI))
def test_ending_shapes_faulted_end_as_golden(shape: str, services: FakeServices, model: MessagesServer,
                                             tmp_path_factory: pytest.TempPathFactory) -> None:
    """CI's cases of the third generator: each fixed DAG faulted at the first of its chosen
    points (CI's time), at both with ``RAYSAGA_FULL_SWEEP=1``."""
    spec, faults = ENDING_CI[shape]
    edited, rests = STATS["ending"]["edited_calls"], STATS["ending"]["golden_rests"]
    stalled = STATS["ending"]["stalled_requests"]
    sweep_dag(spec, ENDING_SEED, KILLS, "inline", services, model, tmp_path_factory, note=print,
              faults=faults if FULL_SWEEP else faults[:1], group="ending")
    planned = sum(len(s.get("edit_calls", ())) for s in spec["steps"])
    assert STATS["ending"]["edited_calls"] - edited == planned  # each ran with its edited arguments
    if shape == "pauses":
        assert STATS["ending"]["golden_rests"] - rests == 1  # the loop paused the golden run once
    if shape == "model_faults":  # s2's first turn stalled past the client's timeout, and was asked again
        assert STATS["ending"]["stalled_requests"] - stalled >= 1


@pytest.mark.slow
@pytest.mark.skipif(not ENDING_DAGS, reason="the third generator's random sweep runs with RAYSAGA_FULL_SWEEP=1")
@pytest.mark.timeout(LONG)
@settings(max_examples=ENDING_DAGS or 1, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=dag_specs(5, MAX_STEPS, agents=True, approvals=True, fanned=True, ending=True),
       seed=st.integers(0, 2**32 - 1))
def test_random_ending_dags_faulted_anywhere_end_as_golden(spec: dict[str, Any], seed: int, services: FakeServices,
                                                           model: MessagesServer,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The third generator's shapes (agents ending on their own, model faults, flaky and gated
    tools, speculative agents), inline."""
    sweep_dag(spec, seed, KILLS, "inline", services, model, tmp_path_factory, group="ending")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not RAY_ENDING_DAGS, reason="the third generator's Ray sweep runs with RAYSAGA_FULL_SWEEP=1")
@pytest.mark.timeout(LONG)
@settings(max_examples=RAY_ENDING_DAGS or 1, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=dag_specs(5, 50, agents=True, approvals=True, fanned=True, ending=True), seed=st.integers(0, 2**32 - 1))
def test_random_ending_dags_on_ray_faulted_anywhere_end_as_golden(spec: dict[str, Any], seed: int, ray_address: str,
                                                                  services: FakeServices, model: MessagesServer,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """The third generator's shapes on the Ray executor."""
    sweep_dag(spec, seed, KILLS, "ray", services, model, tmp_path_factory, group="ray_ending")


@pytest.mark.ray
@full_sweep_only("CI runs tests/chaos/test_ray_agent_sweep.py::test_agents_on_ray_killed_with_a_turn_answered_"
                 "end_as_golden: the same kill on Ray, in a DAG holding RAY_MIXED's shapes")
def test_a_mixed_dag_on_ray_faulted_ends_as_golden(ray_address: str, services: FakeServices, model: MessagesServer,
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    """``RAY_MIXED`` on the Ray executor (drivers join the session's local cluster; steps, model
    calls and tool calls run there, so a fault may leave some in flight), killed with turn 1's
    answer in hand: the resume asks that turn again, and nothing else. Full sweep only since the
    seventh pass: CI's case of this kill on Ray is ``test_ray_agent_sweep.py``'s ``RAY_AGENTS``, which
    holds every shape of ``RAY_MIXED`` (an agent with an undone effect, a compensated effect, an
    effect fan-out, a failure rolling them back) and more agents."""
    sweep_dag(RAY_MIXED, MIXED_SEED, 1, "ray", services, model, tmp_path_factory, note=print, faults=[RAY_CI_FAULT])
    assert STATS["ray"]["model_requests"] > 0 and STATS["ray"]["rolled_back"] == 1, STATS["ray"]


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not FULL_SWEEP, reason="the random Ray sweep runs with RAYSAGA_FULL_SWEEP=1")
@pytest.mark.timeout(LONG)
@settings(max_examples=RAY_DAGS, deadline=None, database=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=dag_specs(5, 50, agents=True, approvals=True), seed=st.integers(0, 2**32 - 1))
def test_random_dags_on_ray_faulted_anywhere_end_as_golden(spec: dict[str, Any], seed: int, ray_address: str,
                                                           services: FakeServices, model: MessagesServer,
                                                           tmp_path_factory: pytest.TempPathFactory) -> None:
    """The random sweep on the Ray executor."""
    sweep_dag(spec, seed, KILLS, "ray", services, model, tmp_path_factory)


@pytest.mark.ray
@full_sweep_only("CI runs tests/chaos/test_ray_agent_sweep.py::test_agents_on_ray_killed_with_a_turn_answered_"
                 "end_as_golden (an agent fan-out calling act_lost and a raising tool, SIGKILLed on Ray, rolled "
                 "back) and FANNED inline (agents and approvals fanned out, act_broken, a rejected item)")
def test_a_fanned_dag_on_ray_faulted_ends_as_golden(ray_address: str, services: FakeServices, model: MessagesServer,
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    """The second generator's fixed Ray case: ``RAY_FANNED`` on the Ray executor, killed once the
    ``act_lost`` call of item 0 took effect and raised, its failure not yet durable: the resume
    sends the planned retry under the same key (deduped), and nothing twice. Full sweep only since
    2026-11-29 (71 s of CI's time at load 8-11): CI's Ray chaos case is ``test_ray_agent_sweep.py``'s
    ``RAY_AGENTS`` (its fan-out's agents call ``act_lost`` on Ray workers a SIGKILL takes down), and
    this DAG's other shapes run inline in ``FANNED``."""
    sweep_dag(RAY_FANNED, FANNED_SEED, 1, "ray", services, model, tmp_path_factory, note=print,
              faults=[RAY_FANNED_FAULT], group="ray_fanned")
    stats = STATS["ray_fanned"]
    assert stats["faults"] == 1 and stats["rolled_back"] == 1 and stats["lost_calls"] == 1, stats


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not RAY_FANNED_DAGS, reason="the second generator's Ray sweep runs with RAYSAGA_FULL_SWEEP=1")
@pytest.mark.timeout(LONG)
@settings(max_examples=RAY_FANNED_DAGS or 1, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=dag_specs(5, 50, agents=True, approvals=True, fanned=True), seed=st.integers(0, 2**32 - 1))
def test_random_fanned_dags_on_ray_faulted_anywhere_end_as_golden(spec: dict[str, Any], seed: int, ray_address: str,
                                                                  services: FakeServices, model: MessagesServer,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    """The second generator's shapes (agents and approvals fanned out, tools that raise, the lost
    reply) on the Ray executor."""
    sweep_dag(spec, seed, KILLS, "ray", services, model, tmp_path_factory, group="ray_fanned")

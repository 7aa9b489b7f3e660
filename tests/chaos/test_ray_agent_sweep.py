"""Invariant 3 ("no model re-roll") on Ray under SIGKILL: DAGs weighted to agents.

The Ray sweeps of the other generators draw DAGs that often fail early (a critical step, a
rejected approval), so few of their agents reach the model: 92 requests in 44 faults in the sixth
pass. Here the DAGs are mostly agents (``chaos_gen.agent_dag_specs``: several sub-agents, fanned
out or not, 2-3 tool turns each, effect tools, tools that raise, the lost reply, no failure before
the end) and 3 in 4 faults are drawn at an agent's points (a turn answered and not yet durable, a
tool call's commit, its ledger row), where sibling agents' model and tool calls are in flight on
Ray workers the SIGKILL takes down with their driver. Each case is checked by the chaos oracle
(``chaos_oracle.check``): equal to golden, 0 duplicate effective calls, 0 ``pending`` rows, no
request asked again once its turn's answer was durable at the fault, each agent the golden
requests.

CI: the fixed DAG ``RAY_AGENTS`` killed once (``RAY_AGENTS_FAULT``; it also holds the shapes of
``test_random_kill_sweep.py``'s ``RAY_MIXED``, whose Ray case now runs in the full sweep only);
``RAYSAGA_FULL_SWEEP=1``: 10 random DAGs x 2 faults (``RAYSAGA_CHAOS_RAY_AGENT_DAGS``, ``RAYSAGA_CHAOS_KILLS``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.support import chaos_flows, chaos_model
from tests.support.chaos_dags import STATS, sweep_dag
from tests.support.chaos_gen import agent_dag_specs
from tests.support.chaos_sweep import Kill
from tests.support.kill_sweep import FULL_SWEEP
from tests.support.messages_server import MessagesServer
from tests.support.services import FakeServices

# The agents' API key, for the driver processes and for the Ray workers, which read it from the
# raylet's environment: the session's Ray head starts after collection, inheriting this.
os.environ[chaos_flows.KEY_ENV] = chaos_flows.TEST_KEY

RAY_AGENT_DAGS = int(os.environ.get("RAYSAGA_CHAOS_RAY_AGENT_DAGS", "10" if FULL_SWEEP else "0"))
KILLS = int(os.environ.get("RAYSAGA_CHAOS_KILLS", "2"))
LONG = 4 * 3600  # seconds: a full sweep's own time limit
SEED = 29
#: Three sub-agents at once, each with two tool turns before its answer: an agent per element of
#: a plan (a lookup and an effect, then the lost reply and an undone effect), and an agent calling
#: an undone effect and a tool that raises, then an effect; a compensated effect step after it and a
#: compensated effect fan-out beside them (``RAY_MIXED``'s shapes, whose CI case this one replaces);
#: then a step failing for good that waits for every other node: the run rolls back what the agents
#: and steps did, with no node racing the failure, so on Ray too each agent must be asked exactly
#: the golden requests and the run use the golden tokens.
RAY_AGENTS: dict[str, Any] = {"name": "chaos_ray_agents", "steps": [
    {"name": "s0", "kind": "plan", "deps": [], "items": 2},
    {"name": "s1", "kind": "agent", "over": "s0", "deps": ["s0"], "policy": {"kind": "all"},
     "turns": [["lookup", "act"], ["act_lost", "act_undone"]]},
    {"name": "s2", "kind": "agent", "deps": [], "turns": [["act_undone", "broken"], ["act"]]},
    {"name": "s3", "kind": "step", "deps": ["s2"], "effect": True, "compensate": True},
    {"name": "s4", "kind": "map", "over": "s0", "deps": ["s0"], "effect": True, "compensate": True,
     "fail_items": [], "policy": {"kind": "all"}},
    {"name": "s5", "kind": "step", "deps": ["s1", "s3", "s4"], "fate": "fail"},
]}
#: Killed with ``s2``'s turn 1 answered, not yet durable, while the fan-out's agents run: the
#: resume asks that turn again (once), and never turn 0, durable before any of its tools ran.
RAY_AGENTS_FAULT: tuple[Kill, str] = (("before_commit", "s2@1"), "kill")


def at_an_agent(kill: Kill) -> bool:
    """A point of an agent's turn or tool call (``s2@1``, ``s1@0.1[0]``), its compensations' aside."""
    return "@" in kill[1] and ":" not in kill[1]


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        yield fake


@pytest.fixture(scope="module")
def model() -> Iterator[MessagesServer]:
    with MessagesServer(chaos_model.ChaosModel(), backlog=128) as srv:
        yield srv


@pytest.fixture(scope="module", autouse=True)
def report_counts() -> Iterator[None]:
    yield
    if STATS["ray_agents"]["dags"]:
        print(f"\nray agent sweep: {STATS['ray_agents']}")


@pytest.mark.ray
def test_agents_on_ray_killed_with_a_turn_answered_end_as_golden(
        ray_address: str, services: FakeServices, model: MessagesServer,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """CI's case: ``RAY_AGENTS`` SIGKILLed at ``RAY_AGENTS_FAULT``; the counts say the rule was
    not checked on nothing (turns durable at the fault, one answer lost with the driver)."""
    before = dict(STATS["ray_agents"])
    sweep_dag(RAY_AGENTS, SEED, 1, "ray", services, model, tmp_path_factory, note=print,
              faults=[RAY_AGENTS_FAULT], group="ray_agents")
    got = {k: v - before.get(k, 0) for k, v in STATS["ray_agents"].items()}
    assert got["faults"] == 1 and got["missed"] == 0 and got["rolled_back"] == 1 and got["raced"] == 0, got
    assert got["durable_turns"] >= 1 and got["lost_turns"] >= 1 and got["model_requests"] >= 2 * 4, got


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not RAY_AGENT_DAGS, reason="the Ray agent sweep runs with RAYSAGA_FULL_SWEEP=1; "
                                               "CI runs test_agents_on_ray_killed_with_a_turn_answered_end_as_golden")
@pytest.mark.timeout(LONG)
@settings(max_examples=RAY_AGENT_DAGS or 1, deadline=None, database=None, phases=[Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(spec=agent_dag_specs(4, 12), seed=st.integers(0, 2**32 - 1))
def test_random_agent_dags_on_ray_faulted_at_agents_end_as_golden(
        spec: dict[str, Any], seed: int, ray_address: str, services: FakeServices, model: MessagesServer,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """The full sweep: random DAGs weighted to agents, faulted 3 in 4 times at an agent's point."""
    sweep_dag(spec, seed, KILLS, "ray", services, model, tmp_path_factory, group="ray_agents", prefer=at_an_agent)

"""One generated DAG through the chaos sweep, and the counts the sweeps print.

``sweep_dag`` runs a spec's golden run, then faults it at points drawn from a seed (or given),
each resumed by a new process and checked against golden (``tests.support.chaos_sweep``). The
random kill sweep (``tests/chaos/test_random_kill_sweep.py``) and the Ray agent sweep
(``tests/chaos/test_ray_agent_sweep.py``) share it; ``STATS`` holds each group's counts.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import note

from raysaga.state import EffectStatus
from tests.support import chaos_flows
from tests.support.chaos_gen import describe
from tests.support.chaos_sweep import Golden, Kill, fault_case, golden_run, pending_rows, planned_calls
from tests.support.kill_sweep import FULL_SWEEP
from tests.support.messages_server import MessagesServer
from tests.support.services import FakeServices

COUNTS = ("dags", "faults", "kills", "raises", "raced", "rolled_back", "agents", "approvals", "rejected",
          "model_requests", "model_repeats", "rests", "abandoned", "golden_abandoned", "missed",
          "agent_fan_outs", "approval_fan_outs", "raising_calls", "model_faults", "ending_agents",
          "faulty_models", "flaky_calls", "gated_calls", "rejected_calls", "edited_calls", "quorum_approvals",
          "answered_approvals", "loop_pauses", "golden_rests", "speculative_agents", "cut_requests",
          "lost_calls", "lost_keys", "durable_turns", "lost_turns", "agent_faults", "tool_calls", "effect_calls",
          "stalled_requests")
GROUPS = ("inline", "ray", "fanned", "ray_fanned", "ending", "ray_ending", "ray_agents")
STATS: dict[str, dict[str, int]] = {group: dict.fromkeys(COUNTS, 0) for group in GROUPS}
#: Of the faults drawn with ``prefer``, how many in four are drawn among the points it accepts.
PREFERRED_IN_FOUR = 3
_counter = itertools.count()


def draw_faults(golden: Golden, seed: int, kills: int,
                prefer: Callable[[Kill], bool] | None = None) -> list[tuple[Kill, str]]:
    """``kills`` distinct reachable points of ``golden`` drawn from ``seed``, each a SIGKILL (3 in 4)
    or a ``raise``; with ``prefer``, 3 in 4 of them among the points ``prefer`` accepts (when
    the golden run passed any)."""
    rng = random.Random(seed)  # from a drawn seed, not from draws that depend on the golden run's shape
    if prefer is None:
        drawn = rng.sample(golden.reachable, min(kills, len(golden.reachable)))
    else:
        drawn = []
        for _ in range(min(kills, len(golden.reachable))):
            left = [k for k in golden.reachable if k not in drawn]
            liked = [k for k in left if prefer(k)]
            drawn.append(rng.choice(liked if liked and rng.randrange(4) < PREFERRED_IN_FOUR else left))
    return [(kill, rng.choice(["kill", "kill", "kill", "raise"])) for kill in drawn]


def sweep_dag(spec: dict[str, Any], seed: int, kills: int, executor: str, services: FakeServices,
              model: MessagesServer, tmp_path_factory: pytest.TempPathFactory,
              note: Callable[[str], None] = note, faults: list[tuple[Kill, str]] | None = None,
              group: str | None = None, prefer: Callable[[Kill], bool] | None = None) -> None:
    """One example: the golden run of ``spec``, then ``kills`` faults drawn from ``seed`` (or
    ``faults``: (point, label) and mode; ``prefer``: as ``draw_faults``); ``note``: where the
    steps are told, a hypothesis note or, outside a hypothesis test, ``print``; ``group``: whose
    counts (default: the executor's)."""
    note(describe(spec))
    note("SPEC " + json.dumps(spec, sort_keys=True))
    folder = tmp_path_factory.mktemp(f"dag{next(_counter)}")
    golden = golden_run(spec, folder, services, executor=executor, model=model)
    note(f"golden: {golden.run['status']}, {len(golden.nodes)} nodes, {len(golden.ledger)} ledger rows, "
         f"compensations {golden.undo_order}, {golden.rests} rests for a decision")
    note("golden steps: " + " ".join(f"{label}={status}" for label, status in sorted(golden.nodes.items())
                                     if "@" not in label and ":" not in label))
    group = group or executor
    stats = STATS[group]
    count(stats, golden)
    if faults is None:
        faults = draw_faults(golden, seed, kills, prefer)
    for i, (kill, mode) in enumerate(faults):
        assert kill in golden.reachable, (kill, golden.reachable)
        note(f"fault {i}: {kill} ({mode})")
        case = folder / f"case{i}"
        case.mkdir()
        race = fault_case(golden, kill, mode, services, case, model=model, stats=stats)
        note(f"fault {i}: nodes that raced the failure: {sorted(race)}")
        stats["faults"] += 1
        stats["raced"] += bool(race)
        stats["kills" if mode == "kill" else "raises"] += 1
        stats["agent_faults"] += "@" in kill[1]
    if FULL_SWEEP:  # a long sweep cut short still tells what it did
        print(f"random kill sweep ({group}) so far: {stats}", flush=True)


def count(stats: dict[str, int], golden: Golden) -> None:
    """Add what ``golden``'s DAG holds (agents, approvals, tools of each kind) to ``stats``."""
    steps = golden.spec["steps"]
    stats["dags"] += 1
    stats["rolled_back"] += golden.run["status"] == "compensated"
    stats["agents"] += sum(s["kind"] == "agent" for s in steps)
    stats["approvals"] += sum(s["kind"] == "approval" for s in steps)
    items = {s["name"]: s.get("items", 0) for s in steps}
    stats["rejected"] += sum(s.get("verdict") == "reject" for s in steps) + sum(
        i < items[s["over"]] for s in steps if s["kind"] == "approval" and "over" in s for i in s["reject_items"])
    stats["agent_fan_outs"] += sum(s["kind"] == "agent" and "over" in s for s in steps)
    stats["approval_fan_outs"] += sum(s["kind"] == "approval" and "over" in s for s in steps)
    stats["raising_calls"] += sum(t in chaos_flows.RAISING for s in steps for turn in s.get("turns", ()) for t in turn)
    agents = [s for s in steps if s["kind"] == "agent"]
    stats["ending_agents"] += sum("end" in s for s in agents)
    stats["faulty_models"] += sum(bool(s.get("model_faults")) for s in agents)
    stats["lost_keys"] += len(planned_calls(golden))
    stats["lost_calls"] += sum(t in chaos_flows.LOST for s in agents for turn in s["turns"] for t in turn)
    stats["flaky_calls"] += sum(t in ("lookup_flaky", "act_flaky") for s in agents for turn in s["turns"] for t in turn)
    stats["gated_calls"] += sum(t == "act_gated" for s in agents for turn in s["turns"] for t in turn)
    stats["rejected_calls"] += sum(len(s.get("reject_calls", ())) for s in agents)
    stats["edited_calls"] += sum(subject.endswith(":edited") for subject in golden.by_subject)  # that ran
    stats["quorum_approvals"] += sum(s["kind"] == "approval" and s.get("quorum", 1) > 1 for s in steps)
    stats["answered_approvals"] += sum(s["kind"] == "approval" and bool(s.get("answer")) for s in steps)
    stats["loop_pauses"] += sum(s.get("end") == "loop_pause" for s in agents)
    stats["golden_rests"] += golden.rests  # for a decision, or paused by an agent's loop
    stats["speculative_agents"] += sum(bool(s.get("speculative")) for s in agents)
    stats["golden_abandoned"] += len(pending_rows(golden.nodes, golden.ledger, EffectStatus.ABANDONED))
    stats["tool_calls"] += sum(len(turn) for s in agents for turn in s["turns"])
    stats["effect_calls"] += sum(t.startswith("act") for s in agents for turn in s["turns"] for t in turn)

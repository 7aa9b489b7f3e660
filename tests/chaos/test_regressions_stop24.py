"""The fourth pass's unexplained Ray failure (``chaos_cfc975a5c7``): an oracle race, not an engine bug.

The random DAG kept in ``tests/chaos/specs/chaos_cfc975a5c7.json``, SIGKILLed at
``after_commit:s22@3[0]`` on Ray, failed ``chaos_sweep.check``'s effective-keys comparison in
about one run in two: ``s16[0]`` (a flaky effect fan-out's retry) and ``s24`` (an effect) were
in flight when ``s36[0]`` failed; the rollback cancelled them (their workers force-killed), and
the run ended with their rows ``pending``, marked ``abandoned``. Whether each request reached
the provider before its worker died hangs on timing: it did in one run and not in the other,
with every node status and ledger row equal. Neither has a compensation, so nothing undoes it
either way; each run sent it at most once. The oracle now allows exactly that difference, on
Ray, for rows ``abandoned`` in both runs (``chaos_sweep.effective_differs``); inline, where
nothing is in flight at a failure, every key must still match.

The replays found the same race for model requests: ``s37@0[1]``, the first turn of an item of a
best-effort agent fan-out, in flight as ``s36[0]`` failed and ``cancelled`` in both runs, reached
the Messages server in the faulted run only (``raise`` at ``after_commit:s22@4[0]``: "s37[1] was
asked other requests than in the golden run"). On Ray such a turn's requests may now differ
(``chaos_sweep.same_requests``); inline they must not. And the DAG's golden runs on Ray met a
model request cut off mid-body (a cancelled item's worker killed while it sent): ``golden_run``
now leaves such requests out as the faulted runs do (``chaos_sweep.model_requests``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.support import chaos_flows, chaos_model
from tests.support.chaos_sweep import Golden, effective_differs, fault_case, golden_run, same_requests
from tests.support.kill_sweep import FULL_SWEEP
from tests.support.messages_server import MessagesServer
from tests.support.services import FakeServices

# the agents' API key, for the drivers and the Ray workers (the session's Ray head inherits it)
os.environ[chaos_flows.KEY_ENV] = chaos_flows.TEST_KEY

SPEC = Path(__file__).parent / "specs" / "chaos_cfc975a5c7.json"
FAULTS = [(("after_commit", "s22@3[0]"), "kill"), (("after_commit", "s22@4[0]"), "raise")]
KILL = FAULTS[0][0]


def golden(ledger: dict[str, tuple[str, str]], effective: set[str]) -> Golden:
    return Golden(spec={"steps": []}, path="", run={}, nodes={}, ledger=ledger,
                  effective=dict.fromkeys(effective, 1), by_subject={}, undo_order=[], completions=[])


LEDGER = {"s16[0]": ("k16", "abandoned"), "s24": ("k24", "abandoned"), "s7": ("k7", "committed")}


def log(effective: set[str]) -> dict[str, Any]:
    return {"effective": dict.fromkeys(effective, 1)}


def test_on_ray_an_abandoned_call_may_take_effect_in_one_run_only() -> None:
    """The failure's case: ``s16[0]`` and ``s24`` effective in the golden run only (and the reverse)."""
    assert effective_differs(golden(LEDGER, {"k16", "k24", "k7"}), LEDGER, log({"k7"}), (), KILL, "ray") \
        == ["s16[0]", "s24"]
    assert effective_differs(golden(LEDGER, {"k7"}), LEDGER, log({"k16", "k7"}), (), KILL, "ray") == ["s16[0]"]
    assert effective_differs(golden(LEDGER, {"k7"}), LEDGER, log({"k7"}), (), KILL, "ray") == []


@pytest.mark.parametrize("executor", ["inline", "ray"])
def test_a_committed_effect_must_take_effect_in_both_runs(executor: str) -> None:
    with pytest.raises(AssertionError, match=r"in golden only \['s7'\]"):
        effective_differs(golden(LEDGER, {"k7"}), LEDGER, log(set()), (), KILL, executor)
    with pytest.raises(AssertionError, match=r"effective here only \['s7'\]"):
        effective_differs(golden(LEDGER, set()), LEDGER, log({"k7"}), (), KILL, executor)


def test_inline_an_abandoned_call_must_match() -> None:
    """Inline nothing is in flight at a failure: an abandoned row's call happened in both runs or in neither."""
    with pytest.raises(AssertionError, match=r"in golden only \['s16\[0\]'\]"):
        effective_differs(golden(LEDGER, {"k16", "k7"}), LEDGER, log({"k7"}), (), KILL, "inline")


def test_a_row_abandoned_in_one_run_only_must_match() -> None:
    """The allowance needs the row ``abandoned`` in both runs (here committed in the faulted one)."""
    mine = {**LEDGER, "s24": ("k24", "committed")}
    with pytest.raises(AssertionError, match=r"effective here only \['s24'\]"):
        effective_differs(golden(LEDGER, {"k7"}), mine, log({"k24", "k7"}), (), KILL, "ray")


def test_a_raced_node_is_left_out() -> None:
    assert effective_differs(golden(LEDGER, {"k7"}), LEDGER, log(set()), ("s7",), KILL, "inline") == []


#: ``s37[1]``, an item of a best-effort agent fan-out, cut off in its first turn by the failure:
#: the turn's node ``cancelled`` in both runs; ``s37[0]`` completed its turn 0 in both.
NODES = {"s37[1]": "running", "s37@0[1]": "cancelled", "s37[0]": "running", "s37@0[0]": "completed",
         "s37@1[0]": "cancelled"}
TURNS = {"q0": "s37@0[0]", "q1": "s37@0[1]", "q2": "s37@1[0]"}


def asked_golden(asked: dict[str, set[str]], nodes: dict[str, str] = NODES) -> Golden:
    gold = golden({}, set())
    gold.nodes, gold.asked, gold.turns = nodes, asked, {k: TURNS[k] for keys in asked.values() for k in keys}
    return gold


def test_on_ray_a_turn_cancelled_in_flight_may_reach_the_model_in_one_run_only() -> None:
    """The second race of the replays: ``s37@0[1]`` asked in the faulted run only (and the reverse)."""
    gold = asked_golden({"s37[0]": {"q0", "q2"}})
    assert same_requests(gold, {"s37[0]": {"q0", "q2"}, "s37[1]": {"q1"}}, TURNS, NODES, (), KILL, "ray") == 1
    gold = asked_golden({"s37[0]": {"q0"}, "s37[1]": {"q1"}})
    assert same_requests(gold, {"s37[0]": {"q0", "q2"}}, TURNS, NODES, (), KILL, "ray") == 2
    assert same_requests(gold, {"s37[0]": {"q0"}, "s37[1]": {"q1"}}, TURNS, NODES, (), KILL, "ray") == 0


def test_inline_a_cancelled_turn_must_match() -> None:
    gold = asked_golden({"s37[0]": {"q0"}})
    with pytest.raises(AssertionError, match=r"s37\[1\] was asked other requests .* here only \['s37@0\[1\]'\]"):
        same_requests(gold, {"s37[0]": {"q0"}, "s37[1]": {"q1"}}, TURNS, NODES, (), KILL, "inline")


def test_a_turn_that_ended_must_match_on_ray() -> None:
    """``s37@0[0]`` completed in both runs: its request was asked in both."""
    gold = asked_golden({"s37[0]": {"q0"}})
    with pytest.raises(AssertionError, match=r"s37\[0\] was asked other requests .* in golden only \['s37@0\[0\]'\]"):
        same_requests(gold, {}, TURNS, NODES, (), KILL, "ray")


def test_a_turn_cancelled_in_one_run_only_must_match() -> None:
    """The allowance needs the turn ``cancelled`` in both runs (here still running in the golden run)."""
    gold = asked_golden({"s37[0]": {"q0"}}, {**NODES, "s37@0[1]": "running"})
    with pytest.raises(AssertionError, match=r"here only \['s37@0\[1\]'\]"):
        same_requests(gold, {"s37[0]": {"q0"}, "s37[1]": {"q1"}}, TURNS, NODES, (), KILL, "ray")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not FULL_SWEEP, reason="a Ray replay of a 39-step DAG: RAYSAGA_FULL_SWEEP=1")
@pytest.mark.timeout(1800)
def test_the_kept_spec_faulted_on_ray_ends_as_golden(ray_address: str, tmp_path_factory: pytest.TempPathFactory
                                                     ) -> None:
    """The kept DAG, faulted where it failed, twice each (before the fixes: 2 of 2 and 1 of 1 failed;
    a golden run that raced past a point, as Ray's may, is reported and that case skipped)."""
    spec = json.loads(SPEC.read_text())
    faulted = 0
    with FakeServices() as services, MessagesServer(chaos_model.ChaosModel(), backlog=128) as model:
        for i in range(2):
            folder = tmp_path_factory.mktemp(f"cfc975a5c7_{i}")
            gold = golden_run(spec, folder, services, executor="ray", model=model)
            for j, (kill, mode) in enumerate(FAULTS):
                if kill not in gold.reachable:
                    print(f"replay {i}: the golden run never passed {kill}")
                    continue
                (folder / f"case{j}").mkdir()
                race = fault_case(gold, kill, mode, services, folder / f"case{j}", model=model)
                print(f"replay {i}: {kill} ({mode}) as golden, raced {sorted(race)}")
                faulted += 1
    assert faulted, "no golden run passed the fault points"

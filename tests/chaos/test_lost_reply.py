"""The oracle's allowance for a lost reply's planned retry (``chaos_record.planned_calls``), unit by unit.

``chaos_flows.act_lost`` is an effect tool whose first attempt calls the provider under the call's
key (the call takes effect) and then raises ``ConnectionError``: the reply was lost. Its retry
re-sends the same key and the provider dedupes, so every run that completes the call sends that
key ``chaos_flows.LOST_CALLS`` (2) times. The oracle (``chaos_oracle.check``) counts a key as
*re-sent* only beyond its planned calls, and counts a call as *returned* at a fault (so the resume
must re-send it once) only when the planned last call had reached the provider. These tests pin
the allowance to exactly those keys and counts; the random sweeps and ``RAY_FANNED`` (in
``test_random_kill_sweep.py``) exercise it on real runs.
"""

from __future__ import annotations

from typing import Any

from tests.support import chaos_flows
from tests.support.chaos_sweep import Golden, planned_calls, returned_calls

SPEC: dict[str, Any] = {"name": "chaos_lost_unit", "steps": [
    {"name": "s0", "kind": "plan", "deps": [], "items": 2},
    {"name": "s1", "kind": "agent", "over": "s0", "deps": ["s0"], "policy": {"kind": "all"},
     "turns": [["act", "act_lost"], ["act_lost"]]},
    {"name": "s2", "kind": "step", "deps": [], "effect": True, "fate": "flaky"},
    {"name": "s3", "kind": "agent", "deps": [], "turns": [["act_flaky", "act_lost"]]},
]}
#: Ledger label -> key: the act_lost calls are s1@0.1[i], s1@1.0[i] and s3@0.1.
LEDGER = {label: (f"k-{label}", "committed") for label in (
    "s1@0.0[0]", "s1@0.1[0]", "s1@1.0[0]", "s1@0.0[1]", "s1@0.1[1]", "s1@1.0[1]", "s2", "s3@0.0", "s3@0.1")}
LOST_LABELS = ("s1@0.1[0]", "s1@1.0[0]", "s1@0.1[1]", "s1@1.0[1]", "s3@0.1")


def golden(ledger: dict[str, tuple[str, str]] = LEDGER) -> Golden:
    return Golden(SPEC, "", {}, {}, ledger, {}, {}, [], [])


def test_only_the_lost_reply_tool_s_keys_are_planned_twice() -> None:
    assert chaos_flows.LOST_CALLS == 2
    assert planned_calls(golden()) == {f"k-{label}": 2 for label in LOST_LABELS}


def test_no_lost_reply_tool_nothing_planned() -> None:
    first = {label: row for label, row in LEDGER.items() if label not in LOST_LABELS}
    assert planned_calls(golden(first)) == {}


def test_a_call_in_the_other_run_only_is_planned_too() -> None:
    """A node that raced a failure may have run in the faulted run only (``chaos_3046f0e762`` on
    Ray: ``s6@0.0[0]`` and others, each sent twice by plan, not in the golden ledger)."""
    first = {label: row for label, row in LEDGER.items() if label not in LOST_LABELS}
    assert planned_calls(golden(first), {"s3@0.1": ("k-s3@0.1", "committed"), "s2": ("k-s2", "committed")}) == \
        {"k-s3@0.1": 2}
    assert returned_calls(golden(first), {"k-s3@0.1"}, {"k-s3@0.1": 1}, {"s3@0.1": ("k-s3@0.1", "pending")}) == set()
    assert returned_calls(golden(first), {"k-s3@0.1"}, {"k-s3@0.1": 1}) == {"k-s3@0.1"}  # unknown: planned once


def test_a_lost_reply_alone_is_not_a_returned_call() -> None:
    """At a fault after the lost reply only (1 call of 2), the resume's call is the planned retry:
    not returned. After the retry's call too (2 of 2), its success was lost: returned, re-sent once."""
    lost = "k-s3@0.1"
    assert returned_calls(golden(), {lost}, {lost: 1}) == set()
    assert returned_calls(golden(), {lost}, {lost: 2}) == {lost}
    assert returned_calls(golden(), {lost}, {}) == set()


def test_any_other_pending_key_returned_once_it_reached_the_provider() -> None:
    plain, flaky = "k-s3@0.0", "k-s2"
    assert returned_calls(golden(), {plain, flaky}, {plain: 1}) == {plain}
    assert returned_calls(golden(), {plain, flaky}, {plain: 1, flaky: 1}) == {plain, flaky}
    assert returned_calls(golden(), set(), {plain: 1, "k-s3@0.1": 2}) == set()  # not pending: durable

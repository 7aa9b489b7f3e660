"""The fault switch (``RAYSAGA_FAULTS``): its grammar, and its ``raise`` and ``stall`` modes on
real driver processes.

- The grammar: ``point:label`` kills (as it always did), ``point:label=raise`` raises
  ``FaultInjected``, ``point:label=stall:S`` blocks S seconds; labels may hold ``:`` and ``[i]``
  (``charge:compensate``, ``work[3]``); a bad point or action is refused; ``raise`` and ``stall``
  fire once; off, the switch is inactive.
- ``raise`` on a driver process (the ``order`` flow, at an effect's every point and at the final
  transition): the driver dies of the exception (exit 1, the traceback names the fault), the run
  stays ``running`` with its lease released at once (no wait for expiry), and a resume ends
  equal to the golden run with one effective call per golden key.
- ``stall`` longer than the lease on a driver process: its heartbeat keeps the lease, so a
  second driver started during the stall backs off (lease held), and the stalled one then
  finishes the run, equal to golden.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raysaga.orchestrator.faults import FaultInjected, Faults
from raysaga.state import EffectStatus, RunStatus, SqlStore
from tests.support import REPO
from tests.support import crash_driver as harness
from tests.support.services import FakeServices

flows = harness.load_flows()
RUN_ID = "fault-modes-1"
TTL = 0.5


def test_grammar_default_kill_raise_and_stall() -> None:
    faults = Faults("after_pending:charge=raise , before_commit:*=stall:0.25,after_commit:a:compensate,"
                    "before_pending:work[3]=kill,before_transition")
    assert faults.active
    assert faults._rules == {("after_pending", "charge"): ("raise", 0.0), ("before_commit", "*"): ("stall", 0.25),
                             ("after_commit", "a:compensate"): ("kill", 0.0),
                             ("before_pending", "work[3]"): ("kill", 0.0), ("before_transition", "*"): ("kill", 0.0)}
    assert not Faults("").active
    for bad in ("after_pendin:x", "after_pending:x=explode", "before_commit:x=stall", "before_commit:x=stall:-1",
                "before_commit:x=stall:soon", "before_commit:x=raise:2"):
        with pytest.raises(ValueError, match="RAYSAGA_FAULTS"):
            Faults(bad)


def test_the_variable_arms_a_default_faults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYSAGA_FAULTS", "after_commit:x=raise")
    assert Faults().active
    monkeypatch.delenv("RAYSAGA_FAULTS")
    assert not Faults().active


def test_raise_fires_once_at_its_first_match() -> None:
    faults = Faults("after_pending:charge=raise,after_commit:*=raise")
    faults.hit("after_pending", ["email"])  # another label: nothing
    faults.hit("before_commit", ["charge"])  # another point: nothing
    with pytest.raises(FaultInjected, match="after_pending:charge") as info:
        faults.hit("after_pending", ["email", "charge"])
    assert (info.value.point, info.value.label) == ("after_pending", "charge")
    assert isinstance(info.value, RuntimeError)
    faults.hit("after_pending", ["charge"])  # fired: disarmed
    with pytest.raises(FaultInjected, match="after_commit:anything"):
        faults.hit("after_commit", ["anything"])
    assert not faults.active  # every rule fired: back to the one-attribute check
    faults.hit("after_commit", ["anything"])


def test_stall_blocks_once_then_goes_on() -> None:
    faults = Faults("before_commit:*=stall:0.3")
    started = time.monotonic()
    faults.hit("before_commit", ["n1"])
    assert time.monotonic() - started >= 0.3
    started = time.monotonic()
    faults.hit("before_commit", ["n1"])
    assert time.monotonic() - started < 0.3


def test_kill_is_the_default_and_kills_the_process() -> None:
    code = "from raysaga.orchestrator.faults import Faults; Faults('after_commit:x').hit('after_commit', ['x']); " \
           "print('survived')"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={k: v for k, v in os.environ.items() if k != "RAYSAGA_FAULTS"})
    assert done.returncode == -signal.SIGKILL and "survived" not in done.stdout, done


# ---------------------------------------------------------------------- on driver processes


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        yield fake


@pytest.fixture(scope="module")
def golden(services: FakeServices, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    db = f"sqlite:///{tmp_path_factory.mktemp('golden') / 'golden.db'}"
    services.reset()
    done = harness.run_driver("order", db, RUN_ID, run_input=flows.sample_input("order", services.url),
                              lease_ttl=TTL)
    assert done.returncode == 0 and done.result is not None, done.describe()
    log = services.log()
    assert list(log["effective"].values()) == [1, 1]
    return {"result": done.result, "keys": set(log["effective"])}


def check_equals_golden(result: dict[str, Any] | None, golden: dict[str, Any], services: FakeServices,
                        store: SqlStore) -> None:
    assert result is not None
    assert (result["status"], result["output"]) == (golden["result"]["status"], golden["result"]["output"])
    log = services.log()
    assert log["effective"] == dict.fromkeys(golden["keys"], 1), log
    assert set(log["raw"]) == golden["keys"]
    assert {e.status for e in store.effects(RUN_ID)} == {EffectStatus.COMMITTED}


RAISES = ["before_pending:charge_card", "after_pending:charge_card", "before_commit:charge_card",
          "after_commit:send_email", "before_transition:*"]


@pytest.mark.parametrize("rule", RAISES)
def test_raise_leaves_a_run_a_resume_finishes(rule: str, services: FakeServices, golden: dict[str, Any],
                                              tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'run.db'}"
    services.reset()
    crashed = harness.run_driver("order", db, RUN_ID, run_input=flows.sample_input("order", services.url),
                                 lease_ttl=TTL, faults=f"{rule}=raise")
    assert crashed.returncode == 1 and crashed.result is None, crashed.describe()
    assert f"FaultInjected: fault injected at {rule}" in crashed.stderr, crashed.describe()
    store = SqlStore(db)
    try:
        run = store.get_run(RUN_ID)
        # an exception, not a death: the driver released its lease on the way out
        assert (run.status, run.lease_owner) == (RunStatus.RUNNING, None), run
        resumed = harness.run_driver("order", db, RUN_ID, resume=True, lease_ttl=TTL)
        assert resumed.returncode == 0, resumed.describe()
        check_equals_golden(resumed.result, golden, services, store)
        raws = services.log()["raw"]
        # the call had returned before the raise only at before_commit: re-issued under its key
        assert sorted(raws.values()) == ([1, 2] if rule.startswith("before_commit") else [1, 1]), raws
    finally:
        store.close()


def test_stall_past_the_lease_keeps_it(services: FakeServices, golden: dict[str, Any], tmp_path: Path) -> None:
    """A stall six leases long: the heartbeat renews, a second driver backs off, the first finishes.

    The second driver is let go only once the lease held when the stall began would have run
    out, and the stored lease has moved on: within its first TTL a lease holds with or without
    a heartbeat, so a driver turned away then says nothing of it."""
    db = f"sqlite:///{tmp_path / 'run.db'}"
    services.reset()
    stall = 6 * TTL
    store = SqlStore(db)
    go = tmp_path / "go"
    # the second driver starts now (its imports overlap the first's) and touches the run on `go`
    second = harness.spawn("order", db, RUN_ID, resume=True, lease_ttl=TTL, go_file=go)
    stalled = harness.spawn("order", db, RUN_ID, run_input=flows.sample_input("order", services.url),
                            lease_ttl=TTL, faults=f"before_commit:charge_card=stall:{stall}")
    try:
        # the stall has begun once the charge reached the provider (its result not yet durable)
        harness.wait_until(lambda: services.log()["raw"], timeout=60, what="the charge to reach the provider")
        first = store.get_run(RUN_ID).lease_expires_at
        assert first is not None
        # the stalled driver's main thread writes nothing now: only its heartbeat moves the lease
        harness.wait_until(lambda: time.time() > first, timeout=10, what="the first lease to run out")
        lease = store.get_run(RUN_ID).lease_expires_at
        assert stalled.poll() is None, "the stall should outlast the first lease"
        assert lease is not None and lease > first, f"the heartbeat did not renew the lease: it ended at " \
                                                   f"{first}, {time.time() - first:.2f}s ago"
        go.touch()
        turned_away = harness.finish(second)
        assert turned_away.returncode == harness.EXIT_LEASE_HELD, turned_away.describe()
        assert stalled.poll() is None, "the second driver should have been turned away during the stall"
        assert [e.status for e in store.effects(RUN_ID)] == [EffectStatus.PENDING]
        done = harness.finish(stalled)
        assert done.returncode == 0, done.describe()
        check_equals_golden(done.result, golden, services, store)
        assert sorted(services.log()["raw"].values()) == [1, 1]
    finally:
        harness.stop(second)
        harness.stop(stalled)
        store.close()

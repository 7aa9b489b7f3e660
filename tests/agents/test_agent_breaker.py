"""Circuit breakers on agent tools: one store row per dependency, shared by every driver.

Unit tests pin the pure transitions (``raysaga.agents.breaker``); the store tests drive real
runs (inline executor) on SQLite and PostgreSQL with a fake clock, so cooldowns pass by
assignment, never by sleeping. Breaker rows are global to a store (not per run) and the
PostgreSQL database is shared by the session: every test names its own dependency.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, RunStatus, Workflow
from raysaga.agents import Agent, BreakerPolicy, ModelResponse, text_reply, tool_reply
from raysaga.agents.breaker import admit, after_call
from raysaga.agents.tools import Tool, tool
from raysaga.orchestrator import Driver, InlineExecutor
from raysaga.state import BreakerRecord, BreakerState, RunRecord, SqlStore
from raysaga.testing import CrashAt, RecordingModel, SimulatedCrash
from tests.support.models import RecordedByConversation

POLICY = BreakerPolicy(threshold=3, cooldown=30.0)
T0 = 1_700_000_000.0

# ---------------------------------------------------------------------- pure transitions


def test_closed_admits_without_a_write() -> None:
    assert admit(BreakerRecord(name="x"), T0, POLICY) == (True, 0.0, None)


def test_failures_below_the_threshold_keep_it_closed_and_a_success_resets_them() -> None:
    record = BreakerRecord(name="x")
    for n in (1, 2):
        record = after_call(record, False, T0 + n, POLICY)
        assert (record.state, record.failures, record.opened_at) == ("closed", n, None)
        assert admit(record, T0 + n, POLICY)[0] is True
    record = after_call(record, True, T0 + 3, POLICY)
    assert (record.state, record.failures) == ("closed", 0)
    # the count is of *consecutive* failures: two more do not open it
    for n in (4, 5):
        record = after_call(record, False, T0 + n, POLICY)
    assert record.state == "closed"


def test_threshold_consecutive_failures_open_it() -> None:
    record = BreakerRecord(name="x")
    for n in range(3):
        record = after_call(record, False, T0 + n, POLICY)
    assert (record.state, record.failures, record.opened_at) == ("open", 3, T0 + 2)


@pytest.mark.parametrize("elapsed", [0.0, 1.0, 29.5])
def test_open_refuses_until_the_cooldown_and_says_how_long(elapsed: float) -> None:
    record = BreakerRecord(name="x", state=BreakerState.OPEN, failures=3, opened_at=T0)
    allowed, wait, change = admit(record, T0 + elapsed, POLICY)
    assert (allowed, change) == (False, None)
    assert wait == pytest.approx(30.0 - elapsed)


def test_after_the_cooldown_one_probe_goes_through_and_others_wait() -> None:
    record = BreakerRecord(name="x", state=BreakerState.OPEN, failures=3, opened_at=T0, version=7)
    allowed, wait, change = admit(record, T0 + 30.0, POLICY)
    assert allowed and wait == 0.0
    assert change is not None and change.state == "half_open" and change.version == 7
    # while the probe is out, a second caller is refused
    allowed2, wait2, change2 = admit(change, T0 + 31.0, POLICY)
    assert (allowed2, change2) == (False, None) and wait2 >= 1.0


def test_probe_success_closes_and_probe_failure_reopens() -> None:
    probing = BreakerRecord(name="x", state=BreakerState.HALF_OPEN, failures=3, opened_at=T0)
    closed = after_call(probing, True, T0 + 31, POLICY)
    assert (closed.state, closed.failures, closed.opened_at) == ("closed", 0, None)
    reopened = after_call(probing, False, T0 + 31, POLICY)
    assert (reopened.state, reopened.opened_at) == ("open", T0 + 31)  # a fresh cooldown from the probe
    assert admit(reopened, T0 + 40, POLICY)[0] is False
    assert admit(reopened, T0 + 61, POLICY)[0] is True


def test_a_lost_probe_does_not_hold_the_breaker_half_open_forever() -> None:
    """A probe's verdict never arrives when its driver dies (or its run is cancelled) mid-call.
    After another cooldown, the next caller probes instead of being refused forever."""
    record = BreakerRecord(name="x", state=BreakerState.OPEN, failures=3, opened_at=T0)
    _, _, probing = admit(record, T0 + 30.0, POLICY)
    assert probing is not None and probing.state == "half_open"
    assert admit(probing, T0 + 45.0, POLICY)[0] is False  # the probe may still be running
    allowed, _, change = admit(probing, T0 + 30.0 + 30.0, POLICY)
    assert allowed and change is not None and change.state == "half_open"
    assert admit(change, T0 + 61.0, POLICY)[0] is False  # and again only one probe at a time


# ---------------------------------------------------------------------- fleet-wide, on a store

#: Tool calls that actually ran; the service's health (the inline executor runs tools here).
CALLS: list[str] = []
SERVICE = {"up": False}
#: The journal every RecordingModel of this module records into, and its requests by conversation.
JOURNAL = "test_agent_breaker"
SEEN = RecordedByConversation(JOURNAL)


@pytest.fixture(autouse=True)
def _reset() -> None:
    CALLS.clear()
    SEEN.clear()
    SERVICE.update(up=False)


def fetch_page(url: str) -> str:
    """Fetch a page from the flaky service."""
    CALLS.append(url)
    if url.startswith("missing"):
        raise LookupError(f"no page {url}")  # a permanent error: the service may be up or down
    if not SERVICE["up"]:
        raise ConnectionError("service unreachable")
    return f"page {url}"


class FakeClock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def fetches(*urls: str) -> list[ModelResponse]:
    return [tool_reply(("fetch", {"url": u})) for u in urls] + [text_reply("done")]


class Fleet:
    """One workflow whose agent guards ``fetch`` with a breaker named for this test; runs are
    driven by a new Driver each (as separate workers would), all on one store and one clock."""

    def __init__(self, url: str, script: dict[str, list[ModelResponse]]) -> None:
        self.url = url
        self.dependency = f"svc-{uuid.uuid4().hex[:8]}"
        fetch: Tool = tool(fetch_page, name="fetch", retry=RetryPolicy(max_attempts=1), breaker=self.dependency)
        model = RecordingModel(journal=JOURNAL, script={f"task: {k}": v for k, v in script.items()})
        agent = Agent(name="reader", model=model, tools=(fetch,), max_turns=10, breaker_threshold=3,
                      breaker_cooldown=30.0)
        self.wf = Workflow("breaker-fleet")

        @self.wf.agent(agent)
        def solve(input: str) -> str:
            return f"task: {input}"

        self.clock = FakeClock()

    def run(self, name: str) -> RunRecord:
        return self.resume(raysaga.create_run(self.wf, name, store=self.url).run_id)

    def resume(self, run_id: str, faults: CrashAt | None = None) -> RunRecord:
        store = SqlStore(self.url)
        try:
            return Driver(self.wf, store, InlineExecutor(), run_id, clock=self.clock, faults=faults).drive()
        finally:
            store.close()

    def breaker(self) -> BreakerRecord:
        store = SqlStore(self.url)
        try:
            return store.breaker_get(self.dependency)
        finally:
            store.close()


def results(conversation: str, turn: int) -> list[dict[str, Any]]:
    """The tool_results the model received in its request for ``turn``."""
    content = SEEN[f"task: {conversation}"][turn][-1]["content"]
    assert isinstance(content, list)
    return content


def assert_unavailable(result: dict[str, Any], seconds: int) -> None:
    assert result["is_error"] is True
    assert result["content"].startswith("the tool is unavailable")
    assert f"try again in about {seconds} s" in result["content"]


def test_breaker_opens_after_threshold_failures_and_the_model_is_told(store_url: str) -> None:
    fleet = Fleet(store_url, {"r1": fetches("a", "b", "c", "d")})
    final = fleet.run("r1")

    assert final.status == RunStatus.COMPLETED, final.error  # the agent carried on without the tool
    assert CALLS == ["a", "b", "c"]  # the 4th call never reached the service
    for turn in (1, 2, 3):
        failed = results("r1", turn)[0]
        assert failed["is_error"] is True and "ConnectionError: service unreachable" in failed["content"]
    assert_unavailable(results("r1", 4)[0], 30)
    record = fleet.breaker()
    assert (record.state, record.failures, record.opened_at) == ("open", 3, T0)


def test_open_breaker_is_seen_by_another_driver_and_a_probe_closes_it(store_url: str) -> None:
    fleet = Fleet(store_url, {"r1": fetches("a", "b", "c"), "r2": fetches("e"), "r3": fetches("f", "g")})
    fleet.run("r1")
    assert fleet.breaker().state == "open"

    SERVICE["up"] = True  # the service is back, but nobody knows yet
    fleet.clock.now = T0 + 10
    assert fleet.run("r2").status == RunStatus.COMPLETED
    assert CALLS == ["a", "b", "c"]  # another run, another driver: still refused
    assert_unavailable(results("r2", 1)[0], 20)

    fleet.clock.now = T0 + 31  # past the cooldown: the next call is the probe
    assert fleet.run("r3").status == RunStatus.COMPLETED
    assert CALLS == ["a", "b", "c", "f", "g"]
    assert results("r3", 1)[0] == {"type": "tool_result", "tool_use_id": "toolu_00_fetch", "content": "page f",
                                   "is_error": False}
    record = fleet.breaker()
    assert (record.state, record.failures, record.opened_at) == ("closed", 0, None)


def test_failed_probe_reopens_for_a_fresh_cooldown(store_url: str) -> None:
    fleet = Fleet(store_url, {"r1": fetches("a", "b", "c"), "r2": fetches("p", "q")})
    fleet.run("r1")
    fleet.clock.now = T0 + 40  # past the cooldown, and the service is still down
    assert fleet.run("r2").status == RunStatus.COMPLETED

    assert CALLS == ["a", "b", "c", "p"]  # the probe went through and failed; "q" was refused
    assert "ConnectionError" in results("r2", 1)[0]["content"]
    assert_unavailable(results("r2", 2)[0], 30)  # a whole new cooldown, from the probe's failure
    record = fleet.breaker()
    assert (record.state, record.opened_at) == ("open", T0 + 40)


def test_a_probe_failing_permanently_frees_its_place_for_the_next_caller(store_url: str) -> None:
    """A probe answered with a permanent error (a 404) gives no verdict on the dependency: the
    breaker stays half-open but the next call probes at once (it waited out another cooldown)."""
    fleet = Fleet(store_url, {"r1": fetches("a", "b", "c"), "r2": fetches("missing-p", "q")})
    fleet.run("r1")
    SERVICE["up"] = True
    fleet.clock.now = T0 + 30
    assert fleet.run("r2").status == RunStatus.COMPLETED

    assert CALLS == ["a", "b", "c", "missing-p", "q"]  # "q" probed; before, it was refused 30 s
    assert "LookupError: no page missing-p" in results("r2", 1)[0]["content"]
    assert results("r2", 2)[0]["content"] == "page q"
    assert fleet.breaker().state == "closed"


def test_a_permanent_failure_neither_opens_nor_resets_a_closed_breaker() -> None:
    record = after_call(BreakerRecord(name="x"), False, T0, POLICY)
    assert after_call(record, None, T0 + 1, POLICY) == record
    opened = BreakerRecord(name="x", state=BreakerState.OPEN, failures=3, opened_at=T0)
    assert after_call(opened, None, T0 + 1, POLICY) == opened


def test_half_open_admits_a_single_probe_among_parallel_calls(store_url: str) -> None:
    both = tool_reply(("fetch", {"url": "x"}), ("fetch", {"url": "y"}))
    fleet = Fleet(store_url, {"r1": fetches("a", "b", "c"), "r2": [both, text_reply("done")]})
    fleet.run("r1")
    SERVICE["up"] = True
    fleet.clock.now = T0 + 30
    assert fleet.run("r2").status == RunStatus.COMPLETED

    assert CALLS == ["a", "b", "c", "x"]  # only the probe ran
    probe, refused = results("r2", 1)
    assert probe["is_error"] is False and probe["content"] == "page x"
    assert refused["is_error"] is True and refused["content"].startswith("the tool is unavailable")
    assert fleet.breaker().state == "closed"


def test_the_refusal_is_durable_as_the_calls_result(store_url: str) -> None:
    """Recorded before the model sees it, so a resumed run replays the refusal, never re-decides it."""
    fleet = Fleet(store_url, {"r1": fetches("a", "b", "c", "d")})
    final = fleet.run("r1")
    store = SqlStore(store_url)
    try:
        rows = {n.node_id: n for n in store.nodes(final.run_id)}
    finally:
        store.close()
    refused = rows["solve@3.0"].output  # turn 3's fetch("d")
    assert refused["unavailable"] is True and refused["is_error"] is True
    assert refused["content"].startswith("the tool is unavailable")
    assert all(rows[f"solve@{t}.0"].status == "failed" for t in (0, 1, 2))


def test_a_probe_lost_with_its_driver_does_not_block_the_fleet_forever(store_url: str) -> None:
    fleet = Fleet(store_url, {"r1": fetches("a", "b", "c"), "r2": fetches("p"), "r3": fetches("z")})
    fleet.run("r1")
    fleet.clock.now = T0 + 30
    r2 = raysaga.create_run(fleet.wf, "r2", store=store_url).run_id
    with pytest.raises(SimulatedCrash):  # the probe was admitted, then its driver died before its verdict
        fleet.resume(r2, CrashAt("before_commit", "solve@0.0"))
    assert fleet.breaker().state == "half_open"
    SERVICE.update(up=True)

    fleet.clock.now = T0 + 40  # the probe could still be out: others wait
    assert fleet.run("r3").status == RunStatus.COMPLETED
    assert CALLS == ["a", "b", "c", "p"]
    assert results("r3", 1)[0]["content"].startswith("the tool is unavailable")

    fleet.clock.now = T0 + 61  # a cooldown after the lost probe: the resumed run probes again
    assert fleet.resume(r2).status == RunStatus.COMPLETED
    assert CALLS == ["a", "b", "c", "p", "p"]
    assert fleet.breaker().state == "closed"

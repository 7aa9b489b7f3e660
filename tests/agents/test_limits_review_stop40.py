"""Rate limits, the I/O pool and resources: the fixes of review stop 40, one test (or a few) per finding.

Model calls go through the real ``anthropic`` SDK to ``tests/support/messages_server.py``; runs
drive a real Ray (the session's cluster) or the inline executor, on a real SQLite store (and
PostgreSQL where the ``store`` fixture has one).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from typing import Any

import anthropic
import pytest
import sqlalchemy

import raysaga
from raysaga import RateLimit, RetryPolicy, Workflow
from raysaga.agents import Agent, AnthropicModel, tool
from raysaga.agents.messages import ModelRequest
from raysaga.errors import InvalidOptionError, WorkflowDefinitionError
from raysaga.node_key import NodeKey
from raysaga.orchestrator import io_pool
from raysaga.orchestrator.agent_io import admit_tool
from raysaga.orchestrator.executor import RayExecutor
from raysaga.orchestrator.executor_base import Executor, Handle
from raysaga.orchestrator.io_pool import IO_CONCURRENCY_ENV, io_concurrency_limit
from raysaga.orchestrator.machine.outbox import AdmitTool
from raysaga.orchestrator.rate_gate import RateGate, rule_of
from raysaga.orchestrator.resources import ResourceRequest
from raysaga.orchestrator.retry import retry_after
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, NodeOutcome
from raysaga.state import BreakerRecord, BreakerState, RunStatus, SqlStore
from tests.support import agent_flows as af
from tests.support import messages_server as ms
from tests.support.store_rows import nodes_of

af.use_test_key()  # Ray workers read the key from the raylet's environment (agent_flows.use_test_key)

HAIKU = "claude-haiku-4-5"
FAST = RetryPolicy(max_attempts=4, base=0.02, cap=0.05)
LIMIT_S = 60.0  # the longest any wait below may take before the test fails
MAX_IO = 4096  # the largest RAYSAGA_IO_CONCURRENCY (io_pool.MAX_IO)


def wait_until(check: Callable[[], Any], what: str) -> Any:
    """Poll ``check`` until it is truthy (``LIMIT_S`` at most); its value."""
    deadline = time.monotonic() + LIMIT_S
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {LIMIT_S} s for {what}")
        time.sleep(0.02)


def grants_of(url: str, name: str) -> list[tuple[int, float | None]]:
    """The limit's grant rows: (id, ended_at), oldest first."""
    return [(int(first), ended) for first, ended in _grant_rows(url, name, "id")]


def spans_of(url: str, name: str) -> list[tuple[float, float | None]]:
    """The limit's grants as (granted_at, ended_at), oldest first."""
    return [(float(first), ended) for first, ended in _grant_rows(url, name, "granted_at")]


def _grant_rows(url: str, name: str, first: str) -> list[tuple[Any, float | None]]:
    engine = sqlalchemy.create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(sqlalchemy.text(f"SELECT {first}, ended_at FROM raysaga_rate_grants WHERE name = :n "
                                                "ORDER BY id"), {"n": name}).fetchall()
        return [(r[0], r[1]) for r in rows]
    finally:
        engine.dispose()


# ------------------------------------------------------------ 1. a cancelled call keeps its concurrency slot


class HeldCalls:
    """A responder that holds the first request of each conversation named in ``held`` until the
    test releases that conversation; every other request is answered at once. Arrivals are noted
    when the responder is entered (the server logs a request only once it is answered)."""

    def __init__(self, *held: str) -> None:
        self.events = {conversation: threading.Event() for conversation in held}
        self.arrivals: list[tuple[str | None, float]] = []
        self.cond = threading.Condition()

    def __call__(self, body: dict[str, Any]) -> ms.Reply:
        conversation = ms.conversation_of(body)
        with self.cond:
            first = all(c != conversation for c, _ in self.arrivals)
            self.arrivals.append((conversation, time.monotonic()))
            self.cond.notify_all()
        if first and conversation in self.events:
            self.events[conversation].wait(LIMIT_S)
        return ms.text(f"{conversation} answered")

    def count(self, conversation: str) -> int:
        with self.cond:
            return sum(1 for c, _ in self.arrivals if c == conversation)

    def release_all(self) -> None:
        for event in self.events.values():
            event.set()


def test_a_timed_out_call_keeps_its_concurrency_slot_until_it_has_stopped(ray_session: str, sqlite_url: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``concurrent=1``: the limited agent's call (A) times out while its I/O pool actor runs
    another call (B), so the actor is only retired and A's thread runs on. Its grant stays held
    (the retry is issued but not admitted) until A has really stopped; once B ends the actor is
    killed, and only then does the retry reach the provider. The grant was released at the
    timeout: the retry ran beside the call it replaced, two calls at once under a limit of one."""
    name = f"stop40-one-{uuid.uuid4().hex[:8]}"
    calls = HeldCalls("A", "B")
    with ms.MessagesServer(calls) as server:
        model = AnthropicModel(HAIKU, base_url=server.base_url, timeout=LIMIT_S)
        # 8 s: the retry goes to a fresh actor (the old one is killed), which a loaded machine may take
        # seconds to start; that time counts against the retry's timeout (a second timeout, a third grant)
        limited = Agent("limited", model, model_timeout=8.0, rate_limit=RateLimit(name=name, concurrent=1),
                        transport_retry=FAST)
        wf = Workflow("stop40-slot", version="1")

        @wf.agent(limited)
        def a(input: int) -> str:
            return "A"

        @wf.agent(Agent("other", model))
        def b(input: int) -> str:
            return "B"

        # one actor of 2 threads: A and B, sent together, share it (a cancel retires, not kills, it);
        # B's end kills it, not the grace (10 s after the retirement, which a loaded machine reached
        # before the check below: the slot was then rightly free, and the test failed)
        monkeypatch.setattr(io_pool, "CANCEL_GRACE_S", 10 * LIMIT_S)
        executor = RayExecutor(address=ray_session, io_concurrency=2)
        box: dict[str, Any] = {}
        runner = threading.Thread(target=lambda: box.update(record=raysaga.run(
            wf, 1, store=sqlite_url, run_id="slot", executor=executor)), daemon=True)
        runner.start()
        try:
            with calls.cond:
                assert calls.cond.wait_for(lambda: len(calls.arrivals) >= 2, LIMIT_S)
            # A timed out: its retry (attempt 2) is issued
            wait_until(lambda: (n := nodes_of(sqlite_url, "slot").get("a@0")) is not None and n.attempt >= 2,
                       "A's first call to time out and its retry to be issued")
            (_, ended), *others = grants_of(sqlite_url, name)
            assert ended is None, "the timed-out call's slot was freed while the call still ran"
            assert others == [] and calls.count("A") == 1  # the retry waits for the slot
            released = time.monotonic()
            calls.events["B"].set()  # B ends: the retired actor is killed, and A's first call with it
            runner.join(LIMIT_S)
        finally:
            calls.release_all()
        record = box["record"]
    assert record.status == RunStatus.COMPLETED, record.status_reason
    retries = [t for c, t in calls.arrivals if c == "A"][1:]
    assert len(retries) == 1 and retries[0] > released  # not beside the call it replaced
    # two grants, or three when the retry's fresh actor took longer to start than its timeout on a
    # loaded machine (that attempt never reached the provider: ``retries`` above): never two at once
    spans = spans_of(sqlite_url, name)
    assert len(spans) in (2, 3) and all(ended is not None for _, ended in spans), spans
    assert all(later[0] >= (earlier[1] or math.inf) for earlier, later in itertools.pairwise(spans)), spans



class _Running(Executor):
    """Calls that are sent and run until the test says they stopped (``stop``)."""

    name = "running"

    def __init__(self) -> None:
        self.running: set[Handle] = set()
        self.cancelled: list[Handle] = []

    def submit(self, spec: StepSpec, call: NodeCall) -> Handle:
        handle = Handle(key=(call.node_id, call.fan_index), sent=True)
        self.running.add(handle)
        return handle

    def wait(self, handles: Collection[Handle] | None, timeout: float) -> list[Handle]:
        return []

    def cancel(self, handle: Handle) -> None:
        self.cancelled.append(handle)  # a request: the call runs on until ``stop``

    def stopped(self, handle: Handle) -> bool:
        return handle not in self.running

    def stop(self, handle: Handle) -> None:
        self.running.discard(handle)


def _limited_spec(name: str) -> StepSpec:
    wf = Workflow("stop40_gate")

    @wf.step()
    def call() -> int:
        return 1

    return dataclasses.replace(wf.steps["call"], rate_limit=RateLimit(name=name, concurrent=1), timeout=5.0)


def _call(node: str) -> NodeCall:
    return NodeCall(fields=("run", node, -1, 1, "trace", None, False), kwargs={}, max_output_bytes=1 << 20)


@pytest.mark.parametrize("settle", [False, True], ids=["next-wait", "settled"])
def test_a_cancelled_call_frees_its_slot_only_once_the_executor_saw_it_stop(sqlite_url: str, settle: bool) -> None:
    """A pause or a run's cancel is a cancel too: the slot goes to the next call only once the
    executor says the cancelled one stopped, at the gate's next wait or when it settles."""
    now = [1_000_000.0]
    name = f"stop40-gate-{uuid.uuid4().hex[:8]}"
    store = SqlStore(sqlite_url)
    try:
        inner = _Running()
        gate = RateGate(inner, store, clock=lambda: now[0])
        spec = _limited_spec(name)
        first = gate.submit(spec, _call("first"))
        second = gate.submit(spec, _call("second"))
        assert first.sent and not second.sent
        gate.cancel(first)  # a timeout, a pause, a cancel: the call is asked to stop, and runs on
        ((_, ended),) = grants_of(sqlite_url, name)
        assert ended is None, "the slot was freed at the cancel, while the call still ran"
        now[0] += 1.0
        gate.wait(None, 0.0)
        assert not second.sent  # it still runs: its slot is still held
        (running,) = inner.cancelled
        inner.stop(running)
        if settle:
            gate.settle_cancelled(0.0)
            ((_, ended),) = grants_of(sqlite_url, name)
            assert ended == now[0]
        gate.wait(None, 0.0)  # the slot it freed is asked for at once, not after the poll
        assert second.sent
    finally:
        store.close()


# ------------------------------------------------------------ 2. resource amounts below Ray's precision


def test_an_amount_finer_than_ray_counts_is_refused_when_the_step_is_declared() -> None:
    """Ray counts resources in units of 0.0001 and refuses a fraction below one at submit: found
    there, after the run began, it crashed the driver. Refused here, naming the step and value."""
    wf = Workflow("stop40-fine", version="1")
    for options in ({"num_cpus": 1e-9}, {"num_cpus": 0.00005}, {"num_gpus": 0.00009}, {"resources": {"x": 1e-7}}):
        with pytest.raises(WorkflowDefinitionError, match=r"step 'tiny': .*=.*e-0\d is finer than Ray counts.*0\.0001"):
            @wf.step(**options)
            def tiny(input: int) -> int:
                return input

    @wf.step(num_cpus=0.0001, resources={"x": 0})  # one unit, and none, are fine
    def unit(input: int) -> int:
        return input

    assert wf.steps["unit"].resources == ResourceRequest(num_cpus=0.0001, custom=(("x", 0.0),))


def test_a_request_ray_refuses_at_submit_fails_the_node_not_the_driver(ray_session: str, sqlite_url: str) -> None:
    """A request that passed the definition's checks but that Ray's own refuse (a spec made by
    hand, a rule of a newer Ray): the node fails permanently, naming Ray's reason. It raised in
    the driver once the run's row was made: the run stayed ``running`` and every resume crashed."""
    wf = Workflow("stop40-refused", version="1")

    @wf.step(num_cpus=0.5)
    def step(input: int) -> int:
        return input + 1

    wf.steps["step"] = dataclasses.replace(wf.steps["step"], resources=ResourceRequest(num_cpus=0.00005))
    record = raysaga.run(wf, 1, store=sqlite_url, run_id="refused", executor="ray", address=ray_session)
    assert record.status == RunStatus.FAILED, record.status_reason
    node = nodes_of(sqlite_url, "refused")["step"]
    assert node.error is not None and node.error.type == "InvalidOptionError" and not node.error.transient
    message = node.error.message or ""
    assert "step 'step'" in message and "0.0001" in message and node.attempt == 1


# ------------------------------------------------------------ 3. inline: a 429 holds the rest of the queue


def _limited_askers(base_url: str, name: str) -> Workflow:
    """``plan`` (``input`` items) -> an agent mapped over them, each asking once under one limit of
    its own (100 requests a minute), which a provider's 429 blocks."""
    agent = Agent("asker", AnthropicModel(HAIKU, base_url=base_url, timeout=10.0),
                  rate_limit=RateLimit(name=f"{name}-{uuid.uuid4().hex[:8]}", requests=100), transport_retry=FAST)
    wf = Workflow(name, version="1")

    @wf.step()
    def plan(input: int) -> list[int]:
        return list(range(input))

    @wf.agent(agent, map_over="plan")
    def ask(plan: int) -> str:
        return f"q{plan}"

    return wf


def test_an_inline_429_blocks_the_limit_before_the_next_call_is_admitted(sqlite_url: str) -> None:
    """Inline, each call runs as it is admitted. The first answer is a 429 with ``retry-after: 2``:
    no other call of the limit reaches the provider in those 2 seconds. The whole queue used to be
    admitted, and sent, before any outcome was read: 5 requests in ~50 ms, all refused."""
    hold = 2
    first = [ms.fault(429, retry_after=hold)]
    with ms.MessagesServer(lambda body: first.pop() if first else ms.text("ok")) as server:
        wf = _limited_askers(server.base_url, "stop40-inline-429")
        record = raysaga.run(wf, 5, store=sqlite_url, run_id="inline-429", executor="inline")
        log = server.requests
    assert record.status == RunStatus.COMPLETED, record.status_reason
    refused, *rest = log
    assert refused.status == 429 and len(rest) == 5  # each agent answered once; the refused one retried
    assert all(r.arrived >= refused.arrived + hold for r in rest), [round(r.arrived - refused.arrived, 3) for r in rest]


def test_a_run_whose_calls_all_wait_on_a_blocked_limit_rests_and_lets_go_of_its_driver(sqlite_url: str) -> None:
    """A 429 with ``retry-after`` longer than ``release_after`` blocks the limit: every other call
    waits at the gate, unsent, and the driver used to hold the run (its lease, a worker's slot)
    for the whole block. The run now rests ``waiting_timer`` until the block ends, having sent
    nothing more; taken up again, each call is sent once and the run completes."""
    hold = 3
    first = [ms.fault(429, retry_after=hold)]
    with ms.MessagesServer(lambda body: first.pop() if first else ms.text("ok")) as server:
        wf = _limited_askers(server.base_url, "stop40-gate-rest")
        options = raysaga.RunOptions(release_after=0.5)
        record = raysaga.run(wf, 3, store=sqlite_url, run_id="gate-rest", executor="inline", options=options)
        assert record.status == RunStatus.WAITING_TIMER, record.status_reason
        assert record.status_reason is not None and "rate limit" in record.status_reason
        assert record.wake_at is not None and record.wake_at >= server.requests[0].arrived + hold - 0.5
        assert [r.status for r in server.requests] == [429]  # nothing else was sent while blocked
        record = wait_until(lambda: (r := raysaga.resume(wf, "gate-rest", store=sqlite_url, executor="inline",
                                                         options=options)).status == RunStatus.COMPLETED and r,
                            "the run to complete once the block ended")
        log = server.requests
    refused, *rest = log
    assert len(rest) == 3 and all(r.status == 200 for r in rest)  # each agent asked once; the refused one again
    assert all(r.arrived >= refused.arrived + hold for r in rest), [round(r.arrived - refused.arrived, 3) for r in rest]
    assert record.output == {"ask": ["ok", "ok", "ok"]}


# ------------------------------------------------------------ 4. one name, one rule


def _asking(agent: Agent, name: str) -> Workflow:
    wf = Workflow(name, version="1")

    @wf.agent(agent)
    def ask(input: str) -> str:
        return input

    return wf


def test_two_rules_under_one_name_are_refused_when_the_workflow_is_validated() -> None:
    """An agent's model calls at 2 a minute and its tool at 100 a second, both named "api": one
    limit by the docs, two rules in the store, each undoing the other. Refused, naming both; the
    same rule declared twice (two equal objects) is one limit and fine."""
    @tool(rate_limit=RateLimit(name="api", requests=100, per=1.0))
    def lookup(q: str) -> str:
        """Look something up."""
        return q

    @tool(rate_limit=RateLimit(name="api", requests=2))
    def fetch(q: str) -> str:
        """Fetch something."""
        return q

    with pytest.raises(WorkflowDefinitionError) as raised:
        _asking(Agent("asker", AnthropicModel(HAIKU), tools=(lookup,), rate_limit=RateLimit(name="api", requests=2)),
                "stop40-one-name").validate()
    message = str(raised.value)
    assert "rate limit 'api' has two rules" in message
    assert "agent 'asker'" in message and "tool 'lookup'" in message and "per=1.0" in message and "per=60.0" in message
    _asking(Agent("asker", AnthropicModel(HAIKU), tools=(fetch,), rate_limit=RateLimit(name="api", requests=2)),
            "stop40-shared").validate()


def test_a_shorter_window_does_not_delete_the_grants_a_longer_one_counts(store: SqlStore) -> None:
    """Two workflows on one store declare one name with different windows (validation cannot see
    both): the 1 s rule's admission deleted the grants the 60 s rule still counted, and the 60 s
    rule then admitted a third call within its minute."""
    name = f"stop40-api-{uuid.uuid4().hex[:8]}"
    per_minute = rule_of(RateLimit(name=name, requests=2, per=60.0))
    per_second = rule_of(RateLimit(name=name, requests=100, per=1.0))
    t0 = time.time()
    for i in range(2):
        admitted = store.rate_acquire(per_minute, t0 + i, 60).grant
        assert admitted is not None
        store.rate_release(admitted, 0, t0 + i + 0.1)
    assert store.rate_acquire(per_minute, t0 + 2, 60).grant is None
    other = store.rate_acquire(per_second, t0 + 10, 60).grant
    assert other is not None
    store.rate_release(other, 0, t0 + 10.1)
    refused = store.rate_acquire(per_minute, t0 + 11, 60)
    assert refused.grant is None and refused.wait > 40


# ------------------------------------------------------------ 5. the I/O pool's size and its actors


@pytest.mark.parametrize("value", ["100000", str(MAX_IO + 1), "+8", "1_000", "\u0668"])
def test_io_concurrency_is_bounded_and_plain(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv(IO_CONCURRENCY_ENV, value)
    with pytest.raises(InvalidOptionError, match=f"{IO_CONCURRENCY_ENV} must be a whole number .* to 4096"):
        io_concurrency_limit()


def test_the_largest_io_concurrency_is_accepted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(IO_CONCURRENCY_ENV, str(MAX_IO))
    assert io_concurrency_limit() == MAX_IO
    with pytest.raises(InvalidOptionError, match="io_concurrency must be a whole number"):
        io_concurrency_limit(100_000)


@pytest.fixture
def big_pool_executor(ray_session: str) -> Iterator[RayExecutor]:
    executor = RayExecutor(address=ray_session, io_concurrency=160)  # up to 5 actors; no other test uses 160
    yield executor
    executor.io_pool.shutdown()  # its actors are this test's


def test_the_pool_spawns_actors_as_calls_need_them(big_pool_executor: RayExecutor, sqlite_url: str) -> None:
    """io_concurrency=160 is 5 actors of 32 threads: a run of one call started 2, and 70 calls sent
    together one more (70 threads); every one of the 5 was started at the first call."""
    pool = big_pool_executor.io_pool
    wf = Workflow("stop40-pool", version="1")

    @wf.step(io_bound=True)
    def one(input: int) -> int:
        return input

    record = raysaga.run(wf, 1, store=sqlite_url, run_id="pool-1", executor=big_pool_executor)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert len(pool.actors()) == 2

    wide = Workflow("stop40-pool-wide", version="1")

    @wide.step()
    def plan(input: int) -> list[int]:
        return list(range(input))

    @wide.map("plan", io_bound=True)
    def item(plan: int) -> int:
        return plan

    record = raysaga.run(wide, 70, store=sqlite_url, run_id="pool-70", executor=big_pool_executor)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert len(pool.actors()) == math.ceil(70 / 32)


# ------------------------------------------------------------ 6. a breaker under contention fails closed


class ContendedStore(SqlStore):
    """Another driver rewrites the breaker's row just before each compare-and-set of this one
    (counting its own calls' outcomes, the state left as it was): every CAS here loses."""

    def breaker_cas(self, record: BreakerRecord, expected_version: int) -> bool:
        current = self.breaker_get(record.name)
        assert super().breaker_cas(current, current.version)  # the other driver's write: version + 1
        return super().breaker_cas(record, expected_version)


def test_a_breaker_whose_cas_keeps_losing_refuses_the_call(sqlite_url: str) -> None:
    """Open, its cooldown over: the caller would be the probe, but every compare-and-set loses.
    ``admit_tool`` said "may go out" after 5 lost tries: a call through an open breaker that was
    not its probe. Now it is refused for the moment, and the row is left as the others made it."""
    store = ContendedStore(sqlite_url)
    try:
        name = f"stop40-dep-{uuid.uuid4().hex[:8]}"
        assert SqlStore.breaker_cas(store, BreakerRecord(name=name, state=BreakerState.OPEN, failures=9,
                                                         opened_at=time.time() - 60), 0)  # uncontended
        query = AdmitTool(key=NodeKey("agent", turn=1, call=0), breaker=name, threshold=5, cooldown=30.0)
        answer = admit_tool(store, query, time.time())
        assert answer is not None and "try again in a moment" in answer
        assert store.breaker_get(name).state == BreakerState.OPEN  # nobody took the probe here
    finally:
        store.close()


# ------------------------------------------------------------ 7. model options and retry-after


@pytest.mark.parametrize("timeout", ["abc", -5, 0, math.nan, math.inf, True, None])
def test_a_bad_model_timeout_is_refused_when_the_model_is_made(timeout: Any) -> None:
    with pytest.raises(InvalidOptionError, match=r"AnthropicModel\('claude-haiku-4-5'\)\.timeout must be"):
        AnthropicModel(HAIKU, timeout=timeout)


@pytest.mark.parametrize("base_url", [123, "not a url", "", "ftp://host", "http://host:99999"])
def test_a_bad_base_url_is_refused_when_the_model_is_made(base_url: Any) -> None:
    with pytest.raises(InvalidOptionError, match=r"\.base_url must be None .* or an http\(s\) URL"):
        AnthropicModel(HAIKU, base_url=base_url)


def _refused_with(headers: dict[str, str]) -> BaseException:
    """What the real SDK raises for an overloaded answer (529: ``fault`` adds no ``retry-after``
    of its own, as it does to a 429) carrying ``headers``, from the local Messages server."""
    with ms.MessagesServer(lambda body: ms.fault(529, headers=headers)) as server:
        model = AnthropicModel(HAIKU, base_url=server.base_url, timeout=10.0)
        with pytest.raises(anthropic.APIStatusError) as raised:
            model.complete(ModelRequest(model=HAIKU, messages=[{"role": "user", "content": "hi"}]))
    return raised.value


#: A provider's headers, and the seconds raysaga reads from them (None: ignored, the backoff decides).
RETRY_AFTER_CASES: list[tuple[dict[str, str], float | None]] = [
    ({"retry-after-ms": "garbage", "retry-after": "7"}, 7.0),  # a bad -ms hid a good retry-after
    ({"retry-after-ms": "-1", "retry-after": "7"}, 7.0),
    ({"retry-after-ms": "1500", "retry-after": "7"}, 1.5),
    ({"retry-after": "1_000"}, None),  # float() read 1000 s
    ({"retry-after": "-5"}, None),
    ({"retry-after": "nan"}, None),
    ({"retry-after": " 7 "}, 7.0),
]


def test_retry_after_is_read_strictly() -> None:
    read = []
    for headers, _ in RETRY_AFTER_CASES:
        exc = _refused_with(headers)
        outcome = NodeOutcome.failure(exc, transient=True, started_at=0.0)
        assert (outcome.error or {}).get("retry_after") == retry_after(exc)
        read.append((headers, retry_after(exc)))
    assert read == RETRY_AFTER_CASES

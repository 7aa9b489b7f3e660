"""I/O-bound attempts on Ray run in threads of the executor's I/O pool, not as one-CPU tasks.

- concurrency beyond the CPUs: 40 ``io_bound`` items on the session's 2-CPU cluster all wait at
  once on a barrier (a local HTTP server that answers nobody before 40 requests are in flight);
  with ``io_concurrency=4`` no more than 4 are ever in flight, and 4 are;
- an agent's model calls (the real ``anthropic`` SDK against ``tests/support/messages_server.py``) run in
  the pool by default and each turn is still checkpointed, no request repeated;
- a pool actor SIGKILLed mid-effect: the attempt is a transient failure, retried under the same
  idempotency key; the provider sees the key twice and one effective charge;
- a node timeout on an ``io_bound`` step: its actor process is killed (a thread cannot be), the
  attempt is retried and exhausted, and every process that ran it exits.

No timing: every wait is on a condition (a barrier, a file, a process's exit) with a generous bound.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast

import pytest

import raysaga
from raysaga import RetryPolicy, RunStatus, StepContext, Workflow
from raysaga.agents import Agent, AnthropicModel
from raysaga.orchestrator.executor import RayExecutor
from raysaga.state import EffectStatus, NodeStatus, SqlStore
from tests.support import agent_flows as af
from tests.support import crash_driver as harness
from tests.support import messages_server as ms
from tests.support import services as fs  # the deduping fake provider
from tests.support.stuck_io import stuck_io_workflow

pytestmark = pytest.mark.ray

af.use_test_key()  # the pool's actors, like Ray workers, read the key from the raylet's environment

#: Seconds a barrier (or a blocked step) waits before giving up: never reached when the test passes.
LIMIT = 120.0


@pytest.fixture(scope="module", autouse=True)
def _pickle_this_module_by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    # the agent flow's tools and the fake provider's client travel by value too: the session's
    # workers cannot import tests/ helpers nor ``examples`` (where the provider is defined)
    cloudpickle.register_pickle_by_value(af)
    cloudpickle.register_pickle_by_value(fs)
    cloudpickle.register_pickle_by_value(sys.modules[fs.post.__module__])


# ---------------------------------------------------------------------- a barrier across processes


class Barrier:
    """An HTTP server whose ``GET /`` answers only once ``parties`` requests have arrived.

    It counts the requests in flight and keeps the most seen at once. A request still waiting
    after ``LIMIT`` seconds gets a 504 (the step then fails, and so does the test)."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.arrived = 0
        self.in_flight = 0
        self.most = 0
        self._open = threading.Event()
        self._lock = threading.Lock()
        barrier = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with barrier._lock:
                    barrier.arrived += 1
                    barrier.in_flight += 1
                    barrier.most = max(barrier.most, barrier.in_flight)
                    if barrier.arrived >= barrier.parties:
                        barrier._open.set()
                opened = barrier._open.wait(LIMIT)
                with barrier._lock:
                    barrier.in_flight -= 1
                body = json.dumps({"open": opened}).encode()
                self.send_response(200 if opened else 504)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> Barrier:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._open.set()
        self._server.shutdown()
        self._server.server_close()


def _barrier_flow(name: str) -> Workflow:
    wf = Workflow(name)

    @wf.step()
    def plan(input: dict[str, Any]) -> list[str]:
        return [input["url"]] * input["n"]

    @wf.map("plan", io_bound=True, retry=RetryPolicy(max_attempts=1))
    def call(plan: str) -> dict[str, Any]:
        import ray

        with urllib.request.urlopen(plan, timeout=LIMIT + 30) as reply:
            assert json.loads(reply.read())["open"]
        ctx = ray.get_runtime_context()
        return {"actor": ctx.get_actor_id(), "pid": os.getpid()}

    @wf.step()
    def summary(call: list[dict[str, Any]]) -> dict[str, int]:
        return {"items": len(call), "actors": len({c["actor"] for c in call}), "no_actor": sum(
            1 for c in call if c["actor"] is None)}

    return wf


def test_io_bound_fan_out_runs_40_calls_at_once_on_2_cpus(ray_session: str, sqlite_url: str) -> None:
    import ray

    resources = cast(dict[str, float], ray.cluster_resources())  # type: ignore[no-untyped-call]
    assert resources.get("CPU") == 2  # the session's cluster: 40 at once needs the pool
    with Barrier(parties=40) as barrier:
        record = raysaga.run(_barrier_flow("io-barrier"), {"url": barrier.url, "n": 40}, store=sqlite_url,
                             executor="ray", address=ray_session)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert barrier.most == 40
    summary = record.output["summary"]
    assert summary["items"] == 40 and summary["no_actor"] == 0  # every item ran in a pool actor's thread
    store = SqlStore(sqlite_url)
    try:
        items = [n for n in store.nodes(record.run_id) if n.node_id == "call" and n.fan_index >= 0]
    finally:
        store.close()
    assert [(n.status, n.attempt) for n in items] == [(NodeStatus.COMPLETED, 1)] * 40  # each one checkpointed


def test_io_concurrency_bounds_the_calls_in_flight(ray_session: str, sqlite_url: str) -> None:
    executor = RayExecutor(address=ray_session, io_concurrency=4)
    assert executor.io_pool.concurrency == 4
    with Barrier(parties=4) as barrier:
        record = raysaga.run(_barrier_flow("io-bounded"), {"url": barrier.url, "n": 12}, store=sqlite_url,
                             executor=executor)
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert barrier.arrived == 12
    assert barrier.most == 4  # at least 4 (the barrier opened) and never more (the limit)


# ---------------------------------------------------------------------- an agent's model calls


@dataclass(frozen=True)
class ProbeModel(AnthropicModel):
    """``AnthropicModel`` that also notes where each call ran (the pool actor's id, or None)."""

    probe_dir: str = ""

    def complete(self, request: Any) -> Any:
        import ray

        actor = ray.get_runtime_context().get_actor_id()
        Path(self.probe_dir, f"{uuid.uuid4().hex}.json").write_text(json.dumps({"actor": actor}))
        return super().complete(request)


def test_agent_model_calls_run_in_the_pool_and_each_turn_is_checkpointed(
        ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    probes = tmp_path / "probes"
    probes.mkdir()
    with ms.MessagesServer(af.reply_for) as srv, fs.FakeServices() as services:
        model = ProbeModel(af.MODEL, base_url=srv.base_url, timeout=30.0, api_key_env=af.KEY_ENV,
                           probe_dir=str(probes))
        agent = Agent("researcher", model, system="You are a careful research assistant.",
                      tools=(af.search, af.file_report_tool(services.url)), output_type=af.Finding,
                      transport_retry=af.FAST_TRANSPORT, max_turns=6)
        wf = Workflow("io-agent")

        @wf.agent(agent)
        def research(input: str) -> str:
            return input

        record = raysaga.run(wf, f"Research {af.TOPIC}. Search first, file one report, then answer in JSON.",
                             store=sqlite_url, executor="ray", address=ray_session)
        requests = srv.requests
        repeated = srv.repeated_requests()
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert len(requests) == 3 and repeated == []
    seen = [json.loads(p.read_text())["actor"] for p in probes.iterdir()]
    assert len(seen) == 3 and all(seen), seen  # each model call ran in an actor (the pool), not a task
    store = SqlStore(sqlite_url)
    try:
        rows = {n.label: n for n in store.nodes(record.run_id)}
    finally:
        store.close()
    for turn in ("research@0", "research@1", "research@2"):  # every model response is its own checkpoint
        assert rows[turn].status == NodeStatus.COMPLETED and rows[turn].output["content"], turn
    for call in ("research@0.0", "research@1.0"):  # and every tool call
        assert rows[call].status == NodeStatus.COMPLETED, call


# ---------------------------------------------------------------------- a pool actor killed mid-effect


def _killed_actor_flow() -> Workflow:
    wf = Workflow("io-actor-kill")

    @wf.step(effect=True, io_bound=True, retry=RetryPolicy(max_attempts=4, base=0.05, cap=0.2))
    def charge(ctx: StepContext, input: dict[str, str]) -> str:
        import ray

        assert ctx.idempotency_key is not None
        reply = fs.post(input["services_url"], "charge", ctx.idempotency_key, {"order_id": "io-1"})
        if ctx.attempt == 1:  # the charge took effect; now die before the result reaches the driver
            control = Path(input["control"])
            actor = ray.get_runtime_context().get_actor_id()
            (control / "pid.tmp").write_text(json.dumps({"pid": os.getpid(), "key": ctx.idempotency_key,
                                                         "actor": actor}))
            (control / "pid.tmp").rename(control / "pid")
            deadline = time.monotonic() + LIMIT
            while not (control / "release").exists() and time.monotonic() < deadline:
                time.sleep(0.05)  # blocked until the test kills this process
        return str(reply["id"])

    return wf


def test_a_killed_pool_actor_is_a_transient_failure_retried_with_the_same_key(
        ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    result: dict[str, Any] = {}
    with fs.FakeServices() as services:
        def drive() -> None:
            try:
                result["record"] = raysaga.run(_killed_actor_flow(), {"services_url": services.url,
                                                                      "control": str(control)},
                                               store=sqlite_url, executor="ray", address=ray_session)
            except BaseException as exc:  # surfaced by the assertion below
                result["error"] = exc

        driver = threading.Thread(target=drive, daemon=True)
        driver.start()
        try:
            harness.wait_until(lambda: (control / "pid").exists() or not driver.is_alive(), timeout=LIMIT,
                               what="the effect's pool actor to report its pid")
            assert driver.is_alive(), (result.get("record") or result).__repr__()[-1500:]
            probe = json.loads((control / "pid").read_text())
            assert probe["actor"] and probe["pid"] != os.getpid()  # a pool actor, not the driver
            assert services.log()["raw"] == {probe["key"]: 1}
            os.kill(probe["pid"], signal.SIGKILL)
            driver.join(LIMIT)
        finally:
            (control / "release").touch()
        log = services.log()
    assert not driver.is_alive() and "error" not in result, result
    record = result["record"]
    assert record.status == RunStatus.COMPLETED, record.status_reason
    key = probe["key"]
    assert log["raw"] == {key: 2} and log["effective"] == {key: 1}  # the same key re-issued, charged once
    store = SqlStore(sqlite_url)
    try:
        retries = [e for e in store.events(record.run_id) if e.kind == "retry_scheduled"]
        node = {n.label: n for n in store.nodes(record.run_id)}["charge"]
        effects = store.effects(record.run_id)
    finally:
        store.close()
    assert [(e.node_id, e.data["attempt"]) for e in retries] == [("charge", 1)]
    error = retries[0].data["error"]
    assert error["transient"] is True and "Actor" in error["type"], error
    assert (node.status, node.attempt) == (NodeStatus.COMPLETED, 2)
    assert [(e.idempotency_key, e.status) for e in effects] == [(key, EffectStatus.COMMITTED)]


# ---------------------------------------------------------------------- a node timeout


def test_an_io_bound_timeout_kills_the_actor_running_it(ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    wf = stuck_io_workflow("io-slow")

    record = raysaga.run(wf, str(pids), store=sqlite_url, executor="ray", address=ray_session)
    assert record.status == RunStatus.FAILED
    store = SqlStore(sqlite_url)
    try:
        node = next(n for n in store.nodes(record.run_id) if n.node_id == "stuck")
    finally:
        store.close()
    assert (node.status, node.attempt) == (NodeStatus.FAILED, 2)
    assert node.error is not None
    assert node.error["type"] == "TimeoutError" and node.error["reason"] == "2 attempts exhausted"
    ran = [int(p) for p in pids.read_text().split()]
    assert len(ran) == 2 and os.getpid() not in ran
    # the thread could not be stopped: the actor process hosting it was killed, by the driver itself
    # on this host, not only through its raylet, which a loaded host can starve past this wait
    # (test_io_pool_kill_stalled_raylet.py); the exit is seen a moment after the death is reported
    for pid in ran:
        harness.wait_until(partial(harness.process_gone, pid), timeout=30, what=f"process {pid} to exit")


# ---------------------------------------------------------------------- a run stopped mid-call


def test_a_failed_run_stops_its_io_bound_calls_before_it_is_recorded(
        ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    """Item 0 fails for good once its siblings block in the pool: the run fails, and before the
    driver records that it settles the cancelled calls, so the actors running them are killed
    (a thread cannot be stopped): no sibling is still running when ``raysaga.run`` returns."""
    wf = Workflow("io-stop")

    @wf.step()
    def plan() -> list[int]:
        return list(range(6))

    @wf.map("plan", io_bound=True)
    def item(input: str, plan: int) -> int:
        folder = Path(input)
        if plan == 0:  # fails once its 5 siblings are surely running
            deadline = time.monotonic() + LIMIT / 4
            while len(list(folder.glob("started-*"))) < 5 and time.monotonic() < deadline:
                time.sleep(0.02)
            raise raysaga.Permanent("item 0 refused")
        pid_file = (folder / f"started-{plan}")  # written whole, then renamed: a reader never sees it empty
        pid_file.with_name(f".{pid_file.name}").write_text(str(os.getpid()))
        os.replace(pid_file.with_name(f".{pid_file.name}"), pid_file)
        deadline = time.monotonic() + LIMIT
        while not (folder / "gate").exists() and time.monotonic() < deadline:
            time.sleep(0.02)  # the workload: blocks until the gate opens (never, if the kill works)
        return plan

    try:
        record = raysaga.run(wf, str(tmp_path), store=sqlite_url, executor="ray", address=ray_session)
        assert record.status == RunStatus.FAILED, record.status_reason
        assert record.error is not None
        assert record.error["node"] == "item[0]"
        store = SqlStore(sqlite_url)
        try:
            rows = {n.label: n for n in store.nodes(record.run_id)}
        finally:
            store.close()
        assert {rows[f"item[{i}]"].status for i in range(1, 6)} == {NodeStatus.CANCELLED}
        pids = {int(p.read_text()) for p in tmp_path.glob("started-*")}
        assert len(list(tmp_path.glob("started-*"))) == 5 and os.getpid() not in pids
        # settled before the run was recorded failed: every process running a sibling is gone
        # (the exit is seen a moment later than the actor's death is reported to the driver)
        for pid in pids:
            harness.wait_until(partial(harness.process_gone, pid), timeout=30, what=f"process {pid} to exit")
        assert not (tmp_path / "gate").exists()
    finally:
        (tmp_path / "gate").touch()

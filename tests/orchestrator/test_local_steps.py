"""``@wf.step(local=True)``: on Ray, the step runs in the driver's own process, no Ray task.

- where: a local planner and join run in the driver (their pid is the test's), the fan-out's
  items between them in Ray workers;
- a local step is retried like any other (attempt 2 in the driver);
- definition errors for what a local step cannot also take (a timeout, the I/O pool, a resource
  request, a fan-out), naming the step; the flag is placement, out of the definition hash;
- a queued local attempt cancelled before the executor's pump never runs;
- a local effect that SIGKILLs its driver right after its call (tests/support/local_flows.py): the
  ledger's pending row was committed before it ran, so the resume asks ``reconcile=`` and the
  provider is called once;
- a pause asked while a local effect runs: the effect's outcome is absorbed and committed before
  the pause (it was dropped, and the resume charged again), and what finished before the local
  step is committed before it starts;
- a local step that mutates its input gets a private copy: the upstream output stays as stored.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Client, RunStatus, Workflow, WorkflowDefinitionError
from raysaga.orchestrator.executor import RayExecutor
from raysaga.orchestrator.task import NodeCall
from raysaga.state import EffectStatus, NodeStatus, SqlStore
from tests.support import crash_driver as harness
from tests.support import local_flows as lf
from tests.support.services import FakeServices, response_id


@pytest.fixture(scope="module")
def _by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(lf)  # the session's workers need not import tests/


def _declare(**options: Any) -> Callable[[], None]:
    def declare() -> None:
        wf = Workflow("local-bad")

        @wf.step
        def source() -> list[int]:
            return [1]

        @wf.step(**options)
        def glue(source: list[int]) -> int:
            return 0

    return declare


@pytest.mark.parametrize(("options", "said"), [
    ({"local": "yes"}, "local= takes True or False, got 'yes'"),
    ({"local": True, "timeout": 5}, "cannot also take timeout=5"),
    ({"local": True, "io_bound": True}, "cannot also take io_bound=True"),
    ({"local": True, "num_cpus": 2}, "cannot also take num_cpus=2"),
    ({"local": True, "resources": {"special": 1}}, "cannot also take special=1"),
    ({"local": True, "map_over": "source"}, "map_over='source': a fan-out's items run on Ray"),
])
def test_what_a_local_step_cannot_take_is_a_definition_error(options: dict[str, Any], said: str) -> None:
    with pytest.raises(WorkflowDefinitionError) as caught:
        _declare(**options)()
    assert "step 'glue'" in str(caught.value) and said in str(caught.value), str(caught.value)


def test_wf_map_refuses_local_naming_the_glue_to_mark_instead() -> None:
    """``@wf.map`` has no ``local=``: its refusal says why and where local=True goes, not only
    that the option is unknown."""
    wf = Workflow("local-map")

    @wf.step
    def source() -> list[int]:
        return [1]

    with pytest.raises(WorkflowDefinitionError) as caught:
        @wf.map("source", local=True)  # type: ignore[call-arg]
        def each(source: int) -> int:
            return source

    said = str(caught.value)
    assert "step 'each'" in said and "fan-out's items" in said and "the planner it maps over" in said, said


def test_local_is_placement_not_contract() -> None:
    """A run started before a step was made local resumes after (as for ``io_bound``)."""
    def build(local: bool) -> Workflow:
        wf = Workflow("local-hash")

        @wf.step(local=local)
        def one() -> int:
            return 1

        return wf.validate()

    assert build(True).definition_hash == build(False).definition_hash
    assert build(True).steps["one"].local and not build(False).steps["one"].local


@pytest.mark.ray
@pytest.mark.usefixtures("_by_value")
def test_local_steps_run_in_the_driver_and_items_on_ray(ray_session: str, sqlite_url: str) -> None:
    record = raysaga.run(lf.where, 6, store=sqlite_url, executor="ray")
    assert record.status == RunStatus.COMPLETED, record.error
    where = record.output["join"]
    assert where["plan"] == os.getpid() and where["join"] == os.getpid(), where
    assert where["items"] and os.getpid() not in where["items"], where


@pytest.mark.ray
@pytest.mark.usefixtures("_by_value")
def test_a_local_step_is_retried_in_the_driver(ray_session: str, sqlite_url: str) -> None:
    record = raysaga.run(lf.flaky, None, store=sqlite_url, executor="ray")
    assert record.status == RunStatus.COMPLETED, record.error
    assert record.output == {"wobbly": {"attempt": 2, "pid": os.getpid()}}
    store = SqlStore(sqlite_url)
    try:
        retries = [(e.node_id, e.data["attempt"]) for e in store.events(record.run_id) if e.kind == "retry_scheduled"]
    finally:
        store.close()
    assert retries == [("wobbly", 1)]


@pytest.mark.ray
def test_a_local_attempt_cancelled_before_the_pump_never_runs(ray_session: str, tmp_path: Path) -> None:
    ran = tmp_path / "ran"

    wf = Workflow("local-cancel")

    @wf.step(local=True)
    def touch() -> None:
        ran.touch()

    spec = wf.validate().steps["touch"]
    executor = RayExecutor()
    try:
        call = NodeCall(fields=("r-1", "touch", -1, 1, "t-1", None, False), kwargs={}, max_output_bytes=1 << 20)
        handle = executor.submit(spec, call)
        assert not handle.sent and handle.outcome is None  # queued until the round's pump
        executor.cancel(handle)
        executor.pump()
        assert executor.wait(None, 0) == [] and not ran.exists()
        assert executor.stopped(handle)

        again = executor.submit(spec, call)
        executor.pump()
        assert executor.wait(None, 0) == [again] and again.outcome is not None and again.outcome.ok
        assert ran.exists()
    finally:
        executor.shutdown()


@pytest.mark.ray
def test_a_local_effect_killing_its_driver_is_reconciled_not_repeated(ray_address: str, sqlite_url: str) -> None:
    run_id = f"lc-{uuid.uuid4().hex[:8]}"
    flows = "tests.support.local_flows"
    with FakeServices() as services:
        run_input = {"services_url": services.url, "order_id": "lc-1"}
        first = harness.run_driver("charge", sqlite_url, run_id, executor="ray", flows=flows, run_input=run_input,
                                   timeout=180)
        assert first.returncode == -9, first.describe()  # the step's SIGKILL, in the driver's own process
        store = SqlStore(sqlite_url)
        try:
            pending = [(e.node_id, e.status) for e in store.effects(run_id)]
        finally:
            store.close()
        assert pending == [("pay", EffectStatus.PENDING)]  # committed before the local call ran
        (key,) = services.log()["raw"]

        resumed = harness.run_driver("charge", sqlite_url, run_id, executor="ray", flows=flows, resume=True,
                                     timeout=180)
        log = services.log()

    assert resumed.returncode == 0, resumed.describe()
    charge_id = response_id("charge", key)
    assert resumed.result is not None and resumed.result["output"] == {"receipt": f"receipt:{charge_id}"}
    assert log["raw"] == {key: 1} and log["effective"] == {key: 1}  # reconciled: never called again
    store = SqlStore(sqlite_url)
    try:
        effects = [(e.idempotency_key, e.status) for e in store.effects(run_id)]
        nodes = {n.label: n.status for n in store.nodes(run_id)}
    finally:
        store.close()
    assert effects == [(key, EffectStatus.COMMITTED)]
    assert nodes == {"pay": NodeStatus.COMPLETED, "receipt": NodeStatus.COMPLETED}


def _heartbeat_read_signals(client: Client, run_id: str) -> None:
    """Return once the driver's heartbeat has read the run's signals since now: it renews the lease,
    then reads them, each beat; two renewals seen means a read after the first."""
    def renewed_after(after: float) -> float | None:
        expires = client.store.get_run(run_id).lease_expires_at
        return expires if expires is not None and expires > after else None

    base = client.store.get_run(run_id).lease_expires_at or 0.0
    first = harness.wait_until(lambda: renewed_after(base), timeout=60, what="a lease renewal")
    harness.wait_until(lambda: renewed_after(first), timeout=60, what="a second lease renewal")


@pytest.mark.ray
@pytest.mark.usefixtures("_by_value")
def test_a_pause_while_a_local_effect_runs_keeps_its_outcome(ray_session: str, sqlite_url: str,
                                                             tmp_path: Path) -> None:
    control = tmp_path / "control"
    control.mkdir()
    run_id = f"lh-{uuid.uuid4().hex[:8]}"
    ended: list[Any] = []
    with FakeServices() as services:
        run_input = {"services_url": services.url, "control_dir": str(control)}
        driver = threading.Thread(target=lambda: ended.append(raysaga.run(
            lf.held, run_input, store=sqlite_url, run_id=run_id, executor="ray")), daemon=True)
        driver.start()
        try:
            harness.wait_until(lambda: (control / "paid-1").exists() or not driver.is_alive(), timeout=120,
                               what="the local effect to charge")
            assert driver.is_alive(), ended
            store = SqlStore(sqlite_url)
            try:  # what finished before the local step is durable before it runs
                assert {n.node_id: n.status for n in store.nodes(run_id)}["first"] == NodeStatus.COMPLETED
            finally:
                store.close()
            client = Client(sqlite_url)
            try:
                client.pause(run_id)
                _heartbeat_read_signals(client, run_id)  # the driver knows of the pause before the step ends
            finally:
                client.close()
        finally:
            (control / "release").touch()
            driver.join(120)
        assert ended and ended[0].status == RunStatus.PAUSED, ended
        store = SqlStore(sqlite_url)
        try:
            nodes = {n.node_id: n for n in store.nodes(run_id)}
            effects = [(e.node_id, e.status) for e in store.effects(run_id)]
        finally:
            store.close()
        assert nodes["slow_pay"].status == NodeStatus.COMPLETED and nodes["slow_pay"].attempt == 1
        assert effects == [("slow_pay", EffectStatus.COMMITTED)]

        client = Client(sqlite_url)
        try:
            client.unpause(run_id)
        finally:
            client.close()
        record = raysaga.resume(lf.held, run_id, store=sqlite_url, executor="ray")
        log = services.log()
    assert record.status == RunStatus.COMPLETED, record.error
    assert list(log["raw"].values()) == [1]  # charged once: the resume did not run it again
    assert not (control / "paid-2").exists()


@pytest.mark.ray
@pytest.mark.usefixtures("_by_value")
def test_a_local_step_mutating_its_input_leaves_the_upstream_output_alone(ray_session: str, sqlite_url: str) -> None:
    record = raysaga.run(lf.mutating, None, store=sqlite_url, executor="ray")
    assert record.status == RunStatus.COMPLETED, record.error
    assert record.output == {"later": {"a": [1, 2]}}
    store = SqlStore(sqlite_url)
    try:
        outputs = {n.node_id: n.output for n in store.nodes(record.run_id)}
    finally:
        store.close()
    assert outputs["src"] == {"a": [1, 2]} and outputs["mutate"] == 3

"""A run resumed where one of its input's secrets is missing (a literal given to another process,
an unset environment variable): refused up front, nothing run, changed or rolled back, and the
error's advice (export it, resume again) then works; a literal given again with ``run --run-id``
supplies it; literals in a list each have a variable of their own (two vendors' tokens read
``RAYSAGA_SECRET_TOKEN`` once: one vendor got the other's token). Real inline runs on SQLite files.

"Another process" is this one with its literals forgotten: ``secrets._MEMORY`` replaced by an
empty dict, which is what a fresh process holds.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import create_engine

import raysaga
from raysaga import Secret, Workflow
from raysaga.errors import Permanent, SecretUnavailableError
from raysaga.orchestrator import runner, secrets
from raysaga.orchestrator.client import Client
from raysaga.orchestrator.worker import Worker
from raysaga.state import NodeStatus, RunStatus, SqlStore
from raysaga.state.schema import runs

CALLS: list[str] = []


class Order(BaseModel):
    amount: int
    vendor_token: Secret


comp = Workflow("stop51_comp", version="1")


@comp.step(effect=True)
def charge(input: Order) -> dict[str, str]:
    CALLS.append("charge")
    return {"charge": "ch_1"}


@comp.compensation("charge")
def refund(output: dict[str, str]) -> None:
    CALLS.append("refund")


@comp.approval()
def gate(charge: dict[str, str]) -> str:
    return "ship?"


@comp.step()
def ship(input: Order, gate: Any) -> str:
    return "shipped with " + input.vendor_token.get()


class Vendor(BaseModel):
    name: str
    token: Secret


class Batch(BaseModel):
    vendors: list[Vendor]


lst = Workflow("stop51_list", version="1")


@lst.approval()
def lgate(input: Batch) -> str:
    return "go?"


@lst.step()
def use(input: Batch, lgate: Any) -> dict[str, str]:
    return {v.name: v.token.get() for v in input.vendors}


FAIL_ONCE: list[bool] = []
flaky = Workflow("stop51_flaky", version="1")


@flaky.step()
def pay(input: Order) -> str:
    if FAIL_ONCE:
        FAIL_ONCE.pop()
        raise Permanent("vendor said no")
    return "paid with " + input.vendor_token.get()


ORDER = {"amount": 5, "vendor_token": "VendTok-51515151"}
VENDORS = {"vendors": [{"name": "acme", "token": "AcmeTok-11111111"}, {"name": "globex", "token": "GlobTok-22222222"}]}


@pytest.fixture(autouse=True)
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    CALLS.clear()
    FAIL_ONCE.clear()
    for name in ("RAYSAGA_SECRET_VENDOR_TOKEN", "RAYSAGA_SECRET_TOKEN", "RAYSAGA_SECRET_VENDORS_0_TOKEN",
                 "RAYSAGA_SECRET_VENDORS_1_TOKEN", "STOP51_VEND_TOK"):
        monkeypatch.delenv(name, raising=False)
    yield


def _another_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(secrets, "_MEMORY", {})


def _approved(url: str, wf: Workflow, value: Any, run_id: str, node: str) -> None:
    rested = raysaga.run(wf, value, store=url, run_id=run_id, executor="inline")
    assert rested.status == RunStatus.WAITING_HUMAN
    client = Client(url)
    try:
        client.approve(run_id, node, by="ops")
    finally:
        client.close()


def _untouched(url: str, run_id: str) -> None:
    """Nothing ran or changed: still waiting for a driver, no compensation, no refund."""
    with runner.using_store(url) as st:
        run = st.get_run(run_id)
        nodes = {n.node_id: n.status for n in st.nodes(run_id)}
    assert run.status == RunStatus.WAITING_HUMAN, run.status
    assert "ship" not in nodes or nodes["ship"] == NodeStatus.PENDING, nodes
    assert not any(":" in n for n in nodes), nodes
    assert "refund" not in CALLS


def test_a_resume_lacking_a_literal_is_refused_then_goes_on_once_it_is_exported(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _approved(sqlite_url, comp, ORDER, "c51", "gate")
    _another_process(monkeypatch)
    with pytest.raises(SecretUnavailableError, match="export RAYSAGA_SECRET_VENDOR_TOKEN=") as caught:
        runner.resume(comp, "c51", store=sqlite_url, executor="inline")
    assert "nothing was run or changed" in str(caught.value) and "raysaga resume c51" in str(caught.value)
    assert "--run-id c51 --input" in str(caught.value)  # or the literal given again
    _untouched(sqlite_url, "c51")
    monkeypatch.setenv("RAYSAGA_SECRET_VENDOR_TOKEN", "VendTok-51515151")  # the error's advice
    done = runner.resume(comp, "c51", store=sqlite_url, executor="inline")
    assert done.status == RunStatus.COMPLETED
    assert done.output == {"ship": "shipped with VendTok-51515151"}
    assert CALLS == ["charge"]


def test_a_resume_lacking_an_env_reference_is_refused(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STOP51_VEND_TOK", "EnvTok-77777777")
    _approved(sqlite_url, comp, {"amount": 5, "vendor_token": {"env": "STOP51_VEND_TOK"}}, "e51", "gate")
    monkeypatch.delenv("STOP51_VEND_TOK")
    with pytest.raises(SecretUnavailableError, match="export STOP51_VEND_TOK"):
        runner.resume(comp, "e51", store=sqlite_url, executor="inline")
    _untouched(sqlite_url, "e51")


def test_the_same_literal_given_again_with_the_run_id_is_used(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _approved(sqlite_url, comp, ORDER, "r51", "gate")
    _another_process(monkeypatch)
    done = raysaga.run(comp, dict(ORDER), store=sqlite_url, run_id="r51", executor="inline")
    assert done.status == RunStatus.COMPLETED
    assert done.output == {"ship": "shipped with VendTok-51515151"}
    assert CALLS == ["charge"]


def test_a_retry_lacking_a_secret_is_refused_before_the_run_is_reopened(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    FAIL_ONCE.append(True)
    failed = raysaga.run(flaky, ORDER, store=sqlite_url, run_id="f51", executor="inline")
    assert failed.status == RunStatus.FAILED
    _another_process(monkeypatch)
    with pytest.raises(SecretUnavailableError, match="RAYSAGA_SECRET_VENDOR_TOKEN"):
        runner.retry(flaky, "f51", store=sqlite_url, executor="inline")
    with runner.using_store(sqlite_url) as st:
        assert st.get_run("f51").status == RunStatus.FAILED  # not reopened and left driverless
    monkeypatch.setenv("RAYSAGA_SECRET_VENDOR_TOKEN", "VendTok-51515151")
    done = runner.retry(flaky, "f51", store=sqlite_url, executor="inline")
    assert done.output == {"pay": "paid with VendTok-51515151"}


def test_literals_in_a_list_each_have_their_own_variable(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _approved(sqlite_url, lst, VENDORS, "l51", "lgate")
    with runner.using_store(sqlite_url) as st:
        stored = st.get_run("l51").input
    refs = [v["token"]["$secret"] for v in stored["vendors"]]
    assert [r["resupply"] for r in refs] == ["RAYSAGA_SECRET_VENDORS_0_TOKEN", "RAYSAGA_SECRET_VENDORS_1_TOKEN"]
    assert [r["field"] for r in refs] == ["vendors[0].token", "vendors[1].token"]
    _another_process(monkeypatch)
    monkeypatch.setenv("RAYSAGA_SECRET_TOKEN", "AcmeTok-11111111")  # the one variable the old naming read
    with pytest.raises(SecretUnavailableError, match="RAYSAGA_SECRET_VENDORS_1_TOKEN"):
        runner.resume(lst, "l51", store=sqlite_url, executor="inline")
    monkeypatch.setenv("RAYSAGA_SECRET_VENDORS_0_TOKEN", "AcmeTok-11111111")
    monkeypatch.setenv("RAYSAGA_SECRET_VENDORS_1_TOKEN", "GlobTok-22222222")
    done = runner.resume(lst, "l51", store=sqlite_url, executor="inline")
    assert done.output == {"use": {"acme": "AcmeTok-11111111", "globex": "GlobTok-22222222"}}


def _stored_as_old(url: str, run_id: str, stored_input: Any) -> None:
    """The run's input as a raysaga before per-place variables stored it: literals named by field alone."""
    engine = create_engine(url)
    try:
        with engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.run_id == run_id).values(input=stored_input))
    finally:
        engine.dispose()


def _old_ref(memory: str, field: str) -> dict[str, Any]:
    return {"$secret": {"memory": memory, "field": field}}


def test_an_old_literal_still_reads_its_field_variable(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    FAIL_ONCE.append(True)
    assert raysaga.run(flaky, ORDER, store=sqlite_url, run_id="o51", executor="inline").status == RunStatus.FAILED
    _stored_as_old(sqlite_url, "o51", {"amount": 5, "vendor_token": _old_ref("0ld", "vendor_token")})
    _another_process(monkeypatch)
    with pytest.raises(SecretUnavailableError, match="RAYSAGA_SECRET_VENDOR_TOKEN"):
        runner.retry(flaky, "o51", store=sqlite_url, executor="inline")
    monkeypatch.setenv("RAYSAGA_SECRET_VENDOR_TOKEN", "VendTok-51515151")
    done = runner.retry(flaky, "o51", store=sqlite_url, executor="inline")
    assert done.output == {"pay": "paid with VendTok-51515151"}


def test_old_literals_sharing_a_variable_are_refused_then_given_again(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old = {"vendors": [{"name": "acme", "token": _old_ref("m0", "token")},
                       {"name": "globex", "token": _old_ref("m1", "token")}]}
    _approved(sqlite_url, lst, VENDORS, "s51", "lgate")
    _stored_as_old(sqlite_url, "s51", old)
    _another_process(monkeypatch)
    monkeypatch.setenv("RAYSAGA_SECRET_TOKEN", "AcmeTok-11111111")
    shared = r"'vendors\[0\].token', 'vendors\[1\].token'.*RAYSAGA_SECRET_TOKEN"
    with pytest.raises(SecretUnavailableError, match=shared):
        runner.resume(lst, "s51", store=sqlite_url, executor="inline")
    with runner.using_store(sqlite_url) as st:
        assert st.get_run("s51").status == RunStatus.WAITING_HUMAN
    # the literals given again are taken place by place, whatever variable they were named by
    done = raysaga.run(lst, VENDORS, store=sqlite_url, run_id="s51", executor="inline")
    assert done.output == {"use": {"acme": "AcmeTok-11111111", "globex": "GlobTok-22222222"}}


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        line = record.getMessage()
        self.lines.append(line)
        if "left for a worker that has its secrets" in line or "is compensated" in line or "is completed" in line:
            self.seen.set()


def test_a_worker_lacking_a_secret_leaves_the_run_alone(sqlite_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _approved(sqlite_url, comp, ORDER, "w51", "gate")
    _another_process(monkeypatch)
    said = _Said()
    logger = logging.getLogger("raysaga.worker")
    logger.addHandler(said)
    previous = logger.level
    logger.setLevel(logging.INFO)
    store = SqlStore(sqlite_url)
    worker = Worker([comp], store, concurrency=1, executor="inline", poll=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        assert said.seen.wait(60), said.lines  # (a bound on a failure, not a synchronisation)
    finally:
        worker.stop()
        thread.join(timeout=60)
        logger.removeHandler(said)
        logger.setLevel(previous)
        store.close()
    assert any("RAYSAGA_SECRET_VENDOR_TOKEN" in line and "w51" in line for line in said.lines), said.lines
    _untouched(sqlite_url, "w51")


def test_the_cli_resume_refuses_before_it_starts_ray(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Any) -> None:
    """``raysaga resume`` (Ray by default) refused only after it had started Ray and imported the
    workflow's code: now first, in a fresh process, with nothing imported (a module that marks its
    import stays unmarked) and nothing run."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    monkeypatch.setenv("STOP51_VEND_TOK", "EnvTok-88888888")
    _approved(sqlite_url, comp, {"amount": 5, "vendor_token": {"env": "STOP51_VEND_TOK"}}, "c51", "gate")
    marker = tmp_path / "imported"
    (tmp_path / "stop51_marker_flow.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).touch()\n"
        "from tests.security.test_secret_resume_stop51 import comp as wf\n")
    repo = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k not in ("STOP51_VEND_TOK", "RAY_ADDRESS")}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(repo)])
    done = subprocess.run([sys.executable, "-m", "raysaga", "resume", "c51", "--db", sqlite_url,
                           "--workflow", "stop51_marker_flow:wf"], env=env, capture_output=True, text=True,
                          timeout=120, cwd=repo)
    assert done.returncode != 0 and "export STOP51_VEND_TOK" in done.stderr, done.stderr
    assert not marker.exists(), "the workflow's code was imported (and Ray started) before the refusal"
    _untouched(sqlite_url, "c51")

"""Rollbacks across dead drivers (stop 40 review): real driver processes, killed by SIGKILL.

- A step prepared in the round a failure was found was never sent; the commit that says so
  (``took_effect: False``) is followed by a SIGKILL: the resumed driver does not compensate it.
- A compensation that kills its driver every time parks the run (a crash loop); once fixed,
  ``retry --compensations`` ends it ``compensated`` with the forward failure as its error, not
  the crash loop's report that overwrote it.
- A fork's undo of an inherited node is under way (ledger ``pending``) in the fork whose driver
  died mid-refund: a second fork of the same parent does not call the same undo key a second
  time; it parks naming the first, and once that one settled it, its retry answers from the ledger.
- A fork takes up the undo key a sibling's refund failed on and dies mid-refund: its resume finds
  its own pending row (the row became the taker's) and reconciles it, never blaming the sibling.

Each driver is a ``python -m raysaga`` process running a workflow module written to the test's
directory, with the inline executor: a step's ``os.kill(os.getpid(), SIGKILL)`` kills the driver.
A dead driver's lease is taken over at once by the next process on this host (its pid is gone).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga.state import EffectStatus, NodeStatus, RunStatus, SqlStore

FLOW = textwrap.dedent('''
    import json
    import os
    import signal
    from pathlib import Path

    from raysaga import Permanent, StepContext, Workflow

    HERE = Path(__file__).parent


    def log(*what):
        with open(HERE / "log", "a") as fh:
            fh.write(json.dumps(what) + "\\n")


    def poisoned(ctx: StepContext) -> None:
        """A compensation that kills the process driving it (inline: the driver), while poisoned."""
        if (HERE / f"poison.{ctx.run_id}").exists():
            os.kill(os.getpid(), signal.SIGKILL)


    # never sent: ``y`` is prepared in the round ``fan`` fails (it maps over a dict)
    unsent = Workflow("stop40_unsent")


    def undo_y(ctx: StepContext, output) -> None:
        log("undo_y", ctx.run_id)


    @unsent.step
    def plan() -> dict:
        return {"not": "a list"}


    @unsent.step(effect=True, compensate=undo_y)
    def y(ctx: StepContext, plan: dict) -> str:
        log("y", ctx.run_id)
        return "Y"


    @unsent.map("plan")
    def fan(plan: int) -> int:
        return plan


    # a crash loop in the rollback: ``b``'s undo kills its driver while poisoned
    loop = Workflow("stop40_loop")


    def undo_a(ctx: StepContext, output: str) -> None:
        log("undo_a", ctx.run_id, ctx.reconciling)


    def undo_b(ctx: StepContext, output: str) -> None:
        log("undo_b", ctx.run_id, ctx.reconciling)
        poisoned(ctx)


    @loop.step(effect=True, compensate=undo_a)
    def a(ctx: StepContext) -> str:
        return "A"


    @loop.step(effect=True, compensate=undo_b)
    def b(ctx: StepContext, a: str) -> str:
        return "B"


    @loop.step
    def c(b: str) -> str:
        raise Permanent("declined")


    # forks sharing an undo key: the parent charges; its forks re-run ``ship``, which fails
    shop = Workflow("stop40_forks")


    def refund(ctx: StepContext, output: str) -> None:
        log("refund", ctx.run_id, ctx.idempotency_key, ctx.reconciling)
        if (HERE / f"refuse.{ctx.run_id}").exists():
            raise Permanent("refund refused")
        poisoned(ctx)


    @shop.step(effect=True, compensate=refund)
    def charge(ctx: StepContext) -> str:
        log("charge", ctx.run_id)
        return "ch_1"


    @shop.step(effect=True)
    def ship(ctx: StepContext, charge: str) -> str:
        if (HERE / "no_stock").exists():
            raise Permanent("no stock")
        return "shipped"
''')


@pytest.fixture
def flow_dir(tmp_path: Path) -> Path:
    (tmp_path / "stop40_flows.py").write_text(FLOW)
    return tmp_path


def _raysaga(flow_dir: Path, *args: str, faults: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(flow_dir), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAYSAGA_FAULTS", None)
    if faults:
        env["RAYSAGA_FAULTS"] = faults
    return subprocess.run([sys.executable, "-m", "raysaga", *args, "--executor", "inline", "-q"], cwd=flow_dir,
                          env=env, capture_output=True, text=True, timeout=120)


def _log(flow_dir: Path) -> list[list[Any]]:
    path = flow_dir / "log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _module(flow_dir: Path) -> Any:
    spec = importlib.util.spec_from_file_location("stop40_flows", flow_dir / "stop40_flows.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_step_never_sent_is_not_compensated_by_the_driver_that_resumes(flow_dir: Path) -> None:
    db = f"sqlite:///{flow_dir / 'unsent.db'}"
    killed = _raysaga(flow_dir, "run", "stop40_flows:unsent", "--db", db, "--run-id", "u1",
                      faults="after_commit:y=kill")
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    store = SqlStore(db)
    try:
        assert store.get_run("u1").status == RunStatus.RUNNING  # killed before the run ended
        [y] = [n for n in store.nodes("u1") if n.label == "y"]
        assert y.status == NodeStatus.CANCELLED and y.error == {"reason": "not sent: the run failed",
                                                                "took_effect": False}
        resumed = _raysaga(flow_dir, "resume", "u1", "--db", db)
        assert resumed.returncode != -9, resumed.stderr
        run = store.get_run("u1")
        assert run.status == RunStatus.FAILED, (run.status, run.status_reason)
        assert _log(flow_dir) == []  # y never ran, and nothing undid it
        assert [n.label for n in store.nodes("u1") if n.label.endswith(":compensate")] == []
        assert [e.node_id for e in store.effects("u1")] == []
    finally:
        store.close()


def test_retry_of_compensations_after_a_crash_loop_ends_with_the_forward_cause(flow_dir: Path) -> None:
    db = f"sqlite:///{flow_dir / 'loop.db'}"
    (flow_dir / "poison.r1").touch()
    first = _raysaga(flow_dir, "run", "stop40_flows:loop", "--db", db, "--run-id", "r1")
    assert first.returncode == -9, first.stderr
    store = SqlStore(db)
    try:
        for _ in range(10):  # each resume dies in b's undo, until the crash loop parks the run
            if store.get_run("r1").status == RunStatus.COMPENSATION_FAILED:
                break
            _raysaga(flow_dir, "resume", "r1", "--db", db)
        parked = store.get_run("r1")
        assert parked.status == RunStatus.COMPENSATION_FAILED and parked.error is not None, parked.status_reason
        assert parked.error["type"] == "CrashLoop"
        (flow_dir / "poison.r1").unlink()
        retried = _raysaga(flow_dir, "retry", "r1", "--compensations", "--db", db)
        assert retried.returncode != -9, retried.stderr
        done = store.get_run("r1")
        assert done.status == RunStatus.COMPENSATED, done.status_reason
        assert done.status_reason == "critical step 'c' failed: declined (operator retry of compensations); rolled back"
        assert done.error == {"node": "c", "type": "Permanent", "message": "declined", "transient": False}
        undone = [line[0] for line in _log(flow_dir)]
        assert undone[-2:] == ["undo_b", "undo_a"] and undone.count("undo_a") == 1
    finally:
        store.close()


def test_a_fork_never_calls_an_undo_key_another_fork_has_under_way(flow_dir: Path) -> None:
    db = f"sqlite:///{flow_dir / 'forks.db'}"
    shop = _module(flow_dir).shop
    done = _raysaga(flow_dir, "run", "stop40_flows:shop", "--db", db, "--run-id", "P")
    assert done.returncode == 0, done.stderr
    for child in ("F1", "F2"):  # both made while the parent stands: each inherits the charge
        raysaga.fork(shop, "P", from_node="ship", store=db, new_run_id=child, drive=False)
    (flow_dir / "no_stock").touch()
    (flow_dir / "poison.F1").touch()
    dead = _raysaga(flow_dir, "resume", "F1", "--db", db)  # dies inside its refund: the key is pending
    assert dead.returncode == -9, dead.stderr
    store = SqlStore(db)
    try:
        [(key, status, owner)] = [(e.idempotency_key, e.status, e.run_id) for e in store.effects("F1")
                                  if e.node_id == "charge:compensate"]
        assert (status, owner) == (EffectStatus.PENDING, "F1")
        parked = raysaga.resume(shop, "F2", store=db, executor="inline")
        assert parked.status == RunStatus.COMPENSATION_FAILED, parked.status_reason
        assert parked.error is not None
        [failed] = parked.error["failed_compensations"]
        assert failed["type"] == "CompensationElsewhere" and failed["run"] == "F1" and key in failed["message"]
        assert [line for line in _log(flow_dir) if line[0] == "refund" and line[1] == "F2"] == []

        (flow_dir / "poison.F1").unlink()
        finished = _raysaga(flow_dir, "resume", "F1", "--db", db)
        assert finished.returncode == 1, finished.stderr  # (a run rolled back exits 1)
        assert store.get_run("F1").status == RunStatus.COMPENSATED
        retried = raysaga.retry(shop, "F2", store=db, executor="inline", compensations=True)
        assert retried.status == RunStatus.COMPENSATED, retried.status_reason
        refunds = [line[1:] for line in _log(flow_dir) if line[0] == "refund"]
        assert refunds == [["F1", key, False], ["F1", key, True]]  # F1's, then its reconciling re-issue
        assert [(e.run_id, e.status) for run in ("P", "F1", "F2") for e in store.effects(run)
                if e.idempotency_key == key] == [("F1", EffectStatus.COMMITTED)]
    finally:
        store.close()


def test_a_fork_killed_in_an_undo_it_took_up_from_a_sibling_resumes_its_own_call(flow_dir: Path) -> None:
    """F1's refund fails for good (its ledger row ``failed``); F2 takes the key up and dies during
    the call. The pending row is F2's: F2's resume reconciles it and ends ``compensated``. Filed
    under F1 (stopped, ``compensation_failed``), F2 took its own call for F1's and parked for good."""
    db = f"sqlite:///{flow_dir / 'forks.db'}"
    shop = _module(flow_dir).shop
    done = _raysaga(flow_dir, "run", "stop40_flows:shop", "--db", db, "--run-id", "P")
    assert done.returncode == 0, done.stderr
    for child in ("F1", "F2"):
        raysaga.fork(shop, "P", from_node="ship", store=db, new_run_id=child, drive=False)
    (flow_dir / "no_stock").touch()
    (flow_dir / "refuse.F1").touch()
    refused = _raysaga(flow_dir, "resume", "F1", "--db", db)
    assert refused.returncode == 1, refused.stderr
    store = SqlStore(db)
    try:
        assert store.get_run("F1").status == RunStatus.COMPENSATION_FAILED
        (flow_dir / "poison.F2").touch()
        dead = _raysaga(flow_dir, "resume", "F2", "--db", db)  # takes the failed key up, dies in the call
        assert dead.returncode == -9, dead.stderr
        [(key, status, owner)] = [(e.idempotency_key, e.status, e.run_id) for run in ("F1", "F2")
                                  for e in store.effects(run) if e.node_id == "charge:compensate"]
        assert (status, owner) == (EffectStatus.PENDING, "F2")
        (flow_dir / "poison.F2").unlink()
        resumed = raysaga.resume(shop, "F2", store=db, executor="inline")
        assert resumed.status == RunStatus.COMPENSATED, (resumed.status_reason, resumed.error)
        refunds = [line[1:] for line in _log(flow_dir) if line[0] == "refund"]
        assert refunds == [["F1", key, False], ["F2", key, False], ["F2", key, True]]
        assert [(e.run_id, e.status) for run in ("P", "F1", "F2") for e in store.effects(run)
                if e.idempotency_key == key] == [("F2", EffectStatus.COMMITTED)]
    finally:
        store.close()

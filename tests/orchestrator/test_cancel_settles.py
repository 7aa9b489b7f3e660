"""A cancelled attempt is seen to stop before its compensation runs (on the session's Ray).

``ray.cancel(force=True)`` only asks: the worker is killed a moment later, and Ray can lose a
cancel that races a task's start. An effect still running when its undo runs could land after
the undo (a refund, then the charge). So the driver waits for every cancelled attempt to end
(cancelling again meanwhile) before it starts a rollback.

The flow: ``charge`` (an effect with a compensation) blocks on a gate that never opens while
``check`` fails; the rollback cancels ``charge`` and compensates it. The compensation writes
down whether ``charge``'s worker was still alive when it began.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Permanent, RunStatus, StepContext, Workflow
from raysaga.state import EffectStatus, NodeStatus, SqlStore

pytestmark = pytest.mark.ray

BLOCK_LIMIT = 60.0


@pytest.fixture(autouse=True)
def _by_value() -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def _alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def _flow() -> Workflow:
    wf = Workflow("settle")

    def refund(ctx: StepContext, input: dict[str, str], output: Any) -> None:
        folder = Path(input["dir"])
        pid = int((folder / "charge-pid").read_text())
        state = "alive" if _alive(pid) else "gone"
        with open(folder / "undo.log", "a") as fh:
            fh.write(f"{ctx.idempotency_key} {output!r} charge-worker-{state}\n")

    @wf.step(effect=True, compensate=refund)
    def charge(ctx: StepContext, input: dict[str, str]) -> str:
        folder = Path(input["dir"])
        pid_file = (folder / "charge-pid")  # written whole, then renamed: a reader never sees it empty
        pid_file.with_name(f".{pid_file.name}").write_text(str(os.getpid()))
        os.replace(pid_file.with_name(f".{pid_file.name}"), pid_file)
        deadline = time.monotonic() + BLOCK_LIMIT
        while not (folder / "gate").exists():  # the workload: blocks until the test opens the gate
            if time.monotonic() > deadline:
                raise Permanent("the gate never opened")
            time.sleep(0.01)
        (folder / "charged").write_text("landed")
        return "C-1"

    @wf.step()
    def check(input: dict[str, str]) -> None:
        folder = Path(input["dir"])
        deadline = time.monotonic() + BLOCK_LIMIT
        while not (folder / "charge-pid").exists():  # fails once charge is surely running
            if time.monotonic() > deadline:
                raise AssertionError("charge never started")
            time.sleep(0.01)
        raise Permanent("the check refused the order")

    return wf


def test_rollback_compensates_an_in_flight_effect_only_after_its_worker_stopped(
        ray_session: str, sqlite_url: str, tmp_path: Path) -> None:
    try:
        record = raysaga.run(_flow(), {"dir": str(tmp_path)}, store=sqlite_url, executor="ray",
                             address=ray_session)
        assert record.status == RunStatus.COMPENSATED, record.status_reason
        undo = (tmp_path / "undo.log").read_text().splitlines()
        assert len(undo) == 1, undo
        key, output, state = undo[0].split(" ")
        assert output == "None"  # the outcome of the cancelled charge is unknown
        assert state == "charge-worker-gone", "the refund ran while the cancelled charge could still land"
        assert not (tmp_path / "charged").exists()
        store = SqlStore(sqlite_url)
        try:
            nodes = {n.node_id: n for n in store.nodes(record.run_id)}
            effects = {e.idempotency_key: e for e in store.effects(record.run_id)}
        finally:
            store.close()
        assert nodes["charge"].status == NodeStatus.CANCELLED
        assert nodes["charge:compensate"].status == NodeStatus.COMPLETED
        assert effects[key].status == EffectStatus.COMMITTED  # the refund's own ledger row
        assert key.endswith(":compensate")
    finally:
        (tmp_path / "gate").write_text("open")  # lets a straggler end: the cluster is shared

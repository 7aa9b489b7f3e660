"""An effect in doubt across a deploy keeps its idempotency key (stop 42 deploys review).

What was wrong: a driver killed while an effect was in flight (the provider took the charge, the
ledger row stayed ``pending``) was resumed by code that derives the effect's key otherwise: a step
that now also reads the run's ``input``, an agent tool whose ``key=`` was narrowed, a step whose
compensation was in flight when the rollback's driver died. The resume re-issued the call under a
fresh key: the provider charged (or refunded) twice. Now the attempt in doubt goes out again under
the key its ledger row holds (DESIGN invariant 2), ``reconciling``, and an ``effect_key_kept``
event says so.

Each driver is a ``python -m raysaga`` process running a workflow module written to the test's
directory, with the inline executor: the effect records the provider's charge, then SIGKILLs its
own process (the driver). The module reads ``STOP42_V2`` to be the deployed code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from raysaga.state import EffectStatus, RunStatus, SqlStore

FLOW = textwrap.dedent('''
    import json
    import os
    import signal
    from pathlib import Path

    from raysaga import Permanent, StepContext, Workflow
    from raysaga.agents import Agent, ScriptedModel, text_reply, tool, tool_reply

    HERE = Path(__file__).parent
    V2 = os.environ.get("STOP42_V2") == "1"


    def provider(what, key):
        """A deduping provider: one record per idempotency key."""
        path = HERE / f"{what}.json"
        seen = json.loads(path.read_text()) if path.exists() else []
        if key not in seen:
            seen.append(key)
            path.write_text(json.dumps(seen))
        if (HERE / f"kill.{what}").exists():  # the call took effect; the driver dies before its commit
            (HERE / f"kill.{what}").unlink()
            os.kill(os.getpid(), signal.SIGKILL)


    # a step that, once deployed, also reads the run input
    orders = Workflow("stop42_orders")

    if not V2:
        @orders.step(effect=True)
        def charge(ctx: StepContext) -> str:
            provider("charge", ctx.idempotency_key)
            return "ch"
    else:
        @orders.step(effect=True)
        def charge(ctx: StepContext, input: dict) -> str:
            provider("charge", ctx.idempotency_key)
            return "ch"


    # an agent tool whose key= is narrowed by the deploy
    @tool(effect=True, key=("order",) if V2 else None)
    def pay(order: str, amount: int, idempotency_key: str) -> str:
        provider("charge", idempotency_key)
        return "paid"


    buyer = Workflow("stop42_buyer")
    model = ScriptedModel(default=(tool_reply(("pay", {"order": "o-7", "amount": 500})), text_reply("done")))


    @buyer.agent(Agent("buyer", model, tools=(pay,)))
    def buy(input: dict) -> str:
        return "pay order o-7"


    # a rollback whose refund is in flight when its driver dies; the deploy makes ``hold`` read the
    # input, which the key of its compensation is derived from
    def release(ctx: StepContext, output: str) -> None:
        provider("refund", ctx.idempotency_key)


    saga = Workflow("stop42_saga")

    if not V2:
        @saga.step(effect=True, compensate=release)
        def hold(ctx: StepContext) -> str:
            return "h"
    else:
        @saga.step(effect=True, compensate=release)
        def hold(ctx: StepContext, input: dict) -> str:
            return "h"


    @saga.step
    def ship(hold: str) -> str:
        raise Permanent("no stock")
''')


@pytest.fixture
def flow_dir(tmp_path: Path) -> Path:
    (tmp_path / "stop42_flows.py").write_text(FLOW)
    return tmp_path


def _raysaga(flow_dir: Path, *args: str, v2: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(flow_dir), os.environ.get("PYTHONPATH", "")])}
    env.pop("RAYSAGA_FAULTS", None)
    env.pop("STOP42_V2", None)
    if v2:
        env["STOP42_V2"] = "1"
    return subprocess.run([sys.executable, "-m", "raysaga", *args, "--executor", "inline", "-q"], cwd=flow_dir,
                          env=env, capture_output=True, text=True, timeout=120)


def _seen(flow_dir: Path, what: str) -> list[str]:
    path = flow_dir / f"{what}.json"
    found: list[str] = json.loads(path.read_text()) if path.exists() else []
    return found


def _killed_then_deployed(flow_dir: Path, flow: str, what: str, *extra: str) -> tuple[SqlStore, str]:
    db = f"sqlite:///{flow_dir / 's.db'}"
    (flow_dir / f"kill.{what}").touch()
    killed = _raysaga(flow_dir, "run", f"stop42_flows:{flow}", "--db", db, "--run-id", "r", *extra)
    assert killed.returncode == -9, (killed.returncode, killed.stderr)
    [key] = _seen(flow_dir, what)
    store = SqlStore(db)
    [row] = [e for e in store.effects("r") if e.idempotency_key == key]
    assert row.status == EffectStatus.PENDING  # the call took effect; its commit never came
    refused = _raysaga(flow_dir, "resume", "r", "--db", db, v2=True)
    assert refused.returncode != 0 and "another definition" in refused.stderr, refused.stderr
    resumed = _raysaga(flow_dir, "resume", "r", "--db", db, "--allow-changed", v2=True)
    assert resumed.returncode != -9, resumed.stderr
    return store, key


def test_an_input_parameter_added_to_an_effect_in_doubt_does_not_charge_twice(flow_dir: Path) -> None:
    store, key = _killed_then_deployed(flow_dir, "orders", "charge", "--input", '{"order": "o-7"}')
    try:
        assert store.get_run("r").status == RunStatus.COMPLETED
        assert _seen(flow_dir, "charge") == [key]  # one charge, under the key in doubt
        assert [(e.idempotency_key, e.status) for e in store.effects("r")] == [(key, EffectStatus.COMMITTED)]
        assert [e.data["key"] for e in store.events("r") if e.kind == "effect_key_kept"] == [key]
    finally:
        store.close()


def test_a_tool_key_changed_while_its_call_is_in_doubt_does_not_charge_twice(flow_dir: Path) -> None:
    store, key = _killed_then_deployed(flow_dir, "buyer", "charge", "--input", "{}")
    try:
        assert store.get_run("r").status == RunStatus.COMPLETED
        assert _seen(flow_dir, "charge") == [key]
        assert [(e.idempotency_key, e.status) for e in store.effects("r")] == [(key, EffectStatus.COMMITTED)]
    finally:
        store.close()


def test_a_compensation_in_doubt_keeps_its_key_when_its_step_now_reads_the_input(flow_dir: Path) -> None:
    store, key = _killed_then_deployed(flow_dir, "saga", "refund", "--input", '{"order": "o-7"}')
    try:
        assert store.get_run("r").status == RunStatus.COMPENSATED
        assert _seen(flow_dir, "refund") == [key]  # one refund
        [row] = [e for e in store.effects("r") if e.idempotency_key == key]
        assert row.status == EffectStatus.COMMITTED
    finally:
        store.close()

"""The ``raysaga.Saga`` builder: linear steps with compensations, on an ordinary Workflow.

Each action runs after the previous one as an effect (idempotency key in ``ctx``) and receives
earlier outputs by parameter name; a failing step rolls the completed ones back in reverse.
The in-process tests use the inline executor and module-level logs; the crash tests SIGKILL a
real process running ``saga.run`` (``RAYSAGA_FAULTS``) and resume it, against a file-backed
fake downstream that dedupes by idempotency key.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from raysaga import Permanent, RunStatus, Saga, StepContext
from raysaga.state import EffectStatus, NodeStatus, SqlStore
from tests.support.files import import_file

LOG: list[tuple[Any, ...]] = []


@pytest.fixture(autouse=True)
def _fresh_log() -> None:
    LOG.clear()


def book_flight(ctx: StepContext, input: dict[str, Any]) -> dict[str, str]:
    LOG.append(("do", "book_flight", ctx.idempotency_key))
    return {"flight": f"FL-{input['traveller']}"}


def cancel_flight(ctx: StepContext, output: dict[str, str]) -> None:
    LOG.append(("undo", "book_flight", ctx.idempotency_key, output))


def charge_card(ctx: StepContext, input: dict[str, Any], book_flight: dict[str, str]) -> dict[str, str]:
    LOG.append(("do", "charge_card", ctx.idempotency_key))
    return {"charge": f"CH-{input['amount']}", "for": book_flight["flight"]}


def refund_card(ctx: StepContext, output: dict[str, str]) -> None:
    LOG.append(("undo", "charge_card", ctx.idempotency_key, output))


def book_hotel(ctx: StepContext, input: dict[str, Any], charge_card: dict[str, str]) -> dict[str, str]:
    LOG.append(("do", "book_hotel", ctx.idempotency_key))
    if input.get("hotel_full"):
        raise Permanent("no rooms left")
    return {"hotel": "HT-1", "paid_by": charge_card["charge"]}


def cancel_hotel(ctx: StepContext, output: dict[str, str]) -> None:
    LOG.append(("undo", "book_hotel", ctx.idempotency_key, output))


def confirm(ctx: StepContext, input: dict[str, Any]) -> str:
    """Uses no earlier output: only the saga's chaining runs it after the hotel."""
    LOG.append(("do", "confirm", ctx.idempotency_key))
    return f"confirmed for {input['traveller']}"


def _trip() -> Saga:
    saga = Saga("trip")
    assert saga.step(book_flight, compensate=cancel_flight) is saga  # chains
    return (saga.step(charge_card, compensate=refund_card)
            .step(book_hotel, compensate=cancel_hotel)
            .step(confirm, name="send_confirmation", effect=False))


TRIP = {"traveller": "ada", "amount": 420}
STEPS = ["book_flight", "charge_card", "book_hotel", "send_confirmation"]


def test_the_saga_is_a_linear_workflow() -> None:
    wf = _trip().workflow
    assert list(wf.steps) == STEPS
    assert [wf.steps[s].deps for s in STEPS] == [(), ("book_flight",), ("charge_card",), ("book_hotel",)]
    assert [wf.steps[s].effect for s in STEPS] == [True, True, True, False]
    assert [wf.compensation_for(s) for s in STEPS] == [cancel_flight, refund_card, cancel_hotel, None]


def test_success_runs_every_step_in_order_with_outputs_by_name(store_url: str) -> None:
    record = _trip().run(TRIP, store=store_url, run_id="trip-ok")
    assert record.status == RunStatus.COMPLETED, record.status_reason
    assert record.output == {"send_confirmation": "confirmed for ada"}
    assert [entry[:2] for entry in LOG] == [("do", s) for s in ("book_flight", "charge_card", "book_hotel", "confirm")]
    store = SqlStore(store_url)
    try:
        nodes = {n.node_id: n for n in store.nodes("trip-ok")}
        effects = {e.node_id: e for e in store.effects("trip-ok")}
    finally:
        store.close()
    assert {s: (nodes[s].status, nodes[s].output) for s in STEPS} == {
        "book_flight": (NodeStatus.COMPLETED, {"flight": "FL-ada"}),
        "charge_card": (NodeStatus.COMPLETED, {"charge": "CH-420", "for": "FL-ada"}),
        "book_hotel": (NodeStatus.COMPLETED, {"hotel": "HT-1", "paid_by": "CH-420"}),
        "send_confirmation": (NodeStatus.COMPLETED, "confirmed for ada"),
    }
    # every effect got its own idempotency key, the one in the ledger, committed; a plain step none
    keys = {step: key for _, step, key in LOG}
    assert keys["confirm"] is None
    effect_keys = [keys[s] for s in ("book_flight", "charge_card", "book_hotel")]
    assert all(k and k.startswith("rs-") for k in effect_keys) and len(set(effect_keys)) == 3
    assert {s: (e.idempotency_key, e.status) for s, e in effects.items()} == {
        s: (keys[s], EffectStatus.COMMITTED) for s in ("book_flight", "charge_card", "book_hotel")}
    assert not [n for n in nodes if n.endswith(":compensate")]


def test_idempotency_keys_are_deterministic(tmp_path: Path) -> None:
    first = _trip().run(TRIP, store=f"sqlite:///{tmp_path / 'a.db'}", run_id="same-trip")
    keys_a = [entry[2] for entry in LOG]
    LOG.clear()
    second = _trip().run(TRIP, store=f"sqlite:///{tmp_path / 'b.db'}", run_id="same-trip")
    keys_b = [entry[2] for entry in LOG]
    assert first.output == second.output
    assert keys_a == keys_b  # same run, step and arguments: same key, never a random one
    LOG.clear()
    _trip().run(TRIP, store=f"sqlite:///{tmp_path / 'c.db'}", run_id="another-trip")
    keys_c = [entry[2] for entry in LOG]
    assert not set(keys_c[:3]) & set(keys_a[:3])  # another run: other keys


def test_a_failing_step_rolls_the_completed_ones_back_in_reverse(store_url: str) -> None:
    record = _trip().run({**TRIP, "hotel_full": True}, store=store_url, run_id="trip-full")
    assert record.status == RunStatus.COMPENSATED, record.status_reason
    assert (record.status_reason or "").startswith("critical step 'book_hotel' failed: no rooms left")
    assert record.error is not None
    assert record.error["node"] == "book_hotel"
    dos = {step: key for kind, step, key, *_ in LOG if kind == "do"}
    undos = [entry for entry in LOG if entry[0] == "undo"]
    assert undos == [  # reverse order; each once; the failed step is not undone
        ("undo", "charge_card", f"{dos['charge_card']}:compensate", {"charge": "CH-420", "for": "FL-ada"}),
        ("undo", "book_flight", f"{dos['book_flight']}:compensate", {"flight": "FL-ada"}),
    ]
    assert ("do", "confirm", None) not in LOG
    store = SqlStore(store_url)
    try:
        nodes = {n.node_id: n.status for n in store.nodes("trip-full")}
    finally:
        store.close()
    assert nodes == {"book_flight": NodeStatus.COMPLETED, "charge_card": NodeStatus.COMPLETED,
                     "book_hotel": NodeStatus.FAILED, "charge_card:compensate": NodeStatus.COMPLETED,
                     "book_flight:compensate": NodeStatus.COMPLETED}


# ---------------------------------------------------------------------------- crash and resume

SAGA_MODULE = '''
import json
from pathlib import Path

from raysaga import Permanent, Saga, StepContext


def _service(input, op, ctx):
    """A downstream that dedupes by idempotency key: a repeated key is recorded, not applied again."""
    path = Path(input["service"])
    seen = {json.loads(line)["key"] for line in path.read_text().splitlines()} if path.exists() else set()
    with path.open("a") as fh:
        fh.write(json.dumps({"op": op, "key": ctx.idempotency_key, "dup": ctx.idempotency_key in seen}) + "\\n")
    return {"op": op, "receipt": "r-" + ctx.idempotency_key[-8:]}


def book_flight(ctx: StepContext, input: dict) -> dict:
    return _service(input, "book_flight", ctx)


def cancel_flight(ctx: StepContext, input: dict, output: dict) -> None:
    _service(input, "cancel_flight " + output["receipt"], ctx)


def charge_card(ctx: StepContext, input: dict, book_flight: dict) -> dict:
    return _service(input, "charge_card", ctx)


def refund_card(ctx: StepContext, input: dict, output: dict) -> None:
    _service(input, "refund_card " + output["receipt"], ctx)


def book_hotel(ctx: StepContext, input: dict, charge_card: dict) -> dict:
    if input.get("hotel_full"):
        raise Permanent("no rooms left")
    return _service(input, "book_hotel", ctx)


saga = (Saga("trip_crash")
        .step(book_flight, compensate=cancel_flight)
        .step(charge_card, compensate=refund_card)
        .step(book_hotel))
'''

DRIVER = '''
import json
import sys

# the flow module was written next to this script, whose folder Python puts first on sys.path
from {module} import saga

import raysaga

saga.run(json.loads(sys.argv[4]), store=sys.argv[2], run_id=sys.argv[3], options=raysaga.RunOptions(lease_ttl=0.6))
print("NOT KILLED")
'''

CRASHES = {
    # the charge was made, its result not yet durable: the resume re-issues it with the same key
    "forward": ("before_commit:charge_card", False),
    # killed mid-rollback, right after the refund was recorded: the resume only cancels the flight
    "rollback": ("after_commit:charge_card:compensate", True),
}



def _calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("case", sorted(CRASHES))
def test_a_crashed_saga_resumes_to_the_same_end(tmp_path: Path, case: str) -> None:
    fault, hotel_full = CRASHES[case]
    module = f"saga_crash_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{module}.py").write_text(SAGA_MODULE)
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER.format(module=module)))
    saga = import_file(tmp_path / f"{module}.py", module).saga
    service = tmp_path / "service.jsonl"
    trip = {"service": str(service), "hotel_full": hotel_full}

    clean = saga.run(trip, store=f"sqlite:///{tmp_path / 'clean.db'}", run_id="trip-1")
    clean_calls = _calls(service)
    service.rename(tmp_path / "clean-service.jsonl")

    url = f"sqlite:///{tmp_path / 'crash.db'}"
    proc = subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(tmp_path), url, "trip-1",
                           json.dumps(trip)], env={**os.environ, "RAYSAGA_FAULTS": fault},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, (proc.returncode, proc.stdout, proc.stderr)
    store = SqlStore(url)
    try:
        crashed = store.get_run("trip-1")
        assert crashed.status == (RunStatus.COMPENSATING if hotel_full else RunStatus.RUNNING)
        deadline = time.monotonic() + 30
        while (lease := store.get_run("trip-1").lease_expires_at) is not None and lease >= time.time():
            assert time.monotonic() < deadline, "the dead driver's lease never expired"
            time.sleep(0.02)  # polling the run row for the dead driver's lease to expire
        resumed = saga.resume("trip-1", store=store)
        nodes = {n.node_id: (n.status, n.output) for n in store.nodes("trip-1")}
    finally:
        store.close()
    clean_store = SqlStore(f"sqlite:///{tmp_path / 'clean.db'}")
    try:
        clean_nodes = {n.node_id: (n.status, n.output) for n in clean_store.nodes("trip-1")}
    finally:
        clean_store.close()

    assert resumed.status == clean.status == (RunStatus.COMPENSATED if hotel_full else RunStatus.COMPLETED)
    assert resumed.output == clean.output
    assert resumed.status_reason == clean.status_reason
    assert nodes == clean_nodes
    calls = _calls(service)
    applied = [c for c in calls if not c["dup"]]
    assert [(c["op"], c["key"]) for c in applied] == [(c["op"], c["key"]) for c in clean_calls]  # once each
    if case == "forward":  # the re-issued charge carried the same key, so the downstream did not apply it twice
        [dup] = [c for c in calls if c["dup"]]
        assert dup["op"] == "charge_card"
        assert [c["key"] for c in calls if c["op"] == "charge_card"] == [dup["key"]] * 2
    else:
        assert [c["op"].split()[0] for c in calls] == ["book_flight", "charge_card", "refund_card",
                                                       "cancel_flight"]
        assert not [c for c in calls if c["dup"]]

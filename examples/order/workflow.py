"""The order example: reserve stock → charge the card → email a receipt → ship.

Charging and emailing change the world, so they are ``effect=True``: each gets a deterministic
``ctx.idempotency_key`` and passes it to the provider, and raysaga's ledger makes sure a resume
never repeats a committed one and re-issues an uncertain one under the same key.

Run the demo from the repository root (it starts the fake provider in-process and a local Ray
on demand; state goes to the default store, ``~/.raysaga/raysaga.db``)::

    python -m examples.order.workflow [--executor inline] [--db URL] [--run-id ID]

or drive the workflow with the CLI against a provider you started yourself::

    raysaga run examples.order.workflow:wf --input @order.json
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import uuid
from typing import Any

from pydantic import BaseModel, Field

import raysaga
from examples.order import fake_services
from raysaga import Permanent, RetryPolicy, StepContext, Workflow


class OrderIn(BaseModel):
    """The run input."""

    order_id: str
    sku: str
    quantity: int = Field(default=1, ge=1)
    amount_cents: int = Field(ge=0)
    email: str
    services_url: str
    """Base URL of the payment/email provider (the fake one in ``fake_services``)."""


class Reservation(BaseModel):
    reservation_id: str
    sku: str
    quantity: int


class Charge(BaseModel):
    charge_id: str
    amount_cents: int


class Receipt(BaseModel):
    message_id: str
    to: str


class Shipment(BaseModel):
    order_id: str
    tracking_number: str
    charge_id: str
    receipt_id: str


wf = Workflow("order", version="1", description="reserve stock, charge the card, email a receipt, ship")
#: Where `raysaga resume`, `fork` and the dashboard import this workflow (run as a script, it records none by itself).
REF = "examples.order.workflow:wf"

#: Provider calls fail transiently (timeouts, 5xx); retried with the same key, so safe.
PROVIDER_RETRY = RetryPolicy(max_attempts=5, base=0.2, cap=2.0)


def _digest(*parts: str) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:12]


def _key(ctx: StepContext) -> str:
    # set by raysaga for every effect=True step; never invent one (a fresh key is a second charge)
    assert ctx.idempotency_key is not None, f"step {ctx.label!r} is not declared effect=True"
    return ctx.idempotency_key


@wf.step()
def reserve_stock(input: OrderIn) -> Reservation:
    """Pure and deterministic: safe to run again after a crash (non-effect steps are at least once)."""
    if input.quantity > 100:
        raise Permanent(f"cannot reserve {input.quantity} x {input.sku}: at most 100 per order")
    return Reservation(reservation_id=f"rsv-{_digest(input.order_id, input.sku)}", sku=input.sku,
                       quantity=input.quantity)


@wf.step(effect=True, retry=PROVIDER_RETRY)
def charge_card(ctx: StepContext, input: OrderIn, reserve_stock: Reservation) -> Charge:
    reply = fake_services.post(input.services_url, "charge", _key(ctx), {
        "order_id": input.order_id, "amount_cents": input.amount_cents,
        "reservation_id": reserve_stock.reservation_id})
    return Charge(charge_id=reply["id"], amount_cents=input.amount_cents)


@wf.step(effect=True, retry=PROVIDER_RETRY)
def send_email(ctx: StepContext, input: OrderIn, charge_card: Charge) -> Receipt:
    reply = fake_services.post(input.services_url, "email", _key(ctx), {
        "order_id": input.order_id, "to": input.email,
        "text": f"We charged {charge_card.amount_cents / 100:.2f} for order {input.order_id}."})
    return Receipt(message_id=reply["id"], to=input.email)


@wf.step()
def ship(input: OrderIn, reserve_stock: Reservation, charge_card: Charge, send_email: Receipt) -> Shipment:
    return Shipment(order_id=input.order_id,
                    tracking_number=f"TRK-{_digest(reserve_stock.reservation_id, charge_card.charge_id)}",
                    charge_id=charge_card.charge_id, receipt_id=send_email.message_id)


def sample_input(services_url: str, order_id: str = "o-1001") -> dict[str, Any]:
    return OrderIn(order_id=order_id, sku="BOOK-42", quantity=2, amount_cents=3998, email="ada@example.com",
                   services_url=services_url).model_dump()


def main(argv: list[str] | None = None) -> int:
    """The demo: start the fake provider, run one order, print the result and the provider's log."""
    parser = argparse.ArgumentParser(prog="python -m examples.order.workflow",
                                     description="run one order against a local fake provider")
    parser.add_argument("--db", default=None, help="store URL (default: RAYSAGA_DB or ~/.raysaga/raysaga.db)")
    parser.add_argument("--executor", choices=["ray", "inline"], default="ray")
    parser.add_argument("--run-id", default=None, help="default: a new id; an existing run's id resumes it")
    parser.add_argument("--services-url", default=None,
                        help="a provider already running (python -m examples.order.fake_services); "
                             "default: start one in this process")
    args = parser.parse_args(argv)
    run_id = args.run_id or f"order-demo-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        url = args.services_url or stack.enter_context(fake_services.FakeServices()).url
        try:
            record = raysaga.run(wf, sample_input(url, order_id=run_id), store=args.db, run_id=run_id, workflow_ref=REF,
                                 executor=args.executor)
        except raysaga.LeaseHeldError as exc:
            print(f"{exc}\n(a killed driver's lease expires {raysaga.RunOptions().lease_ttl:.0f}s after its "
                  "last heartbeat: try again then)", file=sys.stderr)
            return 3
        log = fake_services.get_log(url)
    print(f"run {record.run_id}: {record.status.value}")
    print(json.dumps(record.output, indent=2, sort_keys=True))
    print("provider log (calls per idempotency key):")
    for key, raw in log["raw"].items():
        print(f"  {log['kinds'][key]:<6} {key}  raw={raw} effective={log['effective'].get(key, 0)}")
    return 0 if record.status == raysaga.RunStatus.COMPLETED else 1


if __name__ == "__main__":
    # Run the importable copy (not __main__), so Ray pickles the steps by reference to
    # ``examples.order.workflow`` and its workers import the same module.
    from examples.order import workflow as _importable

    sys.exit(_importable.main())

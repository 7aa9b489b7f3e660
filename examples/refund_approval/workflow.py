"""The refund example: a refund above a limit waits for finance to approve it, holding nothing.

    look_up → review (approval: finance, 1 day, "approve with edits") → refund (effect) → notify

``review`` is an approval node: when the run reaches it, the run rests ``waiting_human``, its
driver releases the lease and returns. Any process decides (``raysaga approve RUN review --by
finance-lead --answer '{"amount_cents": 4000}'``, or ``raysaga.Client(db).approve(...)``); a
``raysaga worker`` takes the run up and refunds the approved amount, once, under its
idempotency key. A rejection fails ``review`` and nothing is refunded.

    python -m examples.refund_approval.workflow [--db URL]

The demo plays all three parts in one process: it starts the run (it rests), approves it as
``finance-lead`` with a smaller amount, and runs a worker until the run completes.
"""

from __future__ import annotations

import argparse
import sys
import threading
import uuid
from typing import Any

from pydantic import BaseModel, Field

import raysaga
from examples.order.fake_services import FakeServices, get_log, post
from raysaga import Approval, Ask, Client, RetryPolicy, StepContext, Worker, Workflow


class RefundIn(BaseModel):
    order_id: str
    amount_cents: int = Field(gt=0)
    reason: str
    services_url: str


class RefundEdit(BaseModel):
    """What finance may change when it approves."""

    amount_cents: int = Field(gt=0)


wf = Workflow("refund_approval", version="1", description="refunds above a limit wait for finance")
#: Where `raysaga resume`, `fork` and the dashboard import this workflow (run as a script, it records none by itself).
REF = "examples.refund_approval.workflow:wf"


@wf.step()
def look_up(input: RefundIn) -> dict[str, Any]:
    return {"order_id": input.order_id, "amount_cents": input.amount_cents, "reason": input.reason}


@wf.approval(approvers=["finance-lead", "cfo"], answer=RefundEdit, timeout=24 * 3600, on_timeout="escalate",
             escalate_to=["cfo"])
def review(look_up: dict[str, Any]) -> Ask:
    return Ask(prompt=f"Refund {look_up['amount_cents']} cents on order {look_up['order_id']}?", payload=look_up)


@wf.step(effect=True, retry=RetryPolicy(max_attempts=5, base=0.2, cap=2.0))
def refund(ctx: StepContext, input: RefundIn, look_up: dict[str, Any], review: Approval) -> dict[str, Any]:
    amount = review.answer["amount_cents"] if review.answer else look_up["amount_cents"]
    assert ctx.idempotency_key is not None
    reply = post(input.services_url, "refund", ctx.idempotency_key,
                 {"order_id": input.order_id, "amount_cents": amount})
    return {"refund_id": reply["id"], "amount_cents": amount, "approved_by": review.by}


@wf.step()
def notify(refund: dict[str, Any]) -> str:
    return f"refunded {refund['amount_cents']} cents (approved by {', '.join(refund['approved_by'])})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.refund_approval.workflow",
                                     description="a refund that waits for finance, then a worker finishes it")
    parser.add_argument("--db", default=None, help="store URL (default: RAYSAGA_DB or ~/.raysaga/raysaga.db)")
    args = parser.parse_args(argv)
    with FakeServices() as services:
        run_id = f"refund-{uuid.uuid4().hex[:8]}"
        value = {"order_id": "o-42", "amount_cents": 5000, "reason": "arrived broken", "services_url": services.url}
        rested = raysaga.run(wf, value, store=args.db, run_id=run_id, workflow_ref=REF, executor="inline")
        print(f"1. run {run_id}: {rested.status.value} — {rested.status_reason}")
        with Client(args.db) as client:
            for item in client.inbox("finance-lead"):
                print(f"2. inbox of finance-lead: {item.run_id} {item.node}: {item.request.prompt}")
            decision = client.approve(run_id, "review", by="finance-lead", answer={"amount_cents": 4000},
                                      comment="partial: the box was fine")
            print(f"3. approved by {decision.by} with an edit: 4000 cents")
            worker = Worker([wf], client.store, concurrency=1, executor="inline", poll=0.05)
            thread = threading.Thread(target=worker.run)
            thread.start()
            try:
                while client.get_run(run_id).status.value not in ("completed", "failed", "compensated"):
                    threading.Event().wait(0.05)
            finally:
                worker.stop()
                thread.join()
            final = client.get_run(run_id)
        print(f"4. a worker took it up: {final.status.value}: {final.output['notify'] if final.output else ''}")
        refunds = [c for c in get_log(services.url)["calls"] if c["kind"] == "refund"]
        print(f"   the provider saw {len(refunds)} refund call(s)")
        return 0 if final.status.value == "completed" and len(refunds) == 1 else 1


if __name__ == "__main__":
    from examples.refund_approval import workflow as _importable

    sys.exit(_importable.main())

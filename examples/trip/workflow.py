"""The trip example: book a flight → charge the card → book a hotel, as a ``raysaga.Saga``.

The hotel is sold out, so ``book_hotel`` fails for good and the saga rolls back what was done,
in reverse: the card is refunded, then the flight is cancelled; the run ends ``compensated``.
Every service is the order example's deduping fake provider (``examples.order.fake_services``),
here wrapped as ``TripServices`` so that it can refuse a kind of call (the sold-out hotel, or
an operator-made outage) with HTTP 409, logging the refused call in its ordered call log.

Each action and each undo is an effect: it passes ``ctx.idempotency_key`` to the provider, so
a resume never repeats one that took effect. An undo is called with ``output=None`` when the
action's outcome is unknown (it was in flight when the run failed); it then cancels by the
original request's key, and a provider answer of "nothing to undo" (404/410) counts as done.

    python -m examples.trip.workflow [--executor ray] [--db URL] [--run-id ID]
    raysaga run examples.trip.workflow:wf --input @trip.json     # against a running provider
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import urllib.error
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

import raysaga
from examples.order.fake_services import FakeServices, get_log, post
from raysaga import Permanent, RetryPolicy, Saga, StepContext

COMPENSATE_SUFFIX = ":compensate"
#: Provider calls fail transiently now and then; retried with the same key, so safe.
PROVIDER_RETRY = RetryPolicy(max_attempts=4, base=0.1, cap=1.0)


# ---------------------------------------------------------------------- the provider


class TripServices(FakeServices):
    """``FakeServices`` (reused as is) that refuses some kinds of call with HTTP 409.

    ``sold_out`` kinds are always refused ("no rooms"); a kind in ``outages`` is refused while
    its file exists (an operator's switch: delete the file and the service works again).
    A refused call is logged in ``log()["calls"]`` with ``refused: True`` and counted in
    ``raw``; it takes no effect (never in ``effective``).
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, sold_out: Iterable[str] = ("hotel",),
                 outages: Mapping[str, str | os.PathLike[str]] | None = None) -> None:
        super().__init__(host, port)
        self.sold_out = set(sold_out)
        self.outages = {kind: Path(path) for kind, path in (outages or {}).items()}

    def refusal(self, kind: str) -> str | None:
        """Why a call of this kind is refused right now (None: it is served)."""
        if kind in self.sold_out:
            return "no rooms"
        outage = self.outages.get(kind)
        if outage is not None and outage.exists():
            return f"{kind} service refusing requests ({outage.name} is set)"
        return None

    def start(self) -> TripServices:
        super().start()
        ledger = self._server.ledger  # type: ignore[union-attr]  # the base class's own bookkeeping
        serve = ledger.apply

        def apply(kind: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
            reason = self.refusal(kind)
            if reason is None:
                return serve(kind, key, body)
            with ledger.lock:
                ledger.raw[key] += 1
                ledger.calls.append({"kind": kind, "key": key, "duplicate": False, "refused": True,
                                     "status": 409, "reason": reason})
            return 409, {"error": reason}

        ledger.apply = apply  # type: ignore[method-assign]  # the request handler calls server.ledger.apply
        return self

    def __enter__(self) -> TripServices:
        return self.start()


# ---------------------------------------------------------------------- models


class TripIn(BaseModel):
    """The run input."""

    trip_id: str
    traveller: str
    flight: str = "LH400 FRA-JFK"
    hotel: str = "Hotel Chelsea, 3 nights"
    amount_cents: int = Field(default=84_900, ge=0)
    services_url: str
    """Base URL of the provider (``TripServices``)."""


class Booking(BaseModel):
    booking_id: str
    what: str


class Charge(BaseModel):
    charge_id: str
    amount_cents: int


class Undo(BaseModel):
    """What a compensation did."""

    undone: bool
    of: str
    """The booking or charge undone, or the original request's key when its outcome was unknown."""
    reference: str | None = None
    """The provider's id for the undo (None when there was nothing to undo)."""


# ---------------------------------------------------------------------- actions


def _key(ctx: StepContext) -> str:
    # set by raysaga for every effect; never invent one (a fresh key is a second booking)
    assert ctx.idempotency_key is not None, f"step {ctx.label!r} is not an effect"
    return ctx.idempotency_key


def _call(input: TripIn, kind: str, ctx: StepContext, body: dict[str, Any]) -> dict[str, Any]:
    try:
        return post(input.services_url, kind, _key(ctx), body)
    except urllib.error.HTTPError as exc:
        if exc.code == 409:  # the provider refused: retrying cannot help
            detail = json.loads(exc.read() or b"{}").get("error", "refused")
            raise Permanent(f"{kind} refused: {detail}") from None
        raise  # 5xx/429 are transient (retried with the same key), other 4xx permanent


def book_flight(ctx: StepContext, input: TripIn) -> Booking:
    reply = _call(input, "flight", ctx, {"subject": f"{input.trip_id}/flight", "flight": input.flight,
                                         "traveller": input.traveller})
    return Booking(booking_id=reply["id"], what=input.flight)


def charge_card(ctx: StepContext, input: TripIn, book_flight: Booking) -> Charge:
    reply = _call(input, "charge", ctx, {"order_id": input.trip_id, "amount_cents": input.amount_cents,
                                         "for": book_flight.booking_id})
    return Charge(charge_id=reply["id"], amount_cents=input.amount_cents)


def book_hotel(ctx: StepContext, input: TripIn) -> Booking:
    reply = _call(input, "hotel", ctx, {"subject": f"{input.trip_id}/hotel", "hotel": input.hotel,
                                        "traveller": input.traveller})
    return Booking(booking_id=reply["id"], what=input.hotel)


# ---------------------------------------------------------------------- compensations


def _undo(ctx: StepContext, input: TripIn, kind: str, subject: str, done_id: str | None) -> Undo:
    """Undo one action. ``done_id`` is None when the action's outcome is unknown: cancel by the
    original request's key (the undo's key minus ``:compensate``) and accept "nothing to undo"."""
    original = _key(ctx).removesuffix(COMPENSATE_SUFFIX)
    of = done_id or original
    try:
        reply = _call(input, kind, ctx, {"subject": f"{input.trip_id}/{subject}", "of": done_id,
                                         "request_key": original})
    except urllib.error.HTTPError as exc:
        if exc.code in (404, 410):  # the action never took effect: nothing to undo
            return Undo(undone=False, of=of)
        raise
    return Undo(undone=True, of=of, reference=reply["id"])


def cancel_flight(ctx: StepContext, input: TripIn, output: Booking | None) -> Undo:
    return _undo(ctx, input, "cancel_flight", "flight", output.booking_id if output else None)


def refund_card(ctx: StepContext, input: TripIn, output: Charge | None) -> Undo:
    return _undo(ctx, input, "refund", "charge", output.charge_id if output else None)


def cancel_hotel(ctx: StepContext, input: TripIn, output: Booking | None) -> Undo:
    return _undo(ctx, input, "cancel_hotel", "hotel", output.booking_id if output else None)


saga = (Saga("trip", version="1")
        .step(book_flight, compensate=cancel_flight, retry=PROVIDER_RETRY)
        .step(charge_card, compensate=refund_card, retry=PROVIDER_RETRY)
        .step(book_hotel, compensate=cancel_hotel, retry=PROVIDER_RETRY))
wf = saga.workflow
#: Where `raysaga resume`, `fork` and the dashboard import this workflow (run as a script, it records none by itself).
REF = "examples.trip.workflow:wf"


def sample_input(services_url: str, trip_id: str = "trip-1001") -> dict[str, Any]:
    return TripIn(trip_id=trip_id, traveller="ada", services_url=services_url).model_dump()


# ---------------------------------------------------------------------- the demo


def describe_call(call: dict[str, Any]) -> str:
    if call.get("refused"):
        return f"refused ({call.get('status')}: {call.get('reason')})"
    return "replayed (duplicate key)" if call.get("duplicate") else "ok"


def main(argv: list[str] | None = None) -> int:
    """Start the provider, run one trip (it ends ``compensated``), print the status and the call log.

    Exit code 0 when the run ended ``compensated``, as the demo intends; 1 otherwise.
    """
    parser = argparse.ArgumentParser(prog="python -m examples.trip.workflow",
                                     description="book a trip whose hotel is sold out, and watch it roll back")
    parser.add_argument("--db", default=None, help="store URL (default: RAYSAGA_DB or ~/.raysaga/raysaga.db)")
    parser.add_argument("--executor", choices=["inline", "ray"], default="inline")
    parser.add_argument("--run-id", default=None, help="default: a new id; an existing run's id resumes it")
    parser.add_argument("--services-url", default=None,
                        help="a provider already serving (--serve); default: start one in this process")
    parser.add_argument("--serve", action="store_true", help="only serve the provider, in the foreground")
    parser.add_argument("--port", type=int, default=8766, help="with --serve")
    args = parser.parse_args(argv)
    if args.serve:
        with TripServices(port=args.port) as services:
            print(f"trip provider on {services.url} (GET /log for the call log); Ctrl-C stops it", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                services._thread.join()  # type: ignore[union-attr]
        return 0
    run_id = args.run_id or f"trip-demo-{uuid.uuid4().hex[:8]}"
    with contextlib.ExitStack() as stack:
        url = args.services_url or stack.enter_context(TripServices()).url
        try:
            record = saga.run(sample_input(url, trip_id=run_id), store=args.db, run_id=run_id, workflow_ref=REF,
                              executor=args.executor)
        except raysaga.LeaseHeldError as exc:
            print(f"{exc}\n(a killed driver's lease expires after its last heartbeat: try again then)",
                  file=sys.stderr)
            return 3
        log = get_log(url)
    print(f"run {record.run_id}: {record.status.value}" + (f" — {record.status_reason}"
                                                           if record.status_reason else ""))
    print("provider calls, in order:")
    for i, call in enumerate(log["calls"], 1):
        print(f"  {i}. {call['kind']:<14} {call['key']}  {describe_call(call)}")
    return 0 if record.status == raysaga.RunStatus.COMPENSATED else 1


if __name__ == "__main__":
    # Run the importable copy (not __main__), so Ray pickles the steps by reference to
    # ``examples.trip.workflow`` and its workers import the same module.
    from examples.trip import workflow as _importable

    sys.exit(_importable.main())

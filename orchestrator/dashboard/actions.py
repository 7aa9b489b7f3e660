"""The dashboard's actions, each the twin of a CLI verb, through ``raysaga.Client``.

Approve, reject, cancel, cancel and compensate, pause and unpause are the client's methods on
the dashboard's store, with the actor (``by``) the page sends: the store records each decision
and transition as an event naming them. A web request never drives a run: retry makes the parked
run runnable again (same keys) and a ``raysaga worker`` (or ``raysaga resume RUN``) drives it.
"""

from __future__ import annotations

from typing import Any

from raysaga.errors import UserError
from raysaga.orchestrator.client import Client
from raysaga.state import Store

VERBS = ("approve", "reject", "cancel", "compensate", "pause", "unpause", "retry")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


def _text(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    return None if value is None or value == "" else str(value)[:2000]


def _node(label: str) -> tuple[str, int]:
    if label.endswith("]") and "[" in label:
        head, _, index = label[:-1].rpartition("[")
        if index.isdigit() and len(index) < 11:
            return head, int(index)
    return label, -1


def perform(store: Store, run_id: str, verb: str, *, by: str, body: dict[str, Any]) -> dict[str, Any]:
    """Do ``verb`` on the run as ``by``; ``UserError`` for an unknown verb, a missing field or an
    action the run's state refuses (the client's message)."""
    if verb not in VERBS:
        raise UserError(f"unknown action {verb!r}: one of {', '.join(VERBS)}")
    if _has_nul(body):  # PostgreSQL text and JSON cannot hold one: a 500 where a refusal belongs
        raise UserError(f"{verb}: the request holds a NUL character (\\u0000), which no field takes")
    store.get_run(run_id, lenient=True)  # RunNotFoundError first
    client = Client(store)  # borrows the store: never closed here
    if verb in ("approve", "reject"):
        label = _text(body, "node")
        if not label:
            raise UserError(f"{verb} needs the waiting node (\"node\")")
        node, index = _node(label)
        if verb == "approve":
            decision = client.approve(run_id, node, by=by, answer=body.get("answer"), comment=_text(body, "comment"),
                                      decision_id=_text(body, "decision_id"), fan_index=index)
        else:
            decision = client.reject(run_id, node, by=by, comment=_text(body, "comment"),
                                     decision_id=_text(body, "decision_id"), fan_index=index)
        return {"ok": True, "verb": verb, "by": by, "decision": decision.model_dump(mode="json")}
    if verb == "retry":  # the run is made runnable again; a worker (or `raysaga resume RUN`) drives it
        run = client.retry(run_id, by=by)
    elif verb in ("cancel", "compensate"):
        run = client.cancel(run_id, compensate=verb == "compensate", by=by, reason=_text(body, "reason"))
    elif verb == "pause":
        run = client.pause(run_id, by=by, reason=_text(body, "reason"))
    else:
        run = client.unpause(run_id, by=by)
    return {"ok": True, "verb": verb, "by": by, "status": run.status.value}


__all__ = ["VERBS", "perform"]

"""The dashboard's actions, each the twin of a CLI verb, through one adapter.

``perform`` calls ``raysaga.orchestrator.client.Client`` (approve, reject, cancel, pause,
unpause) when that module exists in this installation; until then it falls back on what the
engine already has: an approval or rejection is queued as a signal for the run's driver (the
actor in its payload), a cancel goes through ``runner.cancel``. Every action names its actor
(``by``), which the engine records in the run's event log.
"""

from __future__ import annotations

import importlib
from typing import Any

from raysaga.errors import UserError
from raysaga.state import Store

VERBS = ("approve", "reject", "cancel", "compensate", "pause", "unpause", "retry")


def _client(store: Store) -> Any | None:
    try:
        module = importlib.import_module("raysaga.orchestrator.client")
    except ImportError:
        return None
    client_type = getattr(module, "Client", None)
    if client_type is None:
        return None
    return client_type(db=getattr(store, "url", None))


def _text(body: dict[str, Any], key: str) -> str | None:
    value = body.get(key)
    return None if value is None else str(value)[:2000]


def perform(store: Store, run_id: str, verb: str, *, by: str, body: dict[str, Any]) -> dict[str, Any]:
    """Do ``verb`` on the run as ``by``; ``UserError`` for an unknown verb or missing field."""
    if verb not in VERBS:
        raise UserError(f"unknown action {verb!r}: one of {', '.join(VERBS)}")
    store.get_run(run_id, lenient=True)  # RunNotFoundError first
    node = _text(body, "node")
    if verb in ("approve", "reject") and not node:
        raise UserError(f"{verb} needs the waiting node (\"node\")")
    client = _client(store)
    if client is not None:
        if verb == "approve":
            client.approve(run_id, node, by=by, answer=body.get("answer"), comment=_text(body, "comment"),
                           decision_id=_text(body, "decision_id"))
        elif verb == "reject":
            client.reject(run_id, node, by=by, comment=_text(body, "comment"), decision_id=_text(body, "decision_id"))
        elif verb in ("cancel", "compensate"):
            client.cancel(run_id, compensate=verb == "compensate", by=by, reason=_text(body, "reason"))
        elif verb == "pause":
            client.pause(run_id, by=by)
        elif verb == "unpause":
            client.unpause(run_id, by=by)
        else:
            raise UserError("retry from the dashboard is not available yet: use `raysaga retry RUN`")
        return {"ok": True, "verb": verb, "by": by}
    return _fallback(store, run_id, verb, by=by, node=node, body=body)


def _fallback(store: Store, run_id: str, verb: str, *, by: str, node: str | None,
              body: dict[str, Any]) -> dict[str, Any]:
    if verb in ("approve", "reject"):
        payload = {"by": by, "answer": body.get("answer"), "comment": _text(body, "comment")}
        store.send_signal(run_id, verb, node, payload)
        return {"ok": True, "verb": verb, "by": by, "queued": True}
    if verb == "cancel":
        from raysaga.orchestrator.runner import cancel

        reason = _text(body, "reason") or "cancelled"
        run = cancel(run_id, store=store, reason=f"{reason} (by {by}, from the dashboard)", wait=10.0)
        return {"ok": True, "verb": verb, "by": by, "status": run.status.value}
    raise UserError(f"{verb} from the dashboard needs raysaga.Client, which this installation does not have yet: "
                    f"use the CLI")


__all__ = ["VERBS", "perform"]

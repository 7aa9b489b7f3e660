"""The dashboard's actions, each the twin of a CLI verb, through ``raysaga.Client``.

Approve, reject, cancel, cancel and compensate, pause and unpause are the client's methods on
the dashboard's store, with the actor (``by``) the page sends: the store records each decision
and transition as an event naming them. A web request never drives a run: retry makes the parked
run runnable again (same keys) and a ``raysaga worker`` (or ``raysaga resume RUN``) drives it.

The body's text is checked before anything is done: a control character in ``reason`` or
``comment`` is a 400 (the CLI's ``status`` and ``list`` print what is recorded: ESC, BEL and CR
rewrote the operator's terminal), but for the newlines and tabs of a multi-line text, as
``raysaga approve --comment "$(cat review.txt)"`` and ``cancel --reason`` record them; text over
the CLI's limit (``MAX_COMMENT``) is refused, never cut short silently.
"""

from __future__ import annotations

import re
from typing import Any

from raysaga.errors import UserError
from raysaga.orchestrator.client import Client
from raysaga.orchestrator.dashboard.params import fits, node_param
from raysaga.state import RunRecord, RunStatus, Store
from raysaga.state.decisions import MAX_COMMENT
from raysaga.state.models import PARKED, TERMINAL

VERBS = ("approve", "reject", "cancel", "compensate", "pause", "unpause", "retry")


def _has_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(_has_nul(k) or _has_nul(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_nul(v) for v in value)
    return False


#: Control characters (C0, DEL, C1) but newline and tab, which a multi-line text holds.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _text(body: dict[str, Any], key: str, limit: int = MAX_COMMENT) -> str | None:
    """``body[key]``, text of at most ``limit`` characters without control characters but newlines
    and tabs, or ``UserError`` naming it; absent or empty is None."""
    value = body.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise UserError(f"{key} is text (a JSON string), got {type(value).__name__}")
    if len(value) > limit:
        raise UserError(f"{key} is {len(value):,} characters long: at most {limit:,}")
    bad = _CONTROL.search(value)
    if bad is not None:
        raise UserError(f"{key} holds the control character {bad.group()!r} at {bad.start()}: {key} is printable "
                        "text, its lines split by \\n (tabs too; no CR)")
    return value


def _node(body: dict[str, Any], verb: str) -> tuple[str, int]:
    """The waiting node an approve or reject names: ``gate`` or ``gate[3]``, else ``UserError``."""
    label = body.get("node")
    if label is None or label == "":
        raise UserError(f"{verb} needs the waiting node (\"node\")")
    return node_param(label, "node")


def _decision_id(body: dict[str, Any]) -> str | None:
    """The decision's id when the request names one (a retried request then decides once)."""
    value = body.get("decision_id")
    if value is None or value == "":
        return None
    if not fits(value, 200):
        raise UserError("decision_id is an id of 1-200 printable characters (a request id, a UUID)")
    return value


def _unlisted(exc: UserError, by: str, label: str) -> UserError:
    """The store's refusal of a decider who is not an approver, without the approvers' names
    (``state.decisions`` lists them, for the CLI's operator): told over the web to someone who is
    not one, it named whose token or name to use."""
    if str(exc).startswith(f"{by} may not decide "):
        return UserError(f"{by} may not decide {label!r}: {by} is not one of its approvers")
    return exc


def perform(store: Store, run_id: str, verb: str, *, by: str, body: dict[str, Any]) -> dict[str, Any]:
    """Do ``verb`` on the run as ``by``; ``UserError`` for an unknown verb, a missing field or an
    action the run's state refuses (the client's message)."""
    if verb not in VERBS:
        raise UserError(f"unknown action {verb!r}: one of {', '.join(VERBS)}")
    if _has_nul(body):  # PostgreSQL text and JSON cannot hold one: a 500 where a refusal belongs
        raise UserError(f"{verb}: the request holds a NUL character (\\u0000), which no field takes")
    store.get_run(run_id, lenient=True)  # RunNotFoundError first
    reason, comment = _text(body, "reason"), _text(body, "comment")
    client = Client(store)  # borrows the store: never closed here
    if verb in ("approve", "reject"):
        node, index = _node(body, verb)
        try:
            if verb == "approve":
                decision = client.approve(run_id, node, by=by, answer=body.get("answer"), comment=comment,
                                          decision_id=_decision_id(body), fan_index=index)
            else:
                decision = client.reject(run_id, node, by=by, comment=comment, decision_id=_decision_id(body),
                                         fan_index=index)
        except UserError as exc:
            raise _unlisted(exc, by, body["node"]) from None
        return {"ok": True, "verb": verb, "by": by, "decision": decision.model_dump(mode="json")}
    if verb == "retry":  # the run is made runnable again; a worker (or `raysaga resume RUN`) drives it
        run = client.retry(run_id, by=by)
    elif verb in ("cancel", "compensate"):
        _cancellable(client.get_run(run_id), verb)
        run = client.cancel(run_id, compensate=verb == "compensate", by=by, reason=reason)
        if verb == "compensate" and run.status == RunStatus.CANCELLED:  # (``cli_ops.cancel_outcome``'s case)
            raise ActionConflict(f"run {run_id!r} ended cancelled without a rollback: a plain cancel reached it "
                                 "first; its committed effects stand (a cancelled run never changes again)")
    elif verb == "pause":
        run = client.pause(run_id, by=by, reason=reason)
    else:
        run = client.unpause(run_id, by=by)
    return {"ok": True, "verb": verb, "by": by, "status": run.status.value}


class ActionConflict(UserError):
    """An action that the run's state, changed by another at the same moment, did not let happen as
    asked (a 409: the page says it, not "sent")."""


def _cancellable(run: RunRecord, verb: str) -> None:
    """A cancel (or compensate) of a run that has ended, or of a failed rollback, refused as the CLI
    refuses it: it answered ok and changed nothing."""
    if run.status in TERMINAL:
        raise UserError(f"run {run.run_id!r} is already {run.status.value}: nothing to {verb}")
    if run.status == RunStatus.COMPENSATION_FAILED:
        raise UserError(f"run {run.run_id!r} is compensation_failed: its rollback is finished by Retry once what its "
                        "failed compensations need is fixed (`raysaga retry RUN --compensations`)")
    if run.status in PARKED and verb == "cancel":
        raise UserError(f"run {run.run_id!r} is {run.status.value}: nothing to cancel (Compensate rolls it back, "
                        "Retry revives it)")


__all__ = ["VERBS", "ActionConflict", "perform"]

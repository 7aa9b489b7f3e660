"""Attempts of a run's nodes: counting them, the idempotency ledger, retries and their timers.

Every node kind (step, item, model turn, tool call, compensation) goes through here on its way
out and back: an effect's ledger row is ``pending`` in the batch before its call is handed to
the shell, ``committed`` with its result after; a key already committed is never called again
(its result is returned as the node's output); a key that failed for good, or whose tool call
answered a ``ToolError`` (it took no effect), is ``failed`` and may be called again; one whose
retries ran out on transient errors is ``abandoned`` (the last call may have taken effect); a
transient failure is retried after a backoff whose timer is durable (``not_before`` on the row).
A key re-issued while its row says the call may have happened (``may_have_happened``) goes out
``reconciling``; a node whose attempt is in doubt under another key than the code derives now (a
deploy) is issued under that key (``machine.doubt``: invariant 2).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from itertools import repeat
from typing import Any

from raysaga.agents.tools import took_no_effect
from raysaga.node_key import NodeKey
from raysaga.orchestrator.item_block import ItemBlock
from raysaga.orchestrator.keys import args_digest
from raysaga.orchestrator.machine.doubt import InDoubt, may_have_happened
from raysaga.orchestrator.machine.outbox import Dispatch, ItemsDispatch, Outbox
from raysaga.orchestrator.machine.timers import Timers
from raysaga.orchestrator.options import DEFAULT_RETRY
from raysaga.orchestrator.records import cancelled_row, merge_run, short_error
from raysaga.orchestrator.retry import backoff_delay
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import AllSucceeded, NodeCall, NodeOutcome
from raysaga.sagas.rollback import not_sent
from raysaga.state import (
    EffectStatus,
    EffectWrite,
    ErrorRecord,
    NewEvent,
    NodeStatus,
    NodeWrite,
    RunUpdate,
    item_events,
    jsoncodec,
)

#: An item of ``items_succeeded`` that was no longer in flight (nothing to settle).
GONE = object()


@dataclass(frozen=True, slots=True)
class Attempt:
    """An attempt handed to the shell and not yet back. Frozen: a block's first attempts share
    one (``issue_items``); recording one as running replaces its entry (``recorded``)."""

    spec: StepSpec
    attempt: int
    started_at: float
    recorded: bool  # a 'running' row is durable (or in the batch)


@dataclass(frozen=True)
class Committed:
    """The effect's key is committed in the ledger: this is its result, and there is no call."""

    value: Any


def recorded(flight: Attempt) -> Attempt:
    """``flight`` once its 'running' row is in the batch (a new record: one may be shared)."""
    return Attempt(flight.spec, flight.attempt, flight.started_at, True)


class Calls:
    def __init__(self, run_id: str, trace_id: str, out: Outbox, *, max_output_bytes: int, blob_threshold: int,
                 rng: random.Random, records_first: Callable[[StepSpec], bool]) -> None:
        self.run_id = run_id
        self.trace_id = trace_id
        self.out = out
        self.max_output_bytes = max_output_bytes
        self.blob_threshold = blob_threshold
        self.rng = rng
        self._records_first = records_first
        self.attempts: dict[NodeKey, int] = {}
        self.ledger: dict[str, tuple[EffectStatus, Any]] = {}
        self.ledger_blobs: dict[str, Any] = {}  # committed results kept as blobs, read by the shell
        self.keys: dict[NodeKey, str] = {}  # idempotency key of each effect node issued
        self.in_doubt = InDoubt()  # attempts that may have happened keep their keys (``doubt``)
        self.inflight: dict[NodeKey, Attempt] = {}
        self.timers = Timers()
        self.unrecorded: list[NodeKey] = []  # in flight without a 'running' row (may hold stale keys)
        self.draining: set[NodeKey] = set()  # effects let land after their step failed (see ``drain``)
        # Nodes recorded before their call (effects, steps with an undo) one of whose attempts may
        # have left the driver (issued here, or rows restored saying so); and those in flight whose
        # attempt is the first that may leave, under a key no ledger row doubts (``unsent_error``).
        self.maybe_ran: set[NodeKey] = set()
        self.first_out: set[NodeKey] = set()
        self._cancelled_effects: dict[NodeKey, str] = {}  # effect attempts cancelled -> their effect's name
        self._items_events: list[NewEvent] | None = None  # the batch's events list the next two are for
        self._items_of: dict[str, list[list[int]]] = {}  # step -> its items completed in that batch (ranges)
        self.retries_used = 0
        self.retry_budget: int | None = None

    # ------------------------------------------------------------------ out

    def issue(self, key: NodeKey, spec: StepSpec, kwargs: dict[str, Any], ekey: str | None) -> Committed | None:
        """Send an attempt of ``key``; or, when its effect key is already committed, record the
        node completed from the ledger and return its result (nothing is sent)."""
        now = self.out.now
        attempt = self.attempts.get(key, 0) + 1
        self.attempts[key] = attempt
        batch = self.out.batch
        reconciling = False
        if ekey is not None:
            held = self.in_doubt.key_for(key.node_id, key.fan_index, spec.effect_name, ekey, self.ledger)
            if held != ekey:  # derived otherwise by the code now (a deploy): the attempt in doubt keeps its key
                batch.events.append(NewEvent(kind="effect_key_kept", node_id=key.node_id, fan_index=key.fan_index,
                                             data={"key": held, "derived": ekey}))
                ekey = held
            self.keys[key] = ekey
            status, result = self.ledger.get(ekey, (None, None))
            if status == EffectStatus.COMMITTED:  # its result is durable: never call it again
                if isinstance(result, dict) and set(result) == {"blob"}:
                    result = self.ledger_blobs[result["blob"]]
                batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index, status=NodeStatus.COMPLETED,
                                             attempt=attempt, output=result, finished_at=now))
                batch.events.append(NewEvent(kind="node_completed", node_id=key.node_id, fan_index=key.fan_index,
                                             data={"attempt": attempt, "from": "ledger"}))
                return Committed(result)
            reconciling = may_have_happened(status, result)
            self.ledger[ekey] = (EffectStatus.PENDING, None)
            batch.effects.append(EffectWrite(idempotency_key=ekey, node_id=key.node_id, fan_index=key.fan_index,
                                             effect_name=spec.effect_name, args_digest=args_digest(kwargs),
                                             status=EffectStatus.PENDING))
        recorded = self._records_first(spec)
        if recorded:
            if reconciling or key in self.maybe_ran:
                self.first_out.discard(key)
            else:
                self.first_out.add(key)
            self.maybe_ran.add(key)
            batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index, status=NodeStatus.RUNNING,
                                         attempt=attempt, started_at=now))
        call = NodeCall(fields=(self.run_id, key.node_id, key.fan_index, attempt, self.trace_id, ekey, reconciling),
                        kwargs=kwargs, max_output_bytes=self.max_output_bytes, reconcile=reconciling)
        self.inflight[key] = Attempt(spec, attempt, now, recorded)
        if not recorded:
            self.unrecorded.append(key)
        self.out.dispatch.append(Dispatch(key, spec, call))
        return None

    def issue_items(self, spec: StepSpec, keys: list[NodeKey], kwargs: list[dict[str, Any]]) -> None:
        """Send attempts of plain fan-out items of ``spec`` (no effect, no 'running' row first):
        ``issue`` for each, as one block to the shell (``ItemsDispatch``; ``item_block``)."""
        now, attempts, inflight = self.out.now, self.attempts, self.inflight
        if attempts.keys().isdisjoint(keys):  # first attempts (a fan-out just expanded): one shared record
            counts = [1] * len(keys)
            attempts.update(dict.fromkeys(keys, 1))
            inflight.update(dict.fromkeys(keys, Attempt(spec, 1, now, False)))
        else:
            counts = []
            for key in keys:
                attempt = attempts.get(key, 0) + 1
                attempts[key] = attempt
                counts.append(attempt)
                inflight[key] = Attempt(spec, attempt, now, False)
        self.unrecorded.extend(keys)
        self.out.dispatch.append(ItemsDispatch(ItemBlock(spec, self.run_id, self.trace_id, self.max_output_bytes,
                                                         keys, counts, kwargs)))

    def records_first(self, spec: StepSpec) -> bool:
        """Whether ``spec``'s attempts are durable as 'running' before they are sent."""
        return self._records_first(spec)

    def unissue(self, ekeys: set[str]) -> None:
        """Effects issued in this batch that will never be sent (the run failed first): their
        ``pending`` ledger rows are dropped from the batch, as if never issued. (Not for a row
        already ``pending`` before, from an earlier driver: that call may have happened.)"""
        if not ekeys:
            return
        for ekey in ekeys:
            self.ledger.pop(ekey, None)
        effects = self.out.batch.effects
        effects[:] = [e for e in effects if e.idempotency_key not in ekeys or e.status != EffectStatus.PENDING]

    def schedule(self, when: float, key: NodeKey) -> None:
        """Issue ``key`` again at ``when`` (a durable backoff: its row says ``not_before``)."""
        self.timers.push(when, key)

    def unschedule(self, key: NodeKey) -> None:
        """Drop ``key``'s timers (an approval decided before its timeout)."""
        self.timers.drop(key)

    def due(self) -> list[NodeKey]:
        """Timers that fired by now, in time order."""
        return self.timers.due(self.out.now)

    def next_timer(self) -> float | None:
        return self.timers.next()

    # ------------------------------------------------------------------ back

    def succeeded(self, key: NodeKey, outcome: NodeOutcome) -> Any:
        """Record a finished attempt's output (and its ledger commit); return the value."""
        flight = self.inflight.pop(key)
        text = outcome.output_json
        assert text is not None
        value = None if text == "null" else jsoncodec.loads(text)
        digest = None
        batch = self.out.batch
        if len(text) * 4 > self.blob_threshold:  # (a UTF-8 character is at most 4 bytes)
            data = text.encode("utf-8")
            if len(data) > self.blob_threshold:
                digest = jsoncodec.digest(data)
                batch.blobs[digest] = data
        ekey = self.keys.get(key)
        if ekey is None and key.fan_index >= 0 and key.turn is None and not key.compensates:
            # a plain fan-out item: a compact row, its output the worker's canonical JSON text
            batch.items.append((key.step, key.fan_index, flight.attempt, None if digest or value is None else text,
                                digest, outcome.started_at, outcome.finished_at))
            self._item_completed(key)
            return value
        if ekey is not None and key.is_agent_call and took_no_effect(value):
            # A ToolError: the tool says it took no effect, and the model decides whether to try
            # again. Its key stays runnable (``failed``, as for a permanent failure): committed, the
            # model's retry of the same call got this error back from the ledger for ever. The
            # answer of *this* call is durable all the same: its node row (below) is completed.
            error = {"type": "ToolError", "message": str(value.get("content"))[:2000]}  # rows stay small
            self.ledger[ekey] = (EffectStatus.FAILED, None)
            batch.effects.append(EffectWrite(
                idempotency_key=ekey, node_id=key.node_id, fan_index=key.fan_index, effect_name=flight.spec.effect_name,
                args_digest="", status=EffectStatus.FAILED, result={"error": error}))
        elif ekey is not None:
            self.ledger[ekey] = (EffectStatus.COMMITTED, value)
            batch.effects.append(EffectWrite(
                idempotency_key=ekey, node_id=key.node_id, fan_index=key.fan_index, effect_name=flight.spec.effect_name,
                args_digest="", status=EffectStatus.COMMITTED, result={"blob": digest} if digest else value))
        batch.nodes.append(NodeWrite(
            node_id=key.node_id, fan_index=key.fan_index, status=NodeStatus.COMPLETED, attempt=flight.attempt,
            output=None if digest else value, output_digest=digest, started_at=outcome.started_at,
            finished_at=outcome.finished_at, duration=outcome.finished_at - outcome.started_at))
        batch.events.append(NewEvent(kind="node_completed", node_id=key.node_id, fan_index=key.fan_index,
                                     data={"attempt": flight.attempt}))
        return value

    def items_succeeded(self, keys: list[NodeKey], outcomes: list[NodeOutcome]) -> tuple[list[Any], int]:
        """``succeeded`` for plain items of one step that came back together, in order, up to the
        first that needs more (a failure, an output large enough to be a blob, an item being
        drained); an item no longer in flight is skipped (``GONE``). Returns the items' values and
        how many outcomes it took: the caller settles those, and hands the rest to the general path."""
        if not keys:
            return [], 0
        inflight, threshold, loads, draining = self.inflight, self.blob_threshold, jsoncodec.loads, self.draining
        step = keys[0].step
        rows = self.out.batch.items
        ranges: list[list[int]] | None = None  # this batch's items_completed event of the step, made at the first
        values: list[Any] = []
        taken = 0
        for key, outcome in zip(keys, outcomes, strict=True):
            text = outcome.output_json
            if not outcome.ok or text is None or len(text) * 4 > threshold or (draining and key in draining):
                break
            flight = inflight.pop(key, None)
            taken += 1
            if flight is None:  # cancelled while this round was absorbed
                values.append(GONE)
                continue
            value = None if text == "null" else loads(text)
            index = key.fan_index
            rows.append((step, index, flight.attempt, None if value is None else text, None, outcome.started_at,
                         outcome.finished_at))
            if ranges is None:
                ranges = self._item_ranges(step)
            item_events.add_item(ranges, index)
            values.append(value)
        return values, taken

    def all_succeeded(self, keys: list[NodeKey], done: AllSucceeded) -> list[Any] | None:
        """``items_succeeded`` for items of one step that all succeeded (a chunk's usual return),
        column by column: the same rows, event ranges and values, with no step per item in Python
        where a builtin walks the columns. None, having changed nothing, when one of them needs
        the item-by-item path: an output large enough to be a blob, an item being drained, or
        one no longer in flight (cancelled while this round was absorbed)."""
        texts, inflight = done.texts, self.inflight
        if (not keys or None in texts or max(map(len, texts)) * 4 > self.blob_threshold
                or (self.draining and not self.draining.isdisjoint(keys)) or not all(map(inflight.__contains__, keys))):
            return None
        flights = list(map(inflight.pop, keys))
        first = flights[0]  # a fresh fan-out's first attempts share one record (``issue_items``)
        attempts = repeat(first.attempt) if flights.count(first) == len(flights) else [f.attempt for f in flights]
        if texts.count("null") == len(texts):
            values: list[Any] = [None] * len(texts)
            outputs: Iterable[str | None] = repeat(None)
        else:
            loads = jsoncodec.loads
            values = [None if text == "null" else loads(text) for text in texts]
            outputs = [None if text == "null" else text for text in texts]
        step = keys[0].step
        indexes = [key.fan_index for key in keys]
        self.out.batch.items.extend(zip(repeat(step), indexes, attempts, outputs, repeat(None), done.started,
                                        done.finished))
        item_events.add_items(self._item_ranges(step), indexes)
        return values

    def _item_ranges(self, node_id: str) -> list[list[int]]:
        """The ranges of this batch's ``items_completed`` event of ``node_id`` (made when first needed)."""
        events = self.out.batch.events
        if self._items_events is not events:  # a new batch
            self._items_events, self._items_of = events, {}
        ranges = self._items_of.get(node_id)
        if ranges is None:
            ranges = self._items_of[node_id] = []
            events.append(NewEvent(kind=item_events.KIND, node_id=node_id, data={"ranges": ranges}))
        return ranges

    def _item_completed(self, key: NodeKey) -> None:
        """A plain fan-out item completed: one ``items_completed`` event per step per batch names
        the items in the order they completed, as runs of indexes (``state.item_events``; a row
        per item says the rest). One event per item was half of a big fan-out's writes and of its
        bytes, for nothing a reader used; a list of every index, ~5 bytes an item."""
        item_events.add_item(self._item_ranges(key.node_id), key.fan_index)

    def failed(self, key: NodeKey, outcome: NodeOutcome) -> tuple[dict[str, Any], int] | None:
        """A failed attempt: None when it is retried after a backoff (the timer is set), else its
        final error record and attempt count (the node failed for good: the rows say so)."""
        flight = self.inflight.pop(key)
        policy = flight.spec.retry or DEFAULT_RETRY
        error = dict(outcome.error or {})
        compensating = key.compensates  # a rollback is not stopped by the run's retry budget
        budget = None if compensating else self.retry_budget
        budget_left = budget is None or self.retries_used < budget
        batch = self.out.batch
        node_id, index = key.node_id, key.fan_index
        draining = key in self.draining  # its step failed meanwhile: what it did is recorded, never retried
        if outcome.transient and flight.attempt < policy.max_attempts and budget_left and not draining:
            delay = backoff_delay(flight.attempt, policy, self.rng)
            asked = error.get("retry_after")
            if isinstance(asked, int | float) and asked > delay:
                delay = float(asked)  # the provider said when: sooner is refused again
            not_before = self.out.now + delay
            self.retries_used += 1
            batch.run = merge_run(batch.run, RunUpdate(retries_delta=1))
            batch.nodes.append(NodeWrite(node_id=node_id, fan_index=index, status=NodeStatus.RETRYING,
                                         attempt=flight.attempt, not_before=not_before, error=error,
                                         started_at=outcome.started_at, finished_at=outcome.finished_at,
                                         duration=outcome.finished_at - outcome.started_at))
            # the whole error, its (redacted, bounded) traceback included: the node row keeps only
            # the latest attempt's, and `raysaga status --errors` shows every attempt's
            data: dict[str, Any] = {"attempt": flight.attempt, "delay": round(delay, 4), "error": error}
            if compensating:  # a rollback waiting on an undo: say which, which attempt, next try when
                data["not_before"] = round(not_before, 3)
            batch.events.append(NewEvent(kind="compensation_retry" if compensating else "retry_scheduled",
                                         node_id=node_id, fan_index=index, data=data))
            self.schedule(not_before, key)
            return None
        if outcome.transient:
            error["reason"] = "not retried: its step failed" if draining else "retry budget exhausted" \
                if not budget_left else f"{flight.attempt} attempt{'s' * (flight.attempt != 1)} exhausted"
        ekey = self.keys.get(key)
        if ekey is not None:
            # Its retries ran out on transient errors (or the budget did): whether the last call took
            # effect is unknown, as a rollback assumes (``sagas.rollback.effect_time``), so the row
            # says ``abandoned``, not ``failed``: a re-issue (an operator's retry) reconciles it.
            status = EffectStatus.ABANDONED if outcome.transient else EffectStatus.FAILED
            result = {"error": short_error(error)}
            self.ledger[ekey] = (status, result)
            batch.effects.append(EffectWrite(idempotency_key=ekey, node_id=node_id, fan_index=index,
                                             effect_name=flight.spec.effect_name, args_digest="",
                                             status=status, result=result))
        batch.nodes.append(NodeWrite(node_id=node_id, fan_index=index, status=NodeStatus.FAILED,
                                     attempt=flight.attempt, error=error, started_at=outcome.started_at,
                                     finished_at=outcome.finished_at,
                                     duration=outcome.finished_at - outcome.started_at))
        batch.events.append(NewEvent(kind="node_failed", node_id=node_id, fan_index=index,
                                     data={"attempt": flight.attempt, "error": short_error(error)}))
        return error, flight.attempt

    # ------------------------------------------------------------------ cancel, quiet ticks

    def drain(self, keys: list[NodeKey], reason: str) -> None:
        """Stop what is in flight of a step that failed without stopping the run: plain attempts
        are cancelled; an effect's attempt is let land instead, so that its ledger row says what it
        did (``committed`` with its result, or ``failed``). Cancelled, its row would stay ``pending``
        on a finished run for ever: nothing would ever settle or compensate it."""
        effects = [key for key in keys if key in self.inflight and key in self.keys]
        self.draining.update(effects)
        self.cancel([key for key in keys if key not in self.draining], reason)

    def cancel(self, keys: list[NodeKey], reason: str, *, write: bool = True) -> None:
        """Stop attempts in flight (the shell cancels them); their rows say so unless ``write`` is off."""
        for key in keys:
            flight = self.inflight.pop(key, None)
            self.draining.discard(key)
            if flight is None:
                continue
            self.out.cancel.append(key)
            if key in self.keys:  # an effect's: its ledger row is rewritten if it proves never sent (``not_sent``)
                self._cancelled_effects[key] = flight.spec.effect_name
            if write:
                self.out.batch.nodes.append(cancelled_row(key.node_id, key.fan_index, flight.attempt, reason,
                                                          self.out.now, flight.started_at))

    def unsent_error(self, key: NodeKey, why: str) -> dict[str, Any]:
        """The error of ``key``'s attempt in flight, which never left the driver: ``not sent``, and,
        when no attempt of the node may have left before it (``first_out``), ``took_effect: False``
        (``sagas.rollback.not_sent``: no rollback undoes it; the node counts as never run again)."""
        first = key in self.first_out
        if first:
            self.first_out.discard(key)
            self.maybe_ran.discard(key)
        return not_sent(why, first=first)

    def not_sent(self, keys: Iterable[NodeKey]) -> None:
        """Attempts cancelled (``cancel``, their rows in this batch) that the shell shows never left
        it: their rows say ``not sent`` (``unsent_error``); one that took no effect says so, and its
        ledger row, ``pending`` since before the send, ends ``failed`` with that error (a retry
        calls it afresh, not reconciling). Of a node an earlier attempt of which may have left,
        only the reason changes: that one may have taken effect."""
        keys = list(keys)
        if not keys:
            return
        nodes = self.out.batch.nodes
        where = {(n.node_id, n.fan_index): i for i, n in enumerate(nodes) if n.status == NodeStatus.CANCELLED}
        for key in keys:
            i = where.get((key.node_id, key.fan_index))
            if i is None:
                continue
            row = nodes[i]
            error = self.unsent_error(key, str((row.error or {}).get("reason") or "cancelled"))
            nodes[i] = row.model_copy(update={"error": ErrorRecord.model_validate(error)})
            ekey = self.keys.get(key)
            if error.get("took_effect") is False and ekey is not None \
                    and self.ledger.get(ekey, (None, None))[0] == EffectStatus.PENDING:
                result = {"error": {"type": "Cancelled", **error}}
                self.ledger[ekey] = (EffectStatus.FAILED, result)
                self.out.batch.effects.append(EffectWrite(
                    idempotency_key=ekey, node_id=key.node_id, fan_index=key.fan_index,
                    effect_name=self._cancelled_effects.pop(key, ""), args_digest="", status=EffectStatus.FAILED,
                    result=result))

    def stop_retries(self, reason: str, plain: Callable[[NodeKey], bool]) -> None:
        """The forward DAG stops for good: a ``plain`` node waiting out a retry backoff will not be
        retried, and its row says so (``cancelled``) rather than ``retrying`` on a run that ended.
        (Its timer goes with ``cancel_all``; a rollback still undoes it: its outcome is unknown.)"""
        for _, key in self.timers:
            if not key.compensates and key not in self.inflight and plain(key):
                self.out.batch.nodes.append(NodeWrite(
                    node_id=key.node_id, fan_index=key.fan_index, status=NodeStatus.CANCELLED,
                    attempt=self.attempts.get(key, 0), error={"reason": f"not retried: {reason}"},
                    finished_at=self.out.now))

    def drop_timers(self, which: Callable[[NodeKey], bool], reason: str, effect_name: Callable[[NodeKey], str]) -> None:
        """Retries not to be made (``which`` of the keys waiting out a backoff): rows ``cancelled``
        (``stop_retries``), timers gone, and an effect's ledger row, ``pending`` since the attempt that
        failed, ``abandoned`` (as when its retries run out: settled, and undone by a rollback)."""
        dropped = [k for _, k in self.timers if which(k) and k not in self.inflight and k in self.keys]
        self.stop_retries(reason, which)
        self.timers.keep(lambda k: not which(k))
        result = {"error": {"type": "NotRetried", "message": f"not retried: {reason}", "transient": True}}
        for key in (k for k in dropped if self.ledger.get(self.keys[k], (None,))[0] != EffectStatus.COMMITTED):
            self.ledger[self.keys[key]] = (EffectStatus.ABANDONED, result)
            self.out.batch.effects.append(EffectWrite(idempotency_key=self.keys[key], node_id=key.node_id,
                                                      fan_index=key.fan_index, effect_name=effect_name(key),
                                                      args_digest="", status=EffectStatus.ABANDONED, result=result))

    def stop_owned(self, owner: NodeKey, reason: str, specs: Mapping[NodeKey, tuple[StepSpec, Any, Any]]) -> None:
        """An agent node ended for good: its calls in flight or in a backoff stop, and their rows say
        so (a timed-out node's call was left 'running' or 'retrying' on a completed run)."""
        def mine(key: NodeKey) -> bool:
            return key.is_agent_call and key.owner == owner

        self.cancel([k for k in self.inflight if mine(k)], reason)
        self.drop_timers(mine, reason, lambda k: specs[k][0].effect_name if k in specs else "")

    def cancel_all(self, reason: str, *, write: bool = True, keep_compensation_timers: bool = True) -> None:
        self.cancel(list(self.inflight), reason, write=write)
        self.timers.keep(lambda k: keep_compensation_timers and k.compensates)

    def record_running(self) -> None:
        """A quiet tick: attempts still in flight become durable as 'running'.

        One that finishes before goes straight to 'completed': recovery needs no 'running' row
        for a plain step (a node without a row is pending, and a resume re-runs an unfinished
        attempt either way; effects and compensated steps are recorded before their call), and
        skipping it halves the node writes of short steps."""
        for key in self.unrecorded:
            flight = self.inflight.get(key)
            if flight is not None and not flight.recorded:
                self.inflight[key] = recorded(flight)
                self.out.batch.nodes.append(NodeWrite(node_id=key.node_id, fan_index=key.fan_index,
                                                      status=NodeStatus.RUNNING, attempt=flight.attempt,
                                                      started_at=flight.started_at))
        self.unrecorded = []

    def has_unrecorded(self) -> bool:
        if len(self.unrecorded) > 2 * len(self.inflight) + 64:  # amortised O(1): drop keys no longer in flight
            self.unrecorded = [k for k in self.unrecorded if k in self.inflight]
        return bool(self.unrecorded)

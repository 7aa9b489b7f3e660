"""Human decisions on approval nodes: each recorded once, checked against what the node asked.

An approval node that is reached writes its row ``waiting`` with the request in its output
(``{"approval": ApprovalRequest}``): the prompt, who may decide, the answer's JSON Schema, the
timeout. A decision is checked against that row here, in one transaction that serialises on the
run's row, so it needs no workflow code: any process (the CLI, the dashboard, a script) can
decide, and it is told at once when it may not. An accepted decision is a signal row (its
``dedup_key`` is the decision id: a double click is one decision) and a ``decision`` event naming
the actor; when it settles the node and the run rests in ``waiting_human`` or ``waiting_timer`` (a
rate limit's gate, a timer, due later), the run's ``wake_at`` becomes now and its ``status_reason``
names the decision, so a worker takes it up (``status`` says so meanwhile); the driver consumes the
signal with the node's outcome. A run with a cancel on its way to a driver (``Client.cancel``: a
rollback asked for) takes no decision, and ``waiting`` (the inbox) leaves it out.
"""

from __future__ import annotations

import shlex
import time
import uuid
from typing import Any, Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from sqlalchemy import ColumnElement, Connection, Engine, Select, case, func, insert, literal, select, update
from sqlalchemy.exc import IntegrityError

from raysaga.errors import NotJSONableError, RunNotFoundError, UserError
from raysaga.state import jsoncodec
from raysaga.state.answer_schema import validate_answer
from raysaga.state.cancel_pending import due_with_cancel, refuse_if_cancelled
from raysaga.state.decoding import no_such_id, reading, records
from raysaga.state.item_pages import rows_at
from raysaga.state.models import EventRecord, NodeRecord, NodeStatus, RunStatus, SignalKind, SignalRecord
from raysaga.state.redact import refuse_secret_values, scrub, scrub_text
from raysaga.state.schema import events, node_columns, nodes, runs, signals
from raysaga.types import check_run_id, check_text

#: The key of a waiting approval node's output that holds its request.
REQUEST_KEY = "approval"

#: The longest name a decision records as who made it (``by``), as ``raysaga approve --by`` takes.
MAX_BY = 200
#: The longest decision comment, in characters. A comment is stored twice (the decision's signal and
#: its ``decision`` event), shown by ``status``, ``inbox`` and the dashboard, and for a rejected agent
#: tool call handed to the model: 10,000 characters is a long review (~4 pages; ~2,500 tokens), while
#: an unbounded one (a pasted log, 20 MB) bloated two rows per decision and every read of them.
MAX_COMMENT = 10_000

Verdict = Literal["approve", "reject"]
OnTimeout = Literal["reject", "default", "escalate"]


class ApprovalRequest(BaseModel):
    """What an approval node asks, as its waiting row keeps it (JSON, no code)."""

    model_config = ConfigDict(frozen=True)

    prompt: str
    payload: Any = None
    approvers: list[str] | None = None
    """Who may decide; None: anyone."""
    quorum: int = 1
    """How many distinct approvals approve; one rejection rejects."""
    answer_schema: dict[str, Any] | None = None
    """JSON Schema of an approval's answer (an approve "with edits"); None: no answer is taken."""
    asked_at: float
    timeout_at: float | None = None
    on_timeout: OnTimeout = "reject"
    default: Any = None
    """The answer a timeout with ``on_timeout="default"`` approves with."""
    escalate_to: list[str] = Field(default_factory=list)
    escalated: bool = False
    tool: str | None = None
    """For an agent's tool call that requires approval: the tool; the payload holds its arguments."""

    def deciders(self) -> list[str] | None:
        if self.approvers is None:
            return None
        return [*self.approvers, *self.escalate_to] if self.escalated else list(self.approvers)


class Decision(BaseModel):
    """One person's decision on one approval node."""

    model_config = ConfigDict(frozen=True)

    decision_id: str
    verdict: Verdict
    by: str
    answer: Any = None
    comment: str | None = None
    at: float
    node: str
    fan_index: int = -1


class WaitingApproval(BaseModel):
    """An approval node waiting for a decision (``raysaga inbox``)."""

    model_config = ConfigDict(frozen=True)

    run_id: str
    workflow: str
    node: str
    fan_index: int = -1
    request: ApprovalRequest
    approvals: list[str] = Field(default_factory=list)
    """Who approved so far (a quorum above one)."""


def request_of(row: NodeRecord | dict[str, Any] | Any) -> ApprovalRequest | None:
    """The request a waiting approval row holds, or None for any other row."""
    output = row.output if isinstance(row, NodeRecord) else row
    if not isinstance(output, dict) or not isinstance(output.get(REQUEST_KEY), dict):
        return None
    try:
        return ApprovalRequest.model_validate(output[REQUEST_KEY])
    except ValidationError:
        return None


def decision_of(signal: SignalRecord) -> Decision | None:
    if signal.kind not in (SignalKind.APPROVE, SignalKind.REJECT) or not isinstance(signal.payload, dict):
        return None
    try:
        return Decision.model_validate(signal.payload)
    except ValidationError:
        return None


def settles(request: ApprovalRequest, decisions: list[Decision]) -> Verdict | None:
    """Whether these decisions (in order) settle the node: one rejection rejects; ``quorum``
    distinct approvers approve."""
    approvers: set[str] = set()
    for d in decisions:
        if d.verdict == "reject":
            return "reject"
        approvers.add(d.by)
        if len(approvers) >= request.quorum:
            return "approve"
    return None


def decide(engine: Engine, run_id: str, node: str, verdict: Verdict, *, by: str, fan_index: int = -1,
           answer: Any = None, comment: str | None = None, decision_id: str | None = None,
           now: float | None = None) -> Decision:
    """Record one decision, or refuse it with a ``UserError`` that says why (not waiting, already
    decided, timed out, not an approver, an answer that does not fit the schema)."""
    now = time.time() if now is None else now
    by = by.strip() if isinstance(by, str) else by
    if not isinstance(by, str) or not by:
        raise UserError("a decision names who made it: pass --by NAME (or by= in Python)")
    check_text(by, "by (who decides)", MAX_BY)  # recorded in the signal and the event, shown everywhere
    label = node if fan_index < 0 else f"{node}[{fan_index}]"
    comment = _checked_comment(comment)
    if decision_id is not None:
        _check_decision_id(decision_id)
    with engine.begin() as conn:
        status, deadline_at = _lock_run(conn, run_id)
        if decision_id is not None:
            earlier = _by_id(conn, run_id, decision_id)
            if earlier is not None:
                return _same_or_refuse(earlier, Mine(verdict, by, node, fan_index, answer), decision_id)
        refuse_if_cancelled(conn, run_id, label)
        row = _node_row(conn, run_id, node, fan_index)
        request = _waiting_request(conn, run_id, label, row, status)
        _check_decider(request, by, label)
        so_far = _decisions(conn, run_id, node, fan_index)
        settled = settles(request, so_far)
        if settled is not None:  # before the timeout: decided in time, its driver not back yet, it is not "timed out"
            deciders = [d for d in so_far if d.verdict == settled]
            done = "approved" if settled == "approve" else "rejected"
            raise UserError(f"the approval {label!r} of run {run_id!r} is already decided: {done} by "
                            f"{', '.join(d.by for d in deciders)} at {_utc(deciders[-1].at)}")
        if request.timeout_at is not None and now >= request.timeout_at:
            raise UserError(f"the approval {label!r} of run {run_id!r} timed out at {_utc(request.timeout_at)}: "
                            f"a late decision is refused (its declared outcome, {request.on_timeout}, applies)")
        if deadline_at is not None and now >= deadline_at:  # the run fails 'deadline' when a driver takes it up
            raise UserError(f"run {run_id!r} passed its deadline at {_utc(deadline_at)}: a decision on {label!r} "
                            "is refused (the run stops with reason 'deadline' as soon as a driver takes it up)")
        if verdict == "approve" and any(d.by == by for d in so_far):
            raise UserError(f"{by} already approved {label!r} of run {run_id!r}: a quorum of {request.quorum} "
                            "needs other approvers")
        answer = _checked_answer(request, verdict, answer, label)
        decision = Decision(decision_id=decision_id or uuid.uuid4().hex, verdict=verdict, by=by, answer=answer,
                            comment=None if comment is None else scrub_text(comment), at=now, node=node,
                            fan_index=fan_index)
        payload = {**scrub(dumped := decision.model_dump(mode="json")), "answer": dumped["answer"]}  # as given
        try:
            with conn.begin_nested():
                conn.execute(insert(signals).values(
                    run_id=run_id, kind=verdict, node_id=node, payload=payload, created_at=now,
                    dedup_key=decision.decision_id))
        except IntegrityError:  # the same decision id, recorded by a concurrent call a moment ago
            earlier = _by_id(conn, run_id, decision.decision_id)
            assert earlier is not None
            return _same_or_refuse(earlier, Mine(verdict, by, node, fan_index, answer), decision.decision_id)
        settled = settles(request, [*so_far, decision])
        values: dict[str, Any] = {"event_seq": runs.c.event_seq + 1, "updated_at": now}
        if status in _WOKEN and settled is not None:  # a worker takes the run up at once; `status` says why
            values["wake_at"] = case((runs.c.wake_at < now, runs.c.wake_at), else_=now)  # (sooner stays)
            values["status_reason"] = scrub_text(f"{label} {'approved' if settled == 'approve' else 'rejected'} by "
                                                 f"{by}: waiting for a driver (a `raysaga worker`, or `raysaga "
                                                 f"resume {shlex.quote(run_id)}`)")
        seq = conn.execute(update(runs).where(runs.c.run_id == run_id).values(**values)
                           .returning(runs.c.event_seq)).scalar_one()
        conn.execute(insert(events).values(run_id=run_id, seq=seq, at=now, kind="decision", node_id=node,
                                           fan_index=None if fan_index < 0 else fan_index,
                                           data=scrub({"verdict": verdict, "by": by, "comment": decision.comment,
                                                       "decision_id": decision.decision_id})))
    return decision


#: A waiting row's columns as the view ``raysaga_node_rows`` shows them (``run_key`` for its run
#: id), read from ``raysaga_nodes`` itself: a waiting node is always a row of it (chunks hold
#: completed items only), and the view's ``COALESCE(status, 'completed')`` hides ``status`` from
#: the partial index ``ix_raysaga_nodes_waiting`` (both read every row of ``raysaga_nodes`` for
#: each inbox read: 7 ms on SQLite, 10 ms on PostgreSQL for 100,000 completed rows).
_WAITING_COLUMNS: tuple[ColumnElement[Any], ...] = tuple(
    func.coalesce(c, nodes.c.started_at + nodes.c.duration).label(c.name) if c.name == "finished_at" else c
    for c in nodes.c)
#: ``schema.WAITING_ROWS`` as the queries state it: inline (``literal_execute``), for a planner to
#: match it to the index's own predicate, which a bound parameter does not.
_IS_WAITING = nodes.c.status == literal(NodeStatus.WAITING.value, literal_execute=True)
#: Runs whose waiting approvals can be decided (a run at rest keeps its rows, undecidable).
_DECIDABLE_STATES = (RunStatus.RUNNING, RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER, RunStatus.PAUSED)
_DECIDABLE = tuple(s.value for s in _DECIDABLE_STATES)
#: Runs resting without a driver that a settling decision makes due at once (a paused run stays held).
_WOKEN = (RunStatus.WAITING_HUMAN, RunStatus.WAITING_TIMER)


def waiting(engine: Engine, approver: str | None = None, run_id: str | None = None) -> list[WaitingApproval]:
    """Approval nodes waiting for a decision, oldest first; with ``approver``, those they may decide.

    Three index reads, however many completed rows the store holds and however many approvals
    wait: the runs that hold a waiting row and can be decided, the waiting rows themselves
    (``ix_raysaga_nodes_waiting``), then those runs' decisions so far (``ix_raysaga_signals_run``). Not one
    join: without statistics SQLite's planner drove it from the runs (by status) and read each
    active run's every node row by key, 8 ms for a running fan-out of 100,000 rows. With
    ``run_id``, that run's rows by its ``run_key`` (the planner's pick of the key's range or the
    index), as the view read them. A run past its deadline is left out: a decision on it is
    refused (``decide``), and it fails 'deadline' when a driver takes it up. So is one due with a
    cancel on its way to its next driver (``cancel_pending``): it is rolled back (or cancelled), and
    a decision on it is refused."""
    holding = select(nodes.c.run_key).where(_IS_WAITING)
    decidable = select(runs.c.run_key, runs.c.run_id, runs.c.workflow_name).where(
        runs.c.status.in_(_DECIDABLE), runs.c.run_key.in_(holding),
        runs.c.deadline_at.is_(None) | (runs.c.deadline_at > time.time()),
        ~due_with_cancel(runs.c.run_id, time.time()))  # a cancel on its way: no decision is taken (``decide``)
    rows = select(*_WAITING_COLUMNS).where(_IS_WAITING)
    if run_id is not None:
        decidable = decidable.where(runs.c.run_id == run_id)
        rows = rows.where(nodes.c.run_key == select(runs.c.run_key).where(runs.c.run_id == run_id).scalar_subquery())
    asked: list[tuple[NodeRecord, str, ApprovalRequest]] = []
    with engine.connect() as conn:
        named = {key: (rid, workflow) for key, rid, workflow in conn.execute(decidable).all()}
        if not named:
            return []
        for row in conn.execute(rows).all():
            values = row._asdict()
            run = named.get(values.pop("run_key"))
            if run is None:
                continue  # its run is at rest (or came to rest since)
            values["run_id"], workflow = run
            with reading(values["run_id"], nodes.name):
                record = NodeRecord.model_validate(values)
            request = request_of(record)
            if request is None:
                continue  # a sleeping node
            deciders = request.deciders()
            if approver is not None and deciders is not None and approver not in deciders:
                continue
            asked.append((record, workflow, request))
        # the decisions so far of every approval asked, in one read (was one per approval: 200
        # waiting approvals were 200 queries), through ix_raysaga_signals_run
        so_far = _decisions_of(conn, decidable.with_only_columns(runs.c.run_id)) if asked else {}
    found: list[WaitingApproval] = []
    for record, workflow, request in asked:
        made = so_far.get((record.run_id, record.node_id, record.fan_index), [])
        if settles(request, made) is not None:
            continue  # decided; its driver has not taken it up yet
        found.append(WaitingApproval(run_id=record.run_id, workflow=workflow, node=record.node_id,
                                     fan_index=record.fan_index, request=request,
                                     approvals=[d.by for d in made if d.verdict == "approve"]))
    return sorted(found, key=lambda w: (w.request.asked_at, w.run_id, w.node))


#: The events that tell an approval node's story: asked, escalated, each decision (``node_history``).
HISTORY_KINDS = ("approval_requested", "approval_escalated", "decision")


def node_history(engine: Engine, run_id: str, node: str, fan_index: int = -1) -> list[EventRecord]:
    """One approval node's requests and decisions from the event log, oldest first: who decided,
    when, the verdict, the comment and the decision id (scrubbed as they were written). Read from
    the events, not the signals: those are consumed (and pruned) once the node settles."""
    fan = events.c.fan_index.is_(None) if fan_index < 0 else events.c.fan_index == fan_index
    query = select(events).where(events.c.run_id == run_id, events.c.node_id == node, fan,
                                 events.c.kind.in_(HISTORY_KINDS)).order_by(events.c.seq)
    with engine.connect() as conn, reading(run_id, events.name):
        return records(EventRecord, conn.execute(query).all())


# ---------------------------------------------------------------- helpers


def decided_after(conn: Connection, run_id: str, seen: int) -> bool:
    """Whether a decision or a cancel newer than signal ``seen`` waits unconsumed: one recorded while
    a driver held the run, which it never read. The commit that rests the run asks this, in its own
    transaction: a signal is either committed before it (and seen here) or after it (and then
    finds the run resting, and wakes it itself), so none is lost. A cancel sent between the
    driver's last look and its rest left the run resting, not due, the cancel never carried out."""
    return conn.execute(select(signals.c.id).where(
        signals.c.run_id == run_id, signals.c.consumed_at.is_(None), signals.c.id > seen,
        signals.c.kind.in_([SignalKind.APPROVE.value, SignalKind.REJECT.value, SignalKind.CANCEL.value]))
        .limit(1)).first() is not None


def _lock_run(conn: Connection, run_id: str) -> tuple[RunStatus, float | None]:
    """The run's status and deadline, its row locked for this transaction (SQLite: BEGIN IMMEDIATE
    already serialises writers), so two decisions on one node are checked one after the other."""
    no_such_id(conn.dialect.name, run_id)
    query = select(runs.c.status, runs.c.deadline_at).where(runs.c.run_id == run_id)
    if conn.dialect.name == "postgresql":
        query = query.with_for_update()
    found = conn.execute(query).first()
    if found is None:
        raise RunNotFoundError(run_id)
    return RunStatus(found[0]), found[1]


def _by_id(conn: Connection, run_id: str, decision_id: str) -> Decision | None:
    rows = conn.execute(select(signals).where(signals.c.run_id == run_id, signals.c.dedup_key == decision_id)).all()
    for signal in records(SignalRecord, rows):
        return decision_of(signal)
    return None


class Mine(NamedTuple):
    """A decision as asked, to compare with one recorded under the same decision id."""

    verdict: Verdict
    by: str
    node: str
    fan_index: int
    answer: Any


def _same_or_refuse(earlier: Decision, mine: Mine, decision_id: str) -> Decision:
    """The recorded decision when ``mine`` is the same one asked again (a double click, a retried
    request), else a ``UserError``: a decision id names one decision, of one node or fan-out item
    with one answer (reused for another item, the second approval was lost while it said done)."""
    if (earlier.verdict, earlier.by, earlier.node, earlier.fan_index) == mine[:4] \
            and _same_answer(earlier, mine.answer):
        return earlier
    what = earlier.node if earlier.fan_index < 0 else f"{earlier.node}[{earlier.fan_index}]"
    raise UserError(f"decision id {decision_id!r} was already used for another decision "
                    f"({earlier.verdict} of {what!r} by {earlier.by}): use a new id")


def _same_answer(earlier: Decision, answer: Any) -> bool:
    """Whether ``answer`` is the recorded one (JSON as given; scrubbed in older rows; none on a rejection)."""
    if earlier.verdict == "reject" or answer is None:
        return earlier.answer is None
    try:
        return earlier.answer in (given := jsoncodec.to_jsonable(answer, "the answer"), scrub(given))
    except (NotJSONableError, RecursionError):
        return False


def _checked_comment(comment: Any) -> str | None:
    """A comment as it is stored: refused, before anything is written, if it is not text or is over
    ``MAX_COMMENT``; a lone surrogate (no UTF-8 text, so no JSON column, holds one: the decision
    failed with ``NotJSONableError``) written as its escape, ``\\ud800``, as a cancel's reason is."""
    if comment is None:
        return None
    if not isinstance(comment, str):
        raise UserError(f"a decision's comment is text (a str), got {type(comment).__name__}")
    stored = jsoncodec.printable(comment)
    if len(stored) > MAX_COMMENT:
        raise UserError(f"a decision's comment is at most {MAX_COMMENT:,} characters, this one has {len(stored):,}: "
                        "shorten it, or put the long text elsewhere (a ticket, a document) and link to it")
    return stored


def _check_decision_id(decision_id: Any) -> None:
    """A decision id is its signal row's ``dedup_key`` (200 characters, text): on PostgreSQL a NUL
    or a longer id failed inside the database driver (on SQLite it was stored), so refuse both."""
    if not isinstance(decision_id, str):
        raise UserError(f"a decision id is a str (a request id, a UUID), got {type(decision_id).__name__}")
    check_run_id(decision_id, "decision id")


def _fan_index_fits(fan_index: Any) -> bool:
    """Whether ``fan_index`` fits its column (a 32-bit integer): a larger one failed PostgreSQL's look-up."""
    return isinstance(fan_index, int) and not isinstance(fan_index, bool) and -1 <= fan_index < 2**31


def _node_row(conn: Connection, run_id: str, node: str, fan_index: int) -> NodeRecord | None:
    if not isinstance(node, str) or not node.isprintable() or not _fan_index_fits(fan_index):
        return None  # no node id holds a NUL or a lone surrogate (its look-up failed in the driver): "not waiting"
    with reading(run_id, nodes.name):  # by key: through the view, an item read every chunk of its step
        found = rows_at(conn, run_id, [(node, fan_index)], _NODE_NAMES)
        return NodeRecord.model_validate(found[0]) if found else None


_NODE_NAMES = tuple(c.name for c in node_columns)


def _waiting_request(conn: Connection, run_id: str, label: str, row: NodeRecord | None,
                     status: RunStatus) -> ApprovalRequest:
    request = None if row is None else request_of(row)
    if row is not None and row.status == NodeStatus.WAITING and request is not None:
        if status not in _DECIDABLE_STATES:
            raise UserError(f"run {run_id!r} is {status.value}: its approval {label!r} can no longer be decided")
        return request
    asked = _approvals_asked(conn, run_id, None if row is None else row.origin_run_id)
    listed = (f"the approvals of this run so far: {', '.join(sorted(asked))}" if asked
              else "the run has asked for no approval so far")
    if row is not None and row.node_id not in asked and not (isinstance(row.output, dict)
                                                             and "decision_ids" in row.output):  # not an Approval
        raise UserError(f"node {label!r} of run {run_id!r} is a step, not an approval ({listed})")
    if row is not None and row.status in (NodeStatus.COMPLETED, NodeStatus.FAILED):
        raise UserError(f"the approval {label!r} of run {run_id!r} is already decided ({row.status.value}): "
                        f"`raysaga status {shlex.quote(run_id)} --node {shlex.quote(label)}` shows who decided, "
                        "when, and the comment")
    if row is None:
        raise UserError(f"node {label!r} of run {run_id!r} is not waiting for a decision (it has not been "
                        f"reached, or is not an approval; {listed}): `raysaga inbox` lists what waits")
    raise UserError(f"node {label!r} of run {run_id!r} is {row.status.value}, not waiting for a decision: "
                    "`raysaga inbox` lists what waits")


def _approvals_asked(conn: Connection, *run_ids: str | None) -> set[str]:
    """The nodes that asked for a decision: their ``approval_requested`` events (an inherited row's: its parent's)."""
    return set(conn.execute(select(events.c.node_id).distinct().where(
        events.c.run_id.in_([r for r in run_ids if r is not None]), events.c.kind == "approval_requested")).scalars())


def _check_decider(request: ApprovalRequest, by: str, label: str) -> None:
    deciders = request.deciders()
    if deciders is not None and by not in deciders:
        raise UserError(f"{by} may not decide {label!r}: its approvers are {', '.join(deciders)}")


def _decision_signals(conn: Connection, *where: ColumnElement[bool]) -> list[SignalRecord]:
    """The unconsumed decision signals (approve, reject) matching ``where``, in signal order."""
    return records(SignalRecord, conn.execute(select(signals).where(
        *where, signals.c.kind.in_([SignalKind.APPROVE.value, SignalKind.REJECT.value]),
        signals.c.consumed_at.is_(None)).order_by(signals.c.id)).all())


def _decisions(conn: Connection, run_id: str, node: str, fan_index: int) -> list[Decision]:
    found = [decision_of(s) for s in _decision_signals(conn, signals.c.run_id == run_id, signals.c.node_id == node)]
    return [d for d in found if d is not None and d.fan_index == fan_index]


def _decisions_of(conn: Connection, run_ids: Select[tuple[str]]) -> dict[tuple[str, str, int], list[Decision]]:
    """The unconsumed decisions of the runs ``run_ids`` selects, by (run, node, fan index), each
    list in signal order: ``_decisions`` for many approvals at once."""
    found: dict[tuple[str, str, int], list[Decision]] = {}
    for signal in _decision_signals(conn, signals.c.run_id.in_(run_ids)):
        decision = decision_of(signal)
        if decision is not None and signal.node_id is not None:
            found.setdefault((signal.run_id, signal.node_id, decision.fan_index), []).append(decision)
    return found


def _checked_answer(request: ApprovalRequest, verdict: Verdict, answer: Any, label: str) -> Any:
    if answer is None or verdict == "reject":
        return None if verdict == "reject" else answer
    if request.answer_schema is None:
        raise UserError(f"the approval {label!r} takes no answer: approve it without --answer")
    try:  # NaN passes a schema's "number", then the decision's dump wrote it as null: "as proposed"
        jsonable = jsoncodec.to_jsonable(answer, "the answer")
    except (NotJSONableError, RecursionError) as exc:
        raise UserError(f"the answer to {label!r} is not JSON: {exc}") from None
    refuse_secret_values(jsonable, f"the answer to {label!r}")  # handed to the next step as given: never scrubbed
    import jsonschema  # only when an answer is given
    try:
        validate_answer(answer, request.answer_schema)  # formats too: a "date" as pydantic reads one
    except jsonschema.ValidationError as exc:
        where = _cut("/".join(str(p) for p in exc.absolute_path), 200) or "the answer"
        hint = ""
        if exc.validator == "type" and isinstance(exc.instance, float) and exc.instance.is_integer() \
                and "integer" in str(exc.validator_value):
            hint = " (a whole number is written without a fraction: 1, not 1.0)"
        raise UserError(f"the answer to {label!r} does not fit its schema at {where}: "
                        f"{_cut(exc.message, 300)}{hint}") from None
    return answer


def _cut(text: str, limit: int) -> str:
    """At most ``limit`` characters: a message repeating a 100 KB answer is not one line to read."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _utc(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(at))

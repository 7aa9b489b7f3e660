"""What runs inside a Ray task (or inline): call the step, classify its failure, return JSON.

Only ids, config and JSON cross in; only JSON text and a classified error record come back.
The store is never touched here: the driver is the single writer.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from raysaga.agents.awaiting import run_to_end
from raysaga.agents.tools import ToolErrorAnswer
from raysaga.errors import NotJSONableError, OutputTypeError, Permanent, SecretUnavailableError
from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.output_types import EXACT, check_json_form, check_output_type, input_type_error
from raysaga.orchestrator.records import SECRET_MISSING
from raysaga.orchestrator.retry import is_transient, message_of, retry_after, secret_missing, without_colours
from raysaga.orchestrator.spec import NOT_APPLIED, StepSpec
from raysaga.orchestrator.stop_signals import STOP_SIGNALS, StopSignals
from raysaga.orchestrator.workflow import coerce
from raysaga.state import jsoncodec
from raysaga.state.jsoncodec import printable
from raysaga.state.redact import scrub_text
from raysaga.types import is_compensation

#: A ``StepContext``'s fields in order: run_id, node_id, fan_index, attempt, trace_id,
#: idempotency_key, reconciling.
ContextFields = tuple[str, str, int, int, str, str | None, bool]


class NodeCall:
    """Everything a worker needs besides the step itself: the attempt's context, the JSON values
    of the step's data parameters (``kwargs``: dependencies, fan-out item, input), its output cap.

    Built once per attempt on the driver's hot path, so a plain slotted class holding the
    context's fields: the ``StepContext`` (a frozen dataclass, ~2 us to build) is made only when
    something asks for it (a step that takes one, a message naming the node); a fan-out's items
    reach a Ray worker without ever making one on the driver.
    """

    __slots__ = ("_ctx", "fields", "kwargs", "max_output_bytes", "reconcile")

    def __init__(self, ctx: StepContext | None = None, kwargs: dict[str, Any] | None = None,
                 max_output_bytes: int = 0, reconcile: bool = False, *, fields: ContextFields | None = None) -> None:
        if fields is None:
            assert ctx is not None, "NodeCall needs ctx= or fields="
            fields = (ctx.run_id, ctx.node_id, ctx.fan_index, ctx.attempt, ctx.trace_id, ctx.idempotency_key,
                      ctx.reconciling)
        self.fields = fields
        self.kwargs: dict[str, Any] = {} if kwargs is None else kwargs
        self.max_output_bytes = max_output_bytes
        self.reconcile = reconcile
        self._ctx = ctx

    @property
    def ctx(self) -> StepContext:
        if self._ctx is None:
            run_id, node_id, fan_index, attempt, trace_id, key, reconciling = self.fields
            self._ctx = StepContext(run_id=run_id, node_id=node_id, fan_index=fan_index, attempt=attempt,
                                    trace_id=trace_id, idempotency_key=key, reconciling=reconciling)
        return self._ctx

    @property
    def node_id(self) -> str:
        return self.fields[1]

    @property
    def fan_index(self) -> int:
        return self.fields[2]

    @property
    def attempt(self) -> int:
        return self.fields[3]

    @property
    def idempotency_key(self) -> str | None:
        return self.fields[5]

    @property
    def reconciling(self) -> bool:
        return self.fields[6]

    @property
    def label(self) -> str:
        return _label(self.fields[1], self.fields[2])

    def __repr__(self) -> str:
        return f"NodeCall({self.label}, attempt {self.attempt})"


class NodeOutcome(NamedTuple):
    """A finished attempt: JSON text of the output, or a classified error record. (A named
    tuple: the driver makes one per item of a fan-out, and a frozen dataclass cost ~2 us.)"""

    ok: bool
    output_json: str | None = None
    error: dict[str, Any] | None = None
    transient: bool = False
    started_at: float = 0.0
    finished_at: float = 0.0
    aside: Any = None
    """What the step offers the driver besides its output, never stored with it (``Aside``)."""

    @staticmethod
    def failure(exc: BaseException, *, transient: bool, started_at: float) -> NodeOutcome:
        # the JSON record of the failure kept in the store (never the exception object); its
        # message scrubbed before it is cut, so no fragment of a secret survives a truncation
        error: dict[str, Any] = {"type": type(exc).__name__, "message": printable(scrub_text(message_of(exc))[:2000]),
                                 "transient": transient}
        wait = _guarded(retry_after, exc)  # reads the exception's attributes: user code too
        if wait is not None:
            error["retry_after"] = wait  # the retry waits this long; a rate limit blocks the fleet as long
        # (``traceback`` reads a message that raises as "<exception str() failed>")
        frames = without_colours("".join(traceback.format_exception(exc, limit=-8)), exc)
        error["traceback"] = printable(scrub_text(frames))[-4000:]
        return NodeOutcome(ok=False, error=error, transient=transient, started_at=started_at,
                           finished_at=time.time())


class AllSucceeded(NamedTuple):
    """Outcomes of items that all succeeded with nothing aside, as columns: what a task carrying a
    fan-out's chunk returns most of the time (``execute_items``, ``wire.run_packed``). They cross and are absorbed
    column by column (``Calls.all_succeeded``), with no outcome object made per item."""

    texts: Sequence[str]
    started: Sequence[float]
    finished: Sequence[float]

    def outcomes(self) -> list[NodeOutcome]:
        """The same outcomes one by one, for the paths that take them so."""
        return [NodeOutcome(True, text, None, False, started, finished, None)
                for text, started, finished in zip(self.texts, self.started, self.finished, strict=True)]

    def only(self, kept: list[int]) -> AllSucceeded:
        """The outcomes at these places of the columns."""
        texts, started, finished = self.texts, self.started, self.finished
        return AllSucceeded([texts[i] for i in kept], [started[i] for i in kept], [finished[i] for i in kept])


@dataclass(frozen=True)
class Aside:
    """A step's return value with something for the driver alone: ``value`` is the output (stored,
    capped, classified as any output); ``aside`` rides along in ``NodeOutcome.aside`` and is not
    part of it (an agent's model call offers the results of tools it ran speculatively)."""

    value: Any
    aside: Any


def execute(spec: StepSpec, call: NodeCall, *, on_worker: bool = False) -> NodeOutcome:
    """Run one attempt of ``spec``. Never raises: every failure comes back classified, a step's
    own ``sys.exit()`` or ``KeyboardInterrupt`` too (``_exited``); only one a stop signal may have
    raised in the driver's own process (the inline executor, not ``on_worker``: a Ray task or pool
    actor, ``wire.run_packed``) is let through, to end it as it would any program (``_signalled``)."""
    started = time.time()
    try:
        kwargs = _inputs(spec, call.kwargs)
        if spec.ctx_param:
            kwargs[spec.ctx_param] = call.ctx
        result: Any = NOT_APPLIED
        if call.reconcile and spec.reconcile is not None:
            result = _call(spec.reconcile, kwargs)
        if result is NOT_APPLIED:
            result = _call(spec.fn, kwargs)
    except BaseException as exc:
        return _failed(spec, exc, call.label, started, on_worker)
    try:
        text, aside = _output(result, call.fields[1], call.fields[2], call.max_output_bytes, spec.checked_return)
    except Exception as exc:
        if is_compensation(spec.name):
            text, aside = undo_note(result, exc), None  # an undo that returned did its work: never refused
        elif isinstance(result, ToolErrorAnswer) and (cut := result.fitted(call.max_output_bytes)) is not None:
            text, aside = cut, None  # a tool's error message above the cap: the model is shown it cut
        else:
            return _refused(spec, exc, started, result)
    return NodeOutcome(True, text, None, False, started, time.time(), aside)  # (positional: per item)


def execute_items(spec: StepSpec, rows: list[tuple[int, int, dict[str, Any]]], max_output_bytes: int,
                  call: Callable[[int, int, dict[str, Any]], NodeCall]) -> AllSucceeded | list[NodeOutcome]:
    """``execute`` for each of a block's items (index, attempt, inputs) on a worker, in order: the
    outcomes as columns while every item succeeds with nothing aside (``AllSucceeded``), else one
    each. The same attempt, output and classification as ``execute`` (a step taking a context
    goes through it); only the objects made per item are fewer: a ``NodeCall`` (``call``) only for
    a step that takes a context, no outcome object for an item that succeeded."""
    if spec.ctx_param:
        return [execute(spec, call(*row), on_worker=True) for row in rows]
    fn, types, now, step, returns = spec.fn, spec.param_types, time.time, spec.name, spec.checked_return
    texts: list[str] = []
    starts: list[float] = []
    ends: list[float] = []
    odd: dict[int, NodeOutcome] = {}  # the items that did not simply succeed, by place
    for place, (index, _, kwargs) in enumerate(rows):
        started = now()
        text = ""
        try:
            try:  # (in line: a fan-out's items come through here by the 10,000)
                args = {name: coerce(types.get(name, Any), value) for name, value in kwargs.items()}
            except ValidationError:
                args = _inputs(spec, kwargs)  # raises, naming the parameter
            result = _call(fn, args)
        except BaseException as exc:
            odd[place] = _failed(spec, exc, _label(step, index), started, on_worker=True)
        else:
            try:
                text, aside = _output(result, step, index, max_output_bytes, returns)
                if aside is not None:
                    odd[place] = NodeOutcome(True, text, None, False, started, now(), aside)
            except Exception as exc:
                text, odd[place] = "", _refused(spec, exc, started)
        texts.append(text)
        starts.append(started)
        ends.append(now())
    done = AllSucceeded(texts, starts, ends)
    if not odd:
        return done
    return [odd.get(place) or outcome for place, outcome in enumerate(done.outcomes())]


def _inputs(spec: StepSpec, values: dict[str, Any]) -> dict[str, Any]:
    """The step's parameters as their declared types; ``InputTypeError`` naming the parameter
    (and so the step whose output it is) when a stored value is not one: pydantic's own text
    named neither, and a value recorded under another definition read as the step's own bug."""
    types = spec.param_types
    kwargs = {}
    for name, value in values.items():
        try:
            kwargs[name] = coerce(types.get(name, Any), value)
        except ValidationError as exc:
            raise input_type_error(spec.name, name, types.get(name, Any), exc) from None
    return kwargs


def _output(result: Any, node_id: str, index: int, max_output_bytes: int, returns: Any = Any) -> tuple[str, Any]:
    """A step's return value as its output's JSON text, and what it offered aside (``Aside``);
    raises ``NotJSONableError``, ``Permanent`` (above the cap) or ``OutputTypeError`` (not the
    declared type ``returns``, or a JSON form that reads back as another value) naming the step."""
    aside = None
    if isinstance(result, Aside):
        result, aside = result.value, result.aside
    # (None passes: every reader takes None for any declared type, ``workflow.coerce``; a value
    # of exactly a plain declared type passes without a call: a fan-out's items come by the 10,000)
    if result is None:
        return "null", aside
    exact = type(result) is returns and returns in EXACT
    made = result if returns is Any or exact else check_output_type(returns, result, _label(node_id, index))
    nested = ITEM_NESTING if index >= 0 else 0
    text = _validated_form(made, nested) if made is not result else None
    if text is None:
        text = _dumps(result, node_id, index, nested)
    if not exact and (returns is not Any or isinstance(result, BaseModel)):  # (undeclared: as its own type)
        form_of = returns if returns is not Any else type(result)
        try:
            check_json_form(form_of, made, text, _label(node_id, index), declared=returns is not Any)
        except OutputTypeError:
            if made is result:
                raise
            # a validator that is not idempotent (euros into cents): the validated value's form is
            # validated again when read, into another value; the form of the value returned may read
            # back as the validated one, as before the validated form was stored: that one, else refused
            text = _dumps(result, node_id, index, nested)
            check_json_form(form_of, made, text, _label(node_id, index), declared=returns is not Any)
    if len(text) * 4 > max_output_bytes:  # (else it fits: a character is at most 4 bytes)
        size = len(text.encode("utf-8"))
        if size > max_output_bytes:
            raise Permanent(
                f"output of step {_label(node_id, index)!r} is {size} bytes, above the cap of {max_output_bytes}: "
                "return a reference (a path, an id) instead, or raise the cap where the run is driven, in Python "
                "(the raysaga command has no option for it): options=RunOptions(max_output_bytes=N) of "
                "raysaga.run / resume / retry, or of the raysaga.Worker that drives it"
            )
    return text, aside


def _validated_form(made: Any, nested: int) -> str | None:
    """The JSON text of ``made``, a return value validated into another value of its declared type
    (a dict into the model, ``"no"`` into False, ``"5"`` into 5): that one is stored, so every reader,
    typed or not, the run's output and a compensation see one value (the raw one stored, an untyped
    reader saw ``"no"``, truthy, where a typed one saw False). None when it has no JSON form of its
    own (a TypedDict's datetime): the value returned is stored, its form read back as ``made``."""
    try:
        return jsoncodec.dumps(made, "output", nested)
    except NotJSONableError:
        return None


def _dumps(result: Any, node_id: str, index: int, nested: int) -> str:
    """``result`` as JSON text; ``NotJSONableError`` naming the step (and its fan-out's nesting)."""
    try:
        return jsoncodec.dumps(result, "output", nested)
    except NotJSONableError:  # again, naming the step (not built for every item that succeeds)
        try:
            return jsoncodec.dumps(result, f"output of step {_label(node_id, index)!r}", nested)
        except NotJSONableError as exc:
            if not nested or "nested deeper" not in str(exc):
                raise
            raise NotJSONableError(f"{exc}, counting the {nested} levels its fan-out's result (FanOutResult: "
                                   "successes[i].output) adds around each item's output") from None


#: How deep a fan-out item's output sits in its step's result (``FanOutResult``:
#: ``{"successes": [{"output": ...}]}``): an item's output must leave room for it (``jsoncodec.MAX_DEPTH``),
#: or the item was accepted and the result, holding it, failed the driver's commit on every drive.
ITEM_NESTING = 3

#: How much of an undo's unstorable return value its note keeps (``undo_note``).
UNDO_REPR_CHARS = 200


def undo_note(result: Any, exc: Exception) -> str:
    """The stored output of a compensation whose return value raysaga cannot keep (no JSON form,
    above the output cap): a short note, as JSON text, instead of a failure.

    What an undo returns is not its contract: nothing reads it, and its effect is done once it
    returns (an HTTP client's ``Response`` from a refund, say). Refused like a step's output, the
    refund was recorded as failed, the run parked in ``compensation_failed``, and each operator
    retry refunded again and failed the same way. The note says what came back (its type, and
    its ``repr`` scrubbed of secrets and cut to ``UNDO_REPR_CHARS``) and why it was not stored."""
    try:
        shown = repr(result)
    except Exception:  # user code: a __repr__ that raises
        shown = f"<{type(result).__name__} object (its repr failed)>"
    note = {"not_stored": type(exc).__name__, "type": type(result).__name__,
            "repr": printable(scrub_text(shown[:4 * UNDO_REPR_CHARS]))[:UNDO_REPR_CHARS]}
    return jsoncodec.dumps(note, "compensation note")


def _label(node_id: str, index: int) -> str:
    return node_id if index < 0 else f"{node_id}[{index}]"


def _failed(spec: StepSpec, exc: BaseException, label: str, started: float, on_worker: bool) -> NodeOutcome:
    """The attempt's failure, classified (``execute``)."""
    if isinstance(exc, NotJSONableError):
        return NodeOutcome.failure(exc, transient=False, started_at=started)
    if isinstance(exc, KeyboardInterrupt | SystemExit):
        if not on_worker and _signalled():
            raise exc
        return NodeOutcome.failure(_exited(exc, label), transient=False, started_at=started)
    transient = _guarded(is_transient, exc, spec.retry)  # an attribute that raises: permanent
    outcome = NodeOutcome.failure(exc, transient=bool(transient), started_at=started)
    missing = _guarded(secret_missing, exc)
    if outcome.error is not None and isinstance(missing, SecretUnavailableError):  # parks the run (``records.parks``)
        outcome.error[SECRET_MISSING] = printable(scrub_text(message_of(missing))[:1000])
    return outcome


def _refused(spec: StepSpec, exc: Exception, started: float, result: Any = None) -> NodeOutcome:
    """A step that returned, its value refused (no JSON form, not its declared type, above the
    output cap): a permanent failure; an effect step's says ``took_effect``, since its function
    returned, so a rollback undoes it (with ``output=None``) like one whose outcome is unknown.
    Not a tool's ``ToolError`` answer (``ToolErrorAnswer``), which says the tool took no effect:
    its key may run again and nothing is undone, as for any call failing for good."""
    outcome = NodeOutcome.failure(exc, transient=False, started_at=started)
    if spec.effect and outcome.error is not None and not isinstance(result, ToolErrorAnswer):
        outcome.error["took_effect"] = True
    return outcome


def _exited(exc: KeyboardInterrupt | SystemExit, label: str) -> Permanent:
    """A step's ``sys.exit()`` or ``KeyboardInterrupt``, as the permanent failure it is (raysaga
    cancels a Ray task by killing it, never by interrupting it). Let through on Ray, an exit ended
    the worker (Ray: ``WorkerCrashedError``) and an interrupt became Ray's ``TaskCancelledError``,
    both retried as transient: the step failed after all its attempts as "the worker died" or
    "cancelled", and a compensation, retried without limit, left its run ``compensating`` for ever.
    Let through inline, it left the host program (an exit it never asked for) with its run
    ``running``, and every resume ran the exit again."""
    what = f"SystemExit({exc.code!r}) (sys.exit())" if isinstance(exc, SystemExit) else "KeyboardInterrupt"
    failure = Permanent(f"step {label!r} raised {what}: a step returns or raises an Exception; it must not "
                        "end or interrupt the process that runs it")
    failure.__traceback__ = exc.__traceback__
    return failure


def _guarded(classify: Callable[..., Any], exc: BaseException, *args: Any) -> Any:
    """``classify(exc, *args)``, or None when it raises: it reads attributes of the exception
    (``status_code``, ``response``, ``retry_after``), and a property of user code may raise."""
    try:
        return classify(exc, *args)
    except Exception:  # any failure of user code: the failure is recorded without it
        return None


def _signalled() -> bool:
    """Whether a ``KeyboardInterrupt`` or ``SystemExit`` met inline may be a stop signal's, not the
    step's own: Python raises a signal handler's exception in the main thread only, and while a
    driver takes SIGINT and SIGTERM itself (``StopSignals``, installed for its ``drive`` in the main
    thread) no signal raises one: the first sets a flag, the second ends the process or calls the
    application's own handler, which it puts back first. So only in the main thread, when no
    driver's handler is in place (after a second signal, or outside a drive), is one let through."""
    if threading.current_thread() is not threading.main_thread():
        return False
    return not any(isinstance(getattr(signal.getsignal(signum), "__self__", None), StopSignals)
                   for signum in STOP_SIGNALS)


def _call(fn: Any, kwargs: dict[str, Any]) -> Any:
    result = fn(**kwargs)
    if result is not None and asyncio.iscoroutine(result):  # an ``async def`` step's: also under a running loop
        result = run_to_end(result)
    return result

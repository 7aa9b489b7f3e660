"""Testing workflows without a network and without killing anything: scripted models, a deduping
fake provider, crash points, and a guard against the real API.

    from raysaga.testing import (CrashAt, FakeProvider, RecordingModel, ScriptedModel, SimulatedCrash,
                                 drive_inline, forbid_real_api, text_reply, tool_reply)

    model = ScriptedModel({"Summarize: x": [tool_reply(("search", {"query": "x"})), text_reply("done")]})

    forbid_real_api()                 # from here on, this process may not call api.anthropic.com
    with forbid_real_api():           # ... or only inside the block (the old value comes back)
        ...

Models. ``ScriptedModel`` answers a conversation (keyed by its first user message) turn by turn,
the same on every replay, so a resumed run sees exactly what the crashed one saw.
``RecordingModel`` is a ``ScriptedModel`` that also keeps every request it was asked, so a test
can check the exact conversation the model saw (and that a resume asked nothing twice).
``forbid_real_api`` sets ``RAYSAGA_FORBID_REAL_API=1``, which ``AnthropicModel`` checks before
building its client: a call that would reach the real API fails at once with
``raysaga.Permanent`` (never retried), while a ``base_url`` pointing elsewhere (a local Messages
API stand-in) still works. The variable is read where the model call runs: Ray workers of a
cluster started with ``ray start`` need it in their own environment (export it before starting
the cluster); a local Ray started by the driver inherits the driver's environment when it starts.

Effects. ``FakeProvider`` stands in for a payment-like service with idempotency keys: the first
call under a key takes effect, a repeat returns the stored answer without taking effect again,
and a key reused for a different request is refused. Its log is the oracle for "no side effect
happened twice"::

    payments = FakeProvider()

    @wf.step(effect=True)
    def charge(ctx: StepContext, input: Order) -> str:
        return payments.call("charge", ctx.idempotency_key, {"amount": input.amount}, subject=input.id)["id"]

    ...
    payments.assert_effects_once()

Crashes. ``CrashAt("before_commit", "charge")`` stops a driver at one of the points the engine
names (``CRASH_POINTS``), once: in this process it raises ``SimulatedCrash`` out of the driver;
``CrashAt(..., kill=True)`` SIGKILLs the process instead, and ``CrashAt(...).env()`` is the
environment that makes a driver *subprocess* die there (``RAYSAGA_FAULTS``). ``drive_inline``
drives a run in this process with the inline executor, with a crash point or without::

    run_id = raysaga.create_run(wf, order, store=url).run_id
    with pytest.raises(SimulatedCrash):
        drive_inline(wf, run_id, store=url, crash_at=CrashAt("before_commit", "charge"))
    final = raysaga.resume(wf, run_id, store=url, executor="inline")
    assert payments.raw(key) == 2 and payments.effective(key) == 1   # re-issued, taken once

In-memory helpers see only the calls made in this process: use them with the inline executor
(Ray runs steps and model calls in worker processes, whose calls this process never sees).
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import threading
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any

from raysaga.agents.messages import ModelRequest, ModelResponse
from raysaga.agents.models import FORBID_ENV, ScriptedModel, first_user_text, text_reply, tool_reply
from raysaga.errors import InvalidOptionError, Permanent
from raysaga.orchestrator.faults import ENV as FAULTS_ENV
from raysaga.orchestrator.faults import POINTS as CRASH_POINTS
from raysaga.orchestrator.faults import Faults

if TYPE_CHECKING:
    from raysaga.orchestrator.workflow import Workflow
    from raysaga.state import RunRecord, Store
    from raysaga.types import RunOptions

__all__ = [
    "CRASH_POINTS",
    "FAULTS_ENV",
    "FORBID_ENV",
    "CrashAt",
    "FakeProvider",
    "ProviderCall",
    "RecordingModel",
    "ScriptedModel",
    "SimulatedCrash",
    "drive_inline",
    "forbid_real_api",
    "text_reply",
    "tool_reply",
]


# ---------------------------------------------------------------------- the real-API guard


class RealApiForbidden:
    """The guard, already set; as a context manager it restores the previous value on exit."""

    def __init__(self) -> None:
        self._previous = os.environ.get(FORBID_ENV)
        os.environ[FORBID_ENV] = "1"

    def __enter__(self) -> RealApiForbidden:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.restore()

    def restore(self) -> None:
        """Put back what ``RAYSAGA_FORBID_REAL_API`` was before (unset if it was unset)."""
        if self._previous is None:
            os.environ.pop(FORBID_ENV, None)
        else:
            os.environ[FORBID_ENV] = self._previous


def forbid_real_api() -> RealApiForbidden:
    """Forbid calls to the real Anthropic API in this process, now.

    Call it once (a ``conftest.py`` is a good place) to forbid them for the rest of the process,
    or use it as ``with forbid_real_api(): ...`` to forbid them for a block only.
    """
    return RealApiForbidden()


# ---------------------------------------------------------------------- a model that records


#: Every journal's requests, by journal name. Kept outside the (frozen, picklable) model, so a
#: model copied or pickled within this process still records into the same list.
_JOURNALS: dict[str, list[ModelRequest]] = {}
_JOURNALS_LOCK = threading.Lock()


def _new_journal() -> str:
    return f"journal-{uuid.uuid4().hex}"


@dataclass(frozen=True)
class RecordingModel(ScriptedModel):
    """A ``ScriptedModel`` that keeps a copy of every request it is asked, in order.

    Answers come from the script exactly as ``ScriptedModel``'s do. Each request is recorded
    before it is answered (a conversation with no script is recorded, then refused).

    Attributes:
        journal: Where the requests are kept. Each model has its own by default; models built
            with the same name share one (handy when a helper builds a new model per run and the
            test reads every request of the module). Records live in the process where
            ``complete`` runs: with the inline executor, the test's own.
    """

    journal: str = field(default_factory=_new_journal)

    def complete(self, request: ModelRequest) -> ModelResponse:
        with _JOURNALS_LOCK:
            _JOURNALS.setdefault(self.journal, []).append(request.model_copy(deep=True))
        return super().complete(request)

    @property
    def requests(self) -> list[ModelRequest]:
        """The requests recorded so far, oldest first (a copy of the list; the requests are the
        recorded copies, which nothing else holds)."""
        with _JOURNALS_LOCK:
            return list(_JOURNALS.get(self.journal, ()))

    def conversations(self) -> dict[str, list[ModelRequest]]:
        """The recorded requests grouped by conversation (the first user message's text), each
        group oldest first: turn n of a conversation is at index n unless a turn was asked twice."""
        grouped: dict[str, list[ModelRequest]] = {}
        for request in self.requests:
            grouped.setdefault(first_user_text(request.messages), []).append(request)
        return grouped

    def clear(self) -> None:
        """Forget this journal's requests (between scenarios of one test)."""
        with _JOURNALS_LOCK:
            _JOURNALS.pop(self.journal, None)


# ---------------------------------------------------------------------- a deduping fake provider


@dataclass(frozen=True)
class ProviderCall:
    """One call that reached a ``FakeProvider``.

    Attributes:
        kind: What was asked (``"charge"``, ``"refund"``...).
        key: The idempotency key it carried.
        subject: What the effect is about (an order id); the key when the caller named none.
        body: The request's JSON body.
        duplicate: The key had been seen before (the call took no effect).
        refused: The key had been used for a different request (the call was refused).
        answered: The caller got the answer (False when ``lose_next_answers`` dropped it).
    """

    kind: str
    key: str
    subject: str
    body: dict[str, Any]
    duplicate: bool
    refused: bool
    answered: bool


class FakeProvider:
    """An in-memory payment-like provider that dedupes by idempotency key (like Stripe's
    ``Idempotency-Key``), and the test's oracle for "no effect happened twice".

    The first call with a key takes effect and its answer is stored; a later call with the same
    key and the same request returns the stored answer (``"duplicate": True``) without taking
    effect again; the same key with a different request is refused with ``raysaga.Permanent``
    (that is a client bug, not a retry). ``lose_next_answers`` makes calls take effect and then
    fail with ``ConnectionError``, the ambiguous outcome an idempotency key exists for.

    Thread-safe. In-memory: only calls made in this process reach it (use the inline executor).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: list[ProviderCall] = []
        self._requests: dict[str, tuple[str, str]] = {}  # key -> (kind, canonical body)
        self._answers: dict[str, dict[str, Any]] = {}
        self._effects: Counter[str] = Counter()  # subject -> effects taken
        self._lose = 0

    def call(self, kind: str, idempotency_key: str | None, body: Mapping[str, Any] | None = None, *,
             subject: str | None = None) -> dict[str, Any]:
        """Make one call; return the provider's answer.

        Args:
            kind: What is asked (``"charge"``, ``"email"``...).
            idempotency_key: The step's ``ctx.idempotency_key``; required (a step without one is
                not ``effect=True``, and ``raysaga.Permanent`` says so).
            body: The request's JSON body (compared, with the kind, to spot a reused key).
            subject: What the effect is about (an order id): two effects on one subject under
                two keys are what ``assert_effects_once`` catches. Defaults to the key.

        Returns:
            ``{"id", "kind", "key", "subject", "duplicate"}``; ``id`` is derived from kind and
            key, so a repeat gets the same one.

        Raises:
            raysaga.Permanent: No key, or a key already used for another request.
            ConnectionError: The call took effect (or was a duplicate) but ``lose_next_answers``
                dropped its answer.
        """
        if not idempotency_key:
            raise Permanent(f"{kind}: the fake provider needs an idempotency key (is the step effect=True?)")
        payload = dict(body or {})
        canonical = json.dumps(payload, sort_keys=True, default=str)
        about = subject or idempotency_key
        with self._lock:
            seen = self._requests.get(idempotency_key)
            if seen is not None and seen != (kind, canonical):
                self._calls.append(ProviderCall(kind, idempotency_key, about, payload, True, True, True))
                raise Permanent(f"idempotency key {idempotency_key!r} was used for another request "
                                f"({seen[0]}), not this {kind}")
            duplicate = seen is not None
            if not duplicate:
                self._requests[idempotency_key] = (kind, canonical)
                self._effects[about] += 1
                receipt = f"{kind}_{hashlib.sha256(idempotency_key.encode()).hexdigest()[:16]}"
                self._answers[idempotency_key] = {"id": receipt, "kind": kind, "key": idempotency_key,
                                                  "subject": about}
            lost = self._lose > 0
            self._lose -= 1 if lost else 0
            self._calls.append(ProviderCall(kind, idempotency_key, about, payload, duplicate, False, not lost))
            answer = {**self._answers[idempotency_key], "duplicate": duplicate}
        if lost:
            raise ConnectionError(f"{kind}: connection reset after the provider took the call (answer lost)")
        return answer

    def lose_next_answers(self, count: int = 1) -> None:
        """The next ``count`` calls are handled (a new key takes effect) and then fail with
        ``ConnectionError``: the caller cannot tell whether anything happened."""
        with self._lock:
            self._lose = count

    @property
    def calls(self) -> list[ProviderCall]:
        """Every call that arrived, in order (refused and duplicate ones included)."""
        with self._lock:
            return list(self._calls)

    def raw(self, key: str) -> int:
        """How many calls arrived with ``key``."""
        return sum(1 for c in self.calls if c.key == key)

    def effective(self, key: str) -> int:
        """How many calls with ``key`` took effect: 0 or 1, by construction."""
        return sum(1 for c in self.calls if c.key == key and not c.duplicate)

    def effects(self, kind: str | None = None) -> list[ProviderCall]:
        """The calls that took effect (of ``kind``, if given), in order."""
        return [c for c in self.calls if not c.duplicate and (kind is None or c.kind == kind)]

    def effects_by_subject(self) -> dict[str, int]:
        """How many effects each subject got."""
        with self._lock:
            return dict(self._effects)

    def assert_effects_once(self, subjects: Iterable[str] | None = None) -> None:
        """Fail unless every subject (or each of ``subjects``) got exactly one effect: a second
        effect means a call was re-issued under a fresh key; a missing one, an effect lost.

        Raises:
            AssertionError: Naming each subject with another count.
        """
        counts = self.effects_by_subject()
        wanted = list(counts) if subjects is None else list(subjects)
        wrong = {s: counts.get(s, 0) for s in wanted if counts.get(s, 0) != 1}
        if wrong:
            raise AssertionError(f"effects per subject should be 1, got {wrong}")

    def reset(self) -> None:
        """Forget every call and key (between scenarios of one test)."""
        with self._lock:
            self._calls.clear()
            self._requests.clear()
            self._answers.clear()
            self._effects.clear()
            self._lose = 0


# ---------------------------------------------------------------------- crash points


class SimulatedCrash(Exception):
    """Raised out of the driver by ``CrashAt`` where the process would have died.

    The driver's cleanup runs (its lease is released), so a resume in the same test may start at
    once; what is durable is exactly what a real crash at that point would leave.
    """

    def __init__(self, point: str, label: str) -> None:
        super().__init__(f"simulated crash at {point}:{label}")
        self.point = point
        self.label = label

    def __reduce__(self) -> Any:
        return (type(self), (self.point, self.label))


class CrashAt(Faults):
    """Stop the driver the first time it reaches ``point`` for a node labelled ``label``.

    The points (``CRASH_POINTS``): ``before_pending``, ``after_pending`` (an effect's ledger row is
    durable, the call not made), ``before_commit`` (the call returned, its result not durable),
    ``after_commit``, ``before_transition`` (the run's status change; its label is ``*``).
    Labels are node labels: a step (``charge``), a fan-out item (``work[3]``), a compensation
    (``charge:compensate``), an agent's turn or tool call (``research@1``, ``research@1.0``);
    ``*`` matches any.

    Pass it to ``drive_inline`` (in this process), or start a driver process with ``env()``.

    Args:
        point: One of ``CRASH_POINTS``.
        label: The node label, or ``*``.
        kill: SIGKILL this process at the point instead of raising ``SimulatedCrash`` (only for a
            driver running in a process of its own).

    Raises:
        InvalidOptionError: An unknown point (also a ``ValueError``).
    """

    def __init__(self, point: str, label: str = "*", *, kill: bool = False) -> None:
        super().__init__("")
        if point not in CRASH_POINTS:
            raise InvalidOptionError(f"CrashAt: unknown crash point {point!r}; known: {sorted(CRASH_POINTS)}")
        self.point, self.label, self.kill = point, label, kill
        self.fired = False
        self.active = True

    @property
    def spec(self) -> str:
        """The point in ``RAYSAGA_FAULTS``' form (``point:label``)."""
        return f"{self.point}:{self.label}"

    def env(self) -> dict[str, str]:
        """The environment variable that makes a driver process SIGKILL itself at this point:
        ``subprocess.run(cmd, env={**os.environ, **crash.env()})``."""
        return {FAULTS_ENV: self.spec}

    def hit(self, point: str, labels: Iterable[str]) -> None:
        """Called by the driver at each point: crash once, at the first match."""
        if self.fired or point != self.point:
            return
        if self.label != "*" and self.label not in labels:
            return
        self.fired = True
        if self.kill:
            os.kill(os.getpid(), signal.SIGKILL)
        raise SimulatedCrash(point, self.label)


def drive_inline(workflow: Workflow, run_id: str, *, store: Store | str, crash_at: CrashAt | None = None,
                 options: RunOptions | None = None) -> RunRecord:
    """Drive run ``run_id`` (made with ``raysaga.create_run``) to rest in this process, with the
    inline executor, stopping at ``crash_at`` if given.

    Without a crash point this is ``raysaga.resume(..., executor="inline")``.

    Args:
        workflow: The run's workflow.
        run_id: The run to drive.
        store: A store, or its URL (opened and closed here).
        crash_at: Where to stop the driver, once.
        options: The run's options (the lease TTL...).

    Returns:
        The run's record once it rests (completed, failed, compensated, parked...).

    Raises:
        SimulatedCrash: ``crash_at`` was reached; the run stays as a crash there would leave it.
    """
    from raysaga.orchestrator.driver import Driver
    from raysaga.orchestrator.executor import InlineExecutor
    from raysaga.state import open_store

    if not isinstance(store, str):
        return Driver(workflow, store, InlineExecutor(), run_id, options=options, faults=crash_at).drive()
    opened = open_store(store)
    try:
        return Driver(workflow, opened, InlineExecutor(), run_id, options=options, faults=crash_at).drive()
    finally:
        opened.close()

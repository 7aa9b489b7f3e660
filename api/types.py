"""The leaf every layer may import: options, a step's context, names and node identity.

``raysaga.state``, ``raysaga.sagas``, ``raysaga.agents`` and ``raysaga.orchestrator`` all need
these few types; they live here, under everything but ``raysaga.errors``, so that layers point
one way (``[tool.importlinter]`` in pyproject.toml checks it). The old homes
(``raysaga.orchestrator.options``, ``.context``, ``.validation``) re-export them.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, TypeVar, cast

from pydantic import BaseModel, ConfigDict, Field

from raysaga.errors import InvalidOptionError, RaySagaError, UnknownOptionError, UserError, WorkflowDefinitionError

__all__ = [
    "COMPENSATE_SUFFIX",
    "COMPENSATION_ATTEMPTS",
    "COMPENSATION_RETRY",
    "DEFAULT_RETRY",
    "MAX_LABELS",
    "MAX_LABEL_KEY",
    "MAX_LABEL_VALUE",
    "MIN_LEASE_TTL",
    "NAME_RE",
    "NAME_RULE",
    "NO_RETRY",
    "WORKFLOW_NAME_RE",
    "Approval",
    "Ask",
    "RetryPolicy",
    "RunOptions",
    "StepContext",
    "StepFailed",
    "check_labels",
    "check_name",
    "check_number",
    "check_text",
    "checked_fields",
    "checked_options",
    "compensation_node",
    "compensation_retry",
    "is_compensation",
    "str_tuple",
    "unknown_option_message",
]

F = TypeVar("F", bound=Callable[..., Any])
C = TypeVar("C", bound=type)



#: The shortest lease a driver may take: the heartbeat renews every ttl/3, so a tiny ttl spins
#: it, and a lease shorter than one store round trip expires while it is being renewed.
MIN_LEASE_TTL = 0.5


def check_number(owner: str, name: str, value: Any, *, minimum: float, allowed: str, strict: bool = False,
                 integer: bool = False, optional: bool = False, maximum: float | None = None) -> None:
    """Refuse (``InvalidOptionError``, naming ``owner.name``) a value outside ``[minimum, maximum]``
    (``(minimum, ...`` if ``strict``), NaN, inf, a bool, a non-number; ``None`` if ``optional``."""
    if value is None and optional:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if ok and integer:
        ok = isinstance(value, int)
    if ok:
        ok = math.isfinite(value) and (value > minimum if strict else value >= minimum)
        ok = ok and (maximum is None or value <= maximum)
    if not ok:
        raise InvalidOptionError(f"{owner}.{name} must be {allowed}, got {value!r}")


def check_text(value: Any, what: str, limit: int, *, minimum: int = 1,
               error: Callable[[str], Exception] = UserError) -> str:
    """``value`` if it is ``minimum`` (1) to ``limit`` printable characters, else ``error`` (a
    ``UserError`` unless given) saying ``{what} must be 1 to {limit} printable characters`` and
    what is wrong. The one check of text that lands in a store column (run ids, versions, queue
    names, memory keys, labels): PostgreSQL refuses a NUL in text, a lone surrogate is not UTF-8
    anywhere, and a longer value fails inside the database driver (or bloats every row holding it)."""
    rule = f"{what} must be {minimum} to {limit} printable characters"
    if not isinstance(value, str):
        raise error(f"{rule} (a str), got {type(value).__name__} {value!r:.80}")
    if not minimum <= len(value) <= limit:
        raise error(f"{rule}, got {len(value):,}: {value!r:.80}")
    if not value.isprintable():
        bad = next(c for c in value if not c.isprintable())
        raise error(f"{rule}: {value!r:.80} holds {bad!a}, which is not printable")
    return value


def str_tuple(value: Any, where: str, option: str, example: str, *, takes: str = "names",
              error: Callable[[str], Exception] = WorkflowDefinitionError) -> tuple[str, ...]:
    """An option that takes one name or several (``after="plan"``, ``key=("order_id", "line")``)
    as a tuple of str, else ``error`` saying ``{where}: {option}= takes {takes}, e.g.
    {option}={example}, got ...``. A str is one name, never its characters."""
    items = (value,) if isinstance(value, str) else value
    try:
        names = tuple(items)
    except TypeError:
        names = None
    if names is None or not all(isinstance(name, str) for name in names):
        raise error(f"{where}: {option}= takes {takes}, e.g. {option}={example}, got {value!r}")
    return names


def unknown_option_message(where: str, unknown: Iterable[str], options: Iterable[str]) -> str:
    """``where: unknown option(s) [...]; the options are [...]``, with a guess for each typo."""
    import difflib  # only on this error path: raysaga.types is imported by every command

    unknown, options = sorted(unknown), sorted(options)
    guesses = [f"{name!r}: did you mean {close[0]!r}?" for name in unknown
               if (close := difflib.get_close_matches(name, options, n=1))]
    return (f"{where}: unknown option(s) {unknown}; the options are {options}"
            + (f" ({'; '.join(guesses)})" if guesses else ""))


def checked_options(fn: F, *, what: str, unknown: Callable[[str, list[str], list[str]], RaySagaError],
                    misfit: Callable[[str], RaySagaError], decorator_factory: bool = False,
                    fn_param: str | None = None) -> F:
    """``fn``, refusing a call that does not fit its signature with a ``RaySagaError``, not Python's
    ``TypeError``: the public decorators and option objects keep explicit, typed keyword-only
    signatures (no ``**options: Any``), yet a typo still gets an error that names the options.

    Args:
        fn: the function (or ``__init__``) to guard; the wrapper keeps its signature and its
            overloads (``functools.wraps``; typed as ``fn`` itself).
        what: how messages name the call: ``"RetryPolicy"``, ``"@wf.step"``.
        unknown: builds the error for keywords that name no parameter: ``(where, unknown, options)``.
        misfit: builds the error for any other mismatch (a missing or an extra positional argument).
        decorator_factory: ``fn`` returns a decorator: the unknown-option error is raised when that
            decorator is applied, naming the decorated function (or its ``name=`` option) as
            ``where``, so the message says which step or tool the typo is on.
        fn_param: the parameter that may carry the decorated function itself (``@wf.step`` bare,
            or ``tool(fn, nme=...)``): when it does, the error is raised at once.
    """
    signature = inspect.signature(fn)
    accepted = frozenset(name for name, p in signature.parameters.items()
                         if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    options = sorted(name for name, p in signature.parameters.items() if p.kind is p.KEYWORD_ONLY) or sorted(
        accepted - {"self"})

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        strays = sorted(kwargs.keys() - accepted)
        if not strays:
            try:
                signature.bind(*args, **kwargs)
            except TypeError as exc:
                raise misfit(f"{what}: {exc}") from None
            return fn(*args, **kwargs)
        try:
            bound = signature.bind(*args, **{k: v for k, v in kwargs.items() if k not in strays})
        except TypeError as exc:
            raise misfit(f"{what}: {exc}") from None
        if not decorator_factory:
            raise unknown(what, strays, options)

        def refuse(func: Any) -> NoReturn:
            where = kwargs.get("name") or getattr(func, "__name__", None) or repr(func)
            raise unknown(str(where), strays, options)

        target = bound.arguments.get(fn_param) if fn_param else None
        if target is not None:
            refuse(target)
        return refuse

    return cast(F, checked)


def checked_fields(cls: C) -> C:
    """An option object whose constructor answers a typo (``RetryPolicy(max_attempt=3)``) with an
    ``UnknownOptionError`` listing its fields, instead of the dataclass's bare ``TypeError``."""
    fields = [f.name for f in dataclasses.fields(cls)]
    init = checked_options(
        cls.__dict__["__init__"], what=cls.__name__,
        misfit=lambda problem: UnknownOptionError(f"{problem}; its options are {fields}"),
        unknown=lambda where, strays, options: UnknownOptionError(unknown_option_message(where, strays, options)))
    type.__setattr__(cls, "__init__", init)
    return cls


def _exception_classes(owner: str, name: str, value: Any) -> tuple[type[BaseException], ...]:
    """``value`` as a tuple of exception classes: one class, or an iterable of them."""
    items = (value,) if isinstance(value, type) else value
    try:
        classes = tuple(items)
    except TypeError:
        classes = (items,)
    bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, BaseException))]
    if bad:
        raise InvalidOptionError(
            f"{owner}.{name} takes exception classes, e.g. {name}=(TimeoutError, MyServiceBusy); "
            f"{bad[0]!r} is not one")
    return classes


@checked_fields
@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """How a step's failed attempts are retried.

    Only failures classified transient are retried (see ``raysaga.orchestrator.retry``);
    the delay before attempt ``n+1`` is drawn with full jitter:
    ``uniform(0, min(cap, base * 2 ** (n - 1)))``.
    """

    max_attempts: int = 3
    """Attempts in all, the first included. 1 means never retry."""
    base: float = 0.5
    """Seconds: the ceiling of the first backoff draw."""
    cap: float = 30.0
    """Seconds: no backoff draw exceeds this."""
    transient: tuple[type[BaseException], ...] = ()
    """Extra exception types to treat as transient (retry). A list, or one class, is taken too."""
    permanent: tuple[type[BaseException], ...] = ()
    """Extra exception types to treat as permanent (never retry); wins over ``transient``."""

    def __post_init__(self) -> None:
        # frozen: normalized in place, so a list or a single class keeps the policy hashable
        object.__setattr__(self, "transient", _exception_classes("RetryPolicy", "transient", self.transient))
        object.__setattr__(self, "permanent", _exception_classes("RetryPolicy", "permanent", self.permanent))
        both = [c.__name__ for c in self.transient if c in self.permanent]
        if both:  # permanent would win silently: the transient entry is a slip either way
            raise InvalidOptionError(f"RetryPolicy: {', '.join(both)} is in both transient= and permanent=: keep it in "
                                     "the one you mean (permanent wins, so it would never be retried)")
        check_number("RetryPolicy", "max_attempts", self.max_attempts, minimum=1, integer=True,
                     allowed="a whole number >= 1 (1: never retry)")
        check_number("RetryPolicy", "base", self.base, minimum=0, allowed="a finite number of seconds >= 0")
        check_number("RetryPolicy", "cap", self.cap, minimum=0, allowed="a finite number of seconds >= 0")


DEFAULT_RETRY = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)

#: Attempts a compensation gets by default: effectively unlimited. An undo must complete; it
#: stops only when it succeeds, is refused permanently, or a budget the workflow declares with
#: ``@wf.compensation(step, retry=RetryPolicy(...))`` runs out.
COMPENSATION_ATTEMPTS = 1_000_000
#: The default compensation retry: full jitter, base 0.5 s, capped at 60 s between attempts.
COMPENSATION_RETRY = RetryPolicy(max_attempts=COMPENSATION_ATTEMPTS, base=0.5, cap=60.0)


def compensation_retry(declared: RetryPolicy | None, forward: RetryPolicy | None) -> RetryPolicy:
    """The retry policy of a compensation: the one its workflow declares, else the forward step's
    (its classification, base and cap: the same service answers) with effectively unlimited
    attempts, else ``COMPENSATION_RETRY``."""
    if declared is not None:
        return declared
    if forward is None:
        return COMPENSATION_RETRY
    return dataclasses.replace(forward, max_attempts=max(forward.max_attempts, COMPENSATION_ATTEMPTS))


@checked_fields
@dataclass(frozen=True, kw_only=True)
class RateLimit:
    """A provider's or a tool's limit, respected by every driver and worker sharing the store.

    ``RateLimit(name="anthropic", requests=50, tokens=40_000)``: at most 50 calls and 40,000 tokens
    in any 60 s (``per``), fleet-wide; ``concurrent``: calls under way at once. Give it to an
    ``Agent`` (its model calls) or a ``@tool``; limits with one ``name`` are one limit. A call over
    the limit waits, holding nothing, until it fits; a provider's 429 ``retry-after`` holds every
    caller of the limit. See docs/agents.md ("Rate limits and circuit breakers").
    """

    name: str
    """The limit's name in the store, e.g. the provider or the API key's project."""
    requests: int | None = None
    """Calls per ``per`` seconds (None: not limited)."""
    tokens: int | None = None
    """Model tokens (input + output) per ``per`` seconds, counted when each call ends."""
    per: float = 60.0
    """The window, in seconds."""
    concurrent: int | None = None
    """Calls under way at once."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not 0 < len(self.name) <= 200:
            raise InvalidOptionError(f"RateLimit.name must be a name of 1-200 characters, got {self.name!r}")
        for field_name in ("requests", "tokens", "concurrent"):
            check_number("RateLimit", field_name, getattr(self, field_name), minimum=1, integer=True,
                         optional=True, allowed="a whole number >= 1, or None")
        check_number("RateLimit", "per", self.per, minimum=0, strict=True, allowed="a finite number of seconds > 0")
        if self.requests is None and self.tokens is None and self.concurrent is None:
            raise InvalidOptionError(f"RateLimit({self.name!r}) limits nothing: give requests=, tokens= or "
                                     "concurrent=")


#: A run's labels are in its row, which every transition and ``list`` reads: bounded, so a hostile
#: or runaway label set cannot bloat every run row (64 labels of the largest size: ~39,000 characters).
MAX_LABELS = 64
MAX_LABEL_KEY = 100
MAX_LABEL_VALUE = 500


def check_labels(labels: Any, what: str = "labels") -> dict[str, str]:
    """``labels`` if it is a run's labels (see ``RunOptions.labels``), else ``InvalidOptionError``
    naming the label at fault and the rule."""
    if not isinstance(labels, dict):
        raise InvalidOptionError(f"{what} must be a dict of str to str, e.g. {{'team': 'billing'}}, "
                                 f"got {type(labels).__name__} {labels!r:.80}")
    if len(labels) > MAX_LABELS:
        raise InvalidOptionError(f"{what} holds {len(labels)} labels, above the limit of {MAX_LABELS}: "
                                 "keep a few tags to find runs by; put the rest in the run's input")
    for key, value in labels.items():
        check_text(key, f"{what}: the key {key!r:.40}", MAX_LABEL_KEY, error=InvalidOptionError)
        if "=" in key:
            raise InvalidOptionError(f"{what}: the key {key!r:.40} holds '=': `raysaga list --label KEY=VALUE` "
                                     "could not name it; use another character ('-', '_', '.', '/')")
        check_text(value, f"{what}[{key!r:.40}]", MAX_LABEL_VALUE, minimum=0, error=InvalidOptionError)
    return labels


@checked_fields
@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """Per-run knobs; every field has a safe default."""

    deadline: float | None = None
    """Seconds from the run's creation after which it stops with reason ``deadline``."""
    retry_budget: int | None = None
    """Retries the whole run may spend across all nodes (None: only per-step limits)."""
    lease_ttl: float = 15.0
    """Seconds a driver's lease lasts without a heartbeat; a dead driver's run is free after this."""
    blob_threshold: int = 64 * 1024
    """Outputs larger than this many bytes of JSON go to the blob store by digest."""
    max_output_bytes: int = 16 * 1024 * 1024
    """Outputs larger than this fail their node permanently with a clear error."""
    token_budget: int | None = None
    """Model tokens (input + output) the whole run may spend; at the budget agents stop calling
    the model (the run pauses, or the node fails, as each agent declares). Raise it on resume."""
    cost_budget: float | None = None
    """Model cost in USD the whole run may spend (prices: ``raysaga.agents.price_of``)."""
    labels: dict[str, str] = field(default_factory=dict)
    """Free-form ``str -> str`` tags of the run (``{"team": "billing", "ticket": "OPS-12"}``),
    stored with it: ``raysaga status`` shows them, ``raysaga list --label team=billing`` and
    ``store.list_runs(labels=...)`` find runs by them. At most ``MAX_LABELS`` labels; a key is 1 to
    ``MAX_LABEL_KEY`` printable characters without ``=``, a value 0 to ``MAX_LABEL_VALUE``."""
    allow_changed: bool = False
    """Resume a run whose workflow definition changed since it started (the changed steps are
    listed in a ``definition_changed`` event and the run is pinned to the new definition); without
    it such a resume is refused with the steps that changed (docs/fork.md)."""
    release_after: float = 30.0
    """A driver with nothing left to do but wait — for a human's decision, or for a timer (a sleep,
    a backoff) further away than this many seconds — records the run ``waiting_human`` or
    ``waiting_timer``, releases it and returns: the wait holds no process, no Ray task and no
    memory. A ``raysaga worker`` takes it up when it is due (or ``raysaga resume``)."""
    max_driver_deaths: int = 3
    """A run whose last this-many drivers all died before committing any step's outcome (a step
    that kills its process: a poison pill) is parked as ``failed`` naming the steps in flight,
    instead of being resumed, and killing a worker, forever. ``raysaga retry`` it once fixed."""

    def __post_init__(self) -> None:
        check_labels(self.labels, "RunOptions.labels")
        check_number("RunOptions", "lease_ttl", self.lease_ttl, minimum=MIN_LEASE_TTL,
                     allowed=f"a finite number of seconds >= {MIN_LEASE_TTL} (the heartbeat renews every ttl/3; "
                             "5 to 60 is sensible)")
        check_number("RunOptions", "deadline", self.deadline, minimum=0, strict=True, optional=True,
                     allowed="None or a finite number of seconds > 0")
        # the run row's columns: retry_budget a 32-bit integer, token_budget a 64-bit one (a larger
        # budget, sys.maxsize for "no limit" say, ran on SQLite and failed the run's insert on PostgreSQL)
        check_number("RunOptions", "retry_budget", self.retry_budget, minimum=0, integer=True, optional=True,
                     maximum=2**31 - 1, allowed="None (no limit) or a whole number from 0 to 2147483647")
        check_number("RunOptions", "blob_threshold", self.blob_threshold, minimum=0, integer=True,
                     allowed="a whole number of bytes >= 0")
        check_number("RunOptions", "max_output_bytes", self.max_output_bytes, minimum=1, integer=True,
                     allowed="a whole number of bytes >= 1")
        check_number("RunOptions", "token_budget", self.token_budget, minimum=0, integer=True, optional=True,
                     maximum=2**63 - 1, allowed="None (no limit) or a whole number of tokens from 0 to 2**63 - 1")
        check_number("RunOptions", "cost_budget", self.cost_budget, minimum=0, optional=True,
                     allowed="None or a finite amount of USD >= 0")
        check_number("RunOptions", "max_driver_deaths", self.max_driver_deaths, minimum=1, integer=True,
                     allowed="a whole number >= 1")
        check_number("RunOptions", "release_after", self.release_after, minimum=0,
                     allowed="a finite number of seconds >= 0 (0: release at every wait)")


class Ask(BaseModel):
    """What an approval node asks (its function's return value; a bare ``str`` is the prompt)."""

    model_config = ConfigDict(frozen=True)

    prompt: str
    payload: Any = None
    """What the approver reviews (JSON): an order, a plan, a draft; a pydantic model (or models in
    it) is stored, and read, as the dict it dumps to."""

    def __init__(self, prompt: str, payload: Any = None) -> None:
        # positional too, as docs/api.md writes it: ``Ask("Refund 500 cents?", order)``
        super().__init__(prompt=prompt, payload=payload)


class Approval(BaseModel):
    """An approval node's output: who approved, when, and the answer (an approve "with edits")."""

    model_config = ConfigDict(frozen=True)

    approved: bool = True
    by: list[str] = Field(default_factory=list)
    """Who approved (several for a quorum); ``["timeout"]`` when a timeout's default answered."""
    answer: Any = None
    """The approver's answer, validated against the node's ``answer=`` type; None: as proposed."""
    comment: str | None = None
    at: float = 0.0
    timed_out: bool = False
    decision_ids: list[str] = Field(default_factory=list)


class StepFailed(BaseModel):
    """What the dependents of a non-critical ``on_failure="pass"`` step receive in place of its
    output when it fails. A dependent reading it annotates its parameter ``Output | StepFailed``
    (or ``dict``, or leaves it unannotated): annotated ``Output`` alone, it could not read the
    record, and the workflow is refused where it is defined."""

    model_config = ConfigDict(frozen=True)

    failed: Literal[True] = True
    step: str
    """The step that failed."""
    error_type: str
    message: str
    """Its error's message, scrubbed of secrets."""


@dataclass(frozen=True)
class StepContext:
    """Passed to a step that declares a ``ctx`` parameter (or one annotated ``StepContext``).

    ``idempotency_key`` is set for ``effect=True`` steps: pass it to the downstream service
    so a re-issued call after a crash is recognised as the same call.
    """

    run_id: str
    node_id: str
    fan_index: int
    attempt: int
    trace_id: str
    idempotency_key: str | None = None
    reconciling: bool = False

    @property
    def label(self) -> str:
        return self.node_id if self.fan_index < 0 else f"{self.node_id}[{self.fan_index}]"


#: Step, agent, map, effect and compensation-target names. The engine builds node ids and keys
#: from them with reserved characters: ``:`` (``pay:compensate``, ``tool:name``), ``@`` and ``.``
#: (an agent's turns and tool calls, ``research@3.1``), ``[``/``]`` (fan-out items, ``fetch[2]``);
#: quotes and spaces would break the CLI and the mermaid/dot exports.
NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,99}")
NAME_RULE = ("1-100 characters: ASCII letters, digits, '_' and '-', starting with a letter or '_' "
             "(':', '@', '.', '[' and ']' are reserved for compensation, agent-call and fan-out ids)")
#: Workflow names prefix run ids; '.' is allowed there (no node id is built from them).
WORKFLOW_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,99}")


def check_name(kind: str, name: Any) -> str:
    """``name`` if it is a valid step/agent/effect name, else a ``WorkflowDefinitionError`` saying why."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise WorkflowDefinitionError(f"{kind} name {name!r} is not valid: use {NAME_RULE}")
    return name


#: A compensation's node id is the compensated node's + this; its key, the effect's key + this.
COMPENSATE_SUFFIX = ":compensate"


#: Run ids are primary keys in every table; PostgreSQL text refuses NUL, so only printable text.
MAX_RUN_ID = 200


def check_run_id(value: str, what: str = "run id") -> str:
    """A run id: 1 to ``MAX_RUN_ID`` printable characters (no NUL, no control characters)."""
    return check_text(value, what, MAX_RUN_ID)


def is_compensation(node_id: str) -> bool:
    return node_id.endswith(COMPENSATE_SUFFIX)


def compensation_node(node_id: str) -> str:
    return node_id + COMPENSATE_SUFFIX

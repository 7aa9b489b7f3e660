"""What runs inside a Ray task (or inline): call the step, classify its failure, return JSON.

Only ids, config and JSON cross in; only JSON text and a classified error record come back.
The store is never touched here: the driver is the single writer.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from dataclasses import dataclass
from typing import Any

from raysaga.errors import NotJSONableError, Permanent
from raysaga.orchestrator.context import StepContext
from raysaga.orchestrator.retry import describe, is_transient, printable, retry_after
from raysaga.orchestrator.spec import NOT_APPLIED, StepSpec
from raysaga.orchestrator.workflow import coerce
from raysaga.state import jsoncodec
from raysaga.state.redact import scrub_text


@dataclass(frozen=True)
class NodeCall:
    """Everything a worker needs besides the step itself."""

    ctx: StepContext
    kwargs: dict[str, Any]
    """JSON values for the step's data parameters (dependencies, fan-out item, input)."""
    max_output_bytes: int
    reconcile: bool = False


@dataclass(frozen=True)
class NodeOutcome:
    """A finished attempt: JSON text of the output, or a classified error record."""

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
        error = describe(exc)
        # scrubbed before it is cut, so no fragment of a secret survives a truncation
        error["message"] = printable(scrub_text(str(exc))[:2000])
        error["transient"] = transient
        wait = retry_after(exc)
        if wait is not None:
            error["retry_after"] = wait  # the retry waits this long; a rate limit blocks the fleet as long
        error["traceback"] = printable(scrub_text("".join(traceback.format_exception(exc, limit=-8)))[-4000:])
        return NodeOutcome(ok=False, error=error, transient=transient, started_at=started_at,
                           finished_at=time.time())


@dataclass(frozen=True)
class Aside:
    """A step's return value with something for the driver alone: ``value`` is the output (stored,
    capped, classified as any output); ``aside`` rides along in ``NodeOutcome.aside`` and is not
    part of it (an agent's model call offers the results of tools it ran speculatively)."""

    value: Any
    aside: Any


def execute(spec: StepSpec, call: NodeCall) -> NodeOutcome:
    """Run one attempt of ``spec``. Never raises: every failure comes back classified."""
    started = time.time()
    try:
        kwargs = {name: coerce(spec.param_types.get(name, Any), value) for name, value in call.kwargs.items()}
        if spec.ctx_param:
            kwargs[spec.ctx_param] = call.ctx
        result: Any = NOT_APPLIED
        if call.reconcile and spec.reconcile is not None:
            result = _call(spec.reconcile, kwargs)
        if result is NOT_APPLIED:
            result = _call(spec.fn, kwargs)
        aside = None
        if isinstance(result, Aside):
            result, aside = result.value, result.aside
        text = jsoncodec.dumps(result, f"output of step {call.ctx.label!r}")
        size = len(text.encode("utf-8"))
        if size > call.max_output_bytes:
            raise Permanent(
                f"output of step {call.ctx.label!r} is {size} bytes, above the cap of {call.max_output_bytes}: "
                "return a reference (a path, an id) instead, or raise RunOptions.max_output_bytes"
            )
        return NodeOutcome(ok=True, output_json=text, started_at=started, finished_at=time.time(), aside=aside)
    except NotJSONableError as exc:
        return NodeOutcome.failure(exc, transient=False, started_at=started)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt | SystemExit):
            raise
        return NodeOutcome.failure(exc, transient=is_transient(exc, spec.retry), started_at=started)


def _call(fn: Any, kwargs: dict[str, Any]) -> Any:
    result = fn(**kwargs)
    if asyncio.iscoroutine(result):
        result = asyncio.run(result)
    return result

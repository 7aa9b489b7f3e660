"""The run's token and cost budgets: what the model calls used, and whether another may start."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from raysaga.agents.messages import Usage
from raysaga.agents.models import AnthropicModel
from raysaga.orchestrator.records import merge_run
from raysaga.orchestrator.retry import message_of
from raysaga.state import Batch, RunUpdate
from raysaga.state.redact import scrub_text
from raysaga.state.statements import MAX_COST_USED


@dataclass
class Budgets:
    tokens: int = 0
    cost: float = 0.0
    token_budget: int | None = None
    cost_budget: float | None = None

    def charge(self, tokens: int, cost: float, batch: Batch) -> None:
        """Count a model response's usage against the run (durable with the response itself).
        ``cost`` is one call's, as ``model_cost`` accepted it (at most ``MAX_CALL_COST``); the total
        stays at most ``MAX_COST_USED``, as the store's counter does (``statements``), so it is
        finite here and in either database, whatever a row held before."""
        self.tokens += tokens
        self.cost = min(self.cost + cost, MAX_COST_USED)
        batch.run = merge_run(batch.run, RunUpdate(tokens_delta=tokens, cost_delta=cost))

    def stop(self) -> str | None:
        """Why no further model call may start (a budget is spent), or None."""
        if self.token_budget is not None and self.tokens >= self.token_budget:
            return f"budget: {self.tokens} tokens used of a budget of {self.token_budget}"
        if self.cost_budget is not None and self.cost >= self.cost_budget:
            return f"budget: ${self.cost:.4f} spent of a budget of ${self.cost_budget:.4f}"
        return None


#: The most one model call may cost, in USD: far above any real call (a million-token answer of
#: the dearest model is a few hundred dollars), far below what could overflow the run's total. A
#: ``cost()`` above it is counting in another unit, or wrong: its agent node fails, naming it.
MAX_CALL_COST = 1_000_000.0


def model_cost(model: Any, usage: Usage) -> tuple[float, str | None]:
    """The USD cost of one model call by ``model.cost`` (user code, for a model of one's own), and
    why it cannot be counted, if so. Unchecked, a ``cost()`` that raised or returned None crashed
    the driver (every resume the same way), and NaN, inf or a negative amount made the run's
    ``cost_used`` nonsense, so a ``cost_budget`` never stopped it; a finite but huge one (1e308)
    added up to inf: SQLite kept it (``status --json`` then printed ``Infinity``, not JSON) and
    PostgreSQL refused the commit (out of range), leaving the run ``running`` with every resume
    failing the same way. Above ``MAX_CALL_COST`` the agent node fails instead."""
    try:
        cost = model.cost(usage)
    except Exception as exc:  # any failure of user code: the agent node fails naming it
        # scrubbed before it is cut: a cut key is no longer a value the store's scrub can find
        return 0.0, scrub_text(f"its model's cost() raised {type(exc).__name__}: {message_of(exc)}")[:500]
    # an int is finite (math.isfinite would raise OverflowError on one beyond a float's range)
    if isinstance(cost, bool) or not isinstance(cost, int | float) or \
            (isinstance(cost, float) and not math.isfinite(cost)) or cost < 0:
        return 0.0, (f"its model's cost() returned {scrub_text(_repr(cost))[:80]}: it must return the call's "
                     "cost as a finite number of USD >= 0 (0.0 if unknown)")
    if cost > MAX_CALL_COST:
        return 0.0, (f"its model's cost() returned {scrub_text(_repr(cost))[:80]} for one call of model "
                     f"{scrub_text(_model_name(model))[:100]!r}: more than {MAX_CALL_COST:,.0f} USD, the most one "
                     "model call may cost: cost() must return the call's cost in USD")
    return float(cost), None


def _model_name(model: Any) -> str:
    """The model's ``name`` (its type's name when it has none, or reading it fails: user code)."""
    try:
        name = model.name
    except Exception:  # any failure of user code
        name = None
    return name if isinstance(name, str) and name else type(model).__name__


def unpriced(model: Any, cost_budget: float | None) -> str | None:
    """Why a run with ``cost_budget`` may not call ``model``: an ``AnthropicModel`` with no price
    (in ``DEFAULT_PRICES`` or its ``prices=``) would count every call as $0.00, so the budget would
    never stop it. None when there is no cost budget, or the model is priced (a model of one's own
    prices itself with ``cost()``)."""
    if cost_budget is None or not isinstance(model, AnthropicModel) or model.price() is not None:
        return None
    if type(model).cost is not AnthropicModel.cost:  # a subclass pricing itself (a gateway's model names)
        return None
    return (f"model {model.name!r} has no price, so the run's cost_budget (${cost_budget:.4f}) cannot be enforced: "
            f"give its USD per million input and output tokens with AnthropicModel({model.name!r}, "
            f"prices={{{model.name!r}: (input, output)}})")


def _repr(value: Any) -> str:
    """``repr(value)``, or a note when user code's ``__repr__`` raises (it must not crash the driver)."""
    try:
        return repr(value)
    except Exception as problem:  # any failure of user code
        return f"<a {type(value).__name__} whose repr() raised {type(problem).__name__}>"

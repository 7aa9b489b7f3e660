"""A step's return value checked against its declared return type, where it is made.

Why: a step declared ``-> Charge`` that returned ``{"amount": "lots"}`` was stored as it came,
and the error surfaced later, as raw pydantic text, in whichever step read it first (or in the
step's own compensation, which then failed for good): the blame on the wrong step, the run's
store holding a value its own contract refuses. Checked here, the step that returned it fails,
permanently (running it again returns the same), naming itself and the type.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ValidationError

from raysaga.errors import OutputTypeError
from raysaga.orchestrator.type_adapters import type_adapter

#: Types a value of exactly that type already is (nothing to validate).
_EXACT = frozenset({int, str, float, bool, dict, list, type(None)})


def check_output_type(returns: Any, value: Any, label: str) -> None:
    """Raise ``OutputTypeError`` (``raysaga.errors``) naming step ``label`` if ``value`` is not a ``returns``.

    Lax, as reading it back is (``workflow.coerce``): a dict a declared model validates, an int
    for a float; what passes here is what every reader of the output will accept."""
    if type(value) is returns and returns in _EXACT:
        return
    if isinstance(returns, type) and issubclass(returns, BaseModel) and isinstance(value, returns):
        return
    if isinstance(returns, typing.TypeVar):
        return
    try:
        adapter = type_adapter(returns)
    except Exception:  # an annotation pydantic cannot build a validator for: nothing to check with
        return
    try:
        adapter.validate_python(value)
    except ValidationError as exc:
        shown = repr(value)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}" for e in exc.errors()[:5])
        raise OutputTypeError(
            f"step {label!r} returned {shown}, which is not its declared return type "
            f"{getattr(returns, '__name__', None) or str(returns).replace('typing.', '')} ({problems}): "
            "return a value of that type, or change the annotation") from None

"""pydantic's validation errors as one short, bounded line: a run's input that does not match its
workflow (``run``, ``submit``, ``fork``, the Python API), a step's output or input that is not
its declared type.

Why its own module: the CLI formats an input's mismatch before any workflow is loaded, and must
not import the DSL (networkx) for it (``tests/test_public_api.py``).
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError

from raysaga.state.redact import scrub_text

#: Problems a mismatch names (then "and N more"), and the characters shown of each part of one.
MAX_PROBLEMS = 20
MAX_GOT = 60
MAX_WHERE = 100
MAX_MSG = 200


def mismatch(workflow: str, tp: Any, exc: ValidationError) -> str:
    """``input does not match Order of workflow 'w': sku: Input should be a valid string (got 5)``:
    one short form for ``run``, ``submit``, ``fork`` and the Python API. pydantic's own error list
    repeats each bad value whole (a fork's 100 KB patch made a 100 KB line): here every part is cut."""
    return f"input does not match {getattr(tp, '__name__', tp)} of workflow {workflow!r}: {problems(exc)}"


def problems(exc: ValidationError) -> str:
    """pydantic's errors as ``field: problem (got value)`` joined by "; ", at most ``MAX_PROBLEMS``."""
    errors = exc.errors(include_url=False)
    shown = []
    for e in errors[:MAX_PROBLEMS]:
        where = _cut(".".join(str(p) for p in e.get("loc", ())), MAX_WHERE) or "(the input)"
        got = e.get("input")
        value = _preview(got) if got is not None and e.get("type") != "missing" else ""
        shown.append(f"{where}: {_cut(str(e.get('msg', 'invalid')), MAX_MSG)}" + (f" (got {value})" if value else ""))
    if len(errors) > MAX_PROBLEMS:
        shown.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return "; ".join(shown)


def _preview(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (ValueError, TypeError, RecursionError):  # a circular value, an odd object
        text = object.__repr__(value)
    return _cut(scrub_text(text[: MAX_GOT * 4]), MAX_GOT)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

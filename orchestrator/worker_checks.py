"""A worker's settings, checked once for ``Worker(...)`` and ``raysaga worker`` (its flags and
``--config``), before a store is opened, a module imported or a run claimed: each refusal is a
one-line ``UserError`` naming the setting. Kept apart from ``worker`` (no driver, no Ray) so the
CLI checks its flags without importing them."""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from typing import TypeGuard

from raysaga.errors import UserError

#: The executors a worker's slots drive runs with (``executor.make_executor``).
EXECUTORS = ("ray", "inline")


def _count(value: object) -> TypeGuard[int]:
    """A whole number >= 1, and not a bool: TOML's ``true`` is a Python ``True``, an ``int``."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def checked_limits(limits: Mapping[str, object] | None) -> dict[str, int]:
    """Per-workflow limits (``{workflow: N}``: at most N of its runs driven at once, fleet-wide),
    checked once for ``Worker(limits=...)`` and ``raysaga worker`` (``--limit``, ``--config``):
    each a whole number >= 1. Below 1 no run of the workflow was ever claimed (the worker idled,
    silently); NaN limited nothing; ``true`` was taken as 1 by the CLI and refused by ``Worker``."""
    table = dict(limits or {})
    names = [name for name in table if not isinstance(name, str) or not name]
    if names:
        raise UserError(f"limits are keyed by workflow name (a str), got {names[0]!r}")
    bad = {name: n for name, n in table.items() if not _count(n)}
    if bad:
        hint = " (true/false is not a count)" if any(isinstance(n, bool) for n in bad.values()) else ""
        raise UserError("limits are whole numbers >= 1 (at most N runs of the workflow driven at once), got "
                        + ", ".join(f"{name}={n!r}" for name, n in bad.items()) + hint)
    return {name: n for name, n in table.items() if _count(n)}


def checked_concurrency(value: object) -> int:
    """``--concurrency`` / ``Worker(concurrency=...)``: runs driven at once, a whole number >= 1."""
    if not _count(value):
        raise UserError(f"--concurrency must be a whole number >= 1 (runs driven at once), got {value!r}")
    return value


def checked_poll(value: object) -> float:
    """``Worker(poll=...)``: seconds between looks for runs, a finite number > 0 (NaN slept never,
    a negative one spun; beyond ``threading.TIMEOUT_MAX`` a wait raised OverflowError)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise UserError(f"poll must be a number of seconds > 0 (between looks for runs), got {value!r}")
    return min(float(value), threading.TIMEOUT_MAX / 2)  # (a slot waits up to 1.5 polls)


def checked_max_driver_deaths(value: object) -> int:
    """``--max-driver-deaths``: the fleet's ``RunOptions.max_driver_deaths``, a whole number >= 1."""
    if not _count(value):
        raise UserError(f"--max-driver-deaths must be a whole number >= 1 (drivers of a run that die in a row "
                        f"before it commits any step's outcome, then the run is parked as a crash loop), got {value!r}")
    return value


def checked_executor(kind: object, what: str = "--executor") -> str:
    """``--executor`` / ``executor`` in ``--config`` / ``Worker(executor=...)``: ``ray`` or ``inline``.
    Checked before any claim: an unknown kind failed in a slot after it claimed a run, which then
    stayed leased to a slot that had died, while the worker said it claimed nothing."""
    if not isinstance(kind, str) or kind not in EXECUTORS:
        raise UserError(f"{what} must be {' or '.join(EXECUTORS)}, got {kind!r:.80}")
    return kind

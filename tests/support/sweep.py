"""What runs only in the full sweep: ``RAYSAGA_FULL_SWEEP=1`` (the ``slow`` marker).

The default run (CI, ``.ci/run``) keeps a representative of every family; the rest of a family
(every crash point x every node, both stores, both executors, the benchmarks' long scripts) runs
with ``RAYSAGA_FULL_SWEEP=1 pytest`` (``-m slow`` selects just those)::

    @pytest.mark.parametrize("case", sweep_params(CASES, CI_CASES, "CI: CI_CASES"))
    @full_sweep_only("CI runs test_x, the same path on a smaller input")
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Sequence
from typing import Any, TypeVar

import pytest

#: The full sweeps run only when asked (``RAYSAGA_FULL_SWEEP=1``, marked ``slow``).
FULL_SWEEP = os.environ.get("RAYSAGA_FULL_SWEEP") == "1"

F = TypeVar("F", bound=Callable[..., Any])


def full_sweep_marks(reason: str) -> list[pytest.MarkDecorator]:
    """The marks of a test or case that runs only in the full sweep: ``reason`` says which
    representative of it stays in the default run (CI)."""
    return [pytest.mark.slow, pytest.mark.skipif(not FULL_SWEEP, reason=f"RAYSAGA_FULL_SWEEP=1 runs it; {reason}")]


def full_sweep_only(reason: str) -> Callable[[F], F]:
    """A decorator: the test runs only in the full sweep (``full_sweep_marks(reason)``)."""

    def mark(test: F) -> F:
        for decorator in full_sweep_marks(reason):
            test = decorator(test)
        return test

    return mark


def case_ids(cases: Sequence[tuple[Any, ...]]) -> list[str]:
    """Test ids of ``(..., point, label)`` cases: the leading fields, then ``point:label``."""
    return ["-".join([*map(str, case[:-2]), f"{case[-2]}:{case[-1]}"]) for case in cases]


def sweep_params(cases: Sequence[tuple[Any, ...]], ci: Collection[tuple[Any, ...]], reason: str,
                 ids: Sequence[str] | None = None) -> list[Any]:
    """``cases`` as parameters (ids as ``case_ids`` gives them, or ``ids``): those in ``ci`` run in
    the default run, the rest only in the full sweep (``full_sweep_marks(reason)``)."""
    unknown = [case for case in ci if case not in cases]
    assert not unknown, f"CI cases that are not cases of the sweep: {unknown}"
    names = list(ids) if ids is not None else case_ids(cases)
    return [pytest.param(*case, id=name, marks=() if case in ci else full_sweep_marks(reason))
            for case, name in zip(cases, names, strict=True)]

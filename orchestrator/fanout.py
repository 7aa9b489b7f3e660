"""Bookkeeping for fan-outs with a partial-failure policy (anything but ``ALL``).

The driver records each item's final outcome here; once every item has settled, the
step's policy reads the ``FanOutResult`` and decides. The result is what dependents receive.
"""

from __future__ import annotations

from typing import Any

from raysaga.node_key import NodeKey
from raysaga.sagas.policy import FanOutResult, ItemFailure, ItemSuccess
from raysaga.state.redact import scrub_text


class FanOutBook:
    """Failures (and retry rounds) of the partial fan-outs of one run."""

    def __init__(self) -> None:
        self._failures: dict[str, dict[int, ItemFailure]] = {}
        self._rounds: dict[str, int] = {}

    def record_failure(self, step: str, index: int, error: dict[str, Any], attempts: int) -> None:
        self._failures.setdefault(step, {})[index] = ItemFailure(
            index=index, error_type=str(error.get("type", "Error")),
            # scrubbed here: the result is stored as the step's output, which the store does not scrub
            message=scrub_text(str(error.get("message") or error.get("reason") or "")), attempts=attempts)

    def failures(self, step: str) -> dict[int, ItemFailure]:
        return self._failures.get(step, {})

    def round(self, step: str) -> int:
        return self._rounds.get(step, 1)

    def set_round(self, step: str, value: int) -> None:
        self._rounds[step] = value

    def start_retry(self, step: str) -> list[int]:
        """Forget the failed items (they run again) and count a new round; return their indexes."""
        indexes = sorted(self._failures.pop(step, {}))
        self._rounds[step] = self.round(step) + 1
        return indexes

    def result(self, step: str, outputs: dict[NodeKey, Any], total: int) -> FanOutResult:
        failed = self.failures(step)
        return FanOutResult(
            total=total,
            successes=[ItemSuccess(index=i, output=outputs[NodeKey(step, i)]) for i in range(total)
                       if i not in failed and NodeKey(step, i) in outputs],
            failures=[failed[i] for i in sorted(failed)],
            round=self.round(step),
        )

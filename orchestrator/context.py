"""What a running step can know about itself."""

from __future__ import annotations

from dataclasses import dataclass


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

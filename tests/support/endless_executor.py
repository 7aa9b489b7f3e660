"""An executor whose calls are sent and never end (a model or tool call hanging at its provider):
for the rate gate's tests, which look at grants while a call is under way."""

from __future__ import annotations

from collections.abc import Collection

from raysaga.orchestrator.executor_base import Executor, Handle
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall


class Endless(Executor):
    """Calls that are sent and never end; ``sent`` lists their node ids."""

    name = "endless"

    def __init__(self) -> None:
        self.sent: list[str] = []

    def submit(self, spec: StepSpec, call: NodeCall) -> Handle:
        self.sent.append(call.node_id)
        return Handle(key=(call.node_id, call.fan_index), sent=True)

    def wait(self, handles: Collection[Handle] | None, timeout: float) -> list[Handle]:
        return []

    def cancel(self, handle: Handle) -> None:
        return

    def settle_cancelled(self, timeout: float) -> int:
        return 0

    def shutdown(self) -> None:
        return

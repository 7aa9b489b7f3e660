"""Steps declared ``local=True``: the Ray executor runs them in the driver's own process.

A planner that splits a list, or a join that gathers results, takes microseconds; sent as a Ray
task it takes a round trip (3-5 ms on 2 cores), and a fan-out pays two of them, a fifth of a
1,000-item run. Temporal runs such work as local activities for the same reason. A local step is
still one attempt of one node: the driver records, retries and commits it as any other (an effect
still goes through the ledger, its pending row committed before it runs), only no Ray task carries
it. It runs as the inline executor runs a step (``task.execute``), on a private copy of its
inputs (as a Ray task gets one: a step mutating its input must not change an upstream output the
driver holds), at the driver's next ``wait``: what finished before it is committed first
(``driver_io.commits_first``), the round's Ray attempts are sent and run meanwhile, and its
outcome is returned by that very ``wait`` (a pause or cancel seen between its end and its
absorption dropped a local effect that had gone through). That is also the limit:
it shares the driver's thread and GIL with the heartbeat, and nothing can time it out, so the DSL
refuses ``timeout=`` with it; long or blocking work belongs on Ray (docs/execution.md).
"""

from __future__ import annotations

import copy
from collections import deque

from raysaga.orchestrator.executor_base import Handle
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, execute


class LocalSteps:
    """The local attempts submitted and not yet run, in order."""

    def __init__(self) -> None:
        self._queue: deque[tuple[Handle, NodeCall, StepSpec]] = deque()

    def add(self, handle: Handle, call: NodeCall, spec: StepSpec) -> None:
        self._queue.append((handle, call, spec))

    def __bool__(self) -> bool:
        return bool(self._queue)

    def run(self, finished: dict[Handle, None]) -> None:
        """Run every queued attempt, each outcome into ``finished`` (the executor's, in order)."""
        while self._queue:
            handle, call, spec = self._queue.popleft()
            handle.sent = True
            call.kwargs = copy.deepcopy(call.kwargs)
            handle.outcome = execute(spec, call)
            finished[handle] = None

    def drop(self, handle: Handle) -> bool:
        """Forget a queued attempt (cancelled before it ran); False: not queued here."""
        for queued in self._queue:
            if queued[0] is handle:
                self._queue.remove(queued)
                return True
        return False

"""Where node attempts run: Ray tasks, or inline in the driver (for cheap steps and unit tests).

Ray's own retries are off (``max_retries=0``): a task whose worker died must not be re-run
behind the ledger's back. The driver sees the failure, classifies it transient and retries
with the same idempotency key.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, NodeOutcome, execute


@dataclass(eq=False)
class Handle:
    """An attempt in flight."""

    key: tuple[str, int]
    ref: Any = None
    outcome: NodeOutcome | None = None


class Executor(ABC):
    name: str

    @abstractmethod
    def submit(self, spec: StepSpec, call: NodeCall, task_name: str) -> Handle: ...

    @abstractmethod
    def wait(self, handles: list[Handle], timeout: float) -> list[Handle]:
        """Block up to ``timeout`` for one attempt, then return every finished one (outcome set)."""

    @abstractmethod
    def cancel(self, handle: Handle) -> None: ...

    def shutdown(self) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Release what the executor started."""


class InlineExecutor(Executor):
    """Runs each attempt synchronously at submit. Deterministic; no timeouts (nothing can interrupt it)."""

    name = "inline"

    def submit(self, spec: StepSpec, call: NodeCall, task_name: str) -> Handle:
        return Handle(key=(call.ctx.node_id, call.ctx.fan_index), outcome=execute(spec, call))

    def wait(self, handles: list[Handle], timeout: float) -> list[Handle]:
        done = [h for h in handles if h.outcome is not None]
        if not done and timeout > 0:
            time.sleep(timeout)  # nothing in flight can finish: this is a timer wait, not a sync
        return done

    def cancel(self, handle: Handle) -> None:
        handle.outcome = handle.outcome or NodeOutcome(ok=False, error={"type": "Cancelled", "message": "cancelled"})


class RayExecutor(Executor):
    """Each attempt is a Ray task named ``<run_id>:<node>`` (readable in Ray's dashboard)."""

    name = "ray"

    def __init__(self, address: str | None = None, num_cpus: int | None = None) -> None:
        import ray

        self._ray = ray
        self._started_here = False
        if not ray.is_initialized():
            address = address or os.environ.get("RAY_ADDRESS") or None
            # workers must import the user's workflow module as the driver does
            pythonpath = os.pathsep.join(p for p in [os.getcwd(), *sys.path] if p and os.path.isdir(p))
            ray.init(address=address, num_cpus=None if address else num_cpus, include_dashboard=False,
                     logging_level=logging.ERROR, log_to_driver=False, configure_logging=True,
                     runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
            self._started_here = True
        self._remote = ray.remote(max_retries=0, retry_exceptions=False)(execute)
        self._spec_refs: dict[int, Any] = {}
        self._spec_uses: dict[int, int] = {}

    def submit(self, spec: StepSpec, call: NodeCall, task_name: str) -> Handle:
        # A spec is put in the object store once, and only when it is reused (a fan-out's items):
        # for a one-off step, passing it inline costs less than a put plus a fetch on the worker.
        uses = self._spec_uses[id(spec)] = self._spec_uses.get(id(spec), 0) + 1
        spec_arg: Any = spec
        if uses > 1:
            spec_arg = self._spec_refs.get(id(spec))
            if spec_arg is None:
                spec_arg = self._spec_refs[id(spec)] = self._ray.put(spec)
        ref = self._remote.options(name=task_name).remote(spec_arg, call)
        return Handle(key=(call.ctx.node_id, call.ctx.fan_index), ref=ref)

    def wait(self, handles: list[Handle], timeout: float) -> list[Handle]:
        by_ref = {h.ref: h for h in handles if h.outcome is None}
        done = [h for h in handles if h.outcome is not None]
        if by_ref and not done:
            refs = list(by_ref)
            # ray.wait costs O(len(refs)) per call: with many in flight, ask for a slice of them
            # (bounded by a short timeout) so the loop, and the commits, come in larger groups
            want = 1 if len(refs) < 32 else len(refs) // 16
            ready, rest = self._ray.wait(refs, num_returns=want, timeout=timeout if want == 1 else min(timeout, 0.05))
            if ready and rest:  # group commit: drain everything else that is already finished
                more, _ = self._ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
            try:  # one ray.get for the lot; a task that raised (its worker died) is fetched alone
                outcomes: list[NodeOutcome] = self._ray.get(ready)
            except Exception:
                outcomes = [self._result(ref) for ref in ready]
            for ref, outcome in zip(ready, outcomes, strict=True):
                handle = by_ref[ref]
                handle.outcome = outcome
                done.append(handle)
        return done

    def _result(self, ref: Any) -> NodeOutcome:
        started = time.time()
        try:
            outcome: NodeOutcome = self._ray.get(ref)
            return outcome
        except Exception as exc:  # the worker died or the task was cancelled: not the step's own error
            return NodeOutcome.failure(exc, transient=True, started_at=started)

    def cancel(self, handle: Handle) -> None:
        if handle.ref is not None and handle.outcome is None:
            with contextlib.suppress(Exception):  # it may have finished meanwhile
                self._ray.cancel(handle.ref, force=True)

    def shutdown(self) -> None:
        if self._started_here:
            self._ray.shutdown()


def make_executor(kind: str, address: str | None = None, num_cpus: int | None = None) -> Executor:
    if kind == "inline":
        return InlineExecutor()
    if kind == "ray":
        return RayExecutor(address=address, num_cpus=num_cpus)
    from raysaga.errors import UserError

    raise UserError(f"unknown executor {kind!r}: use 'ray' or 'inline'")

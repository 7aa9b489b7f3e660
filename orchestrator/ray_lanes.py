"""What the Ray executor keeps per fan-out step and per task, and how it submits a task.

A wide fan-out's driver submits a task per chunk of items, and Ray's ``.options(name=...)``
re-merges and re-validates the remote function's options at every call (~30 us, a fifth of a
submission measured on 2 cores). The options of a step's tasks differ only by their name, so
``TaskSubmitter`` validates them once per step, through Ray's own ``.options``, and submits each
task with its name as ``.options(...).remote`` would.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from raysaga.errors import InfeasibleResourcesError, InvalidOptionError, RaySagaError
from raysaga.orchestrator.executor_base import Handle
from raysaga.orchestrator.item_block import ItemBlock, ItemOutcomes, ItemsDone
from raysaga.orchestrator.resources import Feasibility
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import AllSucceeded, NodeCall, NodeOutcome
from raysaga.orchestrator.wire import CACHE_LIMIT, StepCodeMissing, run_packed


@dataclass(eq=False)
class Lane:
    """Attempts queued in the driver, sent while the lane has fewer than ``limit`` tasks in flight.

    A fan-out step's lane (``chunked``) sends its items as chunks sized from their measured
    duration; the lane of attempts with a timeout sends one per task, one task per CPU.
    """

    limit: int
    chunked: bool
    spec: StepSpec | None = None  # a chunked lane's step; the timed lane's items carry their own
    probes: int = 0  # a chunked lane's tasks in flight before any item is measured (one per CPU)
    prior: float | None = None  # an item's seconds as a recent run of this process measured them
    queue: deque[tuple[Handle, NodeCall, StepSpec]] = field(default_factory=deque)
    blocks: deque[list[Any]] = field(default_factory=deque)  # [ItemBlock, next position to send]
    tasks: int = 0  # Ray tasks of this lane in flight
    items_done: int = 0
    busy: float = 0.0  # seconds the finished items ran, summed

    def room(self) -> int:
        """Tasks this lane may have in flight now. Until an item is measured, a chunked lane sends
        one item a task, and only ``probes`` of them (as many as the cluster runs at once:
        ``RayExecutor._probes``): they run together, and the first back sizes the chunks (a no-op
        step's first wave was ``limit`` tasks of one item each, a task costing ~0.5 ms of cluster
        CPU; a slow item loses nothing: no more of them could run anyway). With a ``prior`` there
        is nothing to probe: the first wave is the whole lane, each task a chunk sized from it
        (holding it to ``probes`` tasks until the first came back cost a Ray round trip with the
        workers idle: 1,000 no-op items 7 % slower, quiet and interleaved; 10,000 within noise:
        bench/README)."""
        probing = self.chunked and self.probes and self.items_done == 0 and self.prior is None
        return self.probes if probing else self.limit

    def measured(self, outcomes: ItemOutcomes) -> None:
        """Count how long a task's items ran (what sizes a chunked lane's chunks). Only items that
        succeeded: a failure says nothing of an item's length (one that raised at once, a worker
        that died timed by the driver's clock: ~0 s), and counted it sized a slow step's chunks as
        if its items were instant. A lane whose items have all failed stays probing."""
        if not self.chunked:
            return
        if isinstance(outcomes, AllSucceeded):
            self.items_done += len(outcomes.started)
            self.busy += sum(map(operator.sub, outcomes.finished, outcomes.started))
        else:
            timed = [o.finished_at - o.started_at for o in outcomes if o.ok and o.finished_at and o.started_at]
            self.items_done += len(timed)
            self.busy += sum(timed)
        if self.items_done and self.spec is not None:
            remember_item_seconds(self.spec, self.busy / self.items_done)

    def chunk_size(self, target: float, largest: int) -> int:
        if not self.chunked:
            return 1
        if self.items_done:
            mean = self.busy / self.items_done
        elif self.prior is not None:
            mean = self.prior  # until this run's own first items are back
        else:
            return 1  # nothing measured yet: an item might take minutes
        return max(1, min(largest, int(target / max(mean, 1e-6))))


#: Seconds a fan-out step's measured item length sizes the first chunks of this process's next
#: runs of it: their first wave carries chunks, not one item a task (a no-op 1,000-item run spent
#: a Ray round trip on single-item probes before its first chunk). A worker or a service runs the
#: same workflow again and again; Dask's scheduler keeps a task prefix's duration across graphs
#: the same way. A stale guess costs one wave of chunks too long (the lane's tasks in flight), never a
#: result: the run's own first items back re-size the rest.
REMEMBER_S = 60.0
#: Steps remembered at most (a service that builds workflows on the fly makes new functions).
REMEMBER_STEPS = 512
_item_seconds: dict[Any, tuple[float, float]] = {}  # step's function -> (an item's mean seconds, when)
_item_lock = threading.Lock()


def remember_item_seconds(spec: StepSpec, mean: float) -> None:
    now = time.monotonic()
    with _item_lock:
        _item_seconds[spec.fn] = (mean, now)
        if len(_item_seconds) > REMEMBER_STEPS:  # the stale go first, then the oldest
            for fn in [fn for fn, (_, when) in _item_seconds.items() if now - when > REMEMBER_S]:
                del _item_seconds[fn]
            while len(_item_seconds) > REMEMBER_STEPS:
                del _item_seconds[min(_item_seconds, key=lambda fn: _item_seconds[fn][1])]


def remembered_item_seconds(spec: StepSpec) -> float | None:
    """An item of ``spec``'s function's mean seconds, measured by a run of this process at most
    ``REMEMBER_S`` ago (None: not measured, or too long ago)."""
    with _item_lock:
        seen = _item_seconds.get(spec.fn)
    if seen is None or time.monotonic() - seen[1] > REMEMBER_S:
        return None
    return seen[0]


@dataclass(eq=False, slots=True)
class Chunk:
    """A task carrying items of a block: which, and how many of them are still wanted."""

    block: ItemBlock
    positions: list[int]
    live: int
    ref: Any = None


def uncancelled(back: ItemsDone) -> ItemsDone | None:
    """``back`` without the items cancelled since they were sent (None: nothing is left)."""
    cancelled = back.block.cancelled
    if not cancelled:
        return back
    kept = [i for i, p in enumerate(back.positions) if p not in cancelled]
    if not kept:
        return None
    outcomes = back.outcomes
    positions = [back.positions[i] for i in kept]
    if isinstance(outcomes, AllSucceeded):
        return ItemsDone(back.block, positions, outcomes.only(kept))
    return ItemsDone(back.block, positions, [outcomes[i] for i in kept])


#: Seconds a process's executors reuse the cluster's CPU count (it sizes their lanes): reading it
#: is a request to Ray's GCS, 0.4-0.8 ms of each run's start here; a node that joined is counted
#: by the runs that start this long after. Whether a step's request fits a node is not read from
#: here (``resources.Feasibility`` reads the nodes themselves).
CPUS_FRESH_S = 5.0
_cpus_seen: dict[str, tuple[float, int]] = {}  # Ray job -> (when read, CPUs); a new job reads again
_cpus_lock = threading.Lock()


def cluster_cpus(ray: Any) -> int:
    """The connected cluster's CPUs (at least 1), as Ray counted them at most ``CPUS_FRESH_S`` ago."""
    job = str(ray.get_runtime_context().get_job_id())
    now = time.monotonic()
    with _cpus_lock:
        seen = _cpus_seen.get(job)
        if seen is not None and now - seen[0] <= CPUS_FRESH_S:
            return seen[1]
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    with _cpus_lock:
        _cpus_seen.clear()  # one job per process at a time: an earlier Ray session's count goes
        _cpus_seen[job] = (now, cpus)
    return cpus


def task_results(ray: Any, refs: list[Any]) -> list[Any]:
    """Each task's value: packed outcomes (``bytes``), or one failure for every call it carried
    (why ``StuckWatch`` cancelled it, if it did)."""
    started = time.time()
    try:
        values: list[Any] = ray.get(refs)
        return values
    except Exception:  # some task failed: take them one by one
        pass
    out: list[Any] = []
    for ref in refs:
        try:
            out.append(ray.get(ref))
        except Exception as exc:  # the worker died or the task was cancelled: not the step's own error
            with _refused_lock:
                why: Exception = _refused.pop(ref, exc)
            if isinstance(cause := getattr(why, "cause", None), StepCodeMissing):
                why = cause  # its own message, not Ray's wrapper holding the worker's traceback
            out.append(NodeOutcome.failure(why, transient=True, started_at=started))
    return out


#: Tasks ``StuckWatch`` cancelled, and why (read by ``task_results``); at most ``_REFUSED_KEPT``
#: (a task cancelled by the executor too is never read back).
_refused: dict[Any, InfeasibleResourcesError] = {}
_refused_lock = threading.Lock()
_REFUSED_KEPT = 4096


class StuckWatch:
    """Tasks with a resource request in flight, looked at every ``Feasibility.REFRESH_S`` by a
    daemon thread (only while there are some).

    A task whose request no alive node can hold any more (the only node offering it left the
    cluster, and did not come back within ``Feasibility.LEFT_GRACE_S``) waits in Ray's queue for
    ever: a long-lived driver (a worker, a launched job) kept the run ``running`` with nothing to
    show for it. Such a task is cancelled, and reported
    (``task_results``) as an ``InfeasibleResourcesError``, transient: it may have started on the
    node that left, so the driver retries it under the same key, and the retry is refused at
    submit, permanently, naming the step (``TaskSubmitter.refusal``). A task running on an alive
    node is never cancelled: that node holds its request.
    """

    def __init__(self, feasible: Feasibility) -> None:
        self._feasible = feasible
        self._refs: dict[Any, StepSpec] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, ref: Any, spec: StepSpec) -> None:
        with self._lock:
            self._refs[ref] = spec
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="raysaga-resource-watch", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self._feasible.REFRESH_S)  # a timer: the nodes are read again at most this often
            try:
                self.look()
            except Exception:  # Ray shut down under it: nothing left to watch (else a hiccup: look again)
                if not self._feasible.ray.is_initialized():
                    with self._lock:
                        self._refs.clear()
            with self._lock:
                if not self._refs:
                    self._thread = None
                    return

    def look(self) -> int:
        """Forget the tasks that ended; cancel those no alive node can hold now. Returns how many."""
        ray = self._feasible.ray
        with self._lock:
            watched = list(self._refs.items())
        if not watched:
            return 0
        ended, _ = ray.wait([ref for ref, _ in watched], num_returns=len(watched), timeout=0)
        gone = set(ended)
        cancelled = 0
        for ref, spec in watched:
            if ref in gone:
                continue
            assert spec.resources is not None
            problem = self._feasible.problem(spec.name, spec.resources)
            if problem is None:
                continue
            gone.add(ref)
            with _refused_lock:
                if len(_refused) >= _REFUSED_KEPT:
                    _refused.pop(next(iter(_refused)))
                _refused[ref] = InfeasibleResourcesError(f"{problem} (its attempt waited in Ray's queue: cancelled)")
            with contextlib.suppress(Exception):  # it ended meanwhile
                ray.cancel(ref, force=True)
            cancelled += 1
        with self._lock:
            for ref in gone:
                self._refs.pop(ref, None)
        return cancelled


@functools.cache
def remote_run_packed() -> Any:
    """One Ray remote function per process, exported to the cluster once per Ray job (3.4 ms at
    the first run of a process here; no export at the next runs: measured 2026-11-30 by patching
    Ray's ``FunctionActorManager.export``); Ray exports it by itself to a new job or cluster."""
    import ray

    return ray.remote(max_retries=0, retry_exceptions=False)(run_packed)


class TaskSubmitter:
    """Submits ``run_packed`` tasks, named, with a step's resources."""

    def __init__(self, remote: Any) -> None:
        self.remote = remote
        self._watch: StuckWatch | None = None  # made at the first request checked (``refusal``)
        self._runtime_env: str | None = None
        self._options: dict[int, tuple[StepSpec, dict[str, Any] | None]] = {}  # id(spec) -> (spec, options)

    def _entry(self, spec: StepSpec) -> tuple[StepSpec, dict[str, Any] | None]:
        entry = self._options.get(id(spec))
        if entry is None or entry[0] is not spec:
            if len(self._options) >= CACHE_LIMIT:  # a tool call's spec is new at every call
                self._options.clear()
            entry = self._options[id(spec)] = (spec, self._validated(spec))
        return entry

    def refusal(self, spec: StepSpec, feasible: Feasibility) -> RaySagaError | None:
        """Why the step's resource request can never run, or None: Ray's own checks of its task
        options refuse it, or no node of the cluster can ever hold it (``Feasibility``). Asked before
        an attempt is queued, to fail it permanently: raised at submit, Ray's ``ValueError`` crashed
        the driver once the run's row was made, and every resume crashed the same way."""
        if spec.resources is None:
            return None
        try:
            self._entry(spec)
        except (ValueError, TypeError) as exc:
            asked = spec.resources.describe()
            return InvalidOptionError(f"step {spec.name!r}: Ray refuses its resource request ({asked}): {exc}")
        if self._watch is None:
            self._watch = StuckWatch(feasible)
        problem = feasible.problem(spec.name, spec.resources)
        return None if problem is None else InfeasibleResourcesError(problem)

    def submit(self, spec: StepSpec, name: str, payload: bytes) -> Any:
        options = self._entry(spec)[1]
        if options is None:  # a Ray without the internals below: the public way, every time
            extra = spec.resources.ray_options() if spec.resources is not None else {}
            ref = self.remote.options(name=name, **extra).remote(payload)
        else:
            ref = self.remote._remote(args=(payload,), kwargs={}, serialized_runtime_env_info=self._runtime_env,
                                      **options, name=name)
        if spec.resources is not None and self._watch is not None:
            self._watch.add(ref, spec)  # a request a node that leaves held may never be scheduled
        return ref

    def _validated(self, spec: StepSpec) -> dict[str, Any] | None:
        """The step's task options as ``.options`` merges and checks them (None: not reachable)."""
        defaults: dict[str, Any] | None
        try:
            import ray.remote_function

            # the merge ``.options`` does, from the module it imports (its place moved across Ray versions)
            update_options = getattr(ray.remote_function, "ray_option_utils").update_options  # noqa: B009
            defaults = dict(self.remote._default_options)
            self._runtime_env = self.remote._serialized_base_runtime_env_info
            self.remote._remote  # noqa: B018 - present
        except (ImportError, AttributeError):
            defaults = None
        extra = spec.resources.ray_options() if spec.resources is not None else {}
        self.remote.options(name=spec.name, **extra)  # Ray's own checks, once per step (ValueError: ``refusal``)
        if defaults is None:
            return None
        defaults.pop("max_calls", None)
        options: dict[str, Any] = update_options(defaults, extra)
        options.pop("name", None)
        return options

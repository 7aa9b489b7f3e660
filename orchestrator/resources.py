"""Per-step resource requests (``@wf.step(num_cpus=..., num_gpus=..., memory=..., resources={...})``).

A request is checked when the step is declared (``resource_request``: numbers >= 0, known names,
Ray's "above 1 only whole units" and "no fraction below 0.0001" rules) and again when an attempt is
submitted, against the nodes of the cluster (``Feasibility``): a request no single alive node can
ever hold (``num_gpus=1`` on a cluster without GPUs) fails the node permanently with
``InfeasibleResourcesError`` naming the step, the request and what the cluster has, instead of
waiting forever in Ray's queue; one Ray's own option checks refuse fails it permanently too.

Requests are placement, not contract: they are left out of the workflow's definition hash, so
moving a step to a GPU node, or giving it more memory, does not stop a run started before from
resuming (see docs/execution.md).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from raysaga.errors import WorkflowDefinitionError

#: Ray's predefined resources: requested through their own keyword, never through ``resources=``.
RESERVED = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory", "object_store_memory": "memory"}


@dataclass(frozen=True)
class ResourceRequest:
    """What one attempt of a step asks Ray for. ``None`` fields are Ray's defaults (1 CPU, nothing else)."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    memory: int | None = None
    """Bytes of heap memory (Ray's ``memory``): a scheduling reservation, not a limit Ray enforces."""
    custom: tuple[tuple[str, float], ...] = ()

    def ray_options(self) -> dict[str, Any]:
        """Keyword arguments for ``remote_function.options``."""
        out: dict[str, Any] = {}
        if self.num_cpus is not None:
            out["num_cpus"] = self.num_cpus
        if self.num_gpus is not None:
            out["num_gpus"] = self.num_gpus
        if self.memory is not None:
            out["memory"] = self.memory
        if self.custom:
            out["resources"] = dict(self.custom)
        return out

    def demand(self) -> dict[str, float]:
        """The request in the units of ``ray.nodes()[i]["Resources"]`` (CPU defaults to 1)."""
        out = {"CPU": 1.0 if self.num_cpus is None else float(self.num_cpus)}
        if self.num_gpus:
            out["GPU"] = float(self.num_gpus)
        if self.memory:
            out["memory"] = float(self.memory)
        out.update(self.custom)
        return {k: v for k, v in out.items() if v > 0}

    def describe(self) -> str:
        parts = [f"{k}={amount(k, v)}" for k, v in self.ray_options().items() if k != "resources"]
        parts += [f"{k}={v:g}" for k, v in self.custom]
        return ", ".join(parts) or "nothing"


def amount(name: str, value: float) -> str:
    """A resource amount as a person reads it: memory in GiB or MiB (``memory=1.09951e+13`` was
    10 TiB in bytes), the others as numbers."""
    if name not in ("memory", "object_store_memory") or value < 1024**2:
        return f"{value:g}"
    unit, scale = next((u, f) for u, f in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2)) if value >= f)
    return f"{value / scale:.4g} {unit}"


#: Ray keeps resource amounts in units of 1/10,000: a fraction below one unit it refuses.
RAY_UNITS = 10_000


def _quantity(step: str, name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise WorkflowDefinitionError(f"step {step!r}: {name} must be a finite number >= 0, got {value!r}")
    if value > 0 and value * RAY_UNITS < 1:  # Ray's own test; it refused it at the first submit, after the run began
        raise WorkflowDefinitionError(
            f"step {step!r}: {name}={value!r} is finer than Ray counts resources (units of {1 / RAY_UNITS:g}): "
            f"use 0 to ask for none, or at least {1 / RAY_UNITS:g}")
    if value > 1 and value != int(value):
        raise WorkflowDefinitionError(
            f"step {step!r}: {name}={value!r}: above 1, Ray only grants whole units (use {math.ceil(value)} "
            "or a fraction <= 1)")
    return float(value)


def resource_request(step: str, *, num_cpus: Any = None, num_gpus: Any = None, memory: Any = None,
                     resources: Any = None) -> ResourceRequest | None:
    """Validate a step's resource options; None when it asks for nothing (Ray's default: 1 CPU)."""
    cpus = None if num_cpus is None else _quantity(step, "num_cpus", num_cpus)
    gpus = None if num_gpus is None else _quantity(step, "num_gpus", num_gpus)
    mem = None
    if memory is not None:
        if isinstance(memory, bool) or not isinstance(memory, int | float) or not math.isfinite(memory) \
                or memory < 0:
            raise WorkflowDefinitionError(f"step {step!r}: memory must be a number of bytes >= 0, got {memory!r}")
        if memory != int(memory):  # a fraction of a byte is a unit slip (GiB meant): int() made 1.5 one byte
            raise WorkflowDefinitionError(f"step {step!r}: memory is in bytes, got {memory!r}: write a whole number "
                                          f"of bytes (memory={memory!r} * 1024**3 for {memory!r} GiB)")
        mem = int(memory)
    custom: list[tuple[str, float]] = []
    if resources is not None:
        if not isinstance(resources, Mapping):
            raise WorkflowDefinitionError(
                f"step {step!r}: resources= must be a dict of custom resource names to amounts, got {resources!r}")
        for key, value in resources.items():
            if not isinstance(key, str) or not key.strip():
                raise WorkflowDefinitionError(f"step {step!r}: resource names must be non-empty strings, got {key!r}")
            if key in RESERVED:
                raise WorkflowDefinitionError(
                    f"step {step!r}: resources={{{key!r}: ...}}: use {RESERVED[key]}= for Ray's {key} resource")
            custom.append((key, _quantity(step, f"resources[{key!r}]", value)))
    if cpus is None and gpus is None and mem is None and not custom:
        return None
    return ResourceRequest(num_cpus=cpus, num_gpus=gpus, memory=mem, custom=tuple(sorted(custom)))


@dataclass
class Feasibility:
    """Whether some alive node of the cluster can ever hold a request.

    Reads Ray's nodes at the first request and again once the read is ``REFRESH_S`` old, when next
    asked: a node that joined since is seen, and so is one that left. What it said of a request
    holds only as long as that read: a "feasible" kept for the process's life sent a long-lived
    driver's (a worker's) attempts to wait in Ray's queue for ever once the only node offering
    the resource was gone. A request asked about within ``REFRESH_S`` costs a dict lookup (a wide
    fan-out asks once per submit). An autoscaling cluster that would start a matching node on
    demand is not known here: it would be refused.

    A request only a node that left could hold (one this process saw alive) is not refused at once:
    a node restarting under its supervisor comes back, and its run went on before (its attempt
    waited in Ray's queue). It is refused once no such node came back for ``LEFT_GRACE_S``.
    """

    ray: Any
    REFRESH_S: float = 5.0
    LEFT_GRACE_S: float = 120.0
    _nodes: list[dict[str, float]] | None = None
    _read_at: float = 0.0
    _known: dict[ResourceRequest, bool] = field(default_factory=dict)
    _alive: dict[str, dict[str, float]] = field(default_factory=dict)  # node id -> resources, last read
    _left: dict[str, dict[str, float]] = field(default_factory=dict)  # nodes seen alive, not alive now
    _waiting_since: dict[ResourceRequest, float] = field(default_factory=dict)  # held only by nodes that left
    _lock: threading.Lock = field(default_factory=threading.Lock)
    """The submitting thread and the watch on attempts in flight (``ray_lanes.StuckWatch``) both ask."""

    def _read(self) -> None:
        alive = {str(n.get("NodeID") or i): dict(n.get("Resources") or {})
                 for i, n in enumerate(self.ray.nodes()) if n.get("Alive")}
        for node_id, resources in self._alive.items():
            if node_id not in alive:
                self._left[node_id] = resources
        for node_id in alive:
            self._left.pop(node_id, None)
        self._alive = alive
        self._nodes = list(alive.values())
        # a node holding a request is back: its next departure has a grace of its own
        self._waiting_since = {r: t for r, t in self._waiting_since.items() if not self._fits(r.demand())}
        self._read_at = time.monotonic()
        self._known.clear()  # said of the nodes read before

    def _fits(self, demand: dict[str, float], nodes: Iterable[dict[str, float]] | None = None) -> bool:
        return any(all(node.get(k, 0.0) >= v for k, v in demand.items())
                   for node in ((self._nodes or []) if nodes is None else nodes))

    def problem(self, step: str, request: ResourceRequest) -> str | None:
        """None if some node can hold ``request`` (or one that could left less than
        ``LEFT_GRACE_S`` ago, and may come back), else why not (for ``InfeasibleResourcesError``)."""
        with self._lock:
            if self._nodes is None or time.monotonic() - self._read_at > self.REFRESH_S:
                self._read()
            fits = self._known.get(request)
            if fits is None:
                fits = self._known[request] = self._fits(request.demand())
            if fits:
                self._waiting_since.pop(request, None)
                return None
            demand = request.demand()
            left = ""
            if self._fits(demand, self._left.values()):
                since = self._waiting_since.setdefault(request, time.monotonic())
                waited = time.monotonic() - since
                if waited < self.LEFT_GRACE_S:
                    return None  # its node may be restarting: the attempt waits in Ray's queue
                left = (f" (the node that offered it left the cluster and did not come back in {waited:.0f}s: "
                        "raysaga waits Feasibility.LEFT_GRACE_S for a restart)")
            asked = request.describe()
            if request.num_cpus is None and self._fits({k: v for k, v in demand.items() if k != "CPU"}):
                asked = f"CPU=1 (Ray's default: set num_cpus=0 to ask for none), {asked}"
            return (f"step {step!r} asks for {asked}, which no node of the Ray cluster can ever "
                    f"hold: its nodes have {self._describe_nodes(demand)}{left}. Add a node with those "
                    "resources (`ray start --address ... --num-gpus N / --resources '{\"name\": N}'`) "
                    "or lower the step's request")

    def _describe_nodes(self, demand: dict[str, float]) -> str:
        if not self._nodes:
            return "nothing (no alive node)"
        shown = []
        for node in self._nodes:
            names = sorted(set(demand) | ({"CPU", "GPU"} & set(node)) | {"CPU"})
            shown.append("{" + ", ".join(f"{k}: {amount(k, node.get(k, 0.0))}" for k in names) + "}")
        return "; ".join(shown[:8]) + (f"; ... ({len(shown)} nodes)" if len(shown) > 8 else "")


#: The step options that say where an attempt runs (``@wf.step`` / ``@wf.map``; ``local`` on ``@wf.step`` only).
PLACEMENT_OPTIONS = ("io_bound", "num_cpus", "num_gpus", "memory", "resources", "local")


def placement(step: str, *, io_bound: Any = None, num_cpus: Any = None, num_gpus: Any = None, memory: Any = None,
              resources: Any = None, local: tuple[Any, float | None, str | None] = (False, None, None),
              ) -> tuple[bool | None, ResourceRequest | None, bool]:
    """A step's ``io_bound`` flag, resource request and ``local`` flag (given with the step's
    ``timeout`` and ``map_over``, which it cannot go with), validated (``WorkflowDefinitionError``
    naming the step)."""
    if io_bound is not None and not isinstance(io_bound, bool):
        raise WorkflowDefinitionError(f"step {step!r}: io_bound must be True or False, got {io_bound!r}")
    request = resource_request(step, num_cpus=num_cpus, num_gpus=num_gpus, memory=memory, resources=resources)
    if io_bound and request is not None:
        raise WorkflowDefinitionError(
            f"step {step!r}: io_bound=True runs it in a thread of the shared I/O pool, which reserves no "
            f"resources, so it cannot also ask for {request.describe()}: drop io_bound, or the resources")
    flag, timeout, map_over = local
    return io_bound, request, check_local(step, flag, io_bound=io_bound, request=request, timeout=timeout,
                                          map_over=map_over)


def check_local(step: str, local: Any, *, io_bound: bool | None, request: ResourceRequest | None,
                timeout: float | None, map_over: str | None) -> bool:
    """A step's ``local=`` flag (``local_steps``), checked against the options it cannot go with."""
    if not isinstance(local, bool):
        raise WorkflowDefinitionError(f"step {step!r}: local= takes True or False, got {local!r}")
    if not local:
        return False
    clash = ("io_bound=True, which runs it in the I/O pool" if io_bound else
             f"{request.describe()}, which only a Ray task can hold" if request is not None else
             f"timeout={timeout:g}, which nothing can enforce on the driver's own thread" if timeout is not None else
             f"map_over={map_over!r}: a fan-out's items run on Ray, in chunks" if map_over is not None else None)
    if clash is not None:
        raise WorkflowDefinitionError(
            f"step {step!r}: local=True runs it in the driver's process, so it cannot also take {clash}: "
            "drop local=True, or that option")
    return True


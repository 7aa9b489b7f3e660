"""What crosses between the driver and a Ray worker: one ``bytes`` each way.

Ray serialises a task's arguments and result one object at a time through its own
serialisation context (it looks for nested ``ObjectRef``\\ s, keeps out-of-band buffers). For a
dataclass argument that costs ~0.2 ms a side, measured, more than the step itself when the step
is cheap: a 200-node chain paid ~0.3-0.5 ms a node for it. A ``bytes`` object crosses as-is. So the
driver packs a call into plain tuples and pickles it once (``pack_calls``), the worker unpacks
it (``run_packed``) and packs its outcomes the same way: a block's items that all succeeded
as three columns (outputs, start and end times), not a tuple each.

The step's spec (its function, retry policy, ...) is pickled once per spec on the driver (with
Ray's cloudpickle, so ``register_pickle_by_value`` is honoured) and travels with every task,
~0.5 KB; a worker unpickles each distinct spec once and keeps it by digest. Nothing here is
stored: the store holds JSON only.
"""

from __future__ import annotations

import hashlib
import pickle  # noqa: TID251 - in transit between the driver and its Ray workers, never at rest
from typing import Any

from raysaga.errors import Transient
from raysaga.orchestrator.item_block import ItemBlock, ItemOutcomes
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import AllSucceeded, ContextFields, NodeCall, NodeOutcome, execute, execute_items

#: Specs kept per process, both sides. A tool call makes a new spec object per call (same
#: bytes, same digest), so the driver's table is keyed by object and emptied when full.
CACHE_LIMIT = 512

_PROTOCOL = pickle.HIGHEST_PROTOCOL

PackedCall = tuple[ContextFields, dict[str, Any], int, bool]
PackedOutcome = tuple[bool, str | None, dict[str, Any] | None, bool, float, float, Any]


class SpecPacker:
    """The driver's half: each spec pickled once, with a digest the workers cache it under."""

    def __init__(self) -> None:
        self._packed: dict[int, tuple[StepSpec, str, bytes]] = {}  # id(spec) -> (spec kept alive, digest, bytes)

    def pack_calls(self, spec: StepSpec, calls: list[NodeCall]) -> bytes:
        digest, data = self._spec_bytes(spec)
        return pickle.dumps((digest, data, [pack_call(c) for c in calls]), protocol=_PROTOCOL)

    def _spec_bytes(self, spec: StepSpec) -> tuple[str, bytes]:
        entry = self._packed.get(id(spec))
        if entry is None or entry[0] is not spec:
            from ray import cloudpickle  # Ray's: honours register_pickle_by_value, pickles closures

            data: bytes = cloudpickle.dumps(spec)  # type: ignore[no-untyped-call]
            if len(self._packed) >= CACHE_LIMIT:
                self._packed.clear()
            entry = self._packed[id(spec)] = (spec, hashlib.blake2b(data, digest_size=16).hexdigest(), data)
        return entry[1], entry[2]

    def pack_items(self, block: ItemBlock, positions: list[int]) -> bytes:
        """Items of a block (``item_block``) as one task's payload: what they share once, then
        each item's index, attempt and inputs; the worker makes their calls (``run_packed``)."""
        spec, keys, attempts, kwargs = block.spec, block.keys, block.attempts, block.kwargs
        digest, data = self._spec_bytes(spec)
        head = (block.run_id, spec.name, block.trace_id, block.max_output_bytes)
        rows = [(keys[p].fan_index, attempts[p], kwargs[p]) for p in positions]
        return pickle.dumps((digest, data, head, rows), protocol=_PROTOCOL)


def pack_call(call: NodeCall) -> PackedCall:
    return (call.fields, call.kwargs, call.max_output_bytes, call.reconcile)


def unpack_call(packed: PackedCall) -> NodeCall:
    fields, kwargs, max_bytes, reconcile = packed
    return NodeCall(fields=fields, kwargs=kwargs, max_output_bytes=max_bytes, reconcile=reconcile)


def pack_outcome(o: NodeOutcome) -> PackedOutcome:
    return (o.ok, o.output_json, o.error, o.transient, o.started_at, o.finished_at, o.aside)


def unpack_outcomes(data: bytes) -> list[NodeOutcome]:
    """The driver's reading of a task's result: one outcome per call it carried."""
    outcomes = unpack_items(data)
    return outcomes.outcomes() if isinstance(outcomes, AllSucceeded) else outcomes


def unpack_items(data: bytes) -> ItemOutcomes:
    """``unpack_outcomes`` that keeps the columns of a block's items that all succeeded as they came."""
    packed = pickle.loads(data)
    if type(packed) is tuple:  # (texts, started, finished): ``run_packed``'s columns
        return AllSucceeded(*packed)
    return list(map(NodeOutcome._make, packed))  # packed in the named tuple's field order


# ---------------------------------------------------------------- the worker's half

_specs: dict[str, StepSpec] = {}


class StepCodeMissing(Transient):
    """The worker cannot load a step's code (its workflow's module, or one it imports, is not
    importable on this node). Transient, as a dead worker is (another node may have it, or a
    deploy may ship it), with a message saying so and how to ship the code: Ray's own wrapper
    recorded the whole traceback through this module and cloudpickle, naming neither."""


def _spec(digest: str, data: bytes) -> StepSpec:
    spec = _specs.get(digest)
    if spec is None:
        try:
            spec = pickle.loads(data)
        except (ImportError, AttributeError) as exc:  # AttributeError: a module without the function
            raise StepCodeMissing(
                f"this Ray worker cannot load the step's code ({type(exc).__name__}: {exc}): the workflow's "
                "module, and what it imports, must be importable on every node: ship it with the job "
                "(`raysaga launch` uploads its folder; runtime_env working_dir / py_modules: docs/cluster.md) "
                "or install it there") from None
        if len(_specs) >= CACHE_LIMIT:
            _specs.clear()
        _specs[digest] = spec
    return spec


def run_packed(payload: bytes) -> bytes:
    """The Ray task body: run each packed call of one step in order, each classified on its own.

    A spec the worker cannot unpickle (the workflow's module is not importable there) raises:
    Ray reports the task failed, and the driver classifies that as transient, like a dead worker.
    """
    digest, data, *carried = pickle.loads(payload)
    spec = _spec(digest, data)
    if len(carried) == 2:  # a block's items (``pack_items``): their calls are made here, if needed
        (run_id, step, trace_id, max_bytes), rows = carried

        def call(index: int, attempt: int, kwargs: dict[str, Any]) -> NodeCall:
            return NodeCall(fields=(run_id, step, index, attempt, trace_id, None, False), kwargs=kwargs,
                            max_output_bytes=max_bytes)

        done = execute_items(spec, rows, max_bytes, call)
        if isinstance(done, AllSucceeded):
            return pickle.dumps((done.texts, done.started, done.finished), protocol=_PROTOCOL)
        return pickle.dumps([tuple(o) for o in done], protocol=_PROTOCOL)
    # an outcome's plain tuple is ``pack_outcome``'s (the named tuple's fields, in order)
    return pickle.dumps([tuple(execute(spec, unpack_call(c), on_worker=True)) for c in carried[0]],
                        protocol=_PROTOCOL)

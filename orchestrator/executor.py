"""Where node attempts run: Ray tasks, or inline in the driver (for cheap steps and unit tests).

Ray's own retries are off (``max_retries=0``): a task whose worker died must not be re-run
behind the ledger's back. The driver sees the failure, classifies it transient and retries
with the same idempotency key.
"""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from collections import deque
from collections.abc import Collection
from typing import Any

from raysaga.errors import UserError
from raysaga.orchestrator import ray_start
from raysaga.orchestrator.executor_base import CANCELLED, Executor, Handle, InlineExecutor, items_task_name, task_name
from raysaga.orchestrator.io_pool import IoPool, io_concurrency_limit, shared_pool
from raysaga.orchestrator.item_block import ItemBlock, ItemOutcomes, ItemsDone
from raysaga.orchestrator.keys import is_compensation
from raysaga.orchestrator.local_steps import LocalSteps
from raysaga.orchestrator.ray_address import same_cluster
from raysaga.orchestrator.ray_lanes import (
    Chunk,
    Lane,
    TaskSubmitter,
    cluster_cpus,
    remembered_item_seconds,
    remote_run_packed,
    task_results,
    uncancelled,
)
from raysaga.orchestrator.resources import Feasibility
from raysaga.orchestrator.spec import StepSpec
from raysaga.orchestrator.task import NodeCall, NodeOutcome
from raysaga.orchestrator.wire import SpecPacker, unpack_items, unpack_outcomes

__all__ = ["Executor", "Handle", "InlineExecutor", "RayExecutor", "make_executor", "task_name"]


class RayExecutor(Executor):
    """Each attempt is a Ray task named ``<run_id>:<node>`` (readable in Ray's dashboard).

    Fan-out items (of a ``map_over`` step without ``timeout=``) go through a lane per step: at
    most ``LANE_TASKS_PER_CPU`` tasks per cluster CPU in flight, and once items are measured to be
    short, several per task (``<run_id>:<step>[i..j]``), sized so a chunk runs ~``CHUNK_SECONDS``.
    A Ray task costs ~0.4 ms of cluster CPU, more than a cheap item; a slow item keeps a task of
    its own, so a failure or a cancel is seen as soon as that item's own attempt ends. What a task
    carries, either way, is one packed ``bytes`` (see ``wire``). An effect step's items go one a
    task, at most as many as the cluster runs at once: those still in the lane when the run stops
    were never sent, and are not compensated (sent all at once, each was "handed to Ray": a failed
    20-item fan-out refunded 19 charges never made).

    An attempt with a timeout waits in the driver for a CPU (at most one such task per cluster
    CPU in flight): its timeout starts when it is sent, not while it would sit in Ray's queue.
    Counted from dispatch, the last wave of a wide fan-out timed out having run for an instant.

    An I/O-bound attempt (``io_bound=True``; by default an agent's model and tool calls) runs in
    a thread of the I/O pool (``io_pool``: zero-CPU threaded actors), at most ``io_concurrency``
    at once (``RAYSAGA_IO_CONCURRENCY``, default 64); beyond that, one more wave waits in the
    actors' queues (so a thread that frees starts the next call at once) and the rest here. A step's resource
    request (``num_cpus``, ``num_gpus``, ``memory``, ``resources``) goes with its tasks, and one no
    node can ever hold fails the attempt permanently (``resources``). A ``local=True`` step runs
    in this process at the next ``wait`` (``local_steps``). See docs/execution.md.
    """

    name = "ray"
    CHUNK_SECONDS = 0.01
    MAX_CHUNK = 64
    LANE_TASKS_PER_CPU = 4
    #: I/O-bound attempts without a timeout in flight, per thread of the pool (``_io_ready``).
    IO_AHEAD = 2
    #: ``ray.wait`` looks at the oldest this-many tasks in flight (bounds its O(n) cost per call).
    WAIT_WINDOW = 1024
    #: Seconds between looks while an I/O call with a timeout waits for a pool actor to start.
    STARTING_POLL = 0.02

    def __init__(self, address: str | None = None, num_cpus: int | None = None, *,
                 io_concurrency: int | None = None) -> None:
        io_limit = io_concurrency_limit(io_concurrency)  # a bad value is refused before Ray starts
        self._ray = ray = ray_start.imported()
        with ray_start.LOCK:  # runs in threads start Ray once, and share it (``ray_start``)
            if not ray.is_initialized():
                ray_start.start_ray(ray, address or os.environ.get("RAY_ADDRESS") or None, num_cpus)
            elif address and not same_cluster(address, ray.get_runtime_context().gcs_address,
                                               ray.util.get_node_ip_address()):
                # one process joins one cluster: running on another than the one asked for would be silent
                raise UserError(f"this process is already connected to the Ray cluster at "
                                f"{ray.get_runtime_context().gcs_address}, not {address}: drive runs on {address} "
                                "from another process, or drop --address")
            self._started_here = ray_start.join(ray)  # a Ray raysaga started: the last executor shuts it down
        try:
            self._setup(io_limit)
        except BaseException:
            self.shutdown()
            raise

    def _setup(self, io_limit: int) -> None:
        ray = self._ray
        self._tasks = TaskSubmitter(remote_run_packed())
        self._packer = SpecPacker()
        cpus = cluster_cpus(ray)
        self._lane_tasks = self.effect_window = self.LANE_TASKS_PER_CPU * cpus  # (an effect lane's bound too)
        self._cpus = cpus
        self._inflight: dict[Any, tuple[list[Handle] | Chunk, Lane | None]] = {}  # task ref -> its attempts, lane
        self._items_done: list[ItemsDone] = []  # blocks' items back, not taken yet (``take_items``)
        self._lanes: dict[str, Lane] = {}  # fan-out step -> its lane
        self._timed = Lane(limit=max(1, cpus), chunked=False)
        self._finished: dict[Handle, None] = {}  # outcome set, not returned yet (an ordered set)
        self._cancelled: dict[Any, None] = {}  # refs cancelled, not yet seen to end (an ordered set)
        self._recancel_at = 0.0
        self._io_held = False  # an I/O call with a timeout waits for a pool actor to start (_io_ready)
        self._io = Lane(limit=io_limit, chunked=False)  # I/O-bound attempts, queued for the pool
        self._pool: IoPool | None = None  # this process's, taken at the first I/O-bound attempt
        self._feasible = Feasibility(ray)
        self._local = LocalSteps()  # ``local=True`` attempts, run at the next wait

    @property
    def io_pool(self) -> IoPool:
        """The threaded actors I/O-bound attempts run in (``raysaga.orchestrator.io_pool``)."""
        if self._pool is None:
            self._pool = shared_pool(self._ray, self._io.limit)
        return self._pool

    @staticmethod
    def is_io_bound(spec: StepSpec, call: NodeCall) -> bool:
        """Declared ``io_bound``, or by default an agent's model or tool call (``step@turn[.k]``)."""
        if spec.io_bound is not None:
            return spec.io_bound
        node_id = call.node_id
        return "@" in node_id and not is_compensation(node_id)

    def submit(self, spec: StepSpec, call: NodeCall) -> Handle:
        handle = Handle(key=(call.node_id, call.fan_index))
        if spec.local:
            self._local.add(handle, call, spec)
            return handle
        if spec.resources is not None and (refused := self._tasks.refusal(spec, self._feasible)) is not None:
            # it would wait in Ray's queue forever, or Ray refuses it: fail it, permanently
            handle.outcome, handle.sent = NodeOutcome.failure(refused, transient=False, started_at=time.time()), True
            self._finished[handle] = None
            return handle
        lane = self._lane_for(spec, call)
        if lane is None:
            self._send(spec, [(handle, call)], None)
            return handle
        lane.queue.append((handle, call, spec))  # sent by _pump, at the next wait
        return handle

    def _lane_for(self, spec: StepSpec, call: NodeCall) -> Lane | None:
        """Where an attempt waits to be sent: the I/O pool's, the timed, or its fan-out step's lane
        (None: sent at once)."""
        if self.is_io_bound(spec, call):
            return self._io  # sent while the pool has a free thread: a timeout starts with the call
        if spec.timeout is not None:
            return self._timed
        if call.fan_index >= 0 and spec.map_over is not None and spec.kind == "step":
            lane = self._lanes.get(spec.name)
            if lane is None or lane.spec is not spec:
                lane = self._lanes[spec.name] = (
                    # an effect's items: one a task (each its own ledgered call), a plain lane's bound in
                    # flight (as many as the CPUs ran 1.3-1.8x slower: each refill waited on the driver);
                    # the rest wait here, so a run that stops never sent them, and undoes none of them
                    Lane(limit=self._lane_tasks, chunked=False, spec=spec) if spec.effect else
                    Lane(limit=self._lane_tasks, chunked=True, spec=spec, probes=self._probes(spec),
                         prior=remembered_item_seconds(spec)))
            return lane
        return None

    def _probes(self, spec: StepSpec) -> int:
        """A new fan-out lane's first tasks (one item each): as many as the cluster runs at once, so
        the first measure costs no idle CPU: one per CPU, more for a step asking less than a CPU."""
        cpus = spec.resources.num_cpus if spec.resources is not None else None
        if cpus is None:
            return self._cpus
        if cpus <= 0:  # holds no CPU: Ray runs as many as are sent
            return self._lane_tasks
        return min(self._lane_tasks, max(self._cpus, math.ceil(self._cpus / cpus)))

    def submit_block(self, block: ItemBlock) -> bool:
        spec = block.spec
        lane = self._lane_for(spec, block.call(0)) if len(block) else None
        if lane is None or not lane.chunked or self._tasks.refusal(spec, self._feasible) is not None:
            return False  # another lane, or failed one by one
        lane.blocks.append([block, 0])  # sent by _pump, at the next wait
        return True

    def take_items(self) -> list[ItemsDone]:
        done, self._items_done = self._items_done, []
        return [kept for back in done if (kept := uncancelled(back)) is not None]

    def _all_lanes(self) -> list[Lane]:
        return [*self._lanes.values(), self._timed, self._io]

    def pump(self) -> None:
        self._pump()

    def _pump(self) -> None:
        self._io_held = False
        if self._io.queue:
            ready = self._io_ready()
            if ready:  # every I/O-bound attempt ready now: one actor call per pool actor
                self._send_io(ready)
        for lane in self._all_lanes():
            if lane is self._io:
                continue
            while lane.queue and lane.tasks < lane.room():
                size = min(len(lane.queue), lane.chunk_size(self.CHUNK_SECONDS, self.MAX_CHUNK))
                items = [lane.queue.popleft() for _ in range(size)]
                self._send(items[0][2], [(handle, call) for handle, call, _ in items], lane)
            while lane.blocks and lane.tasks < lane.room():
                self._send_block(lane, lane.chunk_size(self.CHUNK_SECONDS, self.MAX_CHUNK))

    def _io_ready(self) -> list[tuple[Handle, NodeCall, StepSpec]]:
        """The queued I/O-bound attempts to send now, in order: while the pool has a free thread,
        and beyond that one wave ahead (``IO_AHEAD`` x its threads in all) for attempts without a
        timeout: those wait in their actor's queue and start the moment a thread frees, instead of
        after a round trip through this driver (a wave's outcomes read, absorbed, committed).
        Still at most ``io_concurrency`` run at once: the actors' threads bound them. An attempt
        with a timeout is sent only to a free thread, once the pool's actors are up
        (``IoPool.all_started``): its timeout starts when it is sent, and counts no actor's start."""
        pool, queue = self.io_pool, self._io.queue
        live = pool.concurrency - pool.room()
        ready = []
        while queue:
            untimed = queue[0][2].timeout is None
            if live >= (pool.concurrency * self.IO_AHEAD if untimed else pool.concurrency):
                break
            if not untimed and not pool.all_started(live + 1):
                self._io_held = True  # its timeout starts when it runs, not while an actor starts
                break
            ready.append(queue.popleft())
            live += 1
        return ready

    def _send(self, spec: StepSpec, items: list[tuple[Handle, NodeCall]], lane: Lane | None) -> None:
        if len(items) == 1:
            name = task_name(items[0][1])
        else:
            first, last = items[0][1].fields, items[-1][1].fields
            name = items_task_name(first[0], first[1], first[2], last[2])
        payload = self._packer.pack_calls(spec, [call for _, call in items])
        ref = self._tasks.submit(spec, name, payload)
        handles = [handle for handle, _ in items]
        for handle in handles:
            handle.ref = ref
            handle.sent = True
        self._inflight[ref] = (handles, lane)
        if lane is not None:
            lane.tasks += 1

    def _send_block(self, lane: Lane, size: int) -> None:
        """The next ``size`` items of the lane's first block as one task (cancelled ones skipped)."""
        entry = lane.blocks[0]
        block, start = entry
        end = min(len(block), start + size)
        positions = list(range(start, end))
        if block.cancelled:
            positions = [p for p in positions if p not in block.cancelled]
        if end == len(block):
            lane.blocks.popleft()
        else:
            entry[1] = end
        if not positions:
            return
        spec = block.spec
        name = items_task_name(block.run_id, spec.name, block.keys[positions[0]].fan_index,
                               block.keys[positions[-1]].fan_index)
        ref = self._tasks.submit(spec, name, self._packer.pack_items(block, positions))
        chunk = Chunk(block, positions, len(positions), ref)
        sent_in = block.sent_in
        for p in positions:
            sent_in[p] = chunk
        self._inflight[ref] = (chunk, lane)
        lane.tasks += 1

    def cancel_item(self, block: ItemBlock, position: int) -> None:
        if position in block.cancelled:
            return
        block.cancelled.add(position)
        chunk = block.sent_in[position]
        if not isinstance(chunk, Chunk) or chunk.ref is None:
            return  # not sent yet (skipped when its turn comes), or back already (its outcome dropped)
        chunk.live -= 1
        if chunk.live == 0 and (entry := self._inflight.pop(chunk.ref, None)) is not None:
            if entry[1] is not None:
                entry[1].tasks -= 1
            self._cancelled[chunk.ref] = None
            with contextlib.suppress(Exception):  # it may have finished meanwhile
                self._ray.cancel(chunk.ref, force=True)

    def _chunk_done(self, chunk: Chunk, outcomes: ItemOutcomes) -> None:
        """A block's task ended: its items' outcomes, for ``take_items``."""
        chunk.ref = None
        self._items_done.append(ItemsDone(chunk.block, chunk.positions, outcomes))

    def _send_io(self, items: list[tuple[Handle, NodeCall, StepSpec]]) -> None:
        """I/O-bound attempts sent together (``IoPool.send_many``): each keeps its own packed call
        and outcome; a pool actor gets one streaming call for its share, not one call each."""
        calls = [(self._packer.pack_calls(spec, [call]), handle) for handle, call, spec in items]
        first = items[0][1]
        name = task_name(first) if len(items) == 1 else f"{first.fields[0]}:io[{len(items)} calls]"
        for stream in self.io_pool.send_many(calls, name):
            carried = list(stream.tags.values())
            for handle in carried:
                handle.ref = stream.gen
                handle.sent = True
            self._inflight[stream.gen] = (carried, self._io)
            self._io.tasks += 1

    def _is_stream(self, ref: Any) -> bool:
        return self._pool is not None and self._pool.stream_of(ref) is not None

    def _collect(self, gen: Any) -> bool:
        """Read a ready I/O stream: outcomes of the calls that ended; True once it is over."""
        assert self._pool is not None
        started = time.time()
        ended, over, moved = self._pool.collect_moving(gen)
        for stream in moved:  # calls a retired actor gave back unstarted: the same attempts, re-sent
            carried = list(stream.tags.values())
            for handle in carried:
                handle.ref = stream.gen
            self._inflight[stream.gen] = (carried, self._io)
            self._io.tasks += 1
        for handle, result, _ in ended:
            if handle.outcome is None:  # not cancelled meanwhile
                handle.outcome = (unpack_outcomes(result)[0] if isinstance(result, bytes)
                                  else NodeOutcome.failure(result, transient=True, started_at=started))
                self._finished[handle] = None
        if over and self._inflight.pop(gen, None) is not None:
            self._io.tasks -= 1
        return over

    def wait(self, handles: Collection[Handle] | None, timeout: float) -> list[Handle]:
        self._pump()
        self._local.run(self._finished)  # (returned by this very wait: no stop signal between end and absorb)
        if self._io_held:  # a call with a timeout waits for a pool actor to start: look again soon
            timeout = min(timeout, self.STARTING_POLL)
        if (self._cancelled or (self._pool and self._pool.retiring())) and time.monotonic() >= self._recancel_at:
            self._recancel()  # (and a retired actor past its grace is killed, its stream not cancelled)
        wanted = None if handles is None else set(handles)
        done = self._take(wanted)
        if done or (wanted is None and self._items_done):
            return done
        if wanted is None or any(h.ref is None and h.outcome is None for h in wanted):
            # any attempt; or some wanted ones are still queued, and only others ending frees their lane
            refs = list(itertools.islice(self._inflight, self.WAIT_WINDOW))
        else:
            refs = list(dict.fromkeys(h.ref for h in wanted if h.ref in self._inflight))
        if not refs:
            if timeout > 0:
                time.sleep(timeout)
            return []
        # everything already finished, in one look (a busy driver finds some most of the time);
        # else block for one, then take whatever else finished meanwhile (a group commit)
        ready, rest = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        if not ready:
            ready, rest = self._ray.wait(refs, num_returns=1, timeout=timeout)
            if ready and rest:
                more, _ = self._ray.wait(rest, num_returns=len(rest), timeout=0)
                ready += more
        any_ready = bool(ready)
        streams = [ref for ref in ready if self._is_stream(ref)]
        for gen in streams:
            self._collect(gen)
        if streams:
            ready = [ref for ref in ready if not self._is_stream(ref) and ref in self._inflight]
        for ref, result in zip(ready, task_results(self._ray, ready), strict=True):
            carried, lane = self._inflight.pop(ref)
            if isinstance(carried, Chunk):
                back = unpack_items(result) if isinstance(result, bytes) else [result] * len(carried.positions)
                if lane is not None:
                    lane.tasks -= 1
                    lane.measured(back)
                self._chunk_done(carried, back)
                continue
            outcomes = unpack_outcomes(result) if isinstance(result, bytes) else [result] * len(carried)
            if lane is not None:
                lane.tasks -= 1
                lane.measured(outcomes)
            finished = self._finished
            for handle, outcome in zip(carried, outcomes, strict=True):
                if handle.outcome is None:  # not cancelled meanwhile
                    handle.outcome = outcome
                    finished[handle] = None
        if any_ready:  # calls that ended (streamed ones too) freed room:
            self._pump()  # the next chunks and I/O calls run while the driver commits these
        return self._take(wanted)

    def _take(self, wanted: set[Handle] | None) -> list[Handle]:
        if wanted is None:
            done = list(self._finished)
            self._finished.clear()
        else:
            done = [h for h in self._finished if h in wanted]
            for handle in done:
                del self._finished[handle]
        return done

    def stopped(self, handle: Handle) -> bool:
        ref, pool = handle.ref, self._pool
        if pool is not None and ref is not None and pool.stream_of(ref) is not None:
            return not pool.carries(ref, handle)  # its call seen to end (or its actor dead)
        return ref is None or (ref not in self._inflight and ref not in self._cancelled)

    def cancel(self, handle: Handle) -> None:
        self._finished.pop(handle, None)
        if handle.outcome is not None:
            return
        handle.outcome = CANCELLED  # wait() never returns it
        if handle.ref is None:  # queued in a lane, or a local step's, not sent
            self._local.drop(handle)
            for lane in self._all_lanes():
                if any(item[0] is handle for item in lane.queue):
                    lane.queue = deque(item for item in lane.queue if item[0] is not handle)
            return
        entry = self._inflight.get(handle.ref)
        stream = self._is_stream(handle.ref)
        if stream:
            assert self._pool is not None
            self._pool.cancel_call(handle.ref, handle)  # its actor retires, as for a call of its own
        if entry is not None and not isinstance(entry[0], Chunk) and all(h.outcome is not None for h in entry[0]):
            del self._inflight[handle.ref]
            if entry[1] is not None:
                entry[1].tasks -= 1
            self._cancelled[handle.ref] = None
            if stream:
                return
            with contextlib.suppress(Exception):  # it may have finished meanwhile
                self._ray.cancel(handle.ref, force=True)

    #: how often a cancelled task not yet seen to end is cancelled again
    RECANCEL_EVERY = 0.1

    def _recancel(self, settling: bool = False) -> list[Any]:
        """Forget the cancelled tasks that have ended; cancel the others again, return them.

        ``ray.cancel`` only asks: the worker dies a moment later, and a force-cancel that races
        the task's start on a worker can be lost (seen on Ray 2.60 as a fan-out closed), leaving
        the task to run to its end. A cancel repeated once it runs kills its worker.

        A cancelled call of the I/O pool stops when its retired actor is killed: once the actor's
        other calls end (or its grace is over), or at once when ``settling``.
        """
        pool = self._pool
        if pool is not None:
            if settling:
                pool.kill_retired()
            else:
                pool.tick()
        # a stream in flight with a cancelled call among others is settled too (its actor killed)
        refs = list(dict.fromkeys([*self._cancelled, *(pool.unsettled() if pool is not None and settling else ())]))
        if not refs:
            return []
        ended, running = self._ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ended:
            if self._is_stream(ref) and not self._collect(ref):
                running.append(ref)  # calls of it are still running
                continue
            self._cancelled.pop(ref, None)
        for ref in running:
            if self._is_stream(ref):
                continue  # an actor call: only killing its actor stops it (done above)
            with contextlib.suppress(Exception):
                self._ray.cancel(ref, force=True)
        self._recancel_at = time.monotonic() + self.RECANCEL_EVERY
        return list(running)

    def settle_cancelled(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self._cancelled or (self._pool is not None and self._pool.unsettled()):
            running = self._recancel(settling=True)
            left = deadline - time.monotonic()
            if not running or left <= 0:
                break
            self._ray.wait(running, num_returns=len(running), timeout=min(left, self.RECANCEL_EVERY))
        return len(self._cancelled)

    def shutdown(self) -> None:
        if self._started_here:  # only the last executor using a Ray raysaga started shuts it down
            self._started_here = False
            ray_start.leave(self._ray)


def make_executor(kind: str, address: str | None = None, num_cpus: int | None = None, *,
                  io_concurrency: int | None = None) -> Executor:
    """``inline`` (steps in this process) or ``ray`` (joining ``address``, or a local Ray);
    ``io_concurrency``: I/O-bound calls in flight at once (default ``RAYSAGA_IO_CONCURRENCY`` or 64)."""
    if kind == "inline":
        return InlineExecutor()
    if kind == "ray":
        return RayExecutor(address=address, num_cpus=num_cpus, io_concurrency=io_concurrency)
    raise UserError(f"unknown executor {kind!r}: use 'ray' or 'inline'")

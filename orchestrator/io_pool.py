"""The I/O pool: long-lived threaded Ray actors that run calls which wait (model calls, HTTP tools).

A Ray task takes one CPU by default, so a 2-CPU cluster made two model calls at once. Here an
I/O-bound attempt runs in a thread of an actor that reserves no CPU (``num_cpus=0``,
``max_concurrency=threads``): a cluster makes as many calls at once as the pool has threads
(``RAYSAGA_IO_CONCURRENCY``, default 64), whatever its CPU count. Measured (bench/io_micro.py,
200 calls x 50 ms on 2 CPUs): one task per call 5.5 s, zero-CPU tasks 4.2 s (Ray starts a worker
process per concurrent task), a pool of 2 actors x 32 threads 0.23 s (ideal 0.20 s).

Each call carries the same packed ``bytes`` as a task (``wire.run_packed``), so outcomes come back
exactly as from a task, and the driver commits them the same way.

Calls sent together go as ONE actor call per actor (``send_many``): a Ray streaming generator
(``IoWorker.run_many``) that runs them in the actor's threads and yields the outcomes of those
that have ended, grouped, as they end. A burst of 50 calls (a turn of 50 agents in lockstep: their
model calls, then their tool calls) was 50 actor calls, ~0.3-0.6 ms each of the driver's time
and more of Ray's, ~20-35 ms a burst on 2 cores, paid twice a turn; one stream per actor costs
~1 ms to send, and its outcomes come back in a few grouped items (bench/agents_fanout.py). Each
call keeps its own attempt, outcome, timeout and cancellation; only the transport is shared.

Failure and cancellation: a thread cannot be killed, its process can. A call whose actor dies
(killed, OOM, node lost) ends with ``RayActorError``: the executor reports a transient failure of
that attempt (retried under the same idempotency key) and the pool replaces the actor. A cancelled
call *retires* its actor: it gets no new calls, a fresh actor takes its share, and it is killed
(``ray.kill``) as soon as its other calls have ended, after ``CANCEL_GRACE_S`` at the latest,
or at once when the driver settles its cancellations (``kill_retired``). Calls still running on
an actor killed that way end as transient failures and are retried. Calls only queued on it (not
started) are given back at once (``IoWorker.withdraw``, in ``io_actor``) and sent to another actor
as the same attempts (``collect_moving``): killed with it, they failed without having run.

A kill is also a SIGKILL from the driver when the actor's process runs on its host (``_kill_local``):
``ray.kill`` returns once the GCS has marked the actor dead, and the driver learns of the death at
once (its streams fail, so its cancellations settle), but the process is killed by its raylet, which
relays the kill when it next runs. A raylet starved on a loaded host (nice'd, 2 cores) relayed it
after ``raysaga.run`` had returned: a cancelled call's thread kept running past the run's end
(tests/orchestrator/test_io_pool_kill_stalled_raylet.py stops the raylet to show it).
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import itertools
import math
import os
import pickle  # noqa: TID251 - in transit between the driver and its pool actors, never at rest
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from raysaga.orchestrator.io_actor import (  # the actor's side, re-exported (tests, bench read them here)
    CONTROL_GROUP,
    THREADS_PER_ACTOR,
    IoWorker,
    NotStarted,
    ProcessIdentity,
    _kill_local,
    _reported,
    process_identity,
)
from raysaga.orchestrator.options import InvalidOptionError

#: Environment variable: calls the I/O pool of one driver process runs at once.
IO_CONCURRENCY_ENV = "RAYSAGA_IO_CONCURRENCY"
DEFAULT_IO_CONCURRENCY = 64
#: The largest pool (128 actors of 32 threads): 100000 asked for 3,125 actor processes.
MAX_IO_CONCURRENCY = 4096
#: Actors a pool starts with (fewer if it is smaller): more are spawned as calls need their threads.
MIN_ACTORS = 2
#: Seconds a retired actor (one of its calls was cancelled) may keep running its other calls.
CANCEL_GRACE_S = 10.0


def io_concurrency_limit(value: int | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The pool's size: ``value``, else ``RAYSAGA_IO_CONCURRENCY`` (of ``environ``, by default this
    process's), else 64; ``InvalidOptionError`` unless a whole number from 1 to
    ``MAX_IO_CONCURRENCY`` (the variable: ASCII digits only)."""
    source = "io_concurrency"
    raw: Any = value
    if raw is None:
        env = (os.environ if environ is None else environ).get(IO_CONCURRENCY_ENV)
        if env is None or not env.strip():
            return DEFAULT_IO_CONCURRENCY
        source, raw = IO_CONCURRENCY_ENV, env.strip()
        if raw.isascii() and raw.isdigit():  # int() also took "+8", "1_000", Arabic-Indic digits
            raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_IO_CONCURRENCY:
        raise InvalidOptionError(f"{source} must be a whole number of concurrent calls from 1 to "
                                 f"{MAX_IO_CONCURRENCY}, got {raw!r:.40}")
    return raw


F = TypeVar("F", bound=Callable[..., Any])


def _locked(method: F) -> F:
    @functools.wraps(method)
    def wrapper(self: IoPool, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return method(self, *args, **kwargs)

    return cast(F, wrapper)


@dataclass(eq=False)
class PoolActor:
    handle: Any
    threads: int
    live: int = 0
    """Calls in flight on it that nobody cancelled."""
    retired_at: float | None = None
    dead: bool = False
    streams: set[IoStream] = field(default_factory=set)
    """Its ``run_many`` streams not seen to end."""
    ready: Any = None
    """A ref that resolves once its process is up (``IoWorker.identity``): a call with a timeout
    waits for it; a kill reads it (``_kill_local``)."""
    started: bool = False


@dataclass(eq=False)
class IoStream:
    """One ``run_many`` actor call: the calls it carries, by index, until each is seen to end."""

    gen: Any  # ray.ObjectRefGenerator
    actor: PoolActor
    tags: dict[int, Any]  # index -> the caller's tag (the executor's Handle), calls not ended
    cancelled: set[int] = field(default_factory=set)  # of those, the cancelled ones
    payloads: dict[int, bytes] = field(default_factory=dict)  # index -> its packed call, until it ends
    name: str = ""
    token: str = ""  # names it to its actor (``IoWorker.withdraw``)

    def index_of(self, tag: Any) -> int | None:
        return next((i for i, t in self.tags.items() if t == tag), None)


#: One ended call from ``collect``: the caller's tag, its packed outcomes (``bytes``) or the
#: exception that failed it, and whether that was its actor dying.
Ended = tuple[Any, "bytes | BaseException", bool]


class IoPool:
    """``concurrency`` threads over up to ``ceil(concurrency / THREADS_PER_ACTOR)`` actors, spawned
    as calls need them: ``MIN_ACTORS`` at the first call, another when the calls sent outgrow the
    threads of those up (``_spawn_for``), so a large limit costs processes only when it is used.

    One pool per driver process and Ray job (``shared_pool``), shared by every executor of the
    process, so a run does not pay the actors' start-up (~0.5 s each on 2 cores); its methods
    hold a lock, as two drivers may run in threads of one process.
    """

    def __init__(self, ray: Any, concurrency: int) -> None:
        self._ray = ray
        self.concurrency = concurrency
        self._count = max(1, math.ceil(concurrency / THREADS_PER_ACTOR))
        self._threads = math.ceil(concurrency / self._count)
        self._cls: Any = None
        self._strategy: Any = None
        self._active: list[PoolActor] = []  # taking new calls
        self._retired: list[PoolActor] = []  # a call of theirs was cancelled: killed once drained
        self._streams: dict[Any, IoStream] = {}  # generator -> its stream, until it is seen to end
        self._live = 0
        self._tokens = itertools.count()
        self._moved: list[IoStream] | None = None  # streams re-sending given-back calls (``collect_moving``)
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ sending

    def room(self) -> int:
        """Free threads: calls that would start at once (negative when calls wait in the actors'
        queues: the executor sends one wave ahead of the threads, ``RayExecutor._io_ready``)."""
        return self.concurrency - self._live

    @_locked
    def send_many(self, calls: list[tuple[bytes, Any]], name: str) -> list[IoStream]:
        """Start calls (packed payload, the caller's tag), ONE actor call per actor that gets some:
        each call to the least busy actor; those beyond its free threads wait in its queue, in order.
        The returned streams' ``gen`` are what to ``ray.wait`` on; ``collect`` reads them."""
        self._spawn_for(self._live + len(calls))
        heap = [(a.live, i) for i, a in enumerate(self._active)]
        heapq.heapify(heap)
        shares: dict[int, list[tuple[bytes, Any]]] = {}
        for call in calls:
            live, i = heapq.heappop(heap)
            shares.setdefault(i, []).append(call)
            heapq.heappush(heap, (live + 1, i))
        streams = []
        for i, share in shares.items():
            actor = self._active[i]
            token = f"s{next(self._tokens)}"
            gen = actor.handle.run_many.options(name=name, num_returns="streaming").remote(
                [payload for payload, _ in share], token)
            stream = IoStream(gen=gen, actor=actor, tags={k: tag for k, (_, tag) in enumerate(share)},
                              payloads={k: payload for k, (payload, _) in enumerate(share)}, name=name, token=token)
            actor.streams.add(stream)
            actor.live += len(share)
            self._live += len(share)
            self._streams[gen] = stream
            streams.append(stream)
        return streams

    def stream_of(self, gen: Any) -> IoStream | None:
        return self._streams.get(gen)

    @_locked
    def collect_moving(self, gen: Any) -> tuple[list[Ended], bool, list[IoStream]]:
        """``collect``, and the streams that now carry calls of ``gen`` its retired actor gave back
        unstarted (``withdraw``): sent to the active actors as the same attempts (the same packed
        call, its attempt not counted again). The caller waits on those streams from now on."""
        moved: list[IoStream] = []
        self._moved = moved
        try:
            ended, over = self.collect(gen)
        finally:
            self._moved = None
        return ended, over, moved

    @_locked
    def collect(self, gen: Any) -> tuple[list[Ended], bool]:
        """What a ready stream reports: the calls that ended (cancelled ones too: the caller drops
        them), and whether the stream is over. Reads every item already there, never blocks
        (call it once ``ray.wait`` returned ``gen``). A failed item (the actor died, or was killed
        for a cancelled call) fails every call not ended yet: transient, retried by the driver.
        A call given back unstarted is re-sent when called from ``collect_moving``; from here it
        ends as a ``NotStarted`` failure (transient, retried), without waiting for a grace."""
        stream = self._streams.get(gen)
        if stream is None:
            return [], True
        ended: list[Ended] = []
        while stream.tags:
            try:
                ref = next(gen)
            except StopIteration:  # over with calls unreported: cannot happen unless Ray lost it
                self._fail_stream(stream, RuntimeError("the I/O pool's stream ended early"), False, ended)
                break
            try:
                reported = pickle.loads(self._ray.get(ref))
            except Exception as exc:  # the actor died or was killed: the calls failed
                self._fail_stream(stream, exc, is_actor_death(exc), ended)
                break
            resend = []
            for index, result in reported:
                payload = stream.payloads.get(index)
                cancelled = index in stream.cancelled
                tag = self._end(stream, index)
                if tag is None:
                    continue
                if isinstance(result, NotStarted) and not cancelled and payload is not None and \
                        self._moved is not None:
                    resend.append((payload, tag))
                else:
                    ended.append((tag, result, False))
            if resend and self._moved is not None:
                self._moved.extend(self.send_many(resend, stream.name))
            if not stream.tags or not gen.next_ready():
                break
        over = not stream.tags
        if over:
            self._forget(stream)
        self._reap()
        return ended, over

    def _end(self, stream: IoStream, index: int) -> Any:
        """One call of ``stream`` seen to end; returns its tag."""
        tag = stream.tags.pop(index, None)
        stream.payloads.pop(index, None)
        if tag is None:
            return None
        if index in stream.cancelled:
            stream.cancelled.discard(index)
        else:
            stream.actor.live -= 1
            self._live -= 1
        return tag

    def _fail_stream(self, stream: IoStream, exc: BaseException, died: bool, ended: list[Ended]) -> None:
        for index in list(stream.tags):
            ended.append((self._end(stream, index), exc, died))
        self._forget(stream)
        if not stream.actor.dead:  # replaced at the next send; killed in case it was only unreachable
            self._drop(stream.actor, kill=True)

    def _forget(self, stream: IoStream) -> None:
        self._streams.pop(stream.gen, None)
        stream.actor.streams.discard(stream)

    @_locked
    def cancel_call(self, gen: Any, tag: Any) -> None:
        """Stop counting one call of a stream; retire its actor (killed once its other calls end)."""
        stream = self._streams.get(gen)
        index = None if stream is None else stream.index_of(tag)
        if stream is None or index is None or index in stream.cancelled:
            return
        stream.cancelled.add(index)
        stream.actor.live -= 1
        self._live -= 1
        self._retire(stream.actor)
        self._reap()

    @_locked
    def carries(self, gen: Any, tag: Any) -> bool:
        """Whether the call ``tag`` of stream ``gen`` (cancelled or not) may still be running: it
        has not been seen to end, nor its actor to die. A cancelled call runs on until then."""
        stream = self._streams.get(gen)
        return stream is not None and stream.index_of(tag) is not None

    def retiring(self) -> bool:
        """Whether an actor is retired and not killed yet (``tick`` kills it once its grace is over)."""
        return bool(self._retired)

    @_locked
    def unsettled(self) -> list[Any]:
        """Streams (their ``gen``) with a cancelled call not seen to end. Once ``kill_retired`` ran,
        each ends (its actor is dead) as soon as Ray has seen that; ``collect`` then reads it."""
        return [s.gen for s in self._streams.values() if s.cancelled]

    def _spawn_for(self, calls: int) -> None:
        """Spawn actors until those taking calls have a thread for each of ``calls`` (at least
        ``MIN_ACTORS``, at most the pool's count): the default pool's 2 at the first call."""
        want = min(self._count, max(MIN_ACTORS, math.ceil(calls / self._threads)))
        while len(self._active) < want:
            self._active.append(self._spawn())

    def _spawn(self) -> PoolActor:
        if self._cls is None:
            self._cls = self._ray.remote(concurrency_groups={CONTROL_GROUP: 1})(IoWorker)
        if self._strategy is None:
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            # on the driver's node (soft: elsewhere if it is gone): a call's bytes cross no network
            # twice, and a zero-CPU actor is not put on a node that only offers a custom resource
            self._strategy = NodeAffinitySchedulingStrategy(self._ray.get_runtime_context().get_node_id(), soft=True)
        # a stream waits in one of Ray's threads while its calls run in the actor's own pool
        handle = self._cls.options(num_cpus=0, max_concurrency=self._threads + 1, max_restarts=0,
                                   max_task_retries=0, scheduling_strategy=self._strategy).remote(self._threads)
        return PoolActor(handle=handle, threads=self._threads, ready=handle.identity.remote())

    @_locked
    def all_started(self, calls: int | None = None) -> bool:
        """Whether every actor taking calls has its process up (those missing for ``calls`` calls
        at once, by default one more than now, are spawned first: ``_spawn_for``); never blocks.
        A call with a timeout is sent only then: an actor starts in ~0.5 s on 2 idle cores and
        several seconds under load, and a timeout counted from the send would spend that on the
        start (a 1 s timeout could expire, attempt after attempt, on a call that never ran: each
        timeout kills its actor, and the next attempt waits for a new one)."""
        self._spawn_for(self._live + 1 if calls is None else calls)
        waiting = [a for a in self._active if not a.started]
        if waiting:
            done, _ = self._ray.wait([a.ready for a in waiting], num_returns=len(waiting), timeout=0)
            for actor in waiting:  # (a ref that failed is done too: the actor died, its calls fail)
                actor.started = actor.ready in done
        return all(a.started for a in self._active)

    # ------------------------------------------------------------------ ends

    def _retire(self, actor: PoolActor) -> None:
        if actor.retired_at is None and not actor.dead:
            actor.retired_at = time.monotonic()
            if actor in self._active:
                self._active.remove(actor)
            self._retired.append(actor)
            # its calls still queued come back (``NotStarted``) and go to another actor, at once:
            # killed at the end of the grace, they failed for good with max_attempts=1, never run
            tokens = [s.token for s in actor.streams if any(i not in s.cancelled for i in s.tags)]
            if tokens:
                with contextlib.suppress(Exception):  # the actor is gone: its calls fail as a death's
                    actor.handle.withdraw.options(concurrency_group=CONTROL_GROUP).remote(tokens)

    def _reap(self) -> None:
        """Kill the retired actors whose other calls have ended, or whose grace is over."""
        now = time.monotonic()
        for actor in list(self._retired):
            if actor.live == 0 or now - (actor.retired_at or now) >= CANCEL_GRACE_S:
                self._drop(actor, kill=True)

    @_locked
    def kill_retired(self) -> None:
        """Settling: every actor running a cancelled call is killed now (its other calls fail, transient)."""
        for actor in list(self._retired):
            self._drop(actor, kill=True)
        for actor in list(self._active):  # a cancelled call on a live actor (cannot happen: it retires)
            if any(s.cancelled for s in actor.streams):
                self._drop(actor, kill=True)

    @_locked
    def tick(self) -> None:
        if self._retired:
            self._reap()

    def _drop(self, actor: PoolActor, *, kill: bool) -> None:
        actor.dead = True
        if actor in self._active:
            self._active.remove(actor)
        if actor in self._retired:
            self._retired.remove(actor)
        if kill:
            with contextlib.suppress(Exception):  # already gone
                self._ray.kill(actor.handle, no_restart=True)
            _kill_local(self._identity(actor))  # gone now, not when its raylet gets to it

    def _identity(self, actor: PoolActor) -> Any:
        """What its ``ready`` ref says, if it has said it (never blocks); None if it failed."""
        try:
            done, _ = self._ray.wait([actor.ready], num_returns=1, timeout=0)
            return self._ray.get(done[0]) if done else None
        except Exception:  # the actor died before it answered
            return None

    @_locked
    def shutdown(self) -> None:
        for actor in [*self._active, *self._retired]:
            self._drop(actor, kill=True)
        self._streams.clear()
        self._live = 0

    # ------------------------------------------------------------------ introspection (tests, bench)

    @_locked
    def actors(self) -> list[Any]:
        """Handles of the actors taking calls."""
        return [a.handle for a in self._active]


def is_actor_death(exc: BaseException) -> bool:
    try:
        from ray.exceptions import RayActorError
    except ImportError:  # pragma: no cover - ray is a dependency
        return False
    return isinstance(exc, RayActorError)


_pools: dict[tuple[str, int], IoPool] = {}
_pools_lock = threading.Lock()


def shared_pool(ray: Any, concurrency: int) -> IoPool:
    """This process's pool for the connected Ray job and this size (created on first use)."""
    context = ray.get_runtime_context()
    # a new local Ray gives its first driver the same job id (01000000): the cluster's address tells
    # the sessions apart (a second run in a process reused the first's dead pool: "Can't find actor")
    key = (f"{getattr(context, 'gcs_address', '')}/{context.get_job_id()}", concurrency)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            for old in [k for k in _pools if k[0] != key[0]]:  # a previous Ray session's: its actors are gone
                del _pools[old]
            pool = _pools[key] = IoPool(ray, concurrency)
        return pool


def forget_pools() -> None:
    """Drop this process's pools: the Ray they ran on was shut down (``ray_start.leave``)."""
    with _pools_lock:
        _pools.clear()


__all__ = ["CANCEL_GRACE_S", "CONTROL_GROUP", "IO_CONCURRENCY_ENV", "THREADS_PER_ACTOR", "IoPool", "IoStream",
           "IoWorker", "NotStarted", "ProcessIdentity", "_kill_local", "_reported", "forget_pools",
           "io_concurrency_limit", "is_actor_death", "process_identity", "shared_pool"]

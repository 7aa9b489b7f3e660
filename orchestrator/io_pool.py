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
an actor killed that way end as transient failures and are retried.

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
import math
import os
import pickle  # noqa: TID251 - in transit between the driver and its pool actors, never at rest
import signal
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

from raysaga.orchestrator.options import InvalidOptionError
from raysaga.orchestrator.ownership import boot_id, process_start
from raysaga.orchestrator.wire import run_packed

#: Environment variable: calls the I/O pool of one driver process runs at once.
IO_CONCURRENCY_ENV = "RAYSAGA_IO_CONCURRENCY"
DEFAULT_IO_CONCURRENCY = 64
#: The largest pool (128 actors of 32 threads): 100000 asked for 3,125 actor processes.
MAX_IO_CONCURRENCY = 4096
#: Threads per pool actor: 64 calls run in 2 processes (a killed actor fails half of them, not all).
THREADS_PER_ACTOR = 32
#: Actors a pool starts with (fewer if it is smaller): more are spawned as calls need their threads.
MIN_ACTORS = 2
#: Seconds a retired actor (one of its calls was cancelled) may keep running its other calls.
CANCEL_GRACE_S = 10.0


def io_concurrency_limit(value: int | None = None) -> int:
    """The pool's size: ``value``, else ``RAYSAGA_IO_CONCURRENCY``, else 64; ``InvalidOptionError``
    unless a whole number from 1 to ``MAX_IO_CONCURRENCY`` (the variable: ASCII digits only)."""
    source = "io_concurrency"
    raw: Any = value
    if raw is None:
        env = os.environ.get(IO_CONCURRENCY_ENV)
        if env is None or not env.strip():
            return DEFAULT_IO_CONCURRENCY
        source, raw = IO_CONCURRENCY_ENV, env.strip()
        if raw.isascii() and raw.isdigit():  # int() also took "+8", "1_000", Arabic-Indic digits
            raw = int(raw)
    if isinstance(raw, bool) or not isinstance(raw, int) or not 1 <= raw <= MAX_IO_CONCURRENCY:
        raise InvalidOptionError(f"{source} must be a whole number of concurrent calls from 1 to "
                                 f"{MAX_IO_CONCURRENCY}, got {raw!r:.40}")
    return raw


class IoWorker:
    """The pool's actor class: each method call runs in one of the actor's threads; the calls of a
    ``run_many`` stream run in a thread pool of the same size."""

    def __init__(self, threads: int = THREADS_PER_ACTOR) -> None:
        self._threads = threads
        self._runner: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    def run_many(self, payloads: list[bytes]) -> Iterator[bytes]:
        """Run the calls at once; yield ``pickle([(index, packed outcomes | exception)])`` groups,
        each of the calls that ended since the last (a burst that ends together is one item)."""
        with self._lock:
            if self._runner is None:
                self._runner = ThreadPoolExecutor(self._threads, thread_name_prefix="raysaga-io")
            runner = self._runner
        futures = {runner.submit(run_packed, payload): i for i, payload in enumerate(payloads)}
        pending: set[Future[bytes]] = set(futures)
        while pending:
            done, pending = wait_futures(pending, return_when=FIRST_COMPLETED)
            yield pickle.dumps([_reported(futures[f], f) for f in done], protocol=pickle.HIGHEST_PROTOCOL)

    def identity(self) -> ProcessIdentity | None:
        """This process, as the driver can tell it from any other (``_kill_local``)."""
        return process_identity(os.getpid())


#: A process as /proc names it: (the host's boot id, pid, start time in clock ticks since boot).
ProcessIdentity = tuple[str, int, int]


def process_identity(pid: int) -> ProcessIdentity | None:
    """``pid``'s identity on this host, or None (no /proc, or no such process). Another host has
    another boot id; a pid reused, or the same pid in another pid namespace (a container), is a
    process with another start time. Read as a driver's lease owner is (``ownership``)."""
    boot, start = boot_id(), process_start(pid)
    return None if boot is None or start is None else (boot, pid, start)


def _kill_local(identity: Any) -> None:
    """SIGKILL a killed actor's process now if it runs on this host and is still that process
    (Ray's own kill reaches it through its raylet, later under load: the module's docstring)."""
    if not (isinstance(identity, tuple) and len(identity) == 3 and isinstance(identity[1], int)):
        return  # not known: the actor never answered, or (tests) its start was stubbed
    pid: int = identity[1]
    if process_identity(pid) != identity:
        return  # already gone, or on another host
    with contextlib.suppress(OSError):  # exited meanwhile
        # a Ray worker leads its own process group: the group, so a step's child processes go too
        # (as with Ray's own kill), else the process alone
        (os.killpg if os.getpgid(pid) == pid else os.kill)(pid, signal.SIGKILL)


def _reported(index: int, future: Future[bytes]) -> tuple[int, bytes | BaseException]:
    """A call's packed outcomes, or why ``run_packed`` itself raised (a spec the worker cannot
    unpickle): a failure of the call, reported as a task's failure is (transient)."""
    try:
        return index, future.result()
    except Exception as exc:  # carried to the driver, which classifies it
        try:
            pickle.dumps(exc)
            return index, exc
        except Exception:  # an exception that does not pickle: its text
            return index, RuntimeError(f"{type(exc).__name__}: {exc}")


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
            gen = actor.handle.run_many.options(name=name, num_returns="streaming").remote(
                [payload for payload, _ in share])
            stream = IoStream(gen=gen, actor=actor, tags={k: tag for k, (_, tag) in enumerate(share)})
            actor.streams.add(stream)
            actor.live += len(share)
            self._live += len(share)
            self._streams[gen] = stream
            streams.append(stream)
        return streams

    def stream_of(self, gen: Any) -> IoStream | None:
        return self._streams.get(gen)

    @_locked
    def collect(self, gen: Any) -> tuple[list[Ended], bool]:
        """What a ready stream reports: the calls that ended (cancelled ones too: the caller drops
        them), and whether the stream is over. Reads every item already there, never blocks
        (call it once ``ray.wait`` returned ``gen``). A failed item (the actor died, or was killed
        for a cancelled call) fails every call not ended yet: transient, retried by the driver."""
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
            for index, result in reported:
                tag = self._end(stream, index)
                if tag is not None:
                    ended.append((tag, result, False))
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
            self._cls = self._ray.remote(IoWorker)
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
    key = (str(ray.get_runtime_context().get_job_id()), concurrency)
    with _pools_lock:
        pool = _pools.get(key)
        if pool is None:
            for old in [k for k in _pools if k[0] != key[0]]:  # a previous Ray session's: its actors are gone
                del _pools[old]
            pool = _pools[key] = IoPool(ray, concurrency)
        return pool

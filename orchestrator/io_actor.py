"""The I/O pool's actor (``IoWorker``): threads that run calls, and what a pool kills them with.

Kept apart from ``io_pool`` (the driver's side) so each reads in one sitting; ``io_pool``
re-exports these names.
"""

from __future__ import annotations

import contextlib
import os
import pickle  # noqa: TID251 - in transit between the driver and its pool actors, never at rest
import signal
import threading
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from typing import Any

from raysaga.orchestrator.ownership import boot_id, process_start
from raysaga.orchestrator.wire import run_packed

#: Threads per pool actor: 64 calls run in 2 processes (a killed actor fails half of them, not all).
THREADS_PER_ACTOR = 32


class NotStarted(Exception):
    """A call its retired actor gave back before it started (``IoWorker.withdraw``): the pool sends
    it to another actor, as the same attempt (``IoPool.collect_moving``)."""

    def __init__(self, message: str = "the call waited in the queue of an I/O pool actor retired by another "
                                      "call's cancel or timeout, and was given back before it started") -> None:
        super().__init__(message)


#: The actors' concurrency group for ``withdraw``: it runs while every thread of theirs is busy.
CONTROL_GROUP = "raysaga-control"


class IoWorker:
    """The pool's actor class: each method call runs in one of the actor's threads; the calls of a
    ``run_many`` stream run in a thread pool of the same size."""

    def __init__(self, threads: int = THREADS_PER_ACTOR) -> None:
        self._threads = threads
        self._runner: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()
        # a stream's token -> its calls, and what wakes it when some are given back (a cancelled
        # future wakes no ``wait`` until a pool thread dequeues it, which a busy pool does not)
        self._running: dict[str, tuple[list[Future[bytes]], Future[None]]] = {}
        self._withdrawn: set[str] = set()  # tokens withdrawn before their stream began

    def run_many(self, payloads: list[bytes], token: str = "") -> Iterator[bytes]:
        """Run the calls at once; yield ``pickle([(index, packed outcomes | exception)])`` groups,
        each of the calls that ended since the last (a burst that ends together is one item). A
        call withdrawn before it started (``withdraw``) is reported as ``NotStarted``."""
        with self._lock:
            if self._runner is None:
                self._runner = ThreadPoolExecutor(self._threads, thread_name_prefix="raysaga-io")
            runner = self._runner
            if token in self._withdrawn:  # given back before it began: none of its calls starts
                self._withdrawn.discard(token)
                futures = {_given_back(): i for i in range(len(payloads))}
            else:
                futures = {runner.submit(run_packed, payload): i for i, payload in enumerate(payloads)}
            wake: Future[None] = Future()
            self._running[token] = (list(futures), wake)
        try:
            pending: set[Future[Any]] = set(futures)
            while pending:
                done = {f for f in pending if f.cancelled()}  # given back: over (``wait`` sees them late)
                if not done:
                    ended, _ = wait_futures(pending | {wake}, return_when=FIRST_COMPLETED)
                    if wake.done():
                        with self._lock:
                            wake = Future()
                            self._running[token] = (list(futures), wake)
                    done = {f for f in ended if f in futures} | {f for f in pending if f.cancelled()}
                pending -= done
                if done:
                    yield pickle.dumps([_reported(futures[f], f) for f in done], protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            with self._lock:
                self._running.pop(token, None)

    def withdraw(self, tokens: list[str]) -> None:
        """Give back the calls of these streams that have not started (each then ends as
        ``NotStarted``); a stream not begun yet gives back all of its calls when it begins. Runs in
        its own concurrency group (``CONTROL_GROUP``): the actor's threads may all be taken."""
        with self._lock:
            for token in tokens:
                running = self._running.get(token)
                if running is None:
                    self._withdrawn.add(token)
                    continue
                futures, wake = running
                given = [future.cancel() for future in futures]  # only one still queued: a running call runs on
                if any(given) and not wake.done():
                    wake.set_result(None)

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


def _given_back() -> Future[bytes]:
    future: Future[bytes] = Future()
    future.cancel()
    return future


def _reported(index: int, future: Future[bytes]) -> tuple[int, bytes | BaseException]:
    """A call's packed outcomes, or why ``run_packed`` itself raised (a spec the worker cannot
    unpickle): a failure of the call, reported as a task's failure is (transient)."""
    if future.cancelled():  # given back unstarted (``IoWorker.withdraw``)
        return index, NotStarted()
    try:
        return index, future.result()
    except Exception as exc:  # carried to the driver, which classifies it
        try:
            pickle.dumps(exc)
            return index, exc
        except Exception:  # an exception that does not pickle: its text
            return index, RuntimeError(f"{type(exc).__name__}: {exc}")

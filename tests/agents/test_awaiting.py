"""``awaiting.run_to_end`` gives a coroutine's result or exception as ``asyncio.run`` does, also in a
thread that already runs an event loop (where ``asyncio.run`` refuses to start): on a loop of its
own, the caller waiting, the caller's context variables seen, what the coroutine sets kept its own."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, TypeVar

import pytest

from raysaga.agents.awaiting import awaited, run_to_end

T = TypeVar("T")

REQUEST_ID: ContextVar[str] = ContextVar("request_id", default="none")


class Refused(Exception):
    pass


async def _seen() -> dict[str, Any]:
    """What the coroutine sees of where it runs; it sets the context variable for itself."""
    await asyncio.sleep(0)
    seen = {"request_id": REQUEST_ID.get(), "loop": asyncio.get_running_loop(), "thread": threading.get_ident()}
    REQUEST_ID.set("changed by the coroutine")
    return seen


def _from(where: str, call: Callable[[], T]) -> tuple[T, asyncio.AbstractEventLoop | None]:
    """``call()`` with ``REQUEST_ID`` set, from a plain function or from inside a running loop (which
    is returned, to tell it from the coroutine's)."""
    REQUEST_ID.set("r-1")
    if where == "no loop":
        return call(), None

    async def handler() -> tuple[T, asyncio.AbstractEventLoop | None]:
        return call(), asyncio.get_running_loop()
    return asyncio.run(handler())


@pytest.mark.parametrize("where", ["no loop", "in a running loop"])
def test_the_result_and_context_are_asyncio_runs(where: str) -> None:
    seen, outer = _from(where, lambda: run_to_end(_seen()))
    assert seen["request_id"] == "r-1"
    assert REQUEST_ID.get() == "r-1", "what the coroutine set stays its own"
    assert seen["loop"] is not outer, "a loop of its own, never the caller's (blocked in the call)"
    assert (seen["thread"] == threading.get_ident()) is (where == "no loop")


@pytest.mark.parametrize("where", ["no loop", "in a running loop"])
@pytest.mark.parametrize("error", [Refused("no"), KeyboardInterrupt(), SystemExit(3)], ids=repr)
def test_its_exception_is_raised_as_itself(where: str, error: BaseException) -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise error

    with pytest.raises(type(error)) as raised:
        _from(where, lambda: run_to_end(failing()))
    assert raised.value is error


def test_awaited_leaves_any_other_value_as_it_is() -> None:
    value = {"a": 1}
    assert awaited(value) is value
    assert awaited(None) is None
    assert _from("in a running loop", lambda: awaited(_seen()))[0]["request_id"] == "r-1"


def test_a_coroutine_run_with_no_loop_has_no_stale_exception_in_hand() -> None:
    """Stop 47's diff review: ``asyncio.run`` was called inside ``except RuntimeError`` (the "no
    running event loop" probe), so every async step ran with that as ``sys.exc_info()`` and its
    own failure chained to it ("During handling of the above exception ...")."""
    import sys

    async def look() -> object:
        return sys.exc_info()[1]

    assert run_to_end(look()) is None

    async def boom() -> None:
        raise ValueError("boom")

    try:
        run_to_end(boom())
    except ValueError as exc:
        assert exc.__context__ is None, repr(exc.__context__)


_STOPPED_HOST = r"""
import asyncio, collections, random, signal, sys, threading
from raysaga.agents.awaiting import run_to_end

main = threading.main_thread().ident
seen = collections.Counter()

def state(s):
    return ("cancelled" if "cancelled" in s else "effect landed" if "finished" in s
            else "running" if "started" in s else "not started")

def trial():
    s = set()
    async def step():
        s.add("started")
        try:
            await asyncio.sleep(0.3)
            s.add("finished")  # the effect the caller no longer waits for
        except asyncio.CancelledError:
            s.add("cancelled")
            raise
    async def handler():
        return run_to_end(step())  # a running loop: the coroutine goes to a helper thread
    ctrl_c = threading.Timer(random.uniform(0, 0.003), signal.pthread_kill, (main, signal.SIGINT))
    loop = asyncio.new_event_loop()  # (not asyncio.run: its own SIGINT handler would only cancel handler())
    ctrl_c.start()
    try:
        loop.run_until_complete(handler())
        seen["not interrupted"] += 1
    except KeyboardInterrupt:
        seen[state(s)] += 1  # what the coroutine is when the caller gets the interrupt
    ctrl_c.join()
    loop.close()

for _ in range(int(sys.argv[1])):
    try:
        trial()
    except KeyboardInterrupt:  # landed outside run_to_end (before the coroutine existed)
        seen["not started"] += 1
print(" ".join(f"{k.replace(' ', '_')}={v}" for k, v in sorted(seen.items())))
"""


def test_a_caller_stopped_while_waiting_cancels_the_coroutine() -> None:
    """Ctrl-C while a host's loop waits on a coroutine in the helper thread, at any instant of
    ``run_to_end`` (a real SIGINT to the main thread of a process of its own, 0-3 ms after the
    call, 150 times): the KeyboardInterrupt reaches the host only once the coroutine was cancelled
    and unwound, or never started: never while it still runs, its effect about to land with
    nothing recorded. (Interrupted in ``Thread.start``, or in a join that 3.11 then marked done,
    it ran on in 1 trial of 3.)"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", _STOPPED_HOST, "150"], capture_output=True, text=True, timeout=300)
    counts = dict(pair.split("=") for pair in done.stdout.split())
    assert counts and set(counts) <= {"cancelled", "not_started"}, done.stdout + done.stderr

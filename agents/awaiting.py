"""An ``async def`` step's or tool's coroutine run to its end from raysaga's synchronous code.

A step (``task.execute``) and a tool (``tools.run_tool``) are called from plain functions, on a
Ray worker or, inline, in the caller's own thread. ``asyncio.run`` refuses to start inside a
running event loop, and an inline run is often called from one (an async web handler,
``asyncio.run(main())``, a Jupyter cell): the step failed for good ("asyncio.run() cannot be
called from a running event loop"), a critical one rolled back what had gone through, and a tool's
coroutine was never awaited at all (its body never ran, the call was recorded as done). Where a
loop runs, the coroutine runs on a fresh loop of its own in a helper thread, the caller waiting:
the same result, the same exception raised, the caller's context variables seen, as
``asyncio.run`` gives in a thread without a loop. (The caller's loop is blocked meanwhile, as
it is by any synchronous call of raysaga's: ``run`` drives a whole run before it returns.)
A caller stopped while it waits (Ctrl-C in a host that catches ``KeyboardInterrupt``) cancels the
coroutine before it re-raises: left running, its effect landed with nothing recorded.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def awaited(value: Any) -> Any:
    """``value`` itself, or, when it is a coroutine (what an ``async def`` returns), what that
    coroutine returns, run to its end (``run_to_end``)."""
    if value is None or not asyncio.iscoroutine(value):
        return value
    return run_to_end(value)


def run_to_end(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to its end on a fresh event loop and return its result (or raise its
    exception): in this thread when no loop runs in it, else in a helper thread (module doc)."""
    try:
        asyncio.get_running_loop()
        running = True
    except RuntimeError:
        running = False
    # (run outside the ``except``: inside it, the step ran with "no running event loop" as the
    # current exception, chained into every failure's traceback and picked up by a bare ``raise``)
    return _in_helper_thread(coro) if running else asyncio.run(coro)


class _Ended:
    """What the helper thread's loop ended with: a result, or the exception to raise; and, while it
    runs, the coroutine's task, for the caller to cancel (``_stop``)."""

    __slots__ = ("error", "lock", "loop", "result", "stopped", "task")

    def __init__(self) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[Any] | None = None
        self.stopped = False


#: Seconds the caller waits for a cancelled coroutine to unwind before it raises what stopped it.
UNWIND_S = 5.0
#: Seconds between the caller's looks at its pending signals while it waits (``_in_helper_thread``).
SIGNAL_LOOK_S = 0.05


def _in_helper_thread(coro: Coroutine[Any, Any, T]) -> T:
    # a copy of the caller's context: the coroutine's task copies it again, as asyncio.run's would
    # copy the caller's own; what the coroutine sets stays its own on either path
    context = contextvars.copy_context()
    ended = _Ended()

    async def tracked() -> T:
        with ended.lock:
            if ended.stopped:  # the caller was stopped before this started: never run the coroutine
                coro.close()
                raise asyncio.CancelledError
            ended.loop, ended.task = asyncio.get_running_loop(), asyncio.current_task()
        return await coro

    done = threading.Event()  # (not ``join``: on 3.11-3.12 a join a KeyboardInterrupt cut short
    # marks the thread stopped, and joining it again returns at once, before the coroutine unwound)

    def main() -> None:
        try:
            ended.result = context.run(asyncio.run, tracked())
        except BaseException as exc:  # raised in the caller's thread, whatever it is (KeyboardInterrupt too)
            ended.error = exc
        finally:
            done.set()

    helper = threading.Thread(target=main, name="raysaga-coroutine", daemon=True)
    try:
        helper.start()  # (inside: ``start`` waits for the thread, and a Ctrl-C can land there too)
        while not done.wait(SIGNAL_LOOK_S):
            pass  # (in slices: a signal landing just before a blocking wait began went unseen until it ended)
    except BaseException:
        # the caller stopped waiting (Ctrl-C in a host that catches KeyboardInterrupt): the coroutine
        # must not run on behind it, its effect landing with nothing recorded; cancel it, let it unwind
        _stop(ended)
        done.wait(UNWIND_S)
        raise
    if ended.error is not None:
        error, ended.error = ended.error, None  # (no cycle through this frame)
        raise error
    result: T = ended.result
    return result


def _stop(ended: _Ended) -> None:
    """Cancel the helper's coroutine, or keep it from starting."""
    with ended.lock:
        ended.stopped = True
        loop, task = ended.loop, ended.task
    if loop is not None and task is not None:
        with contextlib.suppress(RuntimeError):  # its loop has closed: it ended meanwhile
            loop.call_soon_threadsafe(task.cancel)

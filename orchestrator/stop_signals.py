"""SIGINT/SIGTERM turned into a clean stop of a driver (``DriverInterrupted``), and a second one
into an immediate exit.

The first signal sets a flag: the driver's loop stops at its next boundary (with the inline
executor a step running in this thread finishes first), settles what is in flight, commits what
finished, releases the lease and raises ``DriverInterrupted``. A second signal ends the process
at once (exit 130 or 143, or the application's own handler if it installed one): a resume on
this host takes the lease over at once, its owner being provably gone.

A SIGINT the process inherited as ignored stays ignored. A shell without job control (a script,
``nohup cmd &``) starts a background job with SIGINT ignored because it shares the terminal's
process group: a Ctrl-C meant for the foreground job reaches it too. Python keeps that SIG_IGN,
and so does a driver (and a worker: ``Worker.run``); SIGTERM still stops them cleanly.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal as posix_signal
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

log = logging.getLogger("raysaga.driver")

#: Signals a driver turns into a clean stop: SIGINT (Ctrl-C) and SIGTERM (``docker stop``,
#: Kubernetes, systemd).
STOP_SIGNALS = (posix_signal.SIGINT, posix_signal.SIGTERM)

#: SIGINT was ignored when this module was first imported (the driver and the worker import it
#: before they, Ray or the CLI install any handler): the process inherited it so (see the module
#: doc), or the application ignores it. Read once: a handler installed since must not hide it.
SIGINT_IGNORED_AT_START = posix_signal.getsignal(posix_signal.SIGINT) == posix_signal.SIG_IGN


def ignored(signum: int) -> bool:
    """Whether ``signum`` must stay ignored: SIGINT, when it was ignored at start or is now."""
    return signum == posix_signal.SIGINT and (
        SIGINT_IGNORED_AT_START or posix_signal.getsignal(signum) == posix_signal.SIG_IGN)


@contextlib.contextmanager
def sigint_kept_ignored() -> Iterator[None]:
    """Keep SIGINT ignored for the time of the block when it was ignored at start, whatever handler
    was installed for it since (``raysaga worker`` installs one for Ctrl-C); the handler is put
    back after. Main thread only (elsewhere, or when SIGINT was not ignored: nothing is changed)."""
    if not SIGINT_IGNORED_AT_START or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = posix_signal.signal(posix_signal.SIGINT, posix_signal.SIG_IGN)
    try:
        yield
    finally:
        posix_signal.signal(posix_signal.SIGINT, previous if previous is not None else posix_signal.SIG_DFL)


class StopSignals:
    """Installed for the time of one ``drive`` (main thread only; the previous handlers come back)."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.received: str | None = None  # the name of the stop signal received
        self._saved: dict[int, Any] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in STOP_SIGNALS:
            if ignored(signum):  # a background job's SIGINT: meant for the foreground (module doc)
                continue
            try:
                self._saved[signum] = posix_signal.signal(signum, self._on_signal)
            except (ValueError, OSError):  # not the main interpreter, or a platform without it
                continue

    def restore(self) -> None:
        for signum, previous in self._saved.items():
            posix_signal.signal(signum, previous if previous is not None else posix_signal.SIG_DFL)
        self._saved.clear()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.received is None:
            self.received = posix_signal.Signals(signum).name
            log.warning("run %s: %s received: stopping at the next boundary (again to stop at once)",
                        self.run_id, self.received)
            return
        # The second signal stops at once, whatever the step in flight does: an inline step cannot
        # be preempted, and a KeyboardInterrupt can be swallowed by the step. An application's own handler is
        # called instead. The process ends with 130 (SIGINT) or 143 (SIGTERM), its lease still
        # held: its pid is gone, so `raysaga resume` on this host takes the lease over at once.
        self.restore()
        previous = posix_signal.getsignal(signum)
        if callable(previous) and previous is not posix_signal.default_int_handler:
            previous(signum, frame)
            return
        name = posix_signal.Signals(signum).name
        with contextlib.suppress(OSError):  # os.write: a handler must not re-enter sys.stderr's buffer
            os.write(2, f"interrupted by {name} again: stopped at once, inside the step in flight; "
                        f"`raysaga resume {shlex.quote(self.run_id)}` continues it (on this host it takes the lease "
                        f"over at once)\n".encode("utf-8", "replace"))
        os._exit(128 + signum)

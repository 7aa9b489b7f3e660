"""Garbage collection paced for a driver: fewer young collections while a run is driven.

A driver keeps O(nodes) small objects alive for the whole run (keys, outputs, attempts), next to
the large, long-lived heap of Ray, SQLAlchemy and pydantic. With CPython's default thresholds
(700, 10, 10) the young generations fill every few hundred allocations, their survivors are
promoted, and once they reach a quarter of the old generation a full collection scans the whole
heap: measured on a 10,000-item fan-out (bench/bench.py), one or two full collections of
120-240 ms each, a fifth of the driver's time. With a young threshold of ``YOUNG`` the run's
objects are collected as often as they need to be (cyclic garbage still goes at every young
collection) and the full scans stop happening mid-run.

Process-wide, like any ``gc`` setting: raised when the first driver of the process starts and
put back at the first collection after the last one ends. Put back at once, the next allocation
collected that run's last young objects while they were still alive (its machine, its keys):
~2.6 ms at the end of a 10,000-item fan-out, for objects that die with the run a moment later.
A process that disabled the collector, or set a higher threshold itself, is left alone.
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator

#: Allocations (net) between two young collections while a driver runs.
YOUNG = 50_000

_lock = threading.RLock()  # (re-entrant: a collection, and so ``_put_back``, can run inside ``paced_gc``)
_drivers = 0
_saved: tuple[int, int, int] | None = None  # the thresholds to put back; None: nothing to put back


@contextlib.contextmanager
def paced_gc() -> Iterator[None]:
    """Run the block with the young threshold at least ``YOUNG`` (put back after the last block)."""
    global _drivers, _saved
    with _lock:
        if _drivers == 0 and _saved is None:  # (not yet put back since the last block: still ours)
            threshold = gc.get_threshold()
            if gc.isenabled() and 0 < threshold[0] < YOUNG:
                _saved = threshold
                gc.set_threshold(YOUNG, threshold[1], threshold[2])
                if _put_back not in gc.callbacks:
                    gc.callbacks.append(_put_back)
        _drivers += 1
    try:
        yield
    finally:
        with _lock:
            _drivers -= 1


def _put_back(phase: str, info: dict[str, int]) -> None:
    """A ``gc`` callback: after a collection with no driver running, the thresholds go back."""
    global _saved
    if phase != "stop" or _saved is None or not _lock.acquire(blocking=False):
        return  # (another thread holds the lock: at the next collection)
    try:
        if _drivers == 0 and _saved is not None:
            if gc.get_threshold()[0] == YOUNG:  # nobody changed it meanwhile
                gc.set_threshold(*_saved)
            _saved = None
    finally:
        _lock.release()


def _after_fork_in_child() -> None:
    """A child forked while a driver ran (an inline step using ``multiprocessing``) runs no driver:
    its threshold goes back now, or nothing in it ever would (it counted its parent's drivers)."""
    global _lock, _drivers, _saved
    _lock = threading.RLock()  # (the parent's may have been held by a thread the child does not have)
    _drivers = 0
    if _saved is not None and gc.get_threshold()[0] == YOUNG:
        gc.set_threshold(*_saved)
    _saved = None


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)

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
put back when the last one ends (drivers may run in threads of one worker). A process that
disabled the collector, or set a higher threshold itself, is left alone.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

#: Allocations (net) between two young collections while a driver runs.
YOUNG = 50_000

_lock = threading.Lock()
_drivers = 0
_saved: tuple[int, int, int] | None = None


@contextlib.contextmanager
def paced_gc() -> Iterator[None]:
    """Run the block with the young threshold at least ``YOUNG`` (restored when the last block ends)."""
    global _drivers, _saved
    with _lock:
        if _drivers == 0:
            threshold = gc.get_threshold()
            if gc.isenabled() and 0 < threshold[0] < YOUNG:
                _saved = threshold
                gc.set_threshold(YOUNG, threshold[1], threshold[2])
        _drivers += 1
    try:
        yield
    finally:
        with _lock:
            _drivers -= 1
            if _drivers == 0 and _saved is not None:
                if gc.get_threshold()[0] == YOUNG:  # nobody changed it meanwhile
                    gc.set_threshold(*_saved)
                _saved = None

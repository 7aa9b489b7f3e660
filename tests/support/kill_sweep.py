"""The kill-and-resume harness of the crash sweeps (forward effects, agent turns, rollbacks).

One case: a driver process is started with ``RAYSAGA_FAULTS=<point>:<label>`` and must die of
SIGKILL there; the test looks at what is durable at the kill; once the dead driver's lease has
expired (polled in the store) the next process resumes the run, and so on for each kill of the
case; the last process resumes the run to rest. Every later process is started up front, so its
imports overlap the earlier ones' lives; it touches nothing until the harness creates its go
file. No node committed completed at a kill completes again after it (``completion_counts``: a
resume restores it, never runs it again). The test then checks the run against its golden
(uninterrupted) run.

    def start(faults: str | None, resume: bool, go_file: Path | None) -> subprocess.Popen[str]:
        return crash_driver.spawn(flow, db, RUN_ID, faults=faults, resume=resume, go_file=go_file, ...)

    with kill_and_resume(start, db, RUN_ID, [("before_commit", "charge")], tmp_path,
                         at_kill=check_state_at_kill) as (resumed, store):
        assert resumed.result["output"] == golden.output
"""

from __future__ import annotations

import signal
import subprocess
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from raysaga.state import RunStatus, SqlStore
from raysaga.state.item_events import item_indexes
from tests.support import crash_driver
from tests.support.store_template import copy_template

# re-exported: the sweeps import them from here
from tests.support.sweep import FULL_SWEEP as FULL_SWEEP
from tests.support.sweep import case_ids as case_ids
from tests.support.sweep import sweep_params as sweep_params

#: The drivers' lease TTL per executor: short, so a resume can start soon after a kill.
LEASE_TTL = {"inline": 0.5, "ray": 2.0}
#: The crash points of an effect node, in the order a driver passes them.
EFFECT_POINTS = ("before_pending", "after_pending", "before_commit", "after_commit")

Kill = tuple[str, str]
"""A crash point and the node label it is armed for."""


class Start(Protocol):
    """Starts one driver process of the case's run."""

    def __call__(self, faults: str | None, resume: bool, go_file: Path | None) -> subprocess.Popen[str]: ...


def fault(kill: Kill) -> str:
    """The ``RAYSAGA_FAULTS`` value of one kill."""
    point, label = kill
    return f"{point}:{label}"


def ledger_label(effect: Any) -> str:
    """An effect row's node label: ``step``, or ``step[i]`` for a fan-out item."""
    return str(effect.node_id) if effect.fan_index < 0 else f"{effect.node_id}[{effect.fan_index}]"


def completion_counts(store: SqlStore, run_id: str) -> Counter[str]:
    """How often each node (by label) completed in ``run_id``: its ``node_completed`` events, and a
    fan-out's plain items in ``items_completed`` events (each event commits with the node's row).

    A node committed completed is restored on resume, never run again: a step run twice shows
    here only, since its output, status and ledger rows come out the same."""
    counts: Counter[str] = Counter()
    for e in store.events(run_id):
        if e.kind == "node_completed":
            counts[str(e.node_id) if e.fan_index is None or e.fan_index < 0 else f"{e.node_id}[{e.fan_index}]"] += 1
        elif e.kind == "items_completed":
            counts.update(f"{e.node_id}[{i}]" for i in item_indexes(e.data))
    return counts


def differing_counts(here: Mapping[str, int], want: Mapping[str, int],
                     among: Collection[str] | None = None) -> dict[str, tuple[int, int]]:
    """Labels (of ``among``, default all) completed another number of times in ``here`` than in
    ``want`` (label -> (here, want))."""
    labels = set(here) | set(want) if among is None else among
    return {label: (here.get(label, 0), want.get(label, 0)) for label in sorted(labels)
            if here.get(label, 0) != want.get(label, 0)}


@contextmanager
def kill_and_resume(start: Start, db: str, run_id: str, kills: Sequence[Kill], tmp_path: Path, *,
                    at_kill: Callable[[Kill, Any], None],
                    resting: Collection[RunStatus] = (RunStatus.RUNNING,)) -> Iterator[tuple[crash_driver.Finished,
                                                                                             SqlStore]]:
    """Kill a driver at each of ``kills`` in turn, then resume the run to rest.

    Args:
        start: Starts a driver process: the first creates the run (``resume=False``), every
            later one resumes it once its go file exists.
        db: The run's store.
        run_id: The run.
        kills: One crash point per killed process, in order (at least one).
        tmp_path: Where the go files go.
        at_kill: Called after each kill with the kill and the store's snapshot of the run.
        resting: The run's status once the dead driver's lease expired.

    Yields:
        The last process, exited 0 with a result, and the open store (closed, and every driver
        process stopped, on exit).
    """
    assert kills, "a case kills at least once"
    copy_template(db)  # an empty store, before any driver starts (the first one opens it at once)
    gos = [tmp_path / f"go{i}" for i in range(len(kills))]
    # driver i+1 resumes after kill i; all but the last carry the next crash point
    drivers = [start(fault(kills[i]), True, gos[i - 1]) for i in range(1, len(kills))]
    drivers.append(start(None, True, gos[-1]))
    store = SqlStore(db)
    done_at: list[Counter[str]] = []  # per kill: how often each node had completed
    try:
        killed = crash_driver.finish(start(fault(kills[0]), False, None))
        for i, kill in enumerate(kills):
            if i > 0:
                killed = crash_driver.finish(drivers[i - 1])
            assert killed.returncode == -signal.SIGKILL, f"the driver should die at {fault(kill)}\n" \
                                                         f"{killed.describe()}"
            at_kill(kill, store.snapshot(run_id))
            done_at.append(completion_counts(store, run_id))
            # an outcome's commit may also have ended the run: the last plain step's outcome is
            # committed with the run's end on Ray (Driver._loop), as chaos_sweep allows too
            ended = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.COMPENSATED) if kill[0] == "after_commit" else ()
            at_rest = crash_driver.wait_lease_expired(store, run_id)
            assert at_rest.status in (*resting, *ended), (kill, at_rest.status, at_rest.status_reason)
            gos[i].touch()
        resumed = crash_driver.finish(drivers[-1])
        assert resumed.returncode == 0, resumed.describe()
        assert resumed.result is not None, resumed.describe()
        after = completion_counts(store, run_id)
        for kill, counts in zip(kills, done_at, strict=True):  # a completed node is restored, never run again
            again = differing_counts(after, counts, among=counts)
            assert not again, f"nodes completed at the kill at {fault(kill)} completed again after it " \
                              f"(completions at the end, at the kill): {again}"
        yield resumed, store
    finally:
        for proc in drivers:
            crash_driver.stop(proc)
        store.close()


def rows(db: str, run_id: str) -> tuple[dict[str, str], list[Any]]:
    """A finished run's node statuses by label, and its effect rows (a golden run's record)."""
    store = SqlStore(db)
    try:
        return {n.label: n.status.value for n in store.nodes(run_id)}, store.effects(run_id)
    finally:
        store.close()

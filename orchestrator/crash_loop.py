"""A poison pill: a run whose drivers keep dying before they commit anything is parked, not resumed
forever.

A step that kills the process running it (a segfaulting extension, an out-of-memory kill, an
``os._exit`` in a library) kills the driver when it runs inline, and the next driver to resume
the run runs it again. With a worker fleet that is a crash loop: every worker in turn takes the
run up and dies. (On Ray the step dies in a Ray worker, which the driver sees as a failed attempt,
so its retry policy ends it.)

The store's events tell it: a claim whose previous driver still held the lease (it never let go:
no release, pause, rest or hand-back) says ``abandoned_by``, unless that driver's process provably
still ran on this host (``taken_from_live``: its lease expired while it was silent, a step holding
the GIL; it did not die, and ends the count as a plain claim does); an attempt's outcome (a node
completed, failed, retried or skipped) is progress. When the last ``RunOptions.max_driver_deaths``
drivers (the run's own, recorded when it was created with one, else its driver's) all died
without progress, the run is parked as ``failed`` (``compensation_failed`` in a rollback) naming
the steps that were in flight, and an operator fixes the step and ``raysaga retry``s the run.
Pure but for the read of the events: the driver commits what this returns.

A run still ``pending`` is counted too: its drivers may die between their claim and the run's
first commit (killed by whatever kills them there, every time), and a fleet then took it up for
ever. The count cannot tell a step's own death from a killer outside: any ``max_driver_deaths``
drivers in a row that got nothing committed park the run, which loses nothing (``raysaga retry``
goes on with the same keys), where resuming it again would lose a process each time. Its reason
blames no step: a driver commits ``pending → running`` before it starts one, so none had started.

A worker that drives several runs at once (``--concurrency``) loses all of them when one step
kills it: the death is counted for each, and a healthy neighbour with a long step would be parked
beside the culprit. So a run whose last driver died is a suspect, and a worker drives it alone
(``raysaga.orchestrator.worker``): it claims nothing else until that run commits an attempt's
outcome or its drive ends, so a second death is its own. A suspect that had to wait for its turn
says so (``drive_waits``, then ``drive_alone`` as it starts): a driver that died while its run was
still waiting never ran it, and is not counted (nor does it end the count). So a neighbour is
counted at most the one death that made it a suspect, and the culprit's next deaths are its own.
(On Ray too: a step dies in a Ray worker there, but workflow code still runs in the driver's process.)

A wait runs no code of the workflow: a sleep, an approval whose request is built (its row
``waiting``). A run whose drivers died while only waits were pending (a driver killed by a deploy,
an operator or its host while it held a sleep) is not parked, and a wait is never blamed: it would
have parked a healthy run naming its sleep (``waits_only``).

A take-over of a live driver is neutral in the death count: the driver it took the run from did not
die (the driver that made it may have: it is counted as any other), so a step that *always* holds the GIL
past the lease (run in the driver's process: ``--executor inline``, or ``local=True``) passed from
driver to driver for ever, each running it again under its key. It is bounded beside the deaths
(``live_takeovers_in_a_row``): when the run was taken from a live-but-silent driver more than the
same limit times in a row with no attempt's outcome committed between them (the same ``PROGRESS``),
the claimer parks it as a crash loop is parked, its reason naming the step and the way out (run it
on Ray, or raise ``--lease-ttl``). A take-over of a driver still waiting for its turn alone (see
below) is not counted, nor does it end the count: that driver never ran the step, as one that dies
waiting is no death. Any other claim (a released lease, a death) ends that count:
deaths are the crash loop's to count, exactly as before. The claim that parks is one past the
limit (the limit's take-overs each got their chance to run the step to the end). A ``pending`` run
is not parked so: no step of it had started (a driver commits ``running`` first).

Such a step freezes its driver's whole process, and every run a ``--concurrency`` worker drove in
it was taken over live with it, again wherever the step went: a healthy neighbour would be parked
beside the culprit for a loop it did not cause. So a run taken from a live driver is a suspect too,
driven alone as a dead driver's is (``WAITS``, ``ALONE``, naming ``taken_from_live``): after its
first freeze the step freezes no neighbour, and a neighbour's live count ends at its next outcome.
"""

from __future__ import annotations

import logging
import shlex
import time
from collections.abc import Callable, Iterable, Sequence

from raysaga.orchestrator import tracing
from raysaga.orchestrator.blob_parking import parked, settled
from raysaga.orchestrator.status_text import flat
from raysaga.orchestrator.workflow import Workflow
from raysaga.state import (
    Batch,
    EventRecord,
    Lease,
    NewEvent,
    NodeRecord,
    NodeStatus,
    RunRecord,
    RunStatus,
    RunUpdate,
    Store,
)
from raysaga.state.redact import scrub_text

__all__ = ["ALONE", "LIVE_LOOP", "PROGRESS", "WAITS", "WINDOW", "deaths_in_a_row", "failing_parking", "in_flight",
           "live_takeovers_in_a_row", "park_if_looping", "parking", "recent_deaths", "recent_live_takeovers",
           "silent_parking", "suspects", "waits_only"]

log = logging.getLogger("raysaga.driver")

#: Events that mean an attempt's outcome was committed: the driver before got somewhere.
PROGRESS = frozenset({"node_completed", "items_completed", "node_failed", "node_skipped", "retry_scheduled",
                      "compensation_retry", "approval_requested", "sleep_started", "fanout_expanded", "run_created"})
#: Written by a worker for a suspect run (its last driver died, or was taken over alive but silent):
#: ``WAITS`` when it must wait for its turn to be driven alone, ``ALONE`` as its drive starts with no
#: other run in the process.
WAITS, ALONE = "drive_waits", "drive_alone"
#: How many of the run's events are read at a time, newest first, to count the deaths (a death
#: without progress writes one to three: its successor's claim, a transition, a take-over note).
#: Most counts end in the first page; a larger ``max_driver_deaths`` reads further back.
WINDOW = 100


def deaths_in_a_row(events: Sequence[EventRecord]) -> int:
    """How many drivers in a row died without committing an attempt's outcome, counted back from the
    newest claim in ``events`` (ascending by seq, ending with this driver's own claim)."""
    return _count(events)[0]


def _count(events: Sequence[EventRecord]) -> tuple[int, bool]:
    """(deaths in a row, whether the count is settled: a claim of a released lease or progress
    ended it within ``events``; else older events may add to it)."""
    deaths = 0
    abandoned = False  # the newer claim seen last took the lease from a driver that had died
    started = True  # that driver drove the run (it did not die still waiting for its turn alone)
    alone = False  # an ALONE seen in that driver's time (events are read newest first)
    for event in reversed(events):
        if event.kind == "lease_claimed":
            data = event.data if isinstance(event.data, dict) else {}
            if abandoned and started:
                deaths += 1  # this claim's driver died (the newer claim took its lease) and made no progress
            started, alone = True, False
            if data.get("taken_from_live"):
                # a take-over of a driver whose process still ran (silent past its lease, holding the
                # GIL): that driver did not die, and made no progress either: neutral, the count goes
                # on before it. Ending the count there let a real crash loop (each dying driver first
                # taken over while it froze) run for ever; skipping the claim whole lost the death of
                # the driver that made it when only progress lay before it
                abandoned = False
                continue
            abandoned = bool(data.get("abandoned_by"))
            if not abandoned:
                return deaths, True
        elif event.kind in PROGRESS:
            return deaths, True
        elif event.kind == ALONE:
            alone = True
        elif event.kind == WAITS and not alone:
            started = False  # it died waiting: another run's step killed its process
    return deaths, False


def live_takeovers_in_a_row(events: Sequence[EventRecord]) -> int:
    """How many claims in a row took the run from a live-but-silent driver (``taken_from_live``)
    with no attempt's outcome committed between them, counted back from the newest claim in
    ``events`` (ascending by seq)."""
    return _count_live(events)[0]


def _count_live(events: Sequence[EventRecord]) -> tuple[int, bool]:
    """(live take-overs in a row, whether the count is settled: progress or any other claim — a
    released lease, a death — ended it within ``events``). A take-over of a driver that was still
    waiting for its turn alone (``WAITS``, no ``ALONE``) is not counted, nor does it end the count:
    that driver never ran the run (as ``_count`` does not count it dying so)."""
    takeovers = 0
    taken = False  # the newer claim seen last took the run from a live driver: counted once its time is read
    started = True  # that driver drove the run (it was not taken over still waiting for its turn alone)
    alone = False  # an ALONE seen in that driver's time (events are read newest first)
    for event in reversed(events):
        if event.kind == "lease_claimed":
            if taken and started:
                takeovers += 1
            taken = isinstance(event.data, dict) and bool(event.data.get("taken_from_live"))
            started, alone = True, False
            if not taken:
                return takeovers, True
        elif event.kind in PROGRESS:  # (that driver committed an outcome: it drove the run)
            return takeovers + taken, True
        elif event.kind == ALONE:
            alone = True
        elif event.kind == WAITS and not alone:
            started = False
    return takeovers, False  # (a lower bound: the time of the driver taken over is not read whole)


class _Back:
    """A run's events, read back a ``WINDOW`` at a time (newest first) and shared by both counts:
    a resume reads one page for the two in the common case."""

    def __init__(self, store: Store, run: RunRecord) -> None:
        self.store, self.run_id, self.newest = store, run.run_id, run.event_seq
        self.events: list[EventRecord] = []
        self.read_all = False

    def more(self) -> bool:
        """Read the next older window; False when every event was read already."""
        if self.read_all:
            return False
        oldest = max(0, self.newest - WINDOW)
        self.events = self.store.events(self.run_id, after_seq=oldest, limit=self.newest - oldest) + self.events
        self.newest, self.read_all = oldest, oldest == 0
        return True

    def count(self, counter: Callable[[Sequence[EventRecord]], tuple[int, bool]], enough: int) -> int:
        """``counter`` over the events, read back until it is settled or reaches ``enough``: a fixed
        window never counted more than it holds, so a ``max_driver_deaths`` above ~33 (100 events)
        never parked anything."""
        if not self.events:
            self.more()
        while True:
            found, done = counter(self.events)
            if done or found >= enough or not self.more():
                return found


def recent_deaths(store: Store, run: RunRecord, limit: int) -> int:
    """``deaths_in_a_row`` of the run's events, read back until the count is settled or reaches ``limit``."""
    return _Back(store, run).count(_count, limit)


def recent_live_takeovers(store: Store, run: RunRecord, limit: int) -> int:
    """``live_takeovers_in_a_row`` of the run's events, read back until settled or past ``limit``."""
    return _Back(store, run).count(_count_live, limit + 1)


#: A step's own row in one of these states is settled: it is not ready to start.
SETTLED = frozenset({NodeStatus.COMPLETED, NodeStatus.FAILED, NodeStatus.SKIPPED, NodeStatus.CANCELLED})


def suspects(nodes: Iterable[NodeRecord], wf: Workflow, *, rolling_back: bool = False) -> list[str]:
    """What the dying drivers were running: the nodes recorded in flight, and the steps ready to
    start (a quick step is sent before its row is written, so it may have no row at all): not one
    whose row is settled (a step that failed for good is not started again), and none at all in a
    rollback (``rolling_back``: no forward step starts; a compensation is an effect, recorded
    ``running`` before its call)."""
    rows = list(nodes)
    found = set(in_flight(rows))
    if rolling_back:
        return sorted(found)
    done = {n.node_id for n in rows if n.fan_index < 0 and n.status == NodeStatus.COMPLETED}
    settled = {n.node_id for n in rows if n.fan_index < 0 and n.status in SETTLED}
    found |= {name for name, spec in wf.steps.items() if name not in settled and all(d in done for d in spec.deps)}
    return sorted(found)


def waits_only(nodes: Iterable[NodeRecord], wf: Workflow) -> set[str]:
    """The steps among ``wf``'s that only wait, running no code of the workflow: a sleep, and an
    approval whose request is built (each open row of it ``waiting``, none ``running``). Their
    labels too (``step[3]``): ``in_flight`` names rows by label."""
    rows = list(nodes)
    waiting = {name for name, spec in wf.steps.items() if spec.kind == "sleep"}
    for name, spec in wf.steps.items():
        open_rows = [n for n in rows if n.node_id == name and n.status not in SETTLED]
        if spec.kind == "approval" and open_rows and all(n.status == NodeStatus.WAITING for n in open_rows):
            waiting.add(name)
    return waiting | {n.label for n in rows if n.node_id in waiting}


def in_flight(nodes: Iterable[NodeRecord]) -> list[str]:
    """The nodes recorded ``running``: they had started when the driver died."""
    return sorted({n.label for n in nodes if n.status == NodeStatus.RUNNING})


def _names(found: list[str]) -> str:
    return ", ".join(found[:10]) + (" ..." if len(found) > 10 else "")


def parking(status: RunStatus, deaths: int, suspected: list[str], run_id: str, *,
            running: list[str] | None = None, started: bool = True, cause: object = None,
            nodes: Iterable[NodeRecord] = ()) -> tuple[bool, Batch]:
    """``blob_parking.parked`` for a crash loop: the reason names the steps and the way out.

    ``running`` (of ``suspected``) were recorded in flight; the others were ready to start (one may
    have started: a quick step has no row before it ends). ``started`` False: the run was still
    ``pending``, and a driver commits ``running`` before it starts any step, so no step ran under
    any of the dead drivers: the reason says so and blames none, and the error says
    ``"started": False`` (its ``suspects`` stay the steps that were to start, as the field always
    listed in-flight-or-ready steps, for the readers of it). In a rollback (``compensating``) the
    way out is ``retry --compensations``, and the error keeps the run's forward failure as its
    ``cause`` (``sagas.rollback.forward_cause``: a compensated run ends with it). ``nodes``: the
    run's rows; those left ``running`` or ``retrying`` are settled ``cancelled`` in the batch
    (``blob_parking.settled``): a parked run showed the step that killed its drivers under way."""
    drivers = "its last driver" if deaths == 1 else f"the last {deaths} drivers of this run"
    retry = f"raysaga retry {shlex.quote(run_id)}" + (" --compensations" if status == RunStatus.COMPENSATING else "")
    if not started:
        reason = (f"crash loop: {drivers} died before the run's first commit: no step had started (the run was "
                  f"still pending; its first steps, {_names(suspected)}, never ran), so no step is to blame: "
                  f"the process was killed before any step (out of memory, a deploy, a lost host) or died "
                  f"reading the run. Find what killed it, then `{retry}`")[:1000]
        error = {"type": "CrashLoop", "message": reason, "deaths": deaths, "suspects": suspected[:50],
                 "started": False}
        return parked(status, reason, error, NewEvent(kind="crash_loop", data={"deaths": deaths,
                                                                              "suspects": suspected[:50]}), nodes)
    flying = [name for name in suspected if name in set(running or [])]
    ready = [name for name in suspected if name not in set(flying)]
    where = "; ".join([*([f"in flight: {_names(flying)}"] if flying else []),
                       *([f"ready to start, perhaps started: {_names(ready)}"] if ready else [])])
    reason = (f"crash loop: {drivers} died before committing any step's outcome "
              f"({where or 'no step was in flight'}); a step may be killing its process. Fix it (or run it on "
              f"Ray, where its death is a failed attempt), then `{retry}`")[:1000]
    error = {"type": "CrashLoop", "message": reason, "deaths": deaths, "suspects": suspected[:50]}
    if cause is not None and status == RunStatus.COMPENSATING:
        error["cause"] = cause
    return parked(status, reason, error, NewEvent(kind="crash_loop", data={"deaths": deaths,
                                                                          "suspects": suspected[:50]}), nodes)


def failing_parking(status: RunStatus, failures: int, error: str, run_id: str,
                    nodes: Iterable[NodeRecord] = ()) -> tuple[bool, Batch]:
    """``blob_parking.parked`` for a run whose last ``failures`` drives all ended in the same kind of
    error before it could be driven (a run row no driver can read, a bug): the driver let go each
    time, so no death is counted, and without this a worker claimed it again at once, for ever.
    A long error is cut at a sentence (else a word) and says so; the way out after it stays whole.
    ``nodes``: the run's rows, those in flight settled as ``parking`` does."""
    error = scrub_text(error)  # before it is cut: a cut secret is a piece no scrub finds whole
    head, advice = f"parked after {failures} drives in a row failed: ", \
        f"; fix what it names, then `raysaga retry {shlex.quote(run_id)}`"
    reason = head + cut(error, 1000 - len(head) - len(advice)) + advice
    return parked(status, reason, {"type": "DriveFailed", "message": reason, "failures": failures},
                  NewEvent(kind="drive_failed", data={"failures": failures, "error": cut(error, 500)}), nodes)


#: The ``crash_loop`` field of a parking's error and the kind of its event when live take-overs looped.
LIVE_LOOP = "live_takeover_loop"


def silent_parking(status: RunStatus, takeovers: int, suspected: list[str], run_id: str, ttl: float, *,
                   running: list[str] | None = None, cause: object = None,
                   nodes: Iterable[NodeRecord] = ()) -> tuple[bool, Batch]:
    """``blob_parking.parked`` for a run taken from live-but-silent drivers ``takeovers`` times in a
    row without progress: a step holding the GIL past the lease (``ttl``: this driver's) in the
    driver's process. The error's type stays ``CrashLoop`` (a parking, not the run's own failure:
    ``sagas.rollback.PARKING_ERRORS`` unwraps its ``cause`` in a rollback, as ``parking``'s), its
    ``crash_loop`` field ``LIVE_LOOP``; its reason, its event and the rows it leaves in flight
    (settled ``cancelled``, as ``parking`` does) say what happened, not "a crash loop"."""
    flying = [name for name in suspected if name in set(running or [])]
    ready = [name for name in suspected if name not in set(flying)]
    where = "; ".join([*([f"running: {_names(flying)}"] if flying else []),
                       *([f"ready to start, perhaps started: {_names(ready)}"] if ready else [])])
    retry = f"raysaga retry {shlex.quote(run_id)}" + (" --compensations" if status == RunStatus.COMPENSATING else "")
    reason = (f"live takeover loop: this run was taken over {takeovers} times in a row from drivers alive but "
              f"silent (their lease expired while their process still ran), with no step's outcome committed in "
              f"between ({where or 'no step was recorded running'}): a step holding the GIL longer than the lease "
              f"starves the driver's heartbeat, and each driver ran it again under the same key (with "
              f"--concurrency, the step may be another run's in the same worker). Run that step on Ray "
              f"(--executor ray, and not local=True), or raise --lease-ttl (this driver's: {ttl:g}s) above its "
              f"longest GIL-holding stretch, then `{retry}`")[:1000]
    error = {"type": "CrashLoop", "crash_loop": LIVE_LOOP, "message": reason, "deaths": 0,
             "live_takeovers": takeovers, "suspects": suspected[:50]}
    if cause is not None and status == RunStatus.COMPENSATING:
        error["cause"] = cause
    resume_first, batch = parked(status, reason, error, NewEvent(kind=LIVE_LOOP, data={
        "live_takeovers": takeovers, "suspects": suspected[:50], "lease_ttl": ttl}))
    # settled as a crash loop's rows are, but named for what happened (``PARKED_FOR`` would say "a crash loop")
    return resume_first, batch.model_copy(update={"nodes": settled(nodes, {"type": LIVE_LOOP}, time.time())})


def cut(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: whole, or cut after its last sentence (or word)
    that fits, then `` (...)``. Cut at a fixed length, a reason ended mid-word, its advice half said."""
    if len(text) <= limit:
        return text
    room = max(0, limit - len(" (...)"))
    sentence = text.rfind(". ", 0, room + 1)
    space = text.rfind(" ", 0, room + 1)
    end = sentence + 1 if sentence >= room // 2 else space if space >= room // 2 else room  # (a long token: cut in it)
    return text[:end].rstrip(" ,;:") + " (...)"


def park_if_looping(store: Store, lease: Lease, run: RunRecord, nodes: Iterable[NodeRecord], wf: Workflow,
                    limit: int) -> RunRecord | None:
    """Park the run (and return it) when its last ``limit`` drivers died without progress, or when
    it was taken from live-but-silent drivers more than ``limit`` times in a row without progress;
    else None. A run claimed once (fence 1: this driver's own claim) has had no driver to lose:
    nothing is read for it. A ``pending`` one is counted like any other for deaths (see the module doc).

    ``limit`` is the driving process's (a worker's ``--max-driver-deaths``); the run's own
    ``max_driver_deaths``, recorded when it was created with one, wins over it: a run submitted
    with ``RunOptions(max_driver_deaths=5)`` is parked after 5 whichever worker drives it."""
    if run.fence <= 1:
        return None
    limit = run.max_driver_deaths or limit
    back, rows = _Back(store, run), list(nodes)
    deaths = back.count(_count, limit)
    rolling_back = run.status == RunStatus.COMPENSATING
    cause = run.error.as_dict() if rolling_back and run.error is not None else None
    if deaths >= limit:
        def crash(blamed: list[str], running: list[str]) -> tuple[bool, Batch]:
            return parking(run.status, deaths, blamed, run.run_id, running=running,
                           started=run.status != RunStatus.PENDING, cause=cause, nodes=rows)

        return _park(store, lease, run, rows, wf, deaths, crash)
    if run.status == RunStatus.PENDING:
        return None  # no step had started: a driver commits ``running`` before it starts one
    takeovers = back.count(_count_live, limit + 1)
    if takeovers <= limit:
        return None

    def silent(blamed: list[str], running: list[str]) -> tuple[bool, Batch]:
        return silent_parking(run.status, takeovers, blamed, run.run_id, lease.ttl, running=running, cause=cause,
                              nodes=rows)

    return _park(store, lease, run, rows, wf, takeovers, silent)


def _park(store: Store, lease: Lease, run: RunRecord, rows: list[NodeRecord], wf: Workflow, count: int,
          batch_of: Callable[[list[str], list[str]], tuple[bool, Batch]]) -> RunRecord | None:
    """Commit the parking ``batch_of`` builds (given the steps blamed and those recorded running),
    blaming the steps in flight or ready, never a wait: a run whose last ``count`` drivers were lost
    while it only waited is not parked, it goes on (None)."""
    rolling_back, started = run.status == RunStatus.COMPENSATING, run.status != RunStatus.PENDING
    suspected = suspects(rows, wf, rolling_back=rolling_back)
    blamed = suspected if rolling_back or not started else sorted(set(suspected) - waits_only(rows, wf))
    if suspected and not blamed:  # only waits pending: no code of the run was running when they were lost
        log.warning("run %s: its last %d drivers were lost while it only waited (%s): not a loop, it goes on",
                    run.run_id, count, _names(suspected))
        return None
    resume_first, batch = batch_of(blamed, in_flight(rows))
    # before the driver has a tracer: the park's ``run`` span (its trace's root) is written here
    commit = tracing.traced(store, run.run_id, lease.owner, lambda b: store.commit(lease, b), wf)
    if resume_first:
        commit(Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
    log.error("run %s: %s", run.run_id, flat(batch.run.status_reason or "") if batch.run else "parked")
    return commit(batch) or store.get_run(run.run_id)

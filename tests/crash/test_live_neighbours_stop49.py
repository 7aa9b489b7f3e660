"""A step that holds the GIL past the lease freezes no neighbour after its first time.

Such a step (inline, or ``local=True``) freezes its driver's whole process: in a ``--concurrency``
worker every run driven there went silent with it and was taken over live (``taken_from_live``),
and wherever the step went next it froze its neighbours again. A healthy run with steps longer
than the lease was taken over live again and again with no outcome between, and parked as a "live
takeover loop" beside the culprit; the fleet lost its neighbours' work each time. Now a run taken
from a live driver is a suspect, as one whose driver died is: the worker that claims it drives it
alone (``drive_waits`` / ``drive_alone``, naming ``taken_from_live``) until it commits an outcome
or its drive ends, and claims are made one at a time in a process, so no second run slips in
beside a suspect about to start.

Also the older gap of the death count: a driver that took a run over live and then really died
was not counted when only live claims lay between it and the last progress.

Real worker processes (inline, a 1 s lease) and real SQLite files and PostgreSQL databases.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Client, Workflow
from raysaga.orchestrator import crash_loop
from raysaga.orchestrator.worker import HAND_BACK, Worker
from raysaga.state import (
    Batch,
    EventRecord,
    Lease,
    NewEvent,
    NodeStatus,
    NodeWrite,
    RunRecord,
    RunStatus,
    RunUpdate,
    SqlStore,
)
from raysaga.state import claims as claim_rows
from tests.support import REPO, live_takeover_flows
from tests.support import live_neighbour_flows as flows
from tests.support.crash_driver import wait_until
from tests.support.live_takeover_procs import live_owners, stop_all
from tests.support.worker_procs import dead_owner

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs Linux /proc")

LIMIT = 3  # RunOptions.max_driver_deaths' default, which the workers use
HOLD = 2.0  # seconds the hog holds the GIL at a time (until taken over): two leases
STEP_S = 1.5  # seconds each healthy step takes: longer than the lease
HEALTHY = 5  # with the hog, one per slot of the two workers


# ---------------------------------------------------------------------- two real workers, --concurrency 3


def _worker(db: str, log_dir: Path, n: int) -> subprocess.Popen[str]:
    module = flows.__name__
    args = [sys.executable, "-m", "raysaga", "worker", "--db", db, "--executor", "inline", "--lease-ttl", "1",
            "--poll", "0.05", "--concurrency", "3", "-w", f"{module}:hog", "-w", f"{module}:healthy"]
    err_path = log_dir / f"worker{n}.err"
    with err_path.open("w") as err:
        proc = subprocess.Popen(args, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, text=True,
                                stdout=subprocess.PIPE, stderr=err)
    assert proc.stdout is not None
    banner = proc.stdout.readline()  # printed once its signal handlers are in place ('' if it died)
    assert banner.startswith("worker "), (banner, err_path.read_text())
    return proc


def _running(log_dir: Path) -> dict[int, set[str]]:
    """Per process, the healthy runs whose step started there and has not ended there."""
    open_: dict[tuple[int, str, str], int] = {}
    for mark in flows.marks(log_dir):
        if mark.what in ("start", "end"):
            key = (mark.pid, mark.run, mark.step)
            open_[key] = open_.get(key, 0) + (1 if mark.what == "start" else -1)
    found: dict[int, set[str]] = {}
    for (pid, run, _), n in open_.items():
        if n > 0:
            found.setdefault(pid, set()).add(run)
    return found


def _at_gate(log_dir: Path) -> int | None:
    """The process whose hog waits at the gate, once it does."""
    text = (log_dir / flows.AT_GATE).read_text() if (log_dir / flows.AT_GATE).exists() else ""
    return int(text) if text else None


def _beside(marks: list[flows.Mark], hold: flows.Mark) -> list[str]:
    """The healthy steps in flight in the hog's process as it began to hold the GIL (``hold``):
    started there before it and not ended before it."""
    found = []
    for start in [m for m in marks if m.what == "start" and m.pid == hold.pid and m.at <= hold.at]:
        same = [m for m in marks if m.run == start.run and m.step == start.step and m.pid == hold.pid]
        starts = [m for m in same if m.what == "start"]
        ends = [m for m in same if m.what == "end"]
        k = starts.index(start)  # (the k-th start there pairs with the k-th end there)
        if k >= len(ends) or ends[k].at > hold.at:
            found.append(f"{start.run}.{start.step}")
    return found


def _open_gate(log_dir: Path) -> bool:
    try:
        fd = os.open(log_dir / flows.GATE, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: the hog has not opened it yet
        return False
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
    return True


def _claims(events: list[EventRecord]) -> list[int]:
    return [i for i, e in enumerate(events) if e.kind == "lease_claimed"]


def test_a_gil_hog_freezes_its_neighbours_once_and_is_parked_alone(own_store_url: str, tmp_path: Path) -> None:
    """Two workers drive the hog and five healthy runs, one a slot. The hog freezes its worker (its
    first start waits until every healthy run has a step in flight) until the other takes it over;
    from then on every driver that takes it over drives it alone, so it freezes nobody else, and it
    is parked at its fourth live takeover in a row. Every healthy run completes. Before the fix the
    hog went from worker to worker beside whatever they drove, its neighbours frozen and taken over
    live with it (parked with it when no outcome of theirs came between)."""
    db = own_store_url
    store = SqlStore(db)
    workers: list[subprocess.Popen[str]] = []
    names = [f"healthy-{n}" for n in range(HEALTHY)]
    try:
        workers = [_worker(db, tmp_path, n) for n in range(2)]  # both up first: a slow start moves nothing
        hog_id = raysaga.create_run(flows.hog, {"log_dir": str(tmp_path), "hold": HOLD, "db": db}, store=store,
                                    run_id="hog", queue="default").run_id  # the oldest: claimed first
        for name in names:
            raysaga.create_run(flows.healthy, {"log_dir": str(tmp_path), "name": name, "step_s": STEP_S},
                               store=store, run_id=name, queue="default")
        # the hog waits at its gate, a healthy step in flight beside it, and every other slot drives one
        wait_until(lambda: (pid := _at_gate(tmp_path)) is not None and len(_running(tmp_path).get(pid, ())) == 2
                   and sum(map(len, _running(tmp_path).values())) == HEALTHY, timeout=60,
                   what="the hog at its gate beside two healthy runs, the other three in the other worker")
        wait_until(lambda: _open_gate(tmp_path), timeout=60, what="the hog's gate opened")

        def settled() -> bool:
            runs = [store.get_run(run_id) for run_id in [hog_id, *names]]
            return all(r.status in (RunStatus.COMPLETED, RunStatus.FAILED) for r in runs)

        try:
            wait_until(settled, timeout=240, what="the hog parked and every healthy run settled", interval=0.1)
        except AssertionError as exc:
            logs = "\n".join((tmp_path / f"worker{n}.err").read_text()[-3000:] for n in range(2))
            raise AssertionError(f"{exc}\n{logs}") from None
        logs = "\n".join((tmp_path / f"worker{n}.err").read_text()[-3000:] for n in range(2))
        for name in names:  # none parked beside the hog
            run = store.get_run(name)
            assert run.status == RunStatus.COMPLETED, (name, run.status_reason, logs)
            assert run.output == {"three": 3}
            kinds = [e.kind for e in store.events(name)]
            assert crash_loop.LIVE_LOOP not in kinds and "crash_loop" not in kinds, (name, kinds)
        parked = store.get_run(hog_id)
        assert parked.status == RunStatus.FAILED, (parked.status_reason, logs)
        assert parked.error is not None and parked.error.as_dict()["crash_loop"] == crash_loop.LIVE_LOOP
        assert (parked.status_reason or "").startswith(f"live takeover loop: this run was taken over {LIMIT + 1} "
                                                       "times in a row"), parked.status_reason
        # the hog's events: every claim after the first took it from a live driver, and each driver
        # that took it drove it alone (or, on SQLite, lost it while it still waited for its turn:
        # the frozen process held the database's write lock, and its lease could not be renewed)
        events = store.events(hog_id)
        claims = _claims(events)
        owners = [events[i].data["owner"] for i in claims]
        live = [i for i in claims[1:] if (events[i].data or {}).get("taken_from_live")]
        # (a claim that is not live: a slot taking its own lease up again after the store dropped out)
        again = [i for k, i in enumerate(claims[1:], 1) if i not in live and owners[k] == owners[k - 1]]
        assert len(live) + len(again) == len(claims) - 1 and len(live) >= LIMIT + 1, [events[i].data for i in claims]
        times = []  # (pid, from, to, when it was alone or None) of each live takeover's driver
        for k, i in enumerate(claims):
            if i not in live:
                continue
            end = next((claims[m] for m in range(k + 1, len(claims)) if owners[m] != owners[k]), len(events))
            kinds = [e.kind for e in events[i:end]]
            alone = [e for e in events[i:end] if e.kind == crash_loop.ALONE]
            assert alone or crash_loop.WAITS in kinds, kinds
            assert [e.data["taken_from_live"] for e in alone] in ([], [events[i].data["taken_from_live"]])
            times.append((int(events[i].data["owner"].split(":")[1]), events[i].at,
                          events[end].at if end < len(events) else float("inf"), alone[0].at if alone else None))
        # it held the GIL beside nobody but the first time, when healthy steps froze with it
        marks = flows.marks(tmp_path)
        holds = [m for m in marks if m.what == "hold"]
        assert 2 <= len(holds) <= LIMIT + 1, holds  # (each driver that ran it was taken over, counted)
        assert _beside(marks, holds[0]), marks
        assert [_beside(marks, h) for h in holds[1:]] == [[]] * (len(holds) - 1), marks
        for hold in holds[1:]:  # in the time of a driver that took it over live, driving it alone
            [(_, _, _, alone_at)] = [t for t in times if t[0] == hold.pid and t[1] <= hold.at < t[2]]
            assert alone_at is not None and alone_at <= hold.at, (hold, times)
    finally:
        stop_all(workers)
        store.close()


# ---------------------------------------------------------------------- one worker, in this process


held = threading.Event()
order: list[str] = []

plain = Workflow("stop49_plain", version="1")


@plain.step()
def long_step(input: dict[str, Any]) -> int:
    order.append("plain starts")
    held.wait(60)
    order.append("plain ends")
    return 1


@plain.step()
def next_step(input: dict[str, Any], long_step: int) -> int:
    return long_step + 1


silent = Workflow("stop49_silent", version="1")


@silent.step()
def quick(input: dict[str, Any]) -> str:
    order.append("suspect runs")
    return "ok"


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    held.clear()
    order.clear()
    opened = SqlStore(store_url)
    yield opened
    held.set()
    opened.close()


def _kinds(store: SqlStore, run_id: str) -> list[str]:
    return [e.kind for e in store.events(run_id)]


def test_a_run_taken_from_a_live_driver_waits_to_be_driven_alone(store: SqlStore) -> None:
    """The worker drives a plain run whose step is held when a run of a live-but-silent driver
    becomes claimable: it claims it, says it waits (naming the owner it was taken from), hands the
    plain run back at its step boundary, and starts the taken run alone once the plain one is gone."""
    tag = uuid.uuid4().hex[:8]
    with Client(store) as client:
        plain_id = client.submit(plain, {}, run_id=f"plain-{tag}").run_id
        taken_id = client.submit(silent, {}, run_id=f"taken-{tag}").run_id
    with live_owners(2) as (frozen, silent_owner):
        store.claim(taken_id, frozen, 60)  # a driver holds it: not claimable yet
        worker = Worker([plain, silent], store, concurrency=2, executor="inline", poll=0.05)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        try:
            wait_until(lambda: "plain starts" in order, timeout=60, what="the plain run's step to start")
            # its driver froze; the one that took it over froze too, its lease lapsed at once: alive both
            store.claim(taken_id, silent_owner, -1.0, take_from=frozen)
            wait_until(lambda: crash_loop.WAITS in _kinds(store, taken_id), timeout=60,
                       what="the taken run to wait for its turn alone")
            assert "suspect runs" not in order
            held.set()
            wait_until(lambda: store.get_run(taken_id).status == RunStatus.COMPLETED
                       and store.get_run(plain_id).status == RunStatus.COMPLETED, timeout=60, what="both runs done")
        finally:
            held.set()
            worker.stop()
            thread.join(timeout=60)
    assert not thread.is_alive()
    assert order == ["plain starts", "plain ends", "suspect runs"]
    events = store.events(taken_id)
    [claimed] = [e.data for e in events if e.kind == "lease_claimed" and (e.data or {}).get("worker")]
    assert claimed["taken_from_live"] == silent_owner and "abandoned_by" not in claimed
    assert [e.data for e in events if e.kind == crash_loop.WAITS] == [{"taken_from_live": silent_owner,
                                                                       "driving": [plain_id]}]
    [alone] = [e.data for e in events if e.kind == crash_loop.ALONE]
    assert alone["taken_from_live"] == silent_owner and "abandoned_by" not in alone
    assert [e.kind for e in events].index(crash_loop.ALONE) > [e.kind for e in events].index(crash_loop.WAITS)
    assert [h["signal"] for h in (e.data for e in store.events(plain_id) if e.kind == "driver_interrupted")] \
        == [HAND_BACK]
    assert worker.counts.handed_back == 1 and worker.counts.completed == 2


SUSPECTS = 3

twins = Workflow("stop49_twins", version="1")


@twins.step()
def first(input: dict[str, Any]) -> int:
    return 1


@twins.step()
def second(input: dict[str, Any], first: int) -> int:
    return first + 1


def test_a_worker_claims_no_second_suspect_before_its_first_proves_itself(store: SqlStore) -> None:
    """Suspects are claimable as a worker starts: its slots claimed them at once, and the others
    waited in the process the first might freeze or kill (taken over live again there, a neighbour's
    count went on). Claims are one at a time now, and a suspect counts as waiting as it is claimed:
    each is claimed only after the one before committed an outcome of its own."""
    tag = uuid.uuid4().hex[:8]
    with Client(store) as client:
        ids = [client.submit(twins, {}, run_id=f"twin{n}-{tag}").run_id for n in range(SUSPECTS)]
    for n, run_id in enumerate(ids):
        store.claim(run_id, f"dead-{n}", -1.0)  # its driver died holding it: claimable, a suspect
    worker = Worker([twins], store, concurrency=SUSPECTS, executor="inline", poll=0.05)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: all(store.get_run(r).status == RunStatus.COMPLETED for r in ids), timeout=60,
                   what="both runs done")
    finally:
        worker.stop()
        thread.join(timeout=60)
    assert not thread.is_alive()

    def claimed_at(run_id: str) -> float:  # its first claim by the worker (a run handed back is claimed again)
        return min(e.at for e in store.events(run_id) if e.kind == "lease_claimed" and (e.data or {}).get("worker"))

    def proven_at(run_id: str) -> float:
        return min(e.at for e in store.events(run_id) if e.kind in crash_loop.PROGRESS and e.at >= claimed_at(run_id))

    ordered = sorted(ids, key=claimed_at)
    for before, after in itertools.pairwise(ordered):
        assert claimed_at(after) >= proven_at(before), "a suspect was claimed before the one before proved itself"
    for run_id in ids:
        assert crash_loop.ALONE in _kinds(store, run_id)


def test_a_suspect_names_what_it_was_taken_from() -> None:
    from raysaga.orchestrator.worker import suspect_of  # (here: the module's other tests run on older code too)

    lease = Lease(run_id="r", owner="w", fence=2, expires_at=0.0, ttl=1.0)

    def claim(abandoned_by: str | None = None, taken_from_live: str | None = None) -> claim_rows.Claim:
        return claim_rows.Claim(lease=lease, workflow="wf", reason="takeover", latency=0.0,
                                abandoned_by=abandoned_by, taken_from_live=taken_from_live)

    assert suspect_of(claim(abandoned_by="a")) == {"abandoned_by": "a"}
    assert suspect_of(claim(taken_from_live="b")) == {"taken_from_live": "b"}
    assert suspect_of(claim()) == {}


# ---------------------------------------------------------------------- the older gap of the death count


def _claim(seq: int, **data: str) -> EventRecord:
    return EventRecord(run_id="r", seq=seq, at=float(seq), kind="lease_claimed", data={"owner": f"o{seq}", **data})


def _event(seq: int, kind: str, **data: str) -> EventRecord:
    return EventRecord(run_id="r", seq=seq, at=float(seq), kind=kind, data=dict(data))


def test_a_driver_that_took_a_run_over_live_and_died_is_counted() -> None:
    # progress, a live takeover, then that driver died: its death was lost (the count skipped its claim
    # and stopped at the progress before it)
    events = [_claim(1), _event(2, "node_completed"), _claim(3, taken_from_live="o1"), _claim(4, abandoned_by="o3")]
    assert crash_loop.deaths_in_a_row(events) == 1
    # the driver taken over live did not die: no death for it, and the count goes on before it
    assert crash_loop.deaths_in_a_row([_claim(1), _claim(2, abandoned_by="o1"), _claim(3, taken_from_live="o2")]) == 1
    # it died waiting for its turn alone (another run's step killed its process): not counted
    waited = [*events[:3], _event(4, crash_loop.WAITS, taken_from_live="o1"), _claim(5, abandoned_by="o3")]
    assert crash_loop.deaths_in_a_row(waited) == 0
    started = [*waited[:4], _event(5, crash_loop.ALONE, taken_from_live="o1"), _claim(6, abandoned_by="o3")]
    assert crash_loop.deaths_in_a_row(started) == 1
    # the live claims after progress are no deaths of their own
    assert crash_loop.deaths_in_a_row([_claim(1), _event(2, "node_completed"), _claim(3, taken_from_live="o1"),
                                       _claim(4, taken_from_live="o3")]) == 0


def test_a_live_takeover_of_a_driver_still_waiting_is_not_counted() -> None:
    def live(seq: int) -> EventRecord:
        return _claim(seq, taken_from_live=f"o{seq - 1}")

    ran = [_claim(1), _event(2, "node_completed"), live(3), _event(4, crash_loop.ALONE), live(5)]
    assert crash_loop.live_takeovers_in_a_row(ran) == 2
    # the driver of claim 3 waited for its turn alone and was taken over still waiting: it never ran
    waited = [*ran[:3], _event(4, crash_loop.WAITS), live(5)]
    assert crash_loop.live_takeovers_in_a_row(waited) == 1
    # nor does that end the count: the takeovers before it add up
    assert crash_loop.live_takeovers_in_a_row([*waited, _event(6, crash_loop.ALONE), live(7)]) == 2
    # it waited, then drove the run alone: counted
    assert crash_loop.live_takeovers_in_a_row([*waited[:4], _event(5, crash_loop.ALONE), live(6)]) == 2


def _chain(store: SqlStore, run: RunRecord, owners: list[str], start: float) -> claim_rows.Claim:
    """Each of ``owners`` in turn claims the run from the one before, its lease lapsed."""
    claim = None
    for k, owner in enumerate(owners):
        claim = claim_rows.claim_next(store.engine, owner, 15, {run.workflow_name: run.definition_hash},
                                      now=start + 60 * k)
        assert claim is not None and claim.lease.run_id == run.run_id, k
    assert claim is not None
    return claim


def test_deaths_after_a_live_takeover_park_the_run_at_the_limit(store_url: str, tmp_path: Path) -> None:
    """The first driver completes ``prep`` and freezes in ``hog``; the next takes the run over live
    and dies, and so do the two after it: three deaths in a row, parked. The first of them was not
    counted, and the loop went on one death longer than the limit."""
    name = f"stop49_gap_{uuid.uuid4().hex[:8]}"
    wf = live_takeover_flows.make_hog(name)
    store = SqlStore(store_url)
    try:
        run = raysaga.create_run(wf, {"log_dir": str(tmp_path), "hold": HOLD}, store=store, run_id=f"{name}-r",
                                 queue="default")
        with live_owners(2) as owners:
            start = time.time() + 60
            first = _chain(store, run, owners[:1], start)
            store.commit(first.lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
            store.commit(first.lease, Batch(events=[NewEvent(kind="node_completed", node_id="prep")], nodes=[
                NodeWrite(node_id="prep", status=NodeStatus.COMPLETED, attempt=1, output="ready"),
                NodeWrite(node_id="hog", status=NodeStatus.RUNNING, attempt=1)]))
            gone = [dead_owner() for _ in range(LIMIT)]
            claim = _chain(store, run, [*gone, owners[1]], start + 60)
            claims = [e.data for e in store.events(run.run_id) if e.kind == "lease_claimed"]
            assert claims[1]["taken_from_live"] == owners[0]
            assert [c.get("abandoned_by") for c in claims[2:]] == gone
            current = store.get_run(run.run_id)
            assert crash_loop.recent_deaths(store, current, LIMIT) == LIMIT
            parked = crash_loop.park_if_looping(store, claim.lease, current, store.nodes(run.run_id), wf, LIMIT)
        assert parked is not None and parked.status == RunStatus.FAILED
        assert parked.error is not None and parked.error.as_dict()["deaths"] == LIMIT
        assert (parked.status_reason or "").startswith(f"crash loop: the last {LIMIT} drivers of this run died")
    finally:
        store.close()

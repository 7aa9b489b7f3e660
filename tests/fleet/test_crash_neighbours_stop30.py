"""A poison pill's neighbour in a ``raysaga worker --concurrency 2`` process is not parked with it.

One worker (inline executor, two slots, a short lease) drives two runs; whenever it dies the
test starts another, as a supervisor would. ``pill``'s step SIGKILLs its process; ``slow``'s first
step is long and harmless. The test holds each step at its start (a FIFO the step reads) and lets
it go only when the case is the one asked for:

- the pill kills its process only while ``slow``'s step is in flight in that process too (the
  neighbour shares every death), or when the pill is driven alone;
- ``slow``'s step finishes only once the pill is parked, or when ``slow`` is driven alone.

Before the fix every death counted for both runs: after 3, ``slow`` was parked as a crash loop
naming its own step ``crawl``, though the pill killed every process. Now a run whose last driver
died is driven alone (``raysaga.orchestrator.worker``): the pill dies alone and is parked naming
``swallow``, and ``slow`` completes. The FIFOs make each case certain without a sleep: a step
blocks in ``open`` until the test opens the other end.
"""

from __future__ import annotations

import contextlib
import os
import signal
import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from raysaga import Client, Workflow
from raysaga.orchestrator import crash_loop
from raysaga.state import EventRecord, RunStatus, SqlStore
from tests.support.crash_driver import wait_until
from tests.support.kept_worker import KeptWorker

MODULE = "tests.fleet.test_crash_neighbours_stop30"
DEATHS = 3  # RunOptions().max_driver_deaths


class Held(BaseModel):
    folder: str


def held_here(folder: str, name: str) -> None:
    """Block until the test lets this step go: ``<name>-<pid>`` is a FIFO the step opens to read
    (the open returns once the test opens it to write); ``<name>-<pid>.at`` says the step waits."""
    fifo = Path(folder) / f"{name}-{os.getpid()}"
    with contextlib.suppress(FileExistsError):
        os.mkfifo(fifo)
    fifo.with_suffix(".at").touch()
    with fifo.open("rb") as fh:
        fh.read(1)


pill = Workflow("stop30_pill", version="1")


@pill.step()
def swallow(input: Held) -> str:
    held_here(input.folder, "die")
    os.kill(os.getpid(), signal.SIGKILL)
    return "never"


slow = Workflow("stop30_slow", version="1")


@slow.step()
def crawl(input: Held) -> int:
    held_here(input.folder, "go")
    return 1


@slow.step()
def after(input: Held, crawl: int) -> int:
    return crawl + 1



def one_worker(db: str, folder: Path, *extra: str) -> KeptWorker:
    """A worker (``--concurrency 2``, both workflows, unless ``extra`` says) kept alive."""
    return KeptWorker(db, folder, *(extra or ("--concurrency", "2", "-w", f"{MODULE}:pill", "-w", f"{MODULE}:slow")))


def let_go(fifo: Path) -> bool:
    """Open the step's FIFO to write (it waits there to read): False while it is not open yet."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:  # ENXIO: the step has not opened it yet
        return False
    try:
        os.write(fd, b"x")
    finally:
        os.close(fd)
    return True


def alone_now(events: list[EventRecord]) -> bool:
    """The run's current driver (since its newest claim) drives it alone."""
    claims = [i for i, e in enumerate(events) if e.kind == "lease_claimed"]
    return bool(claims) and any(e.kind == crash_loop.ALONE for e in events[claims[-1]:])


def test_a_pill_does_not_park_the_healthy_run_it_shares_a_worker_with(fleet_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "held"
    folder.mkdir()
    tag = uuid.uuid4().hex[:6]
    with Client(fleet_url) as client:
        pill_id = client.submit(pill, {"folder": str(folder)}, run_id=f"pill-{tag}").run_id
        slow_id = client.submit(slow, {"folder": str(folder)}, run_id=f"slow-{tag}").run_id
    store = SqlStore(fleet_url)
    released: set[str] = set()
    worker = one_worker(fleet_url, tmp_path)

    def step() -> bool:
        pill_run, slow_run = store.get_run(pill_id), store.get_run(slow_id)
        pill_alone, slow_alone = alone_now(store.events(pill_id)), alone_now(store.events(slow_id))
        for at in sorted(folder.glob("*.at")):
            fifo, pid = at.with_suffix(""), at.stem.split("-")[1]
            if fifo.name in released:
                continue
            if fifo.name.startswith("die-"):  # the pill: beside slow's step, or alone
                allowed = ((folder / f"go-{pid}.at").exists() and f"go-{pid}" not in released) or pill_alone
            else:  # slow's step: once the pill is parked, or alone
                allowed = pill_run.status == RunStatus.FAILED or slow_alone
            if allowed and let_go(fifo):
                released.add(fifo.name)
        worker.keep_alive()
        return pill_run.status == RunStatus.FAILED and slow_run.status in (RunStatus.COMPLETED, RunStatus.FAILED)

    try:
        wait_until(step, timeout=150, what="the pill parked and the slow run settled", interval=0.05)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.logs()}") from None
    finally:
        worker.close()
    try:
        healthy, parked = store.get_run(slow_id), store.get_run(pill_id)
        assert healthy.status == RunStatus.COMPLETED, (healthy.status_reason, healthy.error)
        assert healthy.output == {"after": 2}
        assert "crash_loop" not in [e.kind for e in store.events(slow_id)]
        assert parked.error is not None and parked.error["type"] == "CrashLoop", parked.status_reason
        assert parked.error["deaths"] == DEATHS and parked.error["suspects"] == ["swallow"]
        assert parked.status_reason is not None and "swallow" in parked.status_reason
        assert worker.deaths == [-signal.SIGKILL] * DEATHS  # the pill's, and no more
        events = store.events(pill_id)
        assert [e.kind for e in events].count(crash_loop.ALONE) >= DEATHS - 1  # its later deaths were its own
    finally:
        store.close()


def _events(*kinds: tuple[str, Any]) -> list[EventRecord]:
    return [EventRecord(run_id="r", seq=i + 1, at=float(i), kind=k, data=d) for i, (k, d) in enumerate(kinds)]


def test_a_driver_that_died_waiting_for_its_turn_is_not_counted() -> None:
    dead = {"abandoned_by": "x"}
    first = ("lease_claimed", {"owner": "a"})
    waited = [("lease_claimed", dead), (crash_loop.WAITS, {}), ("lease_claimed", dead)]
    assert crash_loop.deaths_in_a_row(_events(first, ("lease_claimed", dead))) == 1
    # the second driver waited for its turn alone and died waiting: only the first driver counts
    assert crash_loop.deaths_in_a_row(_events(first, *waited)) == 1
    # it waited, then drove the run alone, and died: counted
    assert crash_loop.deaths_in_a_row(_events(first, *waited[:2], (crash_loop.ALONE, {}), waited[2])) == 2
    # a wait does not end the count: the deaths before it still add up
    assert crash_loop.deaths_in_a_row(_events(first, ("lease_claimed", dead), *waited)) == 2


@pytest.mark.parametrize("limit", [1, 2])
def test_the_fleet_flag_sets_how_many_deaths_park_a_run(fleet_url: str, tmp_path: Path, limit: int) -> None:
    """``raysaga worker --max-driver-deaths N``: the pill is parked after N deaths, not 3."""
    folder = tmp_path / "held"
    folder.mkdir()
    with Client(fleet_url) as client:
        pill_id = client.submit(pill, {"folder": str(folder)}, run_id=f"pill-{uuid.uuid4().hex[:6]}").run_id
    store = SqlStore(fleet_url)
    released: set[str] = set()
    worker = one_worker(fleet_url, tmp_path, "--concurrency", "1", "-w", f"{MODULE}:pill",
                       "--max-driver-deaths", str(limit))

    def step() -> bool:
        for at in sorted(folder.glob("die-*.at")):
            if at.stem not in released and let_go(at.with_suffix("")):
                released.add(at.stem)
        worker.keep_alive()
        return store.get_run(pill_id).status == RunStatus.FAILED

    try:
        wait_until(step, timeout=120, what="the pill parked", interval=0.05)
        parked = store.get_run(pill_id)
        assert parked.error is not None and parked.error["deaths"] == limit, parked.status_reason
        assert parked.error["suspects"] == ["swallow"]
        assert parked.status_reason is not None and "crash loop" in parked.status_reason
        assert worker.deaths == [-signal.SIGKILL] * limit
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.logs()}") from None
    finally:
        worker.close()
        store.close()

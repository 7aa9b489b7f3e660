"""Drivers that die while a run only waits do not park it, and a wait is never blamed (stop 43).

A sleep (or an approval whose request is built) runs no code of the workflow: a driver holding a
durable sleep in its process (``release_after`` above what is left of it) that is SIGKILLed three
times (a deploy, an operator) parked a healthy run ``failed`` as a crash loop, "ready to start,
perhaps started: nap". The deaths here are claims of a lease whose holder never let go
(``Store.claim(take_from=...)``, as in ``tests/crash/test_crash_loop_stop29.py``); the sleeping
driver's ``running`` commit is written as it writes it.

Also: a parked run's reason keeps its way out whole when the error it quotes is long
(``crash_loop.failing_parking``: it was cut at a fixed length, mid-advice).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.orchestrator import crash_loop
from raysaga.state import Batch, Lease, NodeStatus, NodeWrite, RunStatus, RunUpdate, SqlStore

napper = Workflow("stop43_napper", version="1")


@napper.step()
def first(input: dict[str, Any]) -> int:
    return 1


napper.sleep("nap", seconds=1.0, after=["first"])


@napper.step(after=["nap"])
def last(input: dict[str, Any], first: int) -> int:
    log = Path(input["log"])
    log.write_text(log.read_text() + "last\n" if log.exists() else "last\n")
    return first + 1


both = Workflow("stop43_both", version="1")


@both.step()
def start(input: dict[str, Any]) -> int:
    return 1


both.sleep("nap", seconds=3600.0, after=["start"])


@both.step(effect=True)
def charge(input: dict[str, Any], start: int) -> int:
    return start


def _sleeping_driver_dies(store: SqlStore, run_id: str, deaths: int) -> Lease:
    """A driver takes the resting run up (``running``, holding its sleep), then ``deaths`` drivers
    each take the lease its predecessor never let go; the last one's lease has lapsed."""
    lease = store.claim(run_id, "d0", 15)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING, status_reason="resumed")))
    for i in range(1, deaths + 1):
        lease = store.claim(run_id, f"d{i}", 15 if i < deaths else -1.0, take_from=f"d{i - 1}")
    return lease


def test_drivers_killed_during_a_sleep_do_not_park_the_run(store: SqlStore, tmp_path: Path) -> None:
    log = tmp_path / "log"
    rested = raysaga.run(napper, {"log": str(log)}, store=store, executor="inline",
                         options=RunOptions(release_after=0))  # the sleep rests at once: nothing is held
    assert rested.status == RunStatus.WAITING_TIMER, rested.status_reason
    limit = RunOptions().max_driver_deaths
    _sleeping_driver_dies(store, rested.run_id, limit)
    current = store.get_run(rested.run_id)
    assert crash_loop.recent_deaths(store, current, limit) == limit  # counted: the count is not what changed
    assert crash_loop.waits_only(store.nodes(rested.run_id), napper) == {"nap"}
    done = raysaga.resume(napper, rested.run_id, store=store, executor="inline")
    assert done.status == RunStatus.COMPLETED, done.status_reason
    assert done.output == {"last": 2}
    assert log.read_text() == "last\n"
    assert "crash_loop" not in [e.kind for e in store.events(rested.run_id)]


def test_a_wait_beside_a_step_in_flight_is_not_blamed(store: SqlStore) -> None:
    run = raysaga.create_run(both, {}, store=store)
    lease = store.claim(run.run_id, "d0", 15)
    now = time.time()
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING), nodes=[
        NodeWrite(node_id="start", status=NodeStatus.COMPLETED, attempt=1, output=1, finished_at=now),
        NodeWrite(node_id="nap", status=NodeStatus.WAITING, attempt=1, not_before=now + 3600, started_at=now),
        NodeWrite(node_id="charge", status=NodeStatus.RUNNING, attempt=1, started_at=now)]))
    for i in range(1, 4):
        lease = store.claim(run.run_id, f"d{i}", 15, take_from=f"d{i - 1}")
    current = store.get_run(run.run_id)
    parked = crash_loop.park_if_looping(store, lease, current, store.nodes(run.run_id), both, 3)
    assert parked is not None and parked.status == RunStatus.FAILED
    assert parked.error is not None and parked.error["suspects"] == ["charge"]
    assert "in flight: charge" in (parked.status_reason or "") and "nap" not in (parked.status_reason or "")


def test_a_long_error_is_cut_at_a_sentence_and_the_way_out_stays_whole() -> None:
    error = ("DefinitionChangedError: run 'r-1': the types this code declares do not fit what the run stored: "
             + "step 'finish' cannot read the stored output of step 'charge' (got \"ch-7\"). " * 12
             + "Nothing was sent or written: resume it with the code it started with")
    _, batch = crash_loop.failing_parking(RunStatus.RUNNING, 3, error, "r-1")
    assert batch.run is not None and batch.run.status_reason is not None
    reason = batch.run.status_reason
    assert len(reason) <= 1000
    assert reason.endswith("; fix what it names, then `raysaga retry r-1`"), reason[-120:]
    assert '(got "ch-7"). (...); fix what it names' in reason  # cut after a whole sentence, and says so
    short = crash_loop.failing_parking(RunStatus.RUNNING, 3, "ValueError: bad row", "r-1")[1].run
    assert short is not None
    assert short.status_reason == "parked after 3 drives in a row failed: ValueError: bad row; fix what it names, " \
                                  "then `raysaga retry r-1`"


def test_an_error_with_one_long_token_keeps_most_of_it() -> None:
    """The second review: with no sentence and no space in the last half of the room, the cut fell
    back to the last space however early (``ValueError: bad blob (...)``: 114 characters of 3,000)."""
    cut = crash_loop.cut("ValueError: bad blob sha256=" + "ab" * 600, 500)
    assert len(cut) == 500 and cut.startswith("ValueError: bad blob sha256=abab") and cut.endswith(" (...)")
    assert crash_loop.cut("one two three. " * 10, 60) == "one two three. one two three. one two three. (...)"


def test_a_served_entry_survives_a_copy() -> None:
    """``Served`` (a tuple subclass carrying a worker's skipped runs) raised TypeError on a copy (a
    wrapping store copying its arguments): its default reduction called ``__new__`` with the tuple alone."""
    import copy

    from raysaga.state.claims import Served

    served = Served("h1", "h0", skip=["r-2", "r-1"])
    for twin in (copy.copy(served), copy.deepcopy(served)):
        assert twin == ("h1", "h0") and twin.skip == frozenset({"r-1", "r-2"})

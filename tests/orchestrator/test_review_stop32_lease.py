"""Review of stop 31's lease changes: a new run created claimed and running in one transaction
(``Store.create_claimed``, ``state/run_creation.py``), and the run's end or rest releasing its
lease in the write that ends or rests it (``RunUpdate.release_lease``, ``Driver._end``).

Attacked: run id collisions, two processes creating one run id at the same instant (SQLite and
PostgreSQL), labels holding a secret, the deadline and the other recorded fields, and a driver
whose lease is taken over right before its end or rest write (fencing: the stale driver must not
end the run, nor free the new owner's lease).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import Approval, Ask, Permanent, RetryPolicy, RunOptions, RunStatus, Workflow
from raysaga.errors import InvalidOptionError, LeaseHeldError, LeaseLostError, RunExistsError, RunNotFoundError
from raysaga.orchestrator.runner import new_run
from raysaga.state import Batch, Lease, RunRecord, SqlStore

wf = Workflow("review_stop32_lease")


@wf.step
def note(input: dict[str, Any]) -> int:
    """Appends a line per execution: how many times the step ran, across processes."""
    with open(input["log"], "a", encoding="utf-8") as f:
        f.write(f"{os.getpid()}\n")
    return 1


@wf.step
def after(note: int) -> int:
    return note + 1


asks = Workflow("review_stop32_lease_ask")


@asks.step
def reserve(input: int) -> int:
    return input


@asks.approval(approvers=["alice"])
def review(reserve: int) -> Ask:
    return Ask(prompt=f"Refund {reserve}?")


@asks.step
def pay(reserve: int, review: Approval) -> int:
    return reserve


failing = Workflow("review_stop32_lease_fails")


@failing.step(retry=RetryPolicy(max_attempts=1))
def boom(input: int) -> int:
    raise Permanent("no")


# ------------------------------------------------------------ create_claimed


def _fields(record: RunRecord) -> dict[str, Any]:
    """What a run records from its creation (not its status, lease or times)."""
    skip = {"run_id", "status", "version", "fence", "lease_owner", "lease_expires_at", "event_seq", "created_at",
            "updated_at", "trace_id", "run_key", "deadline_at"}
    return {k: v for k, v in record.model_dump().items() if k not in skip}


def test_a_claimed_creation_records_what_create_run_records(store: SqlStore) -> None:
    options = RunOptions(deadline=600.0, retry_budget=7, labels={"team": "ops"}, max_driver_deaths=5)
    pending = store.create_run(new_run(wf, {"log": "x"}, run_id="rv-a", options=options, workflow_ref=None))
    claimed, lease = store.create_claimed(new_run(wf, {"log": "x"}, run_id="rv-b", options=options, workflow_ref=None),
                                          "owner-b", 30.0)
    assert _fields(claimed) == _fields(pending)
    assert claimed.deadline_at is not None and pending.deadline_at is not None
    assert abs(claimed.deadline_at - claimed.created_at - 600.0) < 1e-3  # from its own creation
    assert (claimed.status, claimed.fence, claimed.version, claimed.lease_owner) == (RunStatus.RUNNING, 1, 1, "owner-b")
    assert lease.fence == 1 and lease.owner == "owner-b" and lease.expires_at == claimed.lease_expires_at
    again = store.get_run("rv-b")
    assert (again.status, again.fence, again.lease_owner, again.event_seq) == (RunStatus.RUNNING, 1, "owner-b", 3)
    assert [(e.seq, e.kind) for e in store.events("rv-b")] == [(1, "run_created"), (2, "lease_claimed"),
                                                               (3, "run_running")]
    store.renew(lease)  # the lease is a real one: renewable, fenced
    with pytest.raises(LeaseHeldError):
        store.claim("rv-b", "someone-else", 30.0)


def test_a_claimed_creation_of_a_taken_id_changes_nothing(store: SqlStore) -> None:
    store.create_run(new_run(wf, {"log": "x"}, run_id="rv-taken", options=None, workflow_ref=None))
    before = store.get_run("rv-taken")
    with pytest.raises(RunExistsError):
        store.create_claimed(new_run(wf, {"log": "y"}, run_id="rv-taken", options=None, workflow_ref=None), "me", 30.0)
    after_it = store.get_run("rv-taken")
    assert after_it.model_dump() == before.model_dump()
    assert [e.kind for e in store.events("rv-taken")] == ["run_created"]
    # and taken by a claimed one: a second claimed creation is refused the same way
    store.create_claimed(new_run(wf, {"log": "x"}, run_id="rv-taken-2", options=None, workflow_ref=None), "me", 30.0)
    with pytest.raises(RunExistsError):
        store.create_claimed(new_run(wf, {"log": "x"}, run_id="rv-taken-2", options=None, workflow_ref=None),
                             "other", 30.0)
    assert store.get_run("rv-taken-2").lease_owner == "me"


def test_a_label_holding_a_secret_is_refused_and_nothing_is_created(store: SqlStore) -> None:
    secret = "sk-ant-" + "Z" * 30
    new = new_run(wf, {"log": "x"}, run_id="rv-secret", options=None, workflow_ref=None)
    new = new.model_copy(update={"labels": {"key": secret}})
    with pytest.raises(InvalidOptionError) as caught:
        store.create_claimed(new, "me", 30.0)
    assert secret not in str(caught.value)
    with pytest.raises(RunNotFoundError):
        store.get_run("rv-secret")
    with pytest.raises(InvalidOptionError):  # and through raysaga.run, before anything is stored
        raysaga.run(wf, {"log": "x"}, store=store, executor="inline", run_id="rv-secret",
                    options=RunOptions(labels={"token": secret}))
    with pytest.raises(RunNotFoundError):
        store.get_run("rv-secret")


def _create_at_once(url: str, run_ids: list[str], owner: str, barrier: Any, results: Any) -> None:
    """One racer: for each round (run id), a store of its own, then the barrier, then the create."""
    for run_id in run_ids:
        store = SqlStore(url)
        try:
            new = new_run(wf, {"log": "x"}, run_id=run_id, options=None, workflow_ref=None)
            barrier.wait(timeout=60)
            try:
                store.create_claimed(new, owner, 30.0)
                results.put((run_id, owner, "won"))
            except RunExistsError:
                results.put((run_id, owner, "exists"))
            except Exception as exc:
                results.put((run_id, owner, f"{type(exc).__name__}: {exc}"))
        finally:
            store.close()


def _race(target: Any, rounds: list[Any], racers: list[Any]) -> dict[Any, list[Any]]:
    """Two processes (spawned once: a spawn costs ~1-2 s of imports) race once per round, meeting
    at a barrier before each; the results of each round, keyed by its first field."""
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(len(racers)), ctx.Queue()
    procs = [ctx.Process(target=target, args=(*racer[:1], rounds, *racer[1:], barrier, results)) for racer in racers]
    for p in procs:
        p.start()
    got: dict[Any, list[Any]] = {}
    try:
        for _ in range(len(rounds) * len(procs)):
            key, *rest = results.get(timeout=120)
            got.setdefault(key, []).append(rest[0] if len(rest) == 1 else tuple(rest))
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    return got


def test_two_processes_create_one_run_id_at_once(store_url: str) -> None:
    SqlStore(store_url).close()  # migrated before the race
    # four rounds, each a new run id the two processes create at the same instant
    run_ids = [f"rv-race-{round_}-{os.getpid()}" for round_ in range(4)]
    rounds = _race(_create_at_once, run_ids, [(store_url, f"owner-{i}") for i in range(2)])
    assert sorted(rounds) == sorted(run_ids), rounds
    for run_id in run_ids:
        got = dict(rounds[run_id])
        assert sorted(got.values()) == ["exists", "won"], got
        winner = next(owner for owner, what in got.items() if what == "won")
        store = SqlStore(store_url)
        try:
            row = store.get_run(run_id)
            assert (row.status, row.lease_owner, row.fence, row.version) == (RunStatus.RUNNING, winner, 1, 1)
            assert [(e.seq, e.kind) for e in store.events(run_id)] == [(1, "run_created"), (2, "lease_claimed"),
                                                                      (3, "run_running")]
        finally:
            store.close()


def _run_at_once(url: str, rounds: list[tuple[str, str]], barrier: Any, results: Any) -> None:
    """One racer: for each round (run id, log), the barrier, then ``raysaga.run``."""
    for run_id, log in rounds:
        barrier.wait(timeout=60)
        try:
            record = raysaga.run(wf, {"log": log}, store=url, executor="inline", run_id=run_id)
            results.put((run_id, record.status.value))
        except LeaseHeldError:
            results.put((run_id, "held"))
        except Exception as exc:
            results.put((run_id, f"{type(exc).__name__}: {exc}"))


def test_two_processes_run_one_new_run_id_at_once(store_url: str, tmp_path: Path) -> None:
    """raysaga.run twice at once with one new run id: one drives it, the other backs off on the
    lease (or finds it completed); the step runs once."""
    SqlStore(store_url).close()
    # three rounds, each a new run id the two processes run at the same instant
    runs = [(f"rv-run-race-{round_}-{os.getpid()}", str(tmp_path / f"log-{round_}")) for round_ in range(3)]
    rounds = _race(_run_at_once, runs, [(store_url,), (store_url,)])
    assert sorted(rounds) == sorted(run_id for run_id, _ in runs), rounds
    for run_id, log in runs:
        got = sorted(rounds[run_id])
        assert got in (["completed", "completed"], ["completed", "held"]), got
        assert len(Path(log).read_text().splitlines()) == 1
        store = SqlStore(store_url)
        try:
            row = store.get_run(run_id)
            assert row.status == RunStatus.COMPLETED and row.lease_owner is None
            assert [e.kind for e in store.events(run_id)].count("run_created") == 1
        finally:
            store.close()


# ------------------------------------------------------------ fencing at the end's write


class Usurped(SqlStore):
    """A real store where another driver takes the run over right before the write that ends,
    rests or fails it (the lease lost in that instant: a GC pause, a stopped VM)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.armed = True

    def commit(self, lease: Lease, batch: Batch) -> RunRecord | None:
        upd = batch.run
        if self.armed and upd is not None and (upd.release_lease or upd.status in (
                RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.WAITING_HUMAN, RunStatus.PAUSED)):
            self.armed = False
            self.claim(lease.run_id, "usurper", 60.0, take_from=lease.owner)
        return super().commit(lease, batch)


@pytest.fixture
def usurped(store_url: str) -> Iterator[Usurped]:
    opened = Usurped(store_url)
    yield opened
    opened.close()


@pytest.mark.parametrize("case", ["completes", "fails", "rests"])
def test_a_driver_whose_lease_is_taken_before_its_end_write_does_not_end_the_run(
        usurped: Usurped, tmp_path: Path, case: str) -> None:
    flow, given = {"completes": (wf, {"log": str(tmp_path / "log")}), "fails": (failing, 1),
                   "rests": (asks, 5)}[case]
    with pytest.raises(LeaseLostError):
        raysaga.run(flow, given, store=usurped, executor="inline", run_id=f"rv-fence-{case}-{os.getpid()}")
    assert not usurped.armed, "the take-over never happened: the attack missed"
    row = usurped.get_run(f"rv-fence-{case}-{os.getpid()}")
    assert row.status == RunStatus.RUNNING  # not ended (nor rested) by the stale driver
    assert (row.lease_owner, row.fence) == ("usurper", 2)  # the new owner's lease is not released by it
    assert row.lease_expires_at is not None
    kinds = [e.kind for e in usurped.events(row.run_id)]
    assert not {"run_completed", "run_failed", "run_waiting_human"} & set(kinds)
    # the new owner's lease is intact: it renews
    usurped.renew(Lease(run_id=row.run_id, owner="usurper", fence=2, expires_at=row.lease_expires_at, ttl=60.0))


def test_a_driver_whose_lease_is_taken_before_its_pause_write_does_not_pause_the_run(
        usurped: Usurped, tmp_path: Path) -> None:
    record = raysaga.create_run(wf, {"log": str(tmp_path / "log")}, store=usurped,
                                run_id=f"rv-fence-pause-{os.getpid()}")
    usurped.send_signal(record.run_id, "pause")  # seen at the driver's first look: it pauses
    with pytest.raises(LeaseLostError):
        raysaga.resume(wf, record.run_id, store=usurped, executor="inline")
    assert not usurped.armed, "the take-over never happened: the attack missed"
    row = usurped.get_run(record.run_id)
    assert row.status == RunStatus.RUNNING and (row.lease_owner, row.fence) == ("usurper", 2)
    assert "run_paused" not in [e.kind for e in usurped.events(row.run_id)]


def test_a_pruned_run_s_id_is_created_claimed_again(own_store_url: str, tmp_path: Path) -> None:
    """A run id freed by prune (its row, events and nodes deleted) is a new run again: created
    claimed, its events numbered from 1, driven to its end, not taken for the old one. (A store of
    its own: prune deletes every run at rest in it.)"""
    store = SqlStore(own_store_url)
    try:
        _prune_and_again(store, tmp_path / "log")
    finally:
        store.close()


def _prune_and_again(store: SqlStore, log: Path) -> None:
    run_id = f"rv-pruned-{os.getpid()}"
    first = raysaga.run(wf, {"log": str(log)}, store=store, executor="inline", run_id=run_id)
    assert first.status == RunStatus.COMPLETED
    assert store.prune(older_than=0).runs == 1
    again = raysaga.run(wf, {"log": str(log)}, store=store, executor="inline", run_id=run_id)
    assert again.status == RunStatus.COMPLETED and again.output == {"after": 2}
    assert len(log.read_text().splitlines()) == 2  # a new run: its step ran again
    assert [(e.seq, e.kind) for e in store.events(run_id)][:3] == [(1, "run_created"), (2, "lease_claimed"),
                                                                   (3, "run_running")]

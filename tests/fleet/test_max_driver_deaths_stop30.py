"""A run's own ``RunOptions.max_driver_deaths`` holds under a ``raysaga worker`` of another limit.

Before schema 13 the runs table had no column for it: a run submitted with
``RunOptions(max_driver_deaths=1)`` and driven by a worker was parked after the worker's
``--max-driver-deaths`` deaths (3), not 1. Now ``create_run`` (and ``Client.submit`` through it)
records a value other than the default, and ``crash_loop.park_if_looping`` takes the run's value
over its driver's; a run without one (NULL) still gets the worker's flag.

The fleet cases run a real worker process (inline executor, one run at a time), replaced whenever
it dies, as a supervisor would; the step (``tests.support.poison_fleet_stop29:pill``) logs its
call and SIGKILLs its process. On SQLite and PostgreSQL.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import pytest

import raysaga
from raysaga import Client, RunOptions
from raysaga.orchestrator import crash_loop
from raysaga.state import RunRecord, RunStatus, SqlStore
from raysaga.state.models import MAX_STORED_DEATHS
from tests.support import poison_fleet_stop29 as flows
from tests.support.crash_driver import wait_until
from tests.support.kept_worker import KeptWorker

PILL = "tests.support.poison_fleet_stop29:pill"



def _submit(db: str, folder: Path, options: RunOptions | None) -> tuple[str, Path]:
    """A pill run logging its calls in a folder of its own: (run id, that folder)."""
    logs = folder / uuid.uuid4().hex[:8]
    logs.mkdir()
    with Client(db) as client:
        run = client.submit(flows.pill, {"log_dir": str(logs)}, run_id=f"pill-{logs.name}", options=options)
    return run.run_id, logs


def _drive_until_parked(db: str, folder: Path, flag: int, run_ids: list[str]) -> list[int]:
    """Keep a worker of ``--max-driver-deaths flag`` alive until every run is parked; its deaths."""
    store = SqlStore(db)
    worker = KeptWorker(db, folder, "--concurrency", "1", "-w", PILL, "--max-driver-deaths", str(flag))

    def parked() -> bool:
        worker.keep_alive()
        return all(store.get_run(run_id).status == RunStatus.FAILED for run_id in run_ids)

    try:
        wait_until(parked, timeout=150, what=f"runs {run_ids} parked", interval=0.05)
        return worker.deaths
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{worker.logs()}") from None
    finally:
        worker.close()
        store.close()


def _assert_parked_after(db: str, run_id: str, logs: Path, deaths: int) -> None:
    store = SqlStore(db)
    try:
        run = store.get_run(run_id)
        crash_loops = [e.data for e in store.events(run_id) if e.kind == "crash_loop"]
    finally:
        store.close()
    assert run.error is not None and run.error["type"] == "CrashLoop", run.status_reason
    assert run.error["deaths"] == deaths and run.error["suspects"] == ["swallow"], run.status_reason
    assert crash_loops == [{"deaths": deaths, "suspects": ["swallow"]}]
    assert (logs / "calls").read_text().count("swallow") == deaths  # the step ran once per death, no more
    assert run.lease_owner is None


def test_a_run_s_own_limit_beats_the_worker_flag_and_a_run_without_one_gets_the_flag(
        fleet_url: str, tmp_path: Path) -> None:
    """Worker flag 3: the run submitted with ``max_driver_deaths=1`` is parked after its first
    death (before the fix: after 3), the run submitted without one after 3."""
    own, own_logs = _submit(fleet_url, tmp_path, RunOptions(max_driver_deaths=1))
    plain, plain_logs = _submit(fleet_url, tmp_path, None)
    deaths = _drive_until_parked(fleet_url, tmp_path, 3, [own, plain])
    _assert_parked_after(fleet_url, own, own_logs, 1)
    _assert_parked_after(fleet_url, plain, plain_logs, 3)
    assert deaths == [-signal.SIGKILL] * 4


def test_a_run_s_limit_above_the_worker_flag_is_kept_too(fleet_url: str, tmp_path: Path) -> None:
    """Worker flag 1: the run submitted with ``max_driver_deaths=2`` dies twice before it is parked."""
    own, own_logs = _submit(fleet_url, tmp_path, RunOptions(max_driver_deaths=2))
    assert _drive_until_parked(fleet_url, tmp_path, 1, [own]) == [-signal.SIGKILL] * 2
    _assert_parked_after(fleet_url, own, own_logs, 2)


# ---------------------------------------------------------------- the value recorded, in process

def _recorded(store: SqlStore, run: RunRecord) -> int | None:
    value = store.get_run(run.run_id).max_driver_deaths
    assert run.max_driver_deaths == value  # the row as inserted (RETURNING) says the same
    return value


@pytest.mark.parametrize(("given", "stored"), [(None, None), (3, None), (1, 1), (5, 5), (10**12, MAX_STORED_DEATHS)])
def test_create_run_and_submit_record_a_limit_other_than_the_default(
        store: SqlStore, tmp_path: Path, given: int | None, stored: int | None) -> None:
    """The default (3) is stored as NULL: the driving process's limit applies. A huge limit (never
    park) is stored as the largest the column holds (PostgreSQL refused 10**12 in an INTEGER)."""
    options = None if given is None else RunOptions(max_driver_deaths=given)
    made = raysaga.create_run(flows.pill, {"log_dir": str(tmp_path)}, store=store, options=options)
    submitted = Client(store).submit(flows.pill, {"log_dir": str(tmp_path)}, options=options)
    assert _recorded(store, made) == stored and _recorded(store, submitted) == stored


def test_the_run_s_limit_is_what_the_check_counts_to(store: SqlStore, tmp_path: Path) -> None:
    """``park_if_looping``, given its driver's limit 3: one death parks the run recorded with 1,
    not the run recorded without a limit; 3 deaths do not park the run recorded with 5."""
    found: dict[str | None, RunRecord | None] = {}
    for limit, deaths in ((1, 1), (None, 1), (5, 3)):
        options = RunOptions() if limit is None else RunOptions(max_driver_deaths=limit)
        run = raysaga.create_run(flows.pill, {"log_dir": str(tmp_path)}, store=store, options=options)
        lease = store.claim(run.run_id, "d0", 15)
        for i in range(1, deaths + 1):
            lease = store.claim(run.run_id, f"d{i}", 15, take_from=f"d{i - 1}")
        found[f"{limit}/{deaths}"] = crash_loop.park_if_looping(store, lease, store.get_run(run.run_id), [],
                                                                flows.pill, 3)
    parked = found["1/1"]
    assert parked is not None and parked.status == RunStatus.FAILED
    assert parked.error is not None and parked.error["deaths"] == 1
    assert found["None/1"] is None and found["5/3"] is None

"""``raysaga launch --run-id EXISTING`` compares the identity options it is given with the recorded
run's, as ``raysaga run`` (``run_identity.same_options``) and a retried submit (``run_identity.same_deaths``)
do: a differing ``--deadline``, ``--retry-budget`` or ``--max-driver-deaths`` was silently ignored
(the job's driver reads them from the row). Now it is one line naming the option, the recorded and
the given value, and nothing is submitted to the cluster or recorded in the store; the same values,
or none, launch as before. On SQLite and PostgreSQL.

The cluster is a fake Job API client (``tests.support.fake_jobs.FakeJobs``, shared with
``test_launch_adversarial_stop28``) put in place of ``launch.connect``; the CLI runs in
process (``tests.support.cli.invoke``). The launch on a real cluster is
``tests/cluster/test_launch.py``."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select

from raysaga.orchestrator import launch as lx
from raysaga.state import SqlStore
from raysaga.state.schema import events, runs
from tests.support.cli import invoke, one_line_error
from tests.support.fake_jobs import FakeJobs, project_cluster

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("launch_identity_stop31")

    @wf.step()
    def only() -> int:
        return 1
''')
ADDRESS = "http://127.0.0.1:8265"


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeJobs:
    return project_cluster(tmp_path, monkeypatch, "launch_identity_stop31_flow", FLOW)


def _launch(store_url: str, run_id: str, *options: str) -> tuple[int, str, str]:
    return invoke("launch", "launch_identity_stop31_flow:wf", "--address", ADDRESS, "--db", store_url,
                  "--run-id", run_id, *options)


def _row(store_url: str, run_id: str) -> tuple[object, ...]:
    """The run's row and its number of events: what a refused launch must leave as it was."""
    store = SqlStore(store_url)
    try:
        with store.engine.connect() as conn:
            row = conn.execute(select(runs).where(runs.c.run_id == run_id)).one()
            count = conn.execute(select(func.count()).select_from(events).where(events.c.run_id == run_id)).scalar()
        return (*row, count)
    finally:
        store.close()


RECORDED = ("--deadline", "600", "--retry-budget", "2", "--max-driver-deaths", "5")


@pytest.mark.parametrize(("given", "message"), [
    (("--deadline", "30"), "(deadline: recorded 600.0s, given 30s)"),
    (("--retry-budget", "7"), "(retry_budget: recorded 2, given 7)"),
    (("--retry-budget", "0"), "(retry_budget: recorded 2, given 0)"),
    (("--max-driver-deaths", "9"), "(max_driver_deaths: recorded 5, given 9)"),
    (("--max-driver-deaths", "3"), "(max_driver_deaths: recorded 5, given 3)"),  # 3 given is not "left out"
    (("--deadline", "600", "--retry-budget", "2", "--max-driver-deaths", "4"),
     "(max_driver_deaths: recorded 5, given 4)"),
])
def test_a_differing_option_is_refused_naming_both_values_and_nothing_is_submitted(
        cluster: FakeJobs, store_url: str, given: tuple[str, ...], message: str) -> None:
    run_id = f"order-{uuid.uuid4().hex[:8]}"
    code, out, err = _launch(store_url, run_id, *RECORDED)
    assert code == 0 and out.strip() == run_id, err
    cluster.jobs[lx.submission_id(run_id)].status = "FAILED"  # its job died: a launch would start another
    before, submitted, uploads = _row(store_url, run_id), list(cluster.submitted), cluster.uploads
    code, out, err = _launch(store_url, run_id, *given)
    one_line_error(code, err, f"run {run_id!r} exists with other options {message}")
    assert "launch again" in err and out == ""
    assert cluster.submitted == submitted == [lx.submission_id(run_id)] and cluster.uploads == uploads
    assert _row(store_url, run_id) == before


@pytest.mark.parametrize("given", [
    RECORDED,
    (),  # left out: the run is taken over as recorded (the way a run whose job died is launched again)
    ("--deadline", "600.5", "--retry-budget", "2"),  # a deadline within DEADLINE_SLACK of the recorded one
    ("--max-driver-deaths", "5", "--lease-ttl", "30"),  # a lease is per drive: free to change
])
def test_the_recorded_values_or_none_launch_the_next_job(cluster: FakeJobs, store_url: str,
                                                         given: tuple[str, ...]) -> None:
    run_id = f"order-{uuid.uuid4().hex[:8]}"
    assert _launch(store_url, run_id, *RECORDED)[0] == 0
    cluster.jobs[lx.submission_id(run_id)].status = "FAILED"
    code, out, err = _launch(store_url, run_id, *given)
    assert code == 0 and out.strip() == run_id, err
    assert cluster.submitted == [lx.submission_id(run_id), lx.submission_id(run_id, 2)], err
    assert f"launched as Ray job {lx.submission_id(run_id, 2)}" in err


def test_a_run_recorded_without_its_own_limit_takes_the_default_only(cluster: FakeJobs, store_url: str) -> None:
    """A run launched without ``--max-driver-deaths`` records none (the driving process's limit):
    3, the default, is that; another number is a limit the run would not have."""
    run_id = f"order-{uuid.uuid4().hex[:8]}"
    assert _launch(store_url, run_id)[0] == 0
    code, _, err = _launch(store_url, run_id, "--max-driver-deaths", "4")
    one_line_error(code, err, "(max_driver_deaths: recorded none (the driving process's limit), given 4)")
    assert "launch again with no --max-driver-deaths" in err
    code, _, err = _launch(store_url, run_id, "--max-driver-deaths", "3", "--deadline", "5")
    one_line_error(code, err, "(deadline: recorded none, given 5s)")
    code, _, err = _launch(store_url, run_id, "--max-driver-deaths", "3")
    assert code == 0 and "already launched: Ray job" in err, err  # its first job is still pending
    assert cluster.submitted == [lx.submission_id(run_id)]


def test_a_run_at_rest_is_refused_too_when_an_option_differs(cluster: FakeJobs, store_url: str) -> None:
    """As ``raysaga run`` checks before it resumes: a completed run launched with another deadline
    is a mistake to report, not "nothing to launch"."""
    run_id = f"order-{uuid.uuid4().hex[:8]}"
    assert _launch(store_url, run_id, "--retry-budget", "1")[0] == 0
    store = SqlStore(store_url)
    try:
        with store.engine.begin() as conn:
            conn.execute(runs.update().where(runs.c.run_id == run_id).values(status="completed"))
    finally:
        store.close()
    code, _, err = _launch(store_url, run_id, "--retry-budget", "2")
    one_line_error(code, err, "(retry_budget: recorded 1, given 2)")
    code, out, err = _launch(store_url, run_id, "--retry-budget", "1")
    assert code == 0 and out.strip() == run_id and "is already completed: nothing to launch" in err, err


def test_a_run_recorded_by_a_racing_launch_is_compared_too(store_url: str) -> None:
    """Two launches of one new ``--run-id``: the one whose insert loses drives the winner's run
    (``cli_launch._record``), and compares its options with that run's as well."""
    from raysaga import RunOptions, UserError, Workflow
    from raysaga.orchestrator import cli_launch
    from raysaga.orchestrator.runner import create_run

    wf = Workflow("launch_identity_race_stop31")

    @wf.step()
    def only() -> int:
        return 1

    run_id = f"order-{uuid.uuid4().hex[:8]}"
    store = SqlStore(store_url)
    try:
        create_run(wf, None, store=store, run_id=run_id, options=RunOptions(retry_budget=2))  # the winner
        with pytest.raises(UserError, match=r"\(retry_budget: recorded 2, given 5\)"):
            cli_launch._record(store, wf, None, run_id, "flows:wf", 15.0, None, 5, None)
        same = cli_launch._record(store, wf, None, run_id, "flows:wf", 15.0, None, 2, None)
        assert same.run_id == run_id and same.retry_budget == 2
    finally:
        store.close()

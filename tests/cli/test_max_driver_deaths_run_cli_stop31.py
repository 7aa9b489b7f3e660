"""``--max-driver-deaths N`` on the commands that record a run (``run``, ``launch``, ``fork``):
the run's own crash-loop limit (schema 13, ``raysaga_runs.max_driver_deaths``), which only
``RunOptions`` could set before. Each is checked as ``raysaga worker --max-driver-deaths`` is
(``worker.checked_max_driver_deaths``: same rule, same message) before a store is opened or the
cluster asked, and the value is read back from the store after a real invocation. A retried
``Client.submit`` with another limit is refused as its other identity options are."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from raysaga import Client, RunOptions, Workflow
from raysaga.errors import UserError
from raysaga.orchestrator import launch as lx
from raysaga.state import SqlStore
from raysaga.state.models import MAX_STORED_DEATHS
from tests.support.cli import invoke, one_line_error, project_folder
from tests.support.ports import refused_port

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("deaths_cli_stop31")

    @wf.step()
    def one() -> int:
        return 1

    @wf.step()
    def two(one: int) -> int:
        return one + 1
''')
MODULE = "deaths_cli_stop31_flow"
MESSAGE = "--max-driver-deaths must be a whole number >= 1 (drivers of a run that die in a row"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding the workflow module, importable as ``MODULE:wf`` (launch needs that)."""
    return project_folder(tmp_path, monkeypatch, MODULE, FLOW)


def _deaths(url: str, run_id: str) -> int | None:
    store = SqlStore(url)
    try:
        return store.get_run(run_id).max_driver_deaths
    finally:
        store.close()


def _new_id() -> str:
    return f"deaths-{uuid.uuid4().hex[:10]}"  # the PostgreSQL database is the session's: ids never repeat


# ---------------------------------------------------------------- refused before anything is written


@pytest.mark.parametrize("command", ["run", "fork", "launch"])
@pytest.mark.parametrize("value", ["0", "-2"])
def test_a_limit_below_one_is_refused_as_the_worker_refuses_it(project: Path, tmp_path: Path, command: str,
                                                               value: str) -> None:
    db = tmp_path / "never" / "raysaga.db"
    args = {"run": ["run", f"{MODULE}:wf", "--executor", "inline"],
            "fork": ["fork", "some-run", "--from", "two", "--executor", "inline"],
            "launch": ["launch", f"{MODULE}:wf", "--address", f"http://127.0.0.1:{refused_port()}"]}[command]
    code, out, err = invoke(*args, "--db", f"sqlite:///{db}", "--max-driver-deaths", value)
    one_line_error(code, err, MESSAGE)
    assert err.rstrip().endswith(f"got {int(value)}") and out == "", err
    assert not db.parent.exists()  # refused before the store was opened (and before the cluster was asked)


@pytest.mark.parametrize("command", ["run", "fork", "launch"])
@pytest.mark.parametrize("value", ["two", "1.5", ""])
def test_a_limit_that_is_no_whole_number_is_a_usage_error_naming_the_flag(project: Path, tmp_path: Path,
                                                                          command: str, value: str) -> None:
    db = tmp_path / "never" / "raysaga.db"
    args = {"run": ["run", f"{MODULE}:wf"], "fork": ["fork", "some-run", "--from", "two"],
            "launch": ["launch", f"{MODULE}:wf", "--address", "http://127.0.0.1:1"]}[command]
    code, _, err = invoke(*args, "--db", f"sqlite:///{db}", "--max-driver-deaths", value)
    assert code == 2 and "--max-driver-deaths" in err and "Traceback" not in err, err
    assert not db.parent.exists()


# ---------------------------------------------------------------- recorded with the run


@pytest.mark.parametrize(("flag", "stored"), [(["--max-driver-deaths", "5"], 5), (["--max-driver-deaths", "1"], 1),
                                              ([], None), (["--max-driver-deaths", "3"], None),
                                              (["--max-driver-deaths", str(10**12)], MAX_STORED_DEATHS)])
def test_run_records_the_limit_with_the_run(project: Path, store_url: str, flag: list[str],
                                            stored: int | None) -> None:
    """The default (3) is no limit of the run's own (stored NULL: the driving process decides); a
    value above the column's largest is stored as that largest (never reached either)."""
    run_id = _new_id()
    code, _, err = invoke("run", f"{MODULE}:wf", "--executor", "inline", "--db", store_url, "--run-id", run_id,
                          "--quiet", *flag)
    assert code == 0, err
    assert _deaths(store_url, run_id) == stored


def test_fork_records_its_own_limit_else_keeps_its_parents(project: Path, store_url: str) -> None:
    parent = _new_id()
    code, _, err = invoke("run", f"{MODULE}:wf", "--executor", "inline", "--db", store_url, "--run-id", parent,
                          "--quiet", "--max-driver-deaths", "4")
    assert code == 0, err
    own, kept, reset = _new_id(), _new_id(), _new_id()
    for child, flag in ((own, ["--max-driver-deaths", "2"]), (kept, []), (reset, ["--max-driver-deaths", "3"])):
        code, _, err = invoke("fork", parent, "--from", "two", "--executor", "inline", "--db", store_url,
                              "--run-id", child, *flag)
        assert code == 0, err
    # an explicit 3 (the default) is heard: no limit of the fork's own, not its parent's 4 (stop 33)
    assert (_deaths(store_url, own), _deaths(store_url, kept), _deaths(store_url, reset)) == (2, 4, None)


class _Cluster:
    """A Job API that has no job yet and takes the one submitted (what a launch asks of Ray's SDK)."""

    def __init__(self) -> None:
        self.entrypoints: list[str] = []

    def get_job_info(self, sid: str) -> object:
        raise RuntimeError(f"Request failed with status code 404: Job {sid} does not exist.")

    def submit_job(self, *, entrypoint: str, submission_id: str, **_: object) -> str:
        self.entrypoints.append(entrypoint)
        return submission_id

    def _upload_working_dir_if_needed(self, env: dict[str, object]) -> None:
        return


def test_launch_records_the_limit_for_the_jobs_driver(project: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The job's driver is ``raysaga resume RUN``: it has no flag of its own, the row carries the limit."""
    cluster = _Cluster()
    monkeypatch.setattr(lx, "connect", lambda url: cluster)
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    code, out, err = invoke("launch", f"{MODULE}:wf", "--address", "http://127.0.0.1:8265", "--db", url,
                            "--run-id", "launched-7", "--max-driver-deaths", "6")
    assert code == 0, err
    assert out.strip() == "launched-7" and len(cluster.entrypoints) == 1
    assert cluster.entrypoints[0].endswith(" resume --quiet --lease-ttl 15 -- launched-7")
    assert _deaths(url, "launched-7") == 6


# ---------------------------------------------------------------- a retried submit


def _flow() -> Workflow:
    wf = Workflow("deaths_submit_stop31")

    @wf.step()
    def one() -> int:
        return 1

    return wf


@pytest.mark.parametrize(("first", "again"), [(5, 4), (5, 3), (3, 5), (1, 2)])
def test_a_retried_submit_with_another_limit_is_refused_naming_both(store_url: str, first: int, again: int) -> None:
    """As with its labels, a submit's limit is its own given or not: 3 (the default) asks for a run
    without one, so it differs from a recorded 5."""
    wf, run_id = _flow(), _new_id()
    with Client(store_url) as client:
        client.submit(wf, run_id=run_id, options=RunOptions(max_driver_deaths=first))
        with pytest.raises(UserError) as caught:
            client.submit(wf, run_id=run_id, options=RunOptions(max_driver_deaths=again))
        assert client.get_run(run_id).max_driver_deaths == (None if first == 3 else first)  # unchanged
    message = str(caught.value)
    recorded = "none (the driving process's limit)" if first == 3 else str(first)
    assert f"run {run_id!r} exists with other options (max_driver_deaths: recorded {recorded}, given {again})" \
        in message, message
    assert ("no --max-driver-deaths" if first == 3 else f"--max-driver-deaths {first}") in message


def test_a_retried_submit_without_options_after_one_with_a_limit_is_refused(store_url: str) -> None:
    wf, run_id = _flow(), _new_id()
    with Client(store_url) as client:
        client.submit(wf, run_id=run_id, options=RunOptions(max_driver_deaths=2))
        with pytest.raises(UserError, match="max_driver_deaths: recorded 2, given 3"):
            client.submit(wf, run_id=run_id)


@pytest.mark.parametrize(("first", "again"), [(5, 5), (3, 3), (10**12, 10**15), (MAX_STORED_DEATHS, 10**12)])
def test_a_retried_submit_with_the_same_limit_returns_the_recorded_run(store_url: str, first: int,
                                                                       again: int) -> None:
    """Values above the column's largest are that largest, recorded and given alike."""
    wf, run_id = _flow(), _new_id()
    with Client(store_url) as client:
        recorded = client.submit(wf, run_id=run_id, options=RunOptions(max_driver_deaths=first))
        retried = client.submit(wf, run_id=run_id, options=RunOptions(max_driver_deaths=again))
        assert retried.run_id == recorded.run_id and retried.created_at == recorded.created_at
        assert retried.max_driver_deaths == recorded.max_driver_deaths

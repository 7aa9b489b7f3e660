"""``raysaga launch --run-id NEW`` that loses the insert to a concurrent launch (or any caller
recording that run id a moment before: ``RunExistsError`` in ``cli_launch._record``) drives the
run recorded under the id only after the checks an existing run gets: the same workflow, and the
same input when ``--input`` is given (``runner.existing_run``, as ``_existing_run`` checks it when
the run is there already). Before, that path checked the identity options alone, so the launch
reported "launched" and its job drove another workflow's run, or another input than it was given.

The race is made where it happens: the rival run is recorded between the launch's look-up (no run
yet) and its insert, from the code upload that comes between them (``cli_launch._upload_code``).
The cluster is ``tests.support.fake_jobs.FakeJobs``; on SQLite and PostgreSQL."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from raysaga import Workflow
from raysaga.orchestrator import cli_launch
from raysaga.orchestrator import launch as lx
from raysaga.orchestrator.runner import create_run
from raysaga.state import RunStatus, SqlStore
from tests.support.cli import invoke, one_line_error
from tests.support.fake_jobs import FakeJobs, project_cluster

MODULE = "launch_race_stop32_flow"
FLOW = textwrap.dedent('''
    from typing import Any

    from raysaga import Workflow

    wf = Workflow("launch_race_stop32")

    @wf.step()
    def only(input: Any) -> int:
        return 1
''')
ADDRESS = "http://127.0.0.1:8265"


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeJobs:
    return project_cluster(tmp_path, monkeypatch, MODULE, FLOW)


def _this_flow() -> Workflow:
    from raysaga.orchestrator.loader import load_workflow

    return load_workflow(f"{MODULE}:wf")


def _other_flow() -> Workflow:
    other = Workflow("launch_race_stop32_other")

    @other.step()
    def only(input: Any) -> int:
        return 2

    return other


def _rival_records_first(monkeypatch: pytest.MonkeyPatch, store_url: str, run_id: str, wf: Workflow,
                         value: Any) -> list[str]:
    """Record ``run_id`` (of ``wf``, input ``value``) as the launch uploads its code: after its
    look-up found no run, before its insert. The list returned holds the id once it is recorded."""
    upload = cli_launch._upload_code
    recorded: list[str] = []

    def rival_then_upload(client: Any, env: dict[str, Any]) -> None:
        if not recorded:
            store = SqlStore(store_url)
            try:
                recorded.append(create_run(wf, value, store=store, run_id=run_id).run_id)
            finally:
                store.close()
        upload(client, env)

    monkeypatch.setattr(cli_launch, "_upload_code", rival_then_upload)
    return recorded


def _launch(store_url: str, run_id: str, *options: str) -> tuple[int, str, str]:
    return invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", store_url, "--run-id", run_id, *options)


def _new_id() -> str:
    return f"raced-{uuid.uuid4().hex[:8]}"  # the PostgreSQL database is the session's: ids never repeat


def _as_recorded(store_url: str, run_id: str) -> tuple[str, Any, RunStatus]:
    store = SqlStore(store_url)
    try:
        run = store.get_run(run_id)
        return run.workflow_name, run.input, run.status
    finally:
        store.close()


@pytest.mark.parametrize("options", [(), ("--input", '{"n": 1}')])
def test_a_run_of_another_workflow_recorded_in_the_race_is_refused_and_no_job_drives_it(
        cluster: FakeJobs, store_url: str, monkeypatch: pytest.MonkeyPatch, options: tuple[str, ...]) -> None:
    run_id = _new_id()
    raced = _rival_records_first(monkeypatch, store_url, run_id, _other_flow(), {"n": 1})
    code, out, err = _launch(store_url, run_id, *options)
    assert raced == [run_id], "the race was not made"
    one_line_error(code, err, f"run {run_id!r} belongs to workflow 'launch_race_stop32_other', not "
                              "'launch_race_stop32'")
    assert out == "" and cluster.submitted == []
    assert _as_recorded(store_url, run_id) == ("launch_race_stop32_other", {"n": 1}, RunStatus.PENDING)


def test_a_run_of_another_input_recorded_in_the_race_is_refused_and_no_job_drives_it(
        cluster: FakeJobs, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = _new_id()
    raced = _rival_records_first(monkeypatch, store_url, run_id, _this_flow(), {"n": 1})
    code, out, err = _launch(store_url, run_id, "--input", '{"n": 2}')
    assert raced == [run_id], "the race was not made"
    one_line_error(code, err, f"run {run_id!r} exists with a different input")
    assert out == "" and cluster.submitted == []
    assert _as_recorded(store_url, run_id) == ("launch_race_stop32", {"n": 1}, RunStatus.PENDING)


@pytest.mark.parametrize("options", [
    ("--input", '{"n": 1}'),  # the same input
    (),  # no --input: the run is taken as recorded, as a launch of an existing --run-id takes it
])
def test_the_same_workflow_and_input_recorded_in_the_race_is_driven_by_one_job(
        cluster: FakeJobs, store_url: str, monkeypatch: pytest.MonkeyPatch, options: tuple[str, ...]) -> None:
    run_id = _new_id()
    raced = _rival_records_first(monkeypatch, store_url, run_id, _this_flow(), {"n": 1})
    code, out, err = _launch(store_url, run_id, *options)
    assert raced == [run_id], "the race was not made"
    assert code == 0 and out.strip() == run_id, err
    assert cluster.submitted == [lx.submission_id(run_id)]
    assert _as_recorded(store_url, run_id) == ("launch_race_stop32", {"n": 1}, RunStatus.PENDING)

"""A resume by run id (``raysaga run --run-id``, ``raysaga.run(..., run_id=...)``) of a run that
recorded its own ``max_driver_deaths`` refuses a differing limit given with it, naming both values
and how to fix it (``run_identity.same_own_deaths``, called by ``run_identity.same_options``). Before, the
run's own limit won and the one given was silently ignored: the caller believed the run parked
after their count of deaths.

A run recorded without its own limit (NULL: the driving process's) takes any limit on a resume:
there it is per drive. On the command line a flag left out is not "given 3" (the default), but
``--max-driver-deaths 3`` given is a limit like any other. On SQLite and PostgreSQL; the run is
driven inline."""

from __future__ import annotations

import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.errors import UserError
from raysaga.orchestrator import cli_input, run_identity, runner
from raysaga.state import RunStatus, SqlStore
from raysaga.state.models import MAX_STORED_DEATHS
from tests.support.cli import invoke, one_line_error, project_folder

MODULE = "resume_deaths_stop32_flow"
FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("resume_deaths_stop32")

    @wf.step()
    def only() -> int:
        return 1
''')


@pytest.fixture
def flow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Workflow]:
    """The workflow, importable as ``MODULE:wf`` for the CLI; the object itself for the Python API."""
    project_folder(tmp_path, monkeypatch, MODULE, FLOW)
    from raysaga.orchestrator.loader import load_workflow

    yield load_workflow(f"{MODULE}:wf")


def _new_id() -> str:
    return f"deaths-{uuid.uuid4().hex[:10]}"  # the PostgreSQL database is the session's: ids never repeat


def _recorded(store: SqlStore, wf: Workflow, deaths: int | None) -> str:
    """A pending run recorded with its own limit ``deaths`` (None: without one); its id."""
    options = RunOptions() if deaths is None else RunOptions(max_driver_deaths=deaths)
    return raysaga.create_run(wf, store=store, run_id=_new_id(), options=options).run_id


def _untouched(store: SqlStore, run_id: str, deaths: int | None) -> None:
    run = store.get_run(run_id)
    assert run.status == RunStatus.PENDING and run.fence == 0  # nothing claimed, nothing driven
    assert run.max_driver_deaths == deaths


# ---------------------------------------------------------------- raysaga.run(..., run_id=...)


@pytest.mark.parametrize(("recorded", "given"), [(5, 7), (5, 1), (1, 2), (MAX_STORED_DEATHS, 5)])
def test_a_resume_with_another_limit_than_the_runs_own_is_refused_naming_both(
        store: SqlStore, flow: Workflow, recorded: int, given: int) -> None:
    run_id = _recorded(store, flow, recorded)
    with pytest.raises(UserError) as refused:
        raysaga.run(flow, store=store, run_id=run_id, executor="inline", options=RunOptions(max_driver_deaths=given))
    message = str(refused.value)
    assert f"run {run_id!r} exists with other options (max_driver_deaths: recorded {recorded}, given {given})" \
        in message, message
    assert f"run again with --max-driver-deaths {recorded} (RunOptions.max_driver_deaths), or choose another " \
        "run_id" in message, message
    _untouched(store, run_id, recorded)


@pytest.mark.parametrize(("recorded", "given"), [
    (5, 5),
    (5, RunOptions.max_driver_deaths),  # the default: RunOptions cannot tell it from one left out
    (10**12, 10**15),  # both above the column's largest: that largest, recorded and given alike
    (None, 7),  # a run without its own limit: per drive, any limit resumes it
    (None, 1),
])
def test_the_runs_own_limit_or_none_resumes_it(store: SqlStore, flow: Workflow, recorded: int | None,
                                               given: int) -> None:
    run_id = _recorded(store, flow, recorded)
    done = raysaga.run(flow, store=store, run_id=run_id, executor="inline",
                       options=RunOptions(max_driver_deaths=given))
    assert done.status == RunStatus.COMPLETED
    assert store.get_run(run_id).max_driver_deaths == run_identity.own_limit(recorded or RunOptions.max_driver_deaths)


def test_a_run_recorded_by_a_racing_driver_is_compared_too(store: SqlStore, flow: Workflow,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ``raysaga.run`` of one new run id: the one whose insert loses takes the resume path
    (``runner.run``'s ``RunExistsError``), which compares the limit as well. The race is made
    by recording the winner's run between the look-up that found no run and the insert."""
    run_id = _new_id()
    looked_up = runner.existing_run

    def winner_records_first(wf: Workflow, st: Any, rid: str, input: Any) -> Any:
        if rid == run_id and not raced:
            raced.append(raysaga.create_run(flow, store=store, run_id=run_id, options=RunOptions(max_driver_deaths=5)))
            return None  # the look-up ran before the winner's insert: no run yet
        return looked_up(wf, st, rid, input)

    raced: list[Any] = []
    monkeypatch.setattr(runner, "existing_run", winner_records_first)
    with pytest.raises(UserError, match=r"\(max_driver_deaths: recorded 5, given 8\)"):
        raysaga.run(flow, store=store, run_id=run_id, executor="inline", options=RunOptions(max_driver_deaths=8))
    assert raced, "the race was not made"
    _untouched(store, run_id, 5)


# ---------------------------------------------------------------- raysaga run --run-id


def _run(store_url: str, run_id: str, *flags: str) -> tuple[int, str, str]:
    return invoke("run", f"{MODULE}:wf", "--executor", "inline", "--db", store_url, "--run-id", run_id,
                  "--quiet", *flags)


@pytest.mark.parametrize("given", ["7", "3"])  # 3 given on the command line is a limit, not "left out"
def test_run_run_id_with_another_limit_is_one_line_naming_both(store_url: str, flow: Workflow, given: str) -> None:
    store = SqlStore(store_url)
    try:
        run_id = _recorded(store, flow, 5)
        code, out, err = _run(store_url, run_id, "--max-driver-deaths", given)
        one_line_error(code, err, f"run {run_id!r} exists with other options (max_driver_deaths: recorded 5, "
                                  f"given {given}): it is fixed when a run is recorded; run again with "
                                  "--max-driver-deaths 5")
        assert out == ""
        _untouched(store, run_id, 5)
    finally:
        store.close()


@pytest.mark.parametrize(("recorded", "flags"), [
    (5, []),  # left out: the run resumes with its own limit
    (5, ["--max-driver-deaths", "5"]),
    (None, ["--max-driver-deaths", "7"]),  # a run without its own limit takes any
    (None, ["--max-driver-deaths", "3"]),
    (None, []),
])
def test_run_run_id_with_the_runs_limit_none_or_any_for_a_run_without_one_completes(
        store_url: str, flow: Workflow, recorded: int | None, flags: list[str]) -> None:
    store = SqlStore(store_url)
    try:
        run_id = _recorded(store, flow, recorded)
        code, _, err = _run(store_url, run_id, *flags)
        assert code == 0, err
        run = store.get_run(run_id)
        assert run.status == RunStatus.COMPLETED and run.max_driver_deaths == recorded  # a resume changes no limit
    finally:
        store.close()


def test_the_workflow_is_checked_before_the_limit(store_url: str, flow: Workflow) -> None:
    """The run's workflow comes first, as ``raysaga.run`` checks it: a limit compared with another
    workflow's run would name the wrong mistake."""
    other = Workflow("resume_deaths_stop32_other")

    @other.step()
    def only() -> int:
        return 1

    store = SqlStore(store_url)
    try:
        run_id = _recorded(store, other, 5)
    finally:
        store.close()
    code, _, err = _run(store_url, run_id, "--max-driver-deaths", "3")
    one_line_error(code, err, f"run {run_id!r} belongs to workflow 'resume_deaths_stop32_other', not "
                              "'resume_deaths_stop32'")


@pytest.mark.parametrize(("flag", "value"), [(None, RunOptions.max_driver_deaths), (3, 3), (9, 9)])
def test_one_helper_fills_the_default_of_a_flag_left_out(flag: int | None, value: int) -> None:
    assert cli_input.run_limit(flag) == value


@pytest.mark.parametrize(("first", "again"), [(5, 4), (5, 3), (3, 4)])
def test_a_retried_submit_is_told_what_it_was_told_before(store_url: str, flow: Workflow, first: int,
                                                          again: int) -> None:
    """``Client.submit`` compares with ``same_options`` (which now compares a resume's limit) and
    then ``same_deaths``: whichever refuses it, the words are ``same_deaths``' (a submit's limit is
    its own given or not, so "leave it out" would be wrong advice there)."""
    run_id = _new_id()
    with raysaga.Client(store_url) as client:
        client.submit(flow, run_id=run_id, options=RunOptions(max_driver_deaths=first))
        with pytest.raises(UserError) as refused:
            client.submit(flow, run_id=run_id, options=RunOptions(max_driver_deaths=again))
    recorded, fix = (str(first), f"--max-driver-deaths {first}") if first != 3 else \
        ("none (the driving process's limit)", "no --max-driver-deaths")
    assert str(refused.value) == (
        f"run {run_id!r} exists with other options (max_driver_deaths: recorded {recorded}, given {again}): it is "
        f"fixed when a run is recorded; submit again with {fix} (RunOptions.max_driver_deaths), or choose another "
        "run_id")

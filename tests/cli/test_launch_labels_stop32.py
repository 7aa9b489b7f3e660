"""``raysaga launch --label KEY=VALUE`` (repeatable), as ``run`` and ``submit`` have it: the labels
are recorded with the run (``status`` shows them, ``list --label`` finds it), checked as theirs are
(``cli_input.labels``; a label holding a secret refused as the store refuses it), and a launch of
an existing ``--run-id`` compares the labels it gives with the recorded ones as ``run --run-id``
does (``run_identity.same_options`` -> ``same_labels``): another set is refused naming the labels that
differ, and nothing is submitted; none given is not compared (how a run whose job died is taken
over). A refused label asks nothing of the cluster and records nothing. On SQLite and PostgreSQL;
the cluster is ``tests.support.fake_jobs.FakeJobs``."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from raysaga.errors import RunNotFoundError
from raysaga.orchestrator import cli_launch
from raysaga.orchestrator import launch as lx
from raysaga.orchestrator.runner import create_run
from raysaga.state import SqlStore
from raysaga.types import RunOptions
from tests.support.cli import invoke, one_line_error
from tests.support.fake_jobs import FakeJobs, project_cluster

MODULE = "launch_labels_stop32_flow"
FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("launch_labels_stop32")

    @wf.step()
    def only() -> int:
        return 1
''')
ADDRESS = "http://127.0.0.1:8265"


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeJobs:
    return project_cluster(tmp_path, monkeypatch, MODULE, FLOW)


def _launch(store_url: str, run_id: str, *options: str) -> tuple[int, str, str]:
    return invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", store_url, "--run-id", run_id, *options)


def _new_id() -> str:
    return f"tagged-{uuid.uuid4().hex[:8]}"  # the PostgreSQL database is the session's: ids never repeat


def _labels(store_url: str, run_id: str) -> dict[str, str]:
    store = SqlStore(store_url)
    try:
        return store.get_run(run_id).labels
    finally:
        store.close()


def _exists(store_url: str, run_id: str) -> bool:
    store = SqlStore(store_url)
    try:
        store.get_run(run_id)
        return True
    except RunNotFoundError:
        return False
    finally:
        store.close()


def test_labels_are_recorded_with_the_run_and_found_by_list(cluster: FakeJobs, store_url: str) -> None:
    run_id = _new_id()
    code, out, err = _launch(store_url, run_id, "--label", "team=billing", "--label", f"ticket={run_id}",
                             "--label", "empty=")
    assert code == 0 and out.strip() == run_id, err
    assert cluster.submitted == [lx.submission_id(run_id)]
    assert _labels(store_url, run_id) == {"team": "billing", "ticket": run_id, "empty": ""}
    code, out, err = invoke("list", "--db", store_url, "--label", f"ticket={run_id}")
    assert code == 0 and run_id in out, err


def test_the_help_names_the_option(cluster: FakeJobs) -> None:
    code, out, _ = invoke("launch", "--help")
    assert code == 0 and "--label" in out and "KEY=VALUE" in out


@pytest.mark.parametrize(("labels", "message"), [
    (["team"], "--label 'team' is not KEY=VALUE: e.g. --label team=billing"),
    (["team=a", "team=b"], "--label 'team' is given twice ('a' and 'b'): give each label once"),
    (["=x"], "--label: the key"),
    (["token=sk-ant-api03-abcdefghijklmnop"], "holds what looks like a secret"),
])
def test_a_bad_label_is_one_line_and_nothing_is_asked_or_recorded(cluster: FakeJobs, store_url: str,
                                                                  labels: list[str], message: str) -> None:
    run_id = _new_id()
    code, out, err = _launch(store_url, run_id, *[a for pair in labels for a in ("--label", pair)])
    one_line_error(code, err, message)
    assert "sk-ant-api03" not in err and out == ""
    assert cluster.connects == 0 and cluster.uploads == 0 and cluster.submitted == []
    assert not _exists(store_url, run_id)


def test_an_existing_run_launched_with_other_labels_is_refused_naming_them(cluster: FakeJobs,
                                                                           store_url: str) -> None:
    run_id = _new_id()
    assert _launch(store_url, run_id, "--label", "team=a", "--label", "env=prod")[0] == 0
    cluster.jobs[lx.submission_id(run_id)].status = "FAILED"  # its job died: a launch would start another
    for given, shown in ((["team=b", "env=prod"], "'team': recorded 'a', given 'b'"),
                         (["team=a"], "'env': recorded 'prod', given none"),
                         (["team=a", "env=prod", "x=1"], "'x': recorded none, given '1'")):
        code, out, err = _launch(store_url, run_id, *[a for pair in given for a in ("--label", pair)])
        one_line_error(code, err, f"run {run_id!r} exists with other labels ({shown}): launch again with the "
                                  "labels it was recorded with")
        assert out == ""
    assert cluster.submitted == [lx.submission_id(run_id)]  # nothing more was submitted
    assert _labels(store_url, run_id) == {"team": "a", "env": "prod"}


@pytest.mark.parametrize("given", [["--label", "env=prod", "--label", "team=a"], []])
def test_the_recorded_labels_or_none_launch_the_next_job(cluster: FakeJobs, store_url: str,
                                                         given: list[str]) -> None:
    run_id = _new_id()
    assert _launch(store_url, run_id, "--label", "team=a", "--label", "env=prod")[0] == 0
    cluster.jobs[lx.submission_id(run_id)].status = "FAILED"
    code, out, err = _launch(store_url, run_id, *given)
    assert code == 0 and out.strip() == run_id, err
    assert cluster.submitted == [lx.submission_id(run_id), lx.submission_id(run_id, 2)]
    assert _labels(store_url, run_id) == {"team": "a", "env": "prod"}


def test_a_run_recorded_by_a_racing_launch_with_other_labels_is_refused(cluster: FakeJobs, store_url: str,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The race path (``cli_launch._record``'s ``RunExistsError``) compares the labels too: the
    rival run is recorded as the launch uploads its code, after its look-up found no run."""
    from raysaga.orchestrator.loader import load_workflow

    run_id = _new_id()
    upload = cli_launch._upload_code

    def rival_then_upload(client: object, env: dict[str, object]) -> None:
        store = SqlStore(store_url)
        try:
            create_run(load_workflow(f"{MODULE}:wf"), None, store=store, run_id=run_id,
                       options=RunOptions(labels={"team": "rival"}))
        finally:
            store.close()
        monkeypatch.setattr(cli_launch, "_upload_code", upload)
        upload(client, env)  # type: ignore[arg-type]

    monkeypatch.setattr(cli_launch, "_upload_code", rival_then_upload)
    code, out, err = _launch(store_url, run_id, "--label", "team=mine")
    one_line_error(code, err, "'team': recorded 'rival', given 'mine'")
    assert out == "" and cluster.submitted == []
    assert _labels(store_url, run_id) == {"team": "rival"}

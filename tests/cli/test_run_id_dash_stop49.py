"""A new run's id that starts with ``-`` (review, stop 49).

``raysaga run ... --run-id -dash`` made the run, and every hint printed after it (``raysaga status
-dash``, a launch's "follow it", a Ctrl-C's "resume it") was a command line click reads as an
unknown option. A new run's id starting with ``-`` is now refused (``UserError``, exit 2), naming
why, before anything is recorded: ``run``, ``submit``, ``launch`` (before the code is uploaded)
and the Python API (``run``, ``create_run``, ``Client.submit``). Real SQLite files and PostgreSQL
(a database of the test's own: nothing recorded means none); the Ray Job API of the launch is
``tests.support.fake_jobs`` (what is tested is what raysaga does before it calls it).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import raysaga
from raysaga import Client, Workflow
from raysaga.errors import UserError
from raysaga.state import SqlStore
from tests.support.cli import invoke, one_line_error
from tests.support.fake_jobs import project_cluster

MODULE = "run_id_dash_stop49_flow"
FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("run_id_dash_stop49")

    @wf.step()
    def only() -> int:
        return 1
''')
REFUSED = "run id '-dash' starts with '-', which a command line reads as an option"


def _runs(url: str) -> list[str]:
    store = SqlStore(url)
    try:
        return [r.run_id for r in store.list_runs()]
    finally:
        store.close()


def test_the_cli_refuses_a_new_run_id_starting_with_a_dash(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = project_cluster(tmp_path, monkeypatch, MODULE, FLOW)
    db = str(tmp_path / "s.db")
    for args in (("run", f"{MODULE}:wf", "--executor", "inline"), ("submit", f"{MODULE}:wf"),
                 ("launch", f"{MODULE}:wf", "--address", "http://127.0.0.1:8265")):
        code, _out, err = invoke(*args, "--run-id", "-dash", "--db", db)
        one_line_error(code, err, REFUSED)
    assert _runs(f"sqlite:///{db}") == []
    assert fake.uploads == 0 and fake.submitted == []  # the launch uploaded nothing
    code, out, err = invoke("run", f"{MODULE}:wf", "--executor", "inline", "--run-id", "a-dash", "--db", db)
    assert code == 0 and "completed" in out, err  # a dash further in is an id like any other


def test_the_python_api_refuses_a_new_run_id_starting_with_a_dash(own_store_url: str) -> None:
    wf = Workflow("run_id_dash_api_stop49")

    @wf.step()
    def only() -> int:
        return 1

    with pytest.raises(UserError, match=REFUSED):
        raysaga.run(wf, store=own_store_url, run_id="-dash", executor="inline")
    with pytest.raises(UserError, match=REFUSED):
        raysaga.create_run(wf, store=own_store_url, run_id="-dash")
    with Client(own_store_url) as client, pytest.raises(UserError, match=REFUSED):
        client.submit(wf, None, run_id="-dash")
    assert _runs(own_store_url) == []

"""The ``--db`` of the "follow it" line ``raysaga launch`` prints (review, stop 49).

With the store in ``RAYSAGA_DB`` (a PostgreSQL URL with a password) a launch printed ``follow it:
raysaga status RUN --db postgresql://postgres:[redacted]@...``, which pasted failed to
authenticate. Now a store from ``RAYSAGA_DB`` is left out (the shell that follows has it too); one
given with ``--db`` holding a password is ``--db <your store URL>`` with a note that it is not
printed; a file given with ``--db`` is its absolute path, quoted for the shell.

The Ray Job API is ``tests.support.fake_jobs`` (the line is what raysaga makes of the launch);
the stores are a real SQLite file and a real PostgreSQL database.
"""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support.cli import invoke
from tests.support.fake_jobs import FakeJobs, project_cluster

MODULE = "launch_hint_stop49_flow"
FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("launch_hint_stop49")

    @wf.step()
    def only() -> int:
        return 1
''')
ADDRESS = "http://127.0.0.1:8265"
PASSWORD = "pw-stop49-not-shown"


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeJobs:
    return project_cluster(tmp_path, monkeypatch, MODULE, FLOW)


def _follow_line(err: str) -> str:
    [line] = [x for x in err.splitlines() if x.startswith("follow it: ")]
    return line


def _with_password(pg_url: str) -> str:
    """``pg_url`` with a password in it (the local server trusts the connection: any one is taken)."""
    return make_url(pg_url).set(password=PASSWORD).render_as_string(hide_password=False)


def test_a_store_from_raysaga_db_is_left_out_of_the_follow_line(cluster: FakeJobs, pg_url: str) -> None:
    code, out, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, env={"RAYSAGA_DB": _with_password(pg_url)})
    assert code == 0, err
    line = _follow_line(err)
    assert line.startswith(f"follow it: raysaga status {shlex.quote(out.strip())}  (") and "--db" not in line, line
    assert PASSWORD not in err and cluster.submitted == [f"raysaga-{out.strip()}"]


def test_a_store_url_given_with_a_password_is_a_placeholder(cluster: FakeJobs, pg_url: str) -> None:
    code, out, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", _with_password(pg_url))
    assert code == 0, err
    line = _follow_line(err)
    assert f"raysaga status {shlex.quote(out.strip())} --db <your store URL>  (the store URL is not printed: it " \
           "holds a password; the driver's log: " in line, line
    assert PASSWORD not in err and "[redacted]" not in line


def test_a_store_file_given_is_its_absolute_path(cluster: FakeJobs, tmp_path: Path) -> None:
    folder = tmp_path / "my stores"
    folder.mkdir()
    code, out, err = invoke("launch", f"{MODULE}:wf", "--address", ADDRESS, "--db", "../my stores/s.db")
    assert code == 0, err
    where = shlex.quote(str((folder / "s.db").resolve()))
    assert f"raysaga status {shlex.quote(out.strip())} --db {where}  (the driver's log: " in _follow_line(err)

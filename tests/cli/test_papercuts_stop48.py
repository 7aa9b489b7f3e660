"""CLI papercuts (stop 48): each was a raw Python/psycopg error or a silent mistake.

- a store path or URL with ``~user`` naming no user said ``RuntimeError: Could not determine home
  directory``; a PostgreSQL URL's bad query option (``?connect_timeout=abc``, an unknown option,
  one given twice) said psycopg's ``ProgrammingError`` (``prepare_threshold=0``: a ``TypeError``);
  ``list``'s "more:" line printed a store URL's ``?password=`` in full;
- ``--executor inline --address garbage`` was accepted silently (run, resume, retry, cancel, worker);
- ``list --before RUN`` with RUN pruned said "no run with id ...: `raysaga list` shows the runs";
- ``status --json --summary`` listed an agent's turns and tool calls (``work@0``, ``work@0.1``) as
  steps, and its agent step last (its own row has no start).
"""

from __future__ import annotations

import importlib
import json
from importlib import resources
from pathlib import Path

import jsonschema
import pytest
from sqlalchemy.engine import make_url

import raysaga
from raysaga.errors import StoreUnavailableError
from tests.support.cli import invoke, one_line_error, project_folder
from tests.support.papercut_flows import AGENT_FLOW, KEEP_FLOW, age_run, no_such_user

PASSWORD = "pw-stop48-hunter2"


# ------------------------------------------------------------------------- a. ~user and URL options


@pytest.mark.parametrize("form", ["path", "url"])
@pytest.mark.parametrize("command", [["list"], ["status", "r1"], ["events", "r1"], ["prune", "--older-than", "1d"]])
def test_a_tilde_user_that_does_not_exist_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    form: str, command: list[str]) -> None:
    monkeypatch.chdir(tmp_path)
    user = no_such_user()
    db = f"~{user}/x.db" if form == "path" else f"sqlite:///~{user}/x.db"
    code, _, err = invoke(*command, "--db", db)
    one_line_error(code, err, f"there is no user {user!r} on this machine")
    assert f"~{user}" in err and "write the path in full" in err, err
    assert list(tmp_path.iterdir()) == []  # nothing created


def test_a_tilde_user_in_run_and_in_raysaga_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project_folder(tmp_path, monkeypatch, "papercut_keep", KEEP_FLOW)
    user = no_such_user()
    code, _, err = invoke("run", "papercut_keep:wf", "--input", "1", "--executor", "inline", "--db", f"~{user}/x.db")
    one_line_error(code, err, f"the store path '~{user}/x.db' starts with ~{user}")
    code, _, err = invoke("list", env={"RAYSAGA_HOME": f"~{user}/r"})
    one_line_error(code, err, f"RAYSAGA_HOME='~{user}/r' starts with ~{user}")
    with pytest.raises(StoreUnavailableError, match=f"no user {user!r}"):  # the Python API too
        raysaga.Client(f"~{user}/x.db")


def _with(url: str, query: str, password: bool = True) -> str:
    parsed = make_url(url)
    if password:
        parsed = parsed.set(password=PASSWORD)
    return parsed.render_as_string(hide_password=False) + "?" + query


@pytest.mark.parametrize(("query", "message"), [
    ("connect_timeout=abc", "the option ?connect_timeout='abc' of the PostgreSQL URL"),
    ("connect_timeout=1e400", "?connect_timeout='1e400'"),
    ("port=abc", "?port='abc'"),
    ("keepalives=x", "?keepalives='x'"),
    ("bogus=1", "has the option ?bogus=, which is not a PostgreSQL connection option"),
    ("prepare_threshold=0", "has the option ?prepare_threshold=, which is not"),
    ("autocommit=true", "has the option ?autocommit=, which is not"),
    (f"passwrd={PASSWORD}", "has the option ?passwrd=, which is not"),
    ("connect_timeout=3&connect_timeout=4", "gives the option ?connect_timeout= 2 times: keep one"),
    ("port=5432&port=5433", "gives the option ?port= 2 times: keep one"),
    ("host=127.0.0.1,127.0.0.1&port=5432,x", "?port='x'"),
    ("host=127.0.0.1:5432&host=127.0.0.1:x", "the hosts and ports of the PostgreSQL URL"),
])
def test_a_bad_postgres_url_options_are_named(pg_url: str, query: str, message: str) -> None:
    for command in (["list"], ["status", "r1", "--json"], ["stats"]):
        code, _, err = invoke(*command, "--db", _with(pg_url, query))
        one_line_error(code, err, message)
        assert PASSWORD not in err and "ProgrammingError" not in err and "TypeError" not in err, err
    with pytest.raises(StoreUnavailableError, match="PostgreSQL URL") as caught:
        raysaga.Client(_with(pg_url, query))
    assert PASSWORD not in str(caught.value)


def test_a_good_postgres_url_options_still_open(pg_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project_folder(tmp_path, monkeypatch, "papercut_keep", KEEP_FLOW)
    for query in ("connect_timeout=10", "connect_timeout=", "application_name=stop48&sslmode=prefer",
                  "host=127.0.0.1:5432&host=127.0.0.1:5432", "host=127.0.0.1,127.0.0.1&port=5432,5432"):
        db = _with(pg_url, query, password=False)
        code, out, err = invoke("run", "papercut_keep:wf", "--input", "7", "--executor", "inline", "--db", db, "-q")
        assert code == 0, err
        assert "completed" in out


def test_a_more_line_never_prints_a_query_password(pg_url: str, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    project_folder(tmp_path, monkeypatch, "papercut_keep", KEEP_FLOW)
    db = _with(pg_url, f"password={PASSWORD}", password=False)  # the server trusts 127.0.0.1: it is not asked for
    for value in ("1", "2"):
        code, _, err = invoke("run", "papercut_keep:wf", "--input", value, "--executor", "inline", "--db", db, "-q")
        assert code == 0, err
    code, out, err = invoke("list", "--limit", "1", "--db", db)
    assert code == 0, err
    assert "more: raysaga list --before" in out and "--db ..." in out, out
    assert PASSWORD not in out + err, out


# ------------------------------------------------------------------------- b. --address with inline


def test_b_address_with_the_inline_executor_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project_folder(tmp_path, monkeypatch, "papercut_keep", KEEP_FLOW)
    db = str(tmp_path / "b.db")
    code, _, err = invoke("run", "papercut_keep:wf", "--input", "1", "--executor", "inline", "--address", "garbage",
                          "--db", db)
    one_line_error(code, err, "--address names a Ray cluster to join, and --executor inline joins none")
    assert "drop --address" in err
    assert not Path(db).exists()  # refused before the store was opened
    code, _, err = invoke("run", "papercut_keep:wf", "--input", "1", "--executor", "inline", "--db", db,
                          "--run-id", "b1", "-q")
    assert code == 0, err
    for command in (["resume", "b1"], ["retry", "b1"], ["cancel", "b1"], ["fork", "b1", "--from", "one"]):
        code, _, err = invoke(*command, "--executor", "inline", "--address", "10.0.0.1:6379", "--db", db)
        one_line_error(code, err, "drop --address")
    code, _, err = invoke("worker", "-w", "papercut_keep:wf", "--executor", "inline", "--address", "garbage",
                          "--db", db)
    one_line_error(code, err, "--address names a Ray cluster to join, and the inline executor joins none")
    config = tmp_path / "worker.toml"
    config.write_text('workflows = ["papercut_keep:wf"]\nexecutor = "inline"\naddress = "10.0.0.1:6379"\n')
    code, _, err = invoke("worker", "--config", str(config), "--db", db)
    one_line_error(code, err, f"drop the address from {config}")


def test_b_ray_address_in_the_environment_is_left_aside_by_inline(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray job's driver has RAY_ADDRESS set: ``--executor inline`` there must still run."""
    project_folder(tmp_path, monkeypatch, "papercut_keep", KEEP_FLOW)
    db = str(tmp_path / "b.db")
    code, out, err = invoke("run", "papercut_keep:wf", "--input", "3", "--executor", "inline", "--db", db, "-q",
                            env={"RAY_ADDRESS": "10.0.0.1:6379"})
    assert code == 0, err
    assert "completed" in out


# ------------------------------------------------------------------------- c. list --before a pruned run


def test_c_list_before_a_pruned_run_says_it_is_gone_and_how_to_page(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    project_folder(tmp_path, monkeypatch, "papercut_keep", KEEP_FLOW)
    db = f"sqlite:///{tmp_path / 'c.db'}"
    wf = importlib.import_module("papercut_keep").wf
    for i in range(1, 6):
        raysaga.run(wf, i, store=db, run_id=f"c{i}", executor="inline")
    code, out, _ = invoke("list", "--limit", "3", "--db", db)
    assert code == 0
    assert "more: raysaga list --before c3" in out, out
    age_run(db, "c3", days=3)
    code, out, err = invoke("prune", "--older-than", "1d", "--db", db)
    assert code == 0 and "deleted 1 run" in out, out + err
    for extra in ([], ["--json"]):
        code, _, err = invoke("list", "--before", "c3", "--db", db, *extra)
        one_line_error(code, err, "--before 'c3': there is no run with that id in")
        assert "`raysaga prune` deletes finished runs" in err and "pass --before the run listed just above it" in err
    # the advice: the run listed above c3 (c4) pages on from where c3 was
    code, out, err = invoke("list", "--before", "c4", "--json", "--db", db)
    assert code == 0, err
    assert [r["run_id"] for r in json.loads(out)] == ["c2", "c1"]


# ------------------------------------------------------------------------- d. status --json --summary


def test_d_summary_lists_workflow_steps_with_agent_turns_under_their_step(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project_folder(tmp_path, monkeypatch, "papercut_agent", AGENT_FLOW)
    db = str(tmp_path / "d.db")
    code, _, err = invoke("run", "papercut_agent:wf", "--input", '"hi"', "--executor", "inline", "--db", db,
                          "--run-id", "d1", "-q")
    assert code == 0, err
    code, out, err = invoke("status", "d1", "--json", "--summary", "--db", db)
    assert code == 0, err
    doc = json.loads(out)
    schema = json.loads(resources.files("raysaga.orchestrator.dashboard").joinpath("status.schema.json").read_text())
    jsonschema.validate(doc, schema)
    assert [s["step"] for s in doc["steps"]] == ["first", "work", "last"]  # in the order they ran
    work = doc["steps"][1]
    assert work["agent"] == {"turns": 3, "tool_calls": 3, "unfinished": {}}
    assert work["nodes"] == 1 and work["counts"] == {"completed": 1}  # the agent's own row, as before
    assert work["first_started_at"] is not None
    assert all("agent" not in s for s in (doc["steps"][0], doc["steps"][2]))
    assert doc["node_counts"] == {"completed": 9}  # every row, turns and calls included, as before

"""``raysaga launch`` without a cluster: what it ships and how it names jobs, and every refusal is
one line naming the fix, made before a run is recorded (or a store file created). The launch
itself, on a real cluster with token authentication, is ``tests/cluster/test_launch.py``."""

from __future__ import annotations

import json
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raysaga.errors import UserError
from raysaga.orchestrator import launch as lx
from raysaga.orchestrator import step_env
from tests.support.cli import invoke, one_line_error, project_folder
from tests.support.ports import refused_port

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("launchable")

    @wf.step()
    def only() -> int:
        return 1
''')


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return project_folder(tmp_path, monkeypatch, "launchable_flow", FLOW)


def test_submission_ids_come_from_the_run_id() -> None:
    assert lx.submission_id("order-42") == "raysaga-order-42" == lx.submission_id("order-42", 1)
    assert lx.submission_id("order-42", 2) == "raysaga-order-42-2"
    odd = lx.submission_id("a run/with spaces")
    assert odd == lx.submission_id("a run/with spaces") and odd.startswith("raysaga-a-run-with-spaces-")
    assert odd != lx.submission_id("a run with/spaces")  # the digest keeps look-alikes apart


def test_only_the_named_variables_travel_and_the_store_url_stays_off_the_command_line() -> None:
    environ = {"VENDOR_TOKEN": "t0k", "HOME": "/home/me", "AWS_SECRET_ACCESS_KEY": "nope"}
    env = lx.env_vars(["VENDOR_TOKEN"], environ)
    assert env == {"VENDOR_TOKEN": "t0k"}
    shipped = lx.runtime_env(Path("/src/project"), env, "postgresql://u:pw@db/raysaga")
    assert shipped["env_vars"] == {"VENDOR_TOKEN": "t0k", "RAYSAGA_DB": "postgresql://u:pw@db/raysaga"}
    assert shipped["working_dir"] == "/src/project" and ".venv" in shipped["excludes"]
    entry = lx.entrypoint("run 1", 15.0)
    assert entry == "python -m raysaga resume --quiet --lease-ttl 15 -- 'run 1'"
    assert "pw" not in entry
    assert "working_dir" not in lx.runtime_env(None, {}, "sqlite:////x.db")


def test_the_working_dir_is_the_folder_the_module_is_imported_from(project: Path) -> None:
    assert lx.source_root("launchable_flow:wf") == project.resolve()
    assert lx.source_root("pydantic:BaseModel") is None  # installed: the cluster must have it itself


@pytest.mark.parametrize(("address", "message"), [
    ("ray://head:10001", "Ray Client (ray://) is not how a run is launched"),
    ("head", "is not a dashboard URL with a port"),
    ("http://head:0", "is not a dashboard URL with a port"),
])
def test_a_bad_address_is_refused(project: Path, tmp_path: Path, address: str, message: str) -> None:
    db = tmp_path / "raysaga.db"
    code, _, err = invoke("launch", "launchable_flow:wf", "--address", address, "--db", f"sqlite:///{db}")
    one_line_error(code, err, message)
    assert "http://HEAD:8265" in err
    assert not db.exists()


@pytest.mark.parametrize(("env", "message"), [
    ("VENDOR_TOKEN=abc", "--env 'VENDOR_TOKEN=abc' is not a variable name: pass the NAME only"),
    ("RAYSAGA_TEST_SURELY_UNSET", "--env RAYSAGA_TEST_SURELY_UNSET: not set in this environment; export it first"),
    ("RAYSAGA_DB", "--env RAYSAGA_DB: raysaga or Ray sets RAYSAGA_DB itself; drop it"),
])
def test_a_bad_env_option_is_refused(project: Path, tmp_path: Path, env: str, message: str) -> None:
    db = tmp_path / "raysaga.db"
    code, _, err = invoke("launch", "launchable_flow:wf", "--address", "http://127.0.0.1:8265", "--env", env,
                          "--db", f"sqlite:///{db}")
    one_line_error(code, err, message)
    assert "abc" not in err.replace("VENDOR_TOKEN=abc", "") and not db.exists()


def test_a_job_api_nobody_answers_is_one_line_and_nothing_is_recorded(project: Path, tmp_path: Path) -> None:
    db = tmp_path / "raysaga.db"
    port = refused_port()
    started = time.monotonic()
    code, out, err = invoke("launch", "launchable_flow:wf", "--address", f"http://127.0.0.1:{port}",
                            "--db", f"sqlite:///{db}")
    assert time.monotonic() - started < 30
    one_line_error(code, err, f"cannot reach the Ray Job API at http://127.0.0.1:{port}")
    assert "ray start --head --dashboard-port" in err
    assert out == "" and not db.exists()  # the cluster is asked before the store is even opened


def test_a_module_given_as_a_file_outside_the_path_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))  # loading a file adds its folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "flows.py").write_text(FLOW)
    code, _, err = invoke("launch", f"{elsewhere / 'flows.py'}:wf", "--address", "http://127.0.0.1:8265",
                          "--db", f"sqlite:///{tmp_path / 'raysaga.db'}")
    one_line_error(code, err, "is not importable as MODULE:WORKFLOW from this folder")


def test_a_driver_forwards_the_variables_raysaga_env_names_and_nothing_else() -> None:
    environ = {"RAYSAGA_ENV": "VENDOR_TOKEN, REGION", "VENDOR_TOKEN": "t0k", "REGION": "eu", "HOME": "/home/me"}
    assert step_env.forwarded(environ) == {"VENDOR_TOKEN": "t0k", "REGION": "eu"}
    assert step_env.forwarded({"HOME": "/home/me"}) == {}
    # inside a Ray Job that already carries one of them, Ray would refuse the same key twice
    job = json.dumps({"runtime_env": {"env_vars": {"VENDOR_TOKEN": "t0k"}}})
    assert step_env.forwarded({**environ, "RAY_JOB_CONFIG_JSON_ENV_VAR": job}) == {"REGION": "eu"}
    with pytest.raises(UserError, match="RAYSAGA_ENV MISSING_ONE: not set in this environment"):
        step_env.forwarded({"RAYSAGA_ENV": "MISSING_ONE"})
    with pytest.raises(UserError, match="RAYSAGA_ENV PYTHONPATH: raysaga or Ray sets PYTHONPATH itself"):
        step_env.forwarded({"RAYSAGA_ENV": "PYTHONPATH", "PYTHONPATH": "/x"})

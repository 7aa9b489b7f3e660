"""Third adversarial round, ``raysaga launch`` against a server that is not (quite) a Ray Job API.

A server that answered the SDK's version check but not job requests (a proxy in front of the
head, a partial or older dashboard, another service on the port) passed ``connect``; the launch
then recorded the run and failed at its first job request with a bare
``JSONDecodeError: Expecting value`` (or ``RuntimeError: Request failed with status code 404``),
leaving a ``pending`` run that no worker claims and nothing drives. A server answering 404 to
the version check failed with the SDK's ``RuntimeError`` text. Now each is one line naming the
server and what --address must be, and nothing is recorded.
"""

from __future__ import annotations

import http.server
import json
import textwrap
import threading
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga.state import SqlStore
from tests.support.cli import invoke, one_line_error, project_folder
from tests.support.fake_jobs import FakeJobInfo, FakeJobs
from tests.support.ports import refused_port

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("launchable_stop28")

    @wf.step()
    def only() -> int:
        return 1
''')

VERSION = {"version": "4", "ray_version": "2.52.0", "ray_commit": "0", "session_name": "s"}


def _handler(mode: str) -> type[http.server.BaseHTTPRequestHandler]:
    class Answers(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            return

        def _answer(self) -> None:
            code, kind, body = 200, "text/html", b"<html>sign in</html>"
            if self.path.startswith("/api/version"):
                if mode == "no version":
                    code, kind, body = 404, "text/plain", b"404: Not Found"
                else:
                    kind, body = "application/json", json.dumps(VERSION).encode()
            elif mode == "submit answers html" and self.command == "GET" and self.path.startswith("/api/jobs/"):
                code, kind, body = 404, "text/plain", f"Job {self.path.rsplit('/', 1)[-1]} does not exist".encode()
            elif mode == "submit answers html" and self.path.startswith("/api/packages/"):
                kind, body = "text/plain", b"ok"  # the code package is there already
            elif mode == "jobs 503":
                code, kind, body = 503, "text/plain", b"503: Service Unavailable"
            elif mode == "jobs 404":
                code, kind, body = 404, "text/plain", b"404: Not Found"
            elif mode == "jobs not a job":
                kind, body = "application/json", b"[1, 2, 3]"
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

    return Answers


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return project_folder(tmp_path, monkeypatch, "launchable_stop28_flow", FLOW)


@pytest.fixture(params=["jobs html", "jobs 404", "jobs not a job", "no version"])
def server(request: pytest.FixtureRequest) -> Iterator[str]:
    """A local HTTP server answering as ``request.param`` says; yields its URL."""
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(str(request.param)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.mark.parametrize("run_id", [None, "order-7"])
def test_a_server_that_is_not_a_job_api_is_one_line_and_nothing_is_recorded(project: Path, tmp_path: Path,
                                                                            server: str, run_id: str | None) -> None:
    db = tmp_path / "raysaga.db"
    args = ["launch", "launchable_stop28_flow:wf", "--address", server, "--db", f"sqlite:///{db}"]
    code, out, err = invoke(*args, *(["--run-id", run_id] if run_id else []))
    one_line_error(code, err, f"the server at {server} does not answer as a Ray Job API")
    assert "http://HEAD:8265" in err and out == ""
    if db.exists():  # the store may be opened; no run is recorded in it
        store = SqlStore(f"sqlite:///{db}")
        try:
            assert store.list_runs() == []
        finally:
            store.close()


@pytest.mark.parametrize("server", ["jobs html"], indirect=True)
@pytest.mark.parametrize("variable", ["RAY_ADDRESS", "RAY_API_SERVER_ADDRESS"])
def test_the_address_given_wins_over_a_ray_address_in_the_environment(project: Path, tmp_path: Path, server: str,
                                                                       variable: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Ray's job SDK takes RAY_ADDRESS (or RAY_API_SERVER_ADDRESS) over the address it is given:
    with another cluster's address in the shell, ``launch --address URL`` asked that cluster (here
    nobody: 'Failed to connect to Ray at address: http://127.0.0.1:8265') instead of URL."""
    port = refused_port()
    monkeypatch.setenv(variable, f"http://127.0.0.1:{port}" if variable != "RAY_ADDRESS" else f"127.0.0.1:{port}")
    code, _, err = invoke("launch", "launchable_stop28_flow:wf", "--address", server, "--db",
                          f"sqlite:///{tmp_path / 'raysaga.db'}")
    one_line_error(code, err, f"the server at {server} does not answer as a Ray Job API")


@pytest.mark.parametrize("server", ["submit answers html"], indirect=True)
def test_a_submission_answered_with_garbage_names_the_recorded_run(project: Path, tmp_path: Path, server: str) -> None:
    """The job API looked sound up to the submission itself: the run is recorded by then, so the
    line says so and how to launch it again (was: ``JSONDecodeError: Expecting value``)."""
    db = tmp_path / "raysaga.db"
    code, _, err = invoke("launch", "launchable_stop28_flow:wf", "--address", server, "--db", f"sqlite:///{db}",
                          "--run-id", "order-8")
    one_line_error(code, err, "the Ray cluster refused job raysaga-order-8 for run 'order-8' (the server at")
    assert "the run is recorded, not started; fix that and launch again with --run-id order-8" in err


def test_another_runs_job_under_a_colliding_id_is_not_taken_for_this_runs_driver(tmp_path: Path) -> None:
    """Run ``sync-11``'s second driver is job ``raysaga-sync-11-2``, which is also the first job
    id of run ``sync-11-2``: launching ``sync-11-2`` while that job ran said "already launched"
    and left the run pending with no driver (and ``--wait`` followed the other run)."""
    from raysaga import Workflow
    from raysaga.orchestrator import cli_launch
    from raysaga.orchestrator.runner import create_run

    wf = Workflow("stop28_collide")

    @wf.step()
    def only() -> int:
        return 1

    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        record = create_run(wf, None, store=store, run_id="sync-11-2")
        cluster = FakeJobs({"raysaga-sync-11": FakeJobInfo("FAILED", "sync-11"),
                            "raysaga-sync-11-2": FakeJobInfo("RUNNING", "sync-11")})
        entry = "python -m raysaga resume sync-11-2"
        job = cli_launch._drive_on_cluster(cluster, store, record, {}, entry)  # type: ignore[arg-type]
        assert job is not None and job.started, "the other run's job was taken for this run's driver"
        assert cluster.submitted == ["raysaga-sync-11-2-2"]  # the first job id no job holds yet
        assert cluster.jobs["raysaga-sync-11-2-2"].metadata == {"raysaga_run_id": "sync-11-2"}
    finally:
        store.close()


def _shipped(root: Path, tmp_path: Path) -> set[str]:
    """The files Ray's own packaging puts in the job's working_dir package, with launch's excludes."""
    from ray._private.runtime_env.packaging import create_package

    from raysaga.orchestrator import launch as lx

    target = tmp_path / "package.zip"
    create_package(str(root), target, include_gitignore=True, excludes=list(lx.EXCLUDES))
    with zipfile.ZipFile(target) as zf:
        return {name for name in zf.namelist() if not name.endswith("/")}


def test_secrets_next_to_the_code_are_not_shipped_to_the_cluster(project: Path, tmp_path: Path) -> None:
    """The project folder is the job's code, kept by the cluster and readable by every job: a
    ``.env`` with an API key, an ``.ssh`` key or Ray's own token beside the workflow went with it."""
    for name, text in {".env": "ANTHROPIC_API_KEY=sk-ant-secret", ".env.production": "DB=postgres://u:p@h/d",
                       ".ssh/id_ed25519": "PRIVATE KEY", ".aws/credentials": "aws_secret_access_key=x",
                       ".ray/auth_token": "token", "sub/.env": "K=v", "helpers.py": "X = 1"}.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    shipped = _shipped(project, tmp_path)
    assert shipped == {"launchable_stop28_flow.py", "helpers.py"}, shipped


def test_a_workflow_in_the_home_folder_is_not_shipped_whole(project: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    module = f"home_flow_{uuid.uuid4().hex[:8]}"  # a module no other test imported (from elsewhere)
    (project / f"{module}.py").write_text(FLOW)
    monkeypatch.setenv("HOME", str(project))  # the workflow sits in the home folder itself
    db = tmp_path / "raysaga.db"
    code, _, err = invoke("launch", f"{module}:wf", "--address", "http://127.0.0.1:8265", "--db", f"sqlite:///{db}")
    one_line_error(code, err, f"module {module!r} is imported from {project.resolve()}: launching "
                              "would ship that whole folder")
    assert not db.exists()


@pytest.mark.parametrize("server", ["jobs 503"], indirect=True)
def test_a_job_api_failing_its_requests_is_one_line_and_nothing_is_recorded(project: Path, tmp_path: Path,
                                                                            server: str) -> None:
    """A Job API that answers its version but fails job requests (a 5xx while the head is busy or
    restarting) is said to fail, not to be something else, and nothing is recorded."""
    db = tmp_path / "raysaga.db"
    code, out, err = invoke("launch", "launchable_stop28_flow:wf", "--address", server, "--db", f"sqlite:///{db}")
    one_line_error(code, err, f"the Ray Job API at {server} failed a request for job raysaga-probe-")
    assert "503" in err and "try again once the head's dashboard answers" in err and out == ""
    assert not db.exists()

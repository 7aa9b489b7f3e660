"""A newcomer's first hour: ``--version`` names the store, the README's example command works as
written, Ctrl-C and SIGTERM during ``run`` exit 130/143 naming ``raysaga resume RUN``, and a
cancel of a finished run says why nothing happened."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app
from tests.support import REPO
from tests.support import crash_driver as harness
from tests.support.child_signals import sigint_default
from tests.support.services import FakeServices

EXE = Path(sys.executable).with_name("raysaga")

SLOW = textwrap.dedent('''
    import time
    from pathlib import Path
    from raysaga import Workflow

    wf = Workflow("slow", version="1")
    HERE = Path(__file__).parent

    @wf.step()
    def first() -> int:
        (HERE / "started").write_text("yes")
        while not (HERE / "go").exists():  # the test says when this step may finish
            time.sleep(0.01)
        return 1

    @wf.step()
    def second(first: int) -> int:
        return first + 1
''')


def invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def test_version_names_the_default_store(tmp_path: Path) -> None:
    code, out, _ = invoke("--version", env={"RAYSAGA_DB": f"sqlite:///{tmp_path / 'mine.db'}"})
    assert code == 0
    assert out.splitlines()[0].startswith("raysaga 0.")
    assert f"store: {tmp_path / 'mine.db'}" in out
    assert not (tmp_path / "mine.db").exists()  # naming the store does not create it
    home = tmp_path / "home"
    proc = subprocess.run([str(EXE), "--version"], capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if k != "RAYSAGA_DB"},
                               "RAYSAGA_HOME": str(home)})
    assert proc.returncode == 0 and f"store: {home / 'raysaga.db'}" in proc.stdout, proc.stdout + proc.stderr


def _start_slow(tmp_path: Path) -> tuple[subprocess.Popen[str], str]:
    (tmp_path / "slow_flow.py").write_text(SLOW)
    db = f"sqlite:///{tmp_path / 'slow.db'}"
    proc = subprocess.Popen([str(EXE), "run", "slow_flow.py:wf", "--executor", "inline", "--run-id", "slow-1",
                             "--db", db], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=sigint_default)  # SIGINT reaches it even in a background test run
    wait_until = harness.wait_until
    wait_until(lambda: (tmp_path / "started").exists() or proc.poll() is not None, timeout=60,
               what="the first step to start")
    assert proc.poll() is None, proc.communicate()
    return proc, db


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_during_run_exits_with_its_code_and_names_resume(tmp_path: Path, signum: int, code: int) -> None:
    proc, db = _start_slow(tmp_path)
    try:  # a driver that missed the signal must not outlive the test (its step waits for "go")
        proc.send_signal(signum)
        (tmp_path / "go").write_text("go")
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, (out, err)
    name = signal.Signals(signum).name
    assert f"interrupted by {name}: lease released; `raysaga resume slow-1` continues it" in err
    assert "Traceback" not in err
    resumed = subprocess.run([str(EXE), "resume", "slow-1", "--db", db, "--executor", "inline",
                              "--workflow", "slow_flow.py:wf"], cwd=tmp_path, capture_output=True, text=True,
                             timeout=120)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "completed" in resumed.stdout


def test_a_second_ctrl_c_still_exits_130_naming_resume(tmp_path: Path) -> None:
    proc, _ = _start_slow(tmp_path)
    try:  # a driver that missed the signal must not outlive the test (its step waits for ever)
        proc.send_signal(signal.SIGINT)
        assert proc.stderr is not None
        seen = ""
        while "SIGINT received" not in seen:  # the driver logs the first signal once it has handled it
            ready, _, _ = select.select([proc.stderr], [], [], 60)
            assert ready, f"no word of the first SIGINT: {seen!r}"
            line = proc.stderr.readline()
            assert line, f"the driver exited: {seen!r}"
            seen += line
        proc.send_signal(signal.SIGINT)  # the impatient second Ctrl-C: stop at once, inside the step
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    err = seen + err
    assert proc.returncode == 130, (out, err)
    assert "`raysaga resume slow-1` continues it" in err
    assert "Traceback" not in err


def test_cancel_of_a_completed_run_explains_itself(tmp_path: Path) -> None:
    (tmp_path / "slow_flow.py").write_text(SLOW)
    (tmp_path / "go").write_text("go")
    db = f"sqlite:///{tmp_path / 'done.db'}"
    code, _, err = invoke("run", f"{tmp_path / 'slow_flow.py'}:wf", "--executor", "inline", "--run-id", "done-1",
                          "--db", db)
    assert code == 0, err
    for extra in ([], ["--compensate"]):
        code, out, _ = invoke("cancel", "done-1", "--db", db, *extra)
        assert code == 1
        assert out.startswith("run done-1 is already completed: nothing to cancel (a completed run's effects stand;")


def _port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def test_the_readme_command_runs_the_example_input(tmp_path: Path) -> None:
    example = json.loads((REPO / "examples/order/order.json").read_text())
    port = int(example["services_url"].rsplit(":", 1)[1])
    if not _port_free(port):
        pytest.skip(f"port {port} (the example's provider) is taken on this machine")
    db = f"sqlite:///{tmp_path / 'order.db'}"
    with FakeServices(port=port) as services:
        proc = subprocess.run([str(EXE), "run", "examples.order.workflow:wf", "--input", "@examples/order/order.json",
                               "--executor", "inline", "--db", db, "--run-id", "readme-1", "--json"],
                              cwd=REPO, capture_output=True, text=True, timeout=300)
        log = services.log()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["status"] == "completed" and data["output"]["ship"]["order_id"] == "o-1001"
    assert sorted(log["effective"].values()) == [1, 1]  # one charge, one email

"""Joining a Ray cluster that is not there fails in seconds, with what to do, before anything is
recorded. Real sockets (a closed port, a port that never answers) and a real driver process."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from raysaga.errors import UserError
from raysaga.orchestrator.executor import make_executor
from raysaga.orchestrator.ray_address import check_cluster, host_port
from raysaga.state import open_store
from tests.support.ports import refused_port


def test_a_closed_port_is_refused_with_how_to_start_the_cluster() -> None:
    port = refused_port()
    started = time.monotonic()
    with pytest.raises(UserError) as exc:
        check_cluster(f"127.0.0.1:{port}")
    assert time.monotonic() - started < 5
    message = str(exc.value)
    assert "\n" not in message
    assert f"cannot reach the Ray cluster at 127.0.0.1:{port}" in message
    assert f"ray start --head --port {port}" in message and "--address" in message


def test_an_address_that_never_answers_fails_within_the_timeout() -> None:
    # 192.0.2.0/24 is TEST-NET-1 (RFC 5737): never routed, so a connect there hangs until the timeout;
    # a sandbox may answer it at once (refused, unreachable) instead, which is an error just the same
    started = time.monotonic()
    with pytest.raises(UserError) as exc:
        check_cluster("192.0.2.1:6379", timeout=1.0)
    assert time.monotonic() - started < 4
    assert "cannot reach the Ray cluster at 192.0.2.1:6379" in str(exc.value)


def test_a_listening_address_passes_and_local_addresses_are_not_probed() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        check_cluster(f"127.0.0.1:{server.getsockname()[1]}")
    for local in (None, "", "auto", "local"):
        check_cluster(local)  # Ray finds or starts its own cluster for these
    assert host_port("[::1]:6379") == ("::1", 6379)
    assert host_port("head.example:10001") == ("head.example", 10001)


@pytest.mark.parametrize(("address", "message"), [
    ("127.0.0.1:-5", "is not HOST:PORT with a port from 1 to 65535"),
    ("127.0.0.1:+5", "is not HOST:PORT with a port from 1 to 65535"),
    ("127.0.0.1:0", "is not HOST:PORT with a port from 1 to 65535"),
    ("127.0.0.1:65536", "is not HOST:PORT with a port from 1 to 65535"),
    (":", "is not HOST:PORT"),
    (":6379", "is not HOST:PORT"),
    ("bogus", "is not HOST:PORT"),
    ("ray://127.0.0.1:10001", "Ray Client (ray://) is not supported"),
])
def test_a_malformed_address_is_refused_at_once(address: str, message: str) -> None:
    started = time.monotonic()
    with pytest.raises(UserError) as exc:
        check_cluster(address, timeout=30.0)
    assert time.monotonic() - started < 1
    assert message in str(exc.value)


def test_make_executor_fails_fast_without_starting_ray() -> None:
    port = refused_port()
    code = textwrap.dedent(f"""
        import time
        import ray
        from raysaga.errors import UserError
        from raysaga.orchestrator.executor import make_executor
        started = time.monotonic()
        try:
            make_executor("ray", address="127.0.0.1:{port}")
        except UserError as exc:
            print(round(time.monotonic() - started, 1), ray.is_initialized(), exc)
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - started
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    elapsed, initialized, message = proc.stdout.strip().split(" ", 2)
    assert float(elapsed) < 5 and initialized == "False"
    assert message.startswith(f"cannot reach the Ray cluster at 127.0.0.1:{port}")
    assert took < 30  # the whole process, interpreter and imports included


def test_the_ray_address_variable_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    port = refused_port()
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    import ray

    if ray.is_initialized():
        pytest.skip("Ray is already initialized in this process: the executor would use it")
    with pytest.raises(UserError, match=f"cannot reach the Ray cluster at 127.0.0.1:{port}"):
        make_executor("ray")


def test_a_run_on_an_unreachable_cluster_leaves_no_run_behind(tmp_path: Path) -> None:
    # in a fresh process: this test process may already be connected to the session's cluster
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    code = textwrap.dedent(f"""
        import raysaga
        from raysaga.errors import UserError

        wf = raysaga.Workflow("unreachable")

        @wf.step()
        def only() -> int:
            return 1

        try:
            raysaga.run(wf, store={url!r}, address="127.0.0.1:{refused_port()}")
        except UserError as exc:
            print(exc)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stdout.startswith("cannot reach the Ray cluster"), proc.stdout
    store = open_store(url)
    try:
        assert store.list_runs() == []
    finally:
        store.close()


def test_a_process_on_one_cluster_refuses_an_address_naming_another(ray_session: str) -> None:
    # one process joins one cluster: an --address naming another must not run on this one silently
    with pytest.raises(UserError, match="already connected to the Ray cluster"):
        make_executor("ray", address=f"127.0.0.1:{refused_port()}")
    make_executor("ray", address=ray_session)  # the cluster it is on is fine

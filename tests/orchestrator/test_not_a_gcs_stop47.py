"""A cluster address whose port listens but is not a Ray GCS (PostgreSQL's, Redis's, a web
server's) is named as such at once (stop 47). Ray's own client waited 12-18 s there, then raysaga
said "cannot reach the Ray cluster ... start it with `ray start --head --port 5432`": the connect
had succeeded, and the advice was to start Ray on a port another service holds.

Real sockets: a server that takes the connection and closes it, one that answers nonsense, the
session's real Ray head.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from raysaga.errors import UserError
from raysaga.orchestrator.ray_address import host_port, speaks_grpc
from raysaga.orchestrator.ray_auth import check_gcs


@pytest.fixture(params=[b"", b"-ERR unknown command\r\n"], ids=["closes", "answers-nonsense"])
def not_ray(request: pytest.FixtureRequest) -> Iterator[str]:
    """A TCP server that is no Ray GCS: it closes each connection, or answers as Redis does."""
    answer: bytes = request.param
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.recv(64)
                    if answer:
                        conn.sendall(answer)
                except OSError:
                    pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        server.close()


def test_a_port_that_listens_but_is_no_ray_gcs_is_named_as_such(not_ray: str) -> None:
    hp = host_port(not_ray)
    assert hp is not None and speaks_grpc(*hp) is False
    with pytest.raises(UserError) as exc:
        check_gcs(not_ray)
    message = str(exc.value)
    assert f"something listens at {not_ray}, but not a Ray cluster's GCS" in message, message
    assert "cannot reach" not in message and f"--port {hp[1]}`" not in message


def test_the_sessions_ray_head_speaks_grpc(ray_address: str) -> None:
    hp = host_port(ray_address)
    assert hp is not None and speaks_grpc(*hp) is True
    check_gcs(ray_address)  # a real GCS: no error

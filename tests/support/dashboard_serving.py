"""A real dashboard (uvicorn) on a free port in a thread, for the dashboard tests."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from raysaga.orchestrator.dashboard.server import build
from raysaga.state import Store


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(check: Callable[[], Any], what: str, timeout: float = 20.0, every: float = 0.02) -> Any:
    """Poll ``check`` until it returns something truthy; fail naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


@contextmanager
def serving(store: Store, *, token: str | None = None, poll: float = 0.05, port: int | None = None,
            host: str = "127.0.0.1", **options: Any) -> Iterator[str]:
    """Serve the dashboard over ``store`` bound to ``host`` (on ``port``: a restart's twin), a new
    ``build`` each time (a new CSRF value; ``options`` such as ``users=`` go to it); yields its base
    URL on 127.0.0.1. The server's thread is joined on the way out: no dashboard left running."""
    app, _ = build(store, token=token, poll=poll, host=host, **options)
    port = free_port() if port is None else port
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, name="dashboard", daemon=True)
    thread.start()
    wait_until(lambda: server.started, "the dashboard to start")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
        assert not thread.is_alive(), "the dashboard did not stop"

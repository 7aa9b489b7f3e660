"""Ports for the tests of what happens when nobody answers."""

from __future__ import annotations

import socket

_HELD: list[socket.socket] = []


def refused_port() -> int:
    """A port on 127.0.0.1 whose connections are refused at once: bound and never listening, and
    held until the test process exits, so no other process takes it meanwhile. A port that was
    merely free a moment ago was taken once (CI, a Ray process beside the tests): the launch it
    stood for waited 40 s for an answer instead of being refused."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    _HELD.append(s)
    return int(s.getsockname()[1])

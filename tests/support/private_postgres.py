"""A PostgreSQL server of a test's own, which the test may crash and restart at will.

The session's server (127.0.0.1:5432) is shared by every test: restarting it would fail the others.
This one runs the same binaries (``initdb``, ``pg_ctl`` of the installed PostgreSQL) as the
``postgres`` user on a free port, with its data in a temporary directory, and is stopped with
``-m immediate`` (no checkpoint, no goodbye to the clients: what a crash or a kill -9 of the
server looks like to them). ``available()`` says why not when it cannot run here.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = ["PrivatePostgres", "available", "retrying"]

T = TypeVar("T")

_USER = "postgres"


def _bin_dir() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def available() -> str | None:
    """None when a private server can run here, else why not."""
    if _bin_dir() is None:
        return "no PostgreSQL server binaries under /usr/lib/postgresql/*/bin"
    if os.geteuid() != 0 and not shutil.which("runuser"):
        return "initdb must run as the postgres user: needs root (runuser)"
    try:
        import pwd

        pwd.getpwnam(_USER)
    except KeyError:
        return "no 'postgres' user on this machine"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrivatePostgres:
    """``start()``, ``crash()`` (stop -m immediate), ``start()`` again, ``close()`` (stops it and
    deletes its data); ``url``."""

    def __init__(self) -> None:
        bin_dir = _bin_dir()
        assert bin_dir is not None, available()
        self.bin = bin_dir
        # its own directory under the system's temp dir: pytest's are root's alone (mode 0700), and
        # the server runs as the postgres user
        self.root = root = Path(tempfile.mkdtemp(prefix="raysaga-pg-"))
        self.data = root / "pgdata"
        self.port = _free_port()
        self.url = f"postgresql://{_USER}@127.0.0.1:{self.port}/postgres"
        shutil.chown(root, _USER)
        self._as_postgres([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", _USER,
                           "--no-sync", "-E", "UTF8"])
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write(f"\nport = {self.port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{root}'\n"
                       "fsync = on\nmax_connections = 200\n")

    def _as_postgres(self, cmd: list[str]) -> None:
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", _USER, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{' '.join(cmd)} failed: {done.stdout}\n{done.stderr}"

    def start(self) -> None:
        self._as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
                           "-w", "-t", "60", "start"])

    def crash(self) -> None:
        """Stop at once, as a crash does: clients' connections break mid-statement."""
        self._as_postgres([str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"])

    def close(self) -> None:
        if (self.data / "postmaster.pid").exists():
            self.crash()
        shutil.rmtree(self.root, ignore_errors=True)


def retrying(what: Callable[[], T], timeout: float = 120.0) -> T:
    """``what()``, called again while the store is unreachable (a test's own calls ride out the
    outages it causes), for at most ``timeout`` seconds."""
    from raysaga.state.engine import is_outage

    deadline = time.monotonic() + timeout
    while True:
        try:
            return what()
        except Exception as exc:
            if not is_outage(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)  # the server is down: poll it again (not a synchronisation)


def submit_once(client: Any, workflow: Any, value: Any, run_id: str) -> str:
    """Submit ``run_id`` across the outages: a submit under a run id is idempotent, so an attempt
    whose commit landed before its answer was lost returns that run instead of recording it
    twice. (An anonymous submit retried that way made a second run of the same order: the
    provider saw its subject charged under two runs' keys.)"""

    def attempt() -> str:
        return str(client.submit(workflow, value, run_id=run_id).run_id)

    return retrying(attempt)

"""Shared fixtures: store URLs for SQLite and PostgreSQL, one local Ray cluster per session.

PostgreSQL tests run when ``RAYSAGA_TEST_PG_URL`` names a server database (``.ci/run`` sets
it); each test session creates a fresh database there and drops it at the end. Every test that
touches PostgreSQL carries the ``postgres`` marker (``pytest -m postgres`` runs just those).

Shared fakes and harnesses live in ``tests/support`` (import them as ``tests.support.<module>``).

Under pytest-xdist (``.ci/run``: ``-n 2 --dist loadfile``) each worker process is a session of its
own: its own Ray head (free ports, its own temp dir), PostgreSQL database, templates and
``RAYSAGA_HOME``; nothing here is shared between workers.

No test writes into the user's home: ``RAYSAGA_HOME`` points at a temporary folder for the
whole session (subprocesses inherit it), so the default store lands there.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga.state import SqlStore
from tests.support.postgres import drop_pg_database, make_pg_database
from tests.support.processes import pids_mentioning
from tests.support.store_template import copy_template

PG_ENV = "RAYSAGA_TEST_PG_URL"

# Bytecode is cached as usual (``__pycache__`` is ignored by git): the VMs' environment sets
# PYTHONDONTWRITEBYTECODE=1, with which every process a test starts (a driver, the CLI, a worker, a
# Ray worker) compiled raysaga's and the tests' helper modules from source again, ~0.5 s of CPU each.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

# The guard: no test may reach the real Anthropic API (AnthropicModel refuses at once).
os.environ["RAYSAGA_FORBID_REAL_API"] = "1"
# The default store (``~/.raysaga``) of every test and of the drivers they spawn lives here.
os.environ["RAYSAGA_HOME"] = tempfile.mkdtemp(prefix="raysaga-test-home-")
atexit.register(shutil.rmtree, os.environ["RAYSAGA_HOME"], True)
os.environ.pop("RAYSAGA_DB", None)

_PG_FIXTURES = {"pg_url", "pg_base_url"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test that touches PostgreSQL (a pg fixture, or the ``store_url`` postgres case)."""
    for item in items:
        names = set(getattr(item, "fixturenames", ()))
        callspec = getattr(item, "callspec", None)
        params = callspec.params.values() if callspec is not None else ()
        if names & _PG_FIXTURES or any(isinstance(p, str) and p == "postgres" for p in params):
            item.add_marker(pytest.mark.postgres)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


#: Tried when RAYSAGA_TEST_PG_URL is unset, so the README's plain `pytest` runs the PostgreSQL
#: tests wherever a local server answers (set the variable to "off" to skip them).
LOCAL_PG = "postgresql://postgres@127.0.0.1:5432/test"


def _answers(url: str) -> bool:
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=2).close()
    except psycopg.Error:
        return False
    return True


@pytest.fixture(scope="session")
def pg_base_url() -> str:
    url = os.environ.get(PG_ENV, "").strip()
    if url.lower() == "off":
        pytest.skip(f"{PG_ENV}=off: PostgreSQL tests skipped")
    if not url:
        if not _answers(LOCAL_PG):
            pytest.skip(f"no PostgreSQL at {LOCAL_PG} and {PG_ENV} is not set: PostgreSQL tests need a server "
                        "(set RAYSAGA_TEST_PG_URL=postgresql://USER@HOST:PORT/DB)")
        url = os.environ[PG_ENV] = LOCAL_PG  # subprocess drivers of the tests see it too
    return url


@pytest.fixture(scope="session")
def pg_url(pg_base_url: str) -> Iterator[str]:
    """A database created for this test session, dropped afterwards."""
    url = make_pg_database(pg_base_url)
    yield url
    drop_pg_database(pg_base_url, url)


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Every store test runs on a SQLite file and, when configured, on PostgreSQL. Outside
    ``FRESH_FILE_FOLDERS`` the SQLite file starts as a copy of the migrated empty template."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'raysaga.db'}"
        if _store_file_from_template(request):
            copy_template(url)
        return url
    return str(request.getfixturevalue("pg_url"))


#: The folders of tests/ whose ``store_url`` and ``sqlite_url`` stay a path with no file behind it
#: (the store is created and migrated by the code under test): the tests of opening, creating,
#: migrating and refusing stores (state, cli), and the folders of other owners (security, agents).
FRESH_FILE_FOLDERS = ("state", "cli", "security", "agents")


def _store_file_from_template(request: pytest.FixtureRequest) -> bool:
    """Whether this test's ``store_url`` / ``sqlite_url`` file starts as a copy of the migrated
    template (``tests.support.store_template``: the same file its first open would make) rather
    than as a path with nothing behind it."""
    path = Path(request.node.path).resolve()
    try:
        folder = path.relative_to(Path(__file__).resolve().parent).parts[0]
    except ValueError:
        return False
    return folder not in FRESH_FILE_FOLDERS and "stop33" not in path.name


@pytest.fixture
def store(store_url: str) -> Iterator[SqlStore]:
    copy_template(store_url)  # it opens the store before its test anyway: the same file, not migrated again
    s = SqlStore(store_url)
    yield s
    s.close()


@pytest.fixture(params=["sqlite", "postgres"])
def own_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store of this test's own: a SQLite file, or a fresh PostgreSQL database dropped after (the
    session's ``pg_url`` is shared: a test that claims every runnable run in it, or leaves many
    waiting approvals a later test's whole-store inbox would show, needs its own). Outside
    ``FRESH_FILE_FOLDERS`` it starts migrated, as ``store_url`` does: the SQLite file a copy of the
    template, the PostgreSQL database a copy of ``tests.support.postgres.migrated_template``."""
    migrated = _store_file_from_template(request)
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'own.db'}"
        if migrated:
            copy_template(url)
        yield url
        return
    base = str(request.getfixturevalue("pg_base_url"))
    url = make_pg_database(base, migrated=migrated)
    try:
        yield url
    finally:
        drop_pg_database(base, url)


@pytest.fixture
def sqlite_url(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    if _store_file_from_template(request):
        copy_template(url)
    return url


@pytest.fixture(scope="session")
def ray_address() -> Iterator[str]:
    """One local Ray head for the whole session; tests and their subprocess drivers join it."""
    ray_bin = shutil.which("ray", path=str(Path(sys.executable).parent)) or shutil.which("ray")
    assert ray_bin, "the ray CLI is not installed"
    port, client_port = _free_port(), _free_port()
    # a short path of its own, not under pytest's basetemp: Ray's socket paths must fit 107 bytes, and
    # /tmp/pytest-of-root/pytest-11/popen-gw0/ray0/session_.../sockets/plasma_store.1 (a second node
    # joining under xdist, once pytest's run counter reached two digits) was 108
    temp_dir = Path(tempfile.mkdtemp(prefix="rs-ray-", dir="/tmp"))
    # a local test cluster on loopback needs no token; and a token written to ~/.ray by one
    # cluster would break another cluster on the same machine
    os.environ["RAY_AUTH_MODE"] = "disabled"
    subprocess.run(
        [ray_bin, "start", "--head", f"--port={port}", "--num-cpus=2", "--include-dashboard=false",
         "--node-ip-address=127.0.0.1", f"--temp-dir={temp_dir}", "--disable-usage-stats",
         f"--ray-client-server-port={client_port}"],  # not the default 10001, which other sessions' heads take
        check=True, capture_output=True, timeout=120,
    )
    address = f"127.0.0.1:{port}"
    os.environ["RAY_ADDRESS"] = address
    try:
        yield address
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        _kill_processes_mentioning(str(temp_dir))  # only this session's cluster, not `ray stop`'s all
        shutil.rmtree(temp_dir, ignore_errors=True)
        # its Ray client server names no temp dir (it was left running after every session): its port
        for pid in set(pids_mentioning("ray.util.client.server")) & set(pids_mentioning(f"--port={client_port} ")):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os.environ.pop("RAY_ADDRESS", None)


def _kill_processes_mentioning(marker: str) -> None:
    """SIGKILL every process whose command line contains ``marker`` (our Ray head's temp dir)."""
    for pid in pids_mentioning(marker, open_files=True):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def ray_session(ray_address: str) -> str:
    """This test process connected to the session's Ray cluster."""
    import ray

    if not ray.is_initialized():
        ray.init(address=ray_address, logging_level=logging.ERROR, log_to_driver=False)
    return ray_address

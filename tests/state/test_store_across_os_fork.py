"""A store opened before ``os.fork()`` (a pre-fork server, ``multiprocessing``'s fork start, Celery
prefork) serves the parent and every child, on SQLite and PostgreSQL: each process gets its own
connections, no process closes another's, and every write of every process is in the store.

The children are real forks of the test process (``os.fork``), started once the parent's pool
holds connections; each reports on a pipe and leaves with ``os._exit`` (no pytest, no finalizers
of the parent's objects). Processes start together on a "go" pipe; nothing waits on a clock.
"""

from __future__ import annotations

import os
import select
import signal
import uuid
from collections.abc import Callable
from functools import partial

from sqlalchemy.pool import PoolProxiedConnection

from raysaga.errors import RunNotFoundError
from raysaga.state import NewRun, SqlStore

HASH = "f" * 64
#: Connections the parent's pool holds at the fork (each one a copy in every child).
POOLED = 3
CHILDREN = 3
WRITES = 20
#: Seconds a child may take to report before the test kills it and fails.
REPORT_TIMEOUT = 120.0


def _new(run_id: str) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash=HASH,
                  trace_id=uuid.uuid4().hex)


def _write_runs(store: SqlStore, prefix: str) -> None:
    """WRITES runs, each read back at once (a read on the reader engine between the writes)."""
    for i in range(WRITES):
        run_id = f"{prefix}-{i}"
        store.create_run(_new(run_id))
        assert store.get_run(run_id).run_id == run_id
        store.list_runs(limit=5)


def _pool_connections(store: SqlStore) -> list[PoolProxiedConnection]:
    """POOLED connections of the store's writer checked out at once, each having run a query
    (plain DBAPI: no BEGIN IMMEDIATE, which a second SQLite connection of one process would wait on)."""
    conns = [store.engine.raw_connection() for _ in range(POOLED)]
    for conn in conns:
        cursor = conn.cursor()
        cursor.execute("SELECT 1")
        assert cursor.fetchone() is not None
        cursor.close()
    return conns


def _warm(store: SqlStore) -> list[object]:
    """Fill the parent's pools (writer and reader) before the fork; the writer's driver connections,
    kept referenced so the test can tell later whether the parent still has the same ones."""
    store.list_runs(limit=5)
    conns = _pool_connections(store)
    drivers = [conn.driver_connection for conn in conns]
    for conn in conns:
        conn.close()
    return drivers


def _same_connections(store: SqlStore, before: list[object]) -> bool:
    """Whether the writer's pool still holds the driver connections of ``before`` and they answer."""
    conns = _pool_connections(store)
    try:
        return all(any(conn.driver_connection is b for b in before) for conn in conns)
    finally:
        for conn in conns:
            conn.close()


class Child:
    """A forked child running ``work`` on what it inherited once the parent says go."""

    def __init__(self, work: Callable[[], None], go: int) -> None:
        self.read, write = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            code, said = 0, b""
            try:
                os.close(self.read)
                os.read(go, 1)
                work()
            except BaseException as exc:  # reported to the parent, whatever it is
                code, said = 1, f"{type(exc).__name__}: {exc}".encode()[:2000]
            finally:
                try:
                    os.write(write, said or b"ok")
                finally:
                    os._exit(code)
        os.close(write)

    def report(self) -> str:
        """What the child said ("ok", or its error), once it has exited; fails the test on a hang."""
        ready, _, _ = select.select([self.read], [], [], REPORT_TIMEOUT)
        if not ready:
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
            raise AssertionError(f"child {self.pid} said nothing in {REPORT_TIMEOUT:.0f} s (hung)")
        with os.fdopen(self.read, "rb") as f:
            said = f.read().decode()
        _, status = os.waitpid(self.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        return said if code == 0 or said != "ok" else f"ok, yet exit code {code}"


def _missing(url: str, run_ids: list[str]) -> list[str]:
    """The runs of ``run_ids`` a store opened afresh does not hold."""
    fresh = SqlStore(url)
    try:
        missing = []
        for run_id in run_ids:
            try:
                fresh.get_run(run_id)
            except RunNotFoundError:
                missing.append(run_id)
        return missing
    finally:
        fresh.close()


def test_a_store_opened_before_a_fork_serves_the_parent_and_its_children_at_once(store_url: str) -> None:
    """The parent keeps writing while three children write through the store they inherited: no
    error anywhere (on PostgreSQL the processes shared the pooled sessions: "unexpected result
    EMPTY_QUERY", "can't change 'autocommit' now", a dropped connection), every write present, and
    the parent's pooled connections are the ones it had (no child used or closed them)."""
    tag = uuid.uuid4().hex[:8]
    store = SqlStore(store_url)
    try:
        before = _warm(store)
        go_read, go_write = os.pipe()
        children = [Child(partial(_write_runs, store, f"{tag}-c{k}"), go_read) for k in range(CHILDREN)]
        os.write(go_write, b"g" * CHILDREN)
        for fd in (go_read, go_write):
            os.close(fd)
        _write_runs(store, f"{tag}-p")
        reports = [child.report() for child in children]
        assert reports == ["ok"] * CHILDREN, reports
        assert _same_connections(store, before), "the parent's pooled connections were replaced"
        _write_runs(store, f"{tag}-p-after")
    finally:
        store.close()
    expected = [f"{tag}-{who}-{i}" for who in ["p", "p-after", *(f"c{k}" for k in range(CHILDREN))]
                for i in range(WRITES)]
    assert _missing(store_url, expected) == []


def test_a_child_that_closes_the_store_leaves_the_parent_s_connections_alone(store_url: str) -> None:
    """A child that closes the store it inherited (a worker exiting cleanly) closes only its own
    connections: the parent's pooled connections go on, the same ones (on PostgreSQL the child's
    close ended the parent's sessions on the server)."""
    tag = uuid.uuid4().hex[:8]
    store = SqlStore(store_url)
    try:
        before = _warm(store)

        def write_and_close() -> None:
            _write_runs(store, f"{tag}-c")
            store.close()

        go_read, go_write = os.pipe()
        child = Child(write_and_close, go_read)
        os.write(go_write, b"g")
        for fd in (go_read, go_write):
            os.close(fd)
        assert child.report() == "ok"
        assert _same_connections(store, before), "the parent's pooled connections were replaced"
        _write_runs(store, f"{tag}-p")
    finally:
        store.close()
    assert _missing(store_url, [f"{tag}-{who}-{i}" for who in ("c", "p") for i in range(WRITES)]) == []


def test_a_child_s_writes_survive_the_parent_closing_the_store(store_url: str) -> None:
    """The parent closes the store while a child it forked goes on writing: the child's later
    writes are in the store. (On SQLite the child's connections shared the lock state it
    inherited and held no lock of their own: the parent's close, the last by the kernel's locks,
    checkpointed and deleted the WAL under the child, whose later commits went to the deleted
    file: "child sees 9 runs", none of them on disk. On PostgreSQL the parent's close ended the
    sessions the child was using.)"""
    tag = uuid.uuid4().hex[:8]
    store = SqlStore(store_url)
    _warm(store)
    first_read, first_write = os.pipe()
    closed_read, closed_write = os.pipe()

    def write_around_the_close() -> None:
        store.create_run(_new(f"{tag}-before"))
        os.write(first_write, b"1")
        os.read(closed_read, 1)
        _write_runs(store, f"{tag}-after")

    go_read, go_write = os.pipe()
    child = Child(write_around_the_close, go_read)
    os.write(go_write, b"g")
    ready, _, _ = select.select([first_read, child.read], [], [], REPORT_TIMEOUT)
    assert first_read in ready, child.report()
    os.read(first_read, 1)
    store.close()
    os.write(closed_write, b"1")
    for fd in (go_read, go_write, first_read, first_write, closed_read, closed_write):
        os.close(fd)
    assert child.report() == "ok"
    assert _missing(store_url, [f"{tag}-before", *(f"{tag}-after-{i}" for i in range(WRITES))]) == []

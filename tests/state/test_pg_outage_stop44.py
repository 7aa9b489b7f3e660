"""PostgreSQL outages told from failures (review stop 44), on a real server.

A pool out of connections (``sqlalchemy.exc.TimeoutError``) and a server refusing writes (a failover
left a standby: SQLSTATE 25006, raised as ``InternalError``) are outages: the work is tried again
once the store answers, not counted as the run's failure. A worker's pool is sized to its slots,
or set by ``RAYSAGA_DB_POOL_SIZE``. A connection dropped while a store is opened says so and to
try again. A heartbeat that fails logs one line, not the driver's text and SQLAlchemy's link.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy import exc as sa_exc

from raysaga import RunOptions, StepContext, Worker, Workflow
from raysaga.errors import StoreUnavailableError, UserError
from raysaga.orchestrator.heartbeat import Heartbeat
from raysaga.state import NewRun, SqlStore
from raysaga.state.engine import is_outage, make_engine, normalize_url, opening, outage_cause
from tests.support.crash_driver import wait_until
from tests.support.postgres import drop_pg_database, make_pg_database, pg_admin

noop = Workflow("stop44_noop")


@noop.step()
def only(ctx: StepContext, input: int) -> int:
    return input


def new_run() -> NewRun:
    return NewRun(run_id=f"stop44-{uuid.uuid4().hex[:8]}", workflow_name="wf", workflow_version="1",
                  definition_hash="d" * 64, trace_id=uuid.uuid4().hex)


@pytest.fixture
def own_pg(pg_base_url: str) -> Iterator[str]:
    """A migrated PostgreSQL database of this test's own (it is made read-only, its backends killed)."""
    url = make_pg_database(pg_base_url, migrated=True)
    yield url
    drop_pg_database(pg_base_url, url)


def _read_only(base_url: str, url: str, on: bool) -> None:
    """Make the database refuse writes (as a standby does) or accept them again; new sessions see it."""
    name = url.rpartition("/")[2]
    setting = "SET default_transaction_read_only = on" if on else "RESET default_transaction_read_only"
    pg_admin(base_url, f'ALTER DATABASE "{name}" {setting}')


def test_a_pool_out_of_connections_is_an_outage(pg_url: str) -> None:
    engine = create_engine(normalize_url(pg_url), pool_size=1, max_overflow=0, pool_timeout=0.05)
    try:
        with engine.connect(), pytest.raises(sa_exc.TimeoutError) as caught, engine.connect():
            pass
        assert is_outage(caught.value)
        assert "sqlalche.me" not in outage_cause(caught.value) and "QueuePool limit" in outage_cause(caught.value)
    finally:
        engine.dispose()


def test_a_store_refusing_writes_is_an_outage(pg_base_url: str, own_pg: str) -> None:
    _read_only(pg_base_url, own_pg, True)
    store = SqlStore(own_pg, migrate_schema=False)
    try:
        with pytest.raises(sa_exc.DBAPIError) as caught:
            store.create_run(new_run())
        assert getattr(caught.value.orig, "sqlstate", None) == "25006"
        assert is_outage(caught.value)
        assert outage_cause(caught.value) == "cannot execute INSERT in a read-only transaction"
    finally:
        store.close()
        _read_only(pg_base_url, own_pg, False)


def test_the_pool_size_env_is_checked_and_wins(pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for bad in ("0", "abc", "²", "1001", "-3"):
        monkeypatch.setenv("RAYSAGA_DB_POOL_SIZE", bad)
        with pytest.raises(UserError, match="RAYSAGA_DB_POOL_SIZE"):
            make_engine(pg_url)
    monkeypatch.setenv("RAYSAGA_DB_POOL_SIZE", "7")
    store = SqlStore(pg_url)
    try:
        assert store.engine.pool.size() == 7  # type: ignore[attr-defined]
        Worker([noop], store, concurrency=20, executor="inline")  # the operator's size wins
        assert store.engine.pool.size() == 7  # type: ignore[attr-defined]
    finally:
        store.close()


def test_a_connection_dropped_while_opening_says_try_again(pg_base_url: str, own_pg: str) -> None:
    engine = make_engine(own_pg)
    try:
        with engine.connect() as conn:
            pid = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
            pg_admin(pg_base_url, f"SELECT pg_terminate_backend({pid})")
            probe = create_engine(normalize_url(pg_base_url))
            try:
                with probe.connect() as admin:  # the backend is gone: its next query finds the drop
                    wait_until(lambda: not admin.execute(text(f"SELECT 1 FROM pg_stat_activity WHERE pid = {pid}"))
                               .first(), timeout=10, what="the terminated backend to exit")
            finally:
                probe.dispose()
            with pytest.raises(StoreUnavailableError) as caught, opening(own_pg):
                conn.execute(text("SELECT 1"))
        message = str(caught.value)
        assert "dropped while opening the store" in message and "try again" in message, message
        assert "\n" not in message
    finally:
        engine.dispose()


def test_a_failing_heartbeat_logs_one_line(pg_base_url: str, own_pg: str, caplog: pytest.LogCaptureFixture) -> None:
    store = SqlStore(own_pg, migrate_schema=False)
    said, lines = threading.Event(), []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "heartbeat failed" in record.getMessage():
                lines.append(record.getMessage())
                said.set()

    seen = Seen()
    logging.getLogger("raysaga.driver").addHandler(seen)
    caplog.set_level(logging.WARNING, logger="raysaga.driver")
    beat: Heartbeat | None = None
    try:
        _, lease = store.create_claimed(new_run(), "stop44-owner", RunOptions().lease_ttl)
        store.engine.dispose()
        _read_only(pg_base_url, own_pg, True)  # the renewal's UPDATE is refused
        beat = Heartbeat(store, lease, period=0.01)
        beat.start()
        assert said.wait(30), "the heartbeat never failed"
        assert lines and all("\n" not in line and "sqlalche.me" not in line and "[SQL" not in line
                             for line in lines), lines
        assert lines[0].endswith("heartbeat failed: cannot execute UPDATE in a read-only transaction"), lines[0]
    finally:
        if beat is not None:
            beat.stop()
        logging.getLogger("raysaga.driver").removeHandler(seen)
        store.close()
        _read_only(pg_base_url, own_pg, False)

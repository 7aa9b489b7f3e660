"""A worker on PostgreSQL says at its start when the server cannot give it the connections its
slots may hold (2 per slot + 2, and 10 more at a burst): before, two ``-c 40`` workers on a default
server (100 connections) started silently and the later one was refused "too many clients" in the
middle of its runs."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from raysaga import StepContext, Worker, Workflow
from raysaga.errors import UserError
from raysaga.state import SqlStore
from tests.support.postgres import drop_pg_database, make_pg_database

flows = Workflow("capacity_flows")


@flows.step()
def noop(ctx: StepContext, input: int) -> int:
    return input


@pytest.fixture
def own_pg(pg_base_url: str) -> Iterator[str]:
    url = make_pg_database(pg_base_url, migrated=True)
    yield url
    drop_pg_database(pg_base_url, url)


def _allowed(base_url: str) -> int:
    """Connections the server gives to clients that are not superusers (max_connections less reserved)."""
    import psycopg

    with psycopg.connect(base_url.replace("postgresql+psycopg://", "postgresql://")) as conn:
        row = conn.execute("SELECT current_setting('max_connections')::int "
                           "- current_setting('superuser_reserved_connections')::int").fetchone()
    assert row is not None
    return int(row[0])


def test_a_worker_wanting_more_connections_than_the_server_has_free_says_so(
        own_pg: str, pg_base_url: str, caplog: pytest.LogCaptureFixture) -> None:
    import psycopg

    allowed = _allowed(pg_base_url)
    concurrency = (allowed - 12) // 2  # its pool fits the server, not with its burst and others' connections
    plain = pg_base_url.replace("postgresql+psycopg://", "postgresql://")
    others = [psycopg.connect(plain) for _ in range(3)]  # other clients of the server
    store = SqlStore(own_pg)
    try:
        with caplog.at_level("WARNING", logger="raysaga.worker"):
            Worker([flows], store, concurrency=concurrency, executor="inline")
    finally:
        store.close()
        for conn in others:
            conn.close()
    said = [r.getMessage() for r in caplog.records if "connections to PostgreSQL" in r.getMessage()]
    assert len(said) == 1, caplog.text
    assert f"may open {2 * concurrency + 2 + 10} connections" in said[0]  # and SQLAlchemy's 10 at a burst
    assert "Lower --concurrency, raise max_connections" in said[0] and "RAYSAGA_DB_POOL_SIZE" in said[0]


def test_a_worker_the_server_could_never_hold_is_refused(own_pg: str, pg_base_url: str) -> None:
    """Stop 47: ``-c 100000`` was a warning, then the worker took every free connection of the
    server (other databases' clients refused "too many clients")."""
    concurrency = _allowed(pg_base_url) // 2 + 1  # 2 per slot + 2: more than the whole server allows
    store = SqlStore(own_pg)
    try:
        with pytest.raises(UserError, match=f"needs {2 * concurrency + 2} connections to PostgreSQL") as exc:
            Worker([flows], store, concurrency=concurrency, executor="inline")
        assert "lower --concurrency" in str(exc.value) and "RAYSAGA_DB_POOL_SIZE" in str(exc.value)
    finally:
        store.close()


def test_a_worker_that_fits_says_nothing(own_pg: str, caplog: pytest.LogCaptureFixture) -> None:
    store = SqlStore(own_pg)
    try:
        with caplog.at_level("DEBUG", logger="raysaga.worker"):
            Worker([flows], store, concurrency=2, executor="inline")
    finally:
        store.close()
    assert "connections to PostgreSQL" not in caplog.text
    assert "could not read" not in caplog.text  # the check ran (and found room), it did not give up


def test_the_operators_pool_size_is_the_one_checked(own_pg: str, pg_base_url: str, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("RAYSAGA_DB_POOL_SIZE", "3")  # a pooler in front, or a small worker: it fits
    store = SqlStore(own_pg)
    try:
        with caplog.at_level("WARNING", logger="raysaga.worker"):
            Worker([flows], store, concurrency=_allowed(pg_base_url), executor="inline")
    finally:
        store.close()
    assert "connections to PostgreSQL" not in caplog.text

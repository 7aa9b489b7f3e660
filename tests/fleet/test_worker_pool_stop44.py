"""A worker on PostgreSQL rides out a pool out of connections and a store refusing writes (review
stop 44): neither is the run's failure. Before, a pool wait that timed out (SQLAlchemy's default 5+10
connections under ``--concurrency 40``) and a failover's read-only standby (SQLSTATE 25006) each
counted a failed drive, parking healthy runs ``failed`` after three, and a claim refused by the
standby logged a traceback at every poll of every slot.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import Connection
from sqlalchemy.pool import QueuePool

from raysaga import Client, RunOptions, StepContext, Worker, Workflow
from raysaga.state import RunStatus, SqlStore
from raysaga.state.claims import Claim
from raysaga.state.engine import normalize_url
from tests.support.crash_driver import wait_until
from tests.support.postgres import drop_pg_database, make_pg_database, pg_admin

held: list[Connection] = []  # the connection the ``hold`` step takes (the pool's only one)
holder: list[SqlStore] = []
entered, go = threading.Event(), threading.Event()
calls = {"hold": 0, "gate": 0}

holds = Workflow("stop44_holds")


@holds.step()
def hold(ctx: StepContext, input: int) -> int:
    calls["hold"] += 1
    if calls["hold"] == 1:  # the first time: the driver's commit finds no connection in the pool
        held.append(holder[0].engine.connect())
    return input + 1


gates = Workflow("stop44_gates")


@gates.step()
def gate(ctx: StepContext, input: int) -> int:
    calls["gate"] += 1
    if calls["gate"] == 1:  # the first time: the store turns read-only before this step's commit
        entered.set()
        assert go.wait(60)
    return input + 1


class Said(logging.Handler):
    """Sets ``event`` when a record saying ``text`` is logged."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text, self.event = text, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.text in record.getMessage():
            self.event.set()


class CountingStore(SqlStore):
    """A real store that counts its claims (each slot's poll)."""

    claims = 0

    def claim_next(self, *args: object, **kwargs: object) -> Claim | None:
        CountingStore.claims += 1
        return super().claim_next(*args, **kwargs)  # type: ignore[arg-type]

    def claim_of(self, owner: str, ttl: float) -> Claim | None:  # (a slot's first look after a claim raised)
        CountingStore.claims += 1
        return super().claim_of(owner, ttl)


@pytest.fixture
def own_pg(pg_base_url: str) -> Iterator[str]:
    url = make_pg_database(pg_base_url, migrated=True)
    yield url
    drop_pg_database(pg_base_url, url)


def _terminate(base_url: str, url: str) -> None:
    """Kill every session on the database: the pools' next checkouts open new ones."""
    name = url.rpartition("/")[2]
    pg_admin(base_url, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       f"WHERE datname = '{name}' AND pid <> pg_backend_pid()")


def test_a_worker_pool_holds_a_driver_and_a_heartbeat_per_slot(own_pg: str) -> None:
    store = SqlStore(own_pg)
    try:
        Worker([holds], store, concurrency=10, executor="inline")
        assert isinstance(store.engine.pool, QueuePool) and store.engine.pool.size() == 22
        conns = [store.engine.connect() for _ in range(22)]  # every slot busy at once: no wait, no overflow
        assert store.engine.pool.overflow() <= 0
        for conn in conns:
            conn.close()
    finally:
        store.close()


def test_a_pool_out_of_connections_is_waited_out(own_pg: str, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("RAYSAGA_DB_POOL_SIZE", "1")  # the operator's size: the worker keeps it
    store = SqlStore(own_pg)
    # one connection, no overflow and a short wait, so a step holding it makes the commit's wait time out
    old = store.engine.pool
    store.engine.pool = QueuePool(old._creator, pool_size=1, max_overflow=0, timeout=0.1, pre_ping=True,
                                  dialect=store.engine.dialect, _dispatch=old.dispatch)
    old.dispose()
    store.reader = store.engine
    holder[:] = [store]
    client = Client(own_pg)
    said = Said("the store is unreachable")
    logging.getLogger("raysaga.worker").addHandler(said)
    caplog.set_level(logging.WARNING, logger="raysaga.worker")
    worker = Worker([holds], store, concurrency=1, executor="inline", poll=0.05, options=RunOptions(lease_ttl=10.0))
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        run_id = client.submit(holds, 1).run_id
        thread.start()
        wait_until(lambda: said.event.is_set() or worker.counts.failed, timeout=60,
                   what="the commit to time out waiting for a connection")
        held.pop().close()
        wait_until(lambda: client.get_run(run_id).status == RunStatus.COMPLETED or worker.counts.failed > 1,
                   timeout=60, what="the run at rest")
        assert worker.counts.failed == 0, [r.getMessage() for r in caplog.records]
        assert said.event.is_set()
        run = client.get_run(run_id)
        assert (run.status, run.output, calls["hold"]) == (RunStatus.COMPLETED, {"hold": 2}, 2)
    finally:
        for conn in held:
            conn.close()
        worker.stop()
        thread.join(timeout=30)
        logging.getLogger("raysaga.worker").removeHandler(said)
        client.close()
        store.close()


def test_a_store_refusing_writes_is_waited_out_and_said_once(pg_base_url: str, own_pg: str,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    name = own_pg.rpartition("/")[2]
    store = CountingStore(own_pg)
    client = Client(own_pg)
    said = Said("the store is unreachable")
    logging.getLogger("raysaga.worker").addHandler(said)
    caplog.set_level(logging.WARNING, logger="raysaga.worker")
    worker = Worker([gates], store, concurrency=2, executor="inline", poll=0.05, options=RunOptions(lease_ttl=10.0))
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        run_id = client.submit(gates, 1).run_id
        thread.start()
        assert entered.wait(60), "the run was never driven"
        pg_admin(pg_base_url, f'ALTER DATABASE "{name}" SET default_transaction_read_only = on')
        _terminate(pg_base_url, own_pg)  # (as a failover does: the next sessions are the standby's)
        polled = CountingStore.claims
        go.set()
        wait_until(lambda: (said.event.is_set() or worker.counts.failed) and CountingStore.claims > polled + 20,
                   timeout=60, what="the step's commit refused and the other slot polling meanwhile")
        pg_admin(pg_base_url, f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        _terminate(pg_base_url, own_pg)
        wait_until(lambda: client.get_run(run_id).status == RunStatus.COMPLETED, timeout=60, what="the run completed")
        assert worker.counts.failed == 0, [r.getMessage() for r in caplog.records]
        tracebacks = [r.getMessage() for r in caplog.records if r.exc_info]
        assert tracebacks == []
        claims = [r.getMessage() for r in caplog.records if "claim failed" in r.getMessage()]
        # once per slot and outage (the sessions' ends may be met too), not at each of the 20+ polls
        assert 1 <= len(claims) <= 4 and all("\n" not in line for line in claims), claims
        assert client.get_run(run_id).output == {"gate": 2}
    finally:
        go.set()
        worker.stop()
        thread.join(timeout=30)
        logging.getLogger("raysaga.worker").removeHandler(said)
        pg_admin(pg_base_url, f'ALTER DATABASE "{name}" RESET default_transaction_read_only')
        client.close()
        store.close()


def test_the_pool_url_is_the_stores(own_pg: str) -> None:
    """(``fit_pool`` swaps the pool: the store still reaches its own database, with its options.)"""
    store = SqlStore(own_pg)
    try:
        Worker([holds], store, concurrency=3, executor="inline")
        assert store.engine.url.render_as_string(hide_password=False) == normalize_url(own_pg)
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("SELECT current_database()").scalar_one() == own_pg.rpartition("/")[2]
    finally:
        store.close()


def _claim_failures(store: CountingStore, caplog: pytest.LogCaptureFixture,
                    concurrency: int) -> list[logging.LogRecord]:
    """The "claim failed" records of a worker on ``store`` over 30 claims (then stopped)."""
    caplog.set_level(logging.DEBUG, logger="raysaga.worker")
    worker = Worker([gates], store, concurrency=concurrency, executor="inline", poll=0.02)
    thread = threading.Thread(target=worker.run, daemon=True)
    try:
        polled = CountingStore.claims
        thread.start()
        wait_until(lambda: CountingStore.claims > polled + 30, timeout=60, what="30 claims")
    finally:
        worker.stop()
        thread.join(timeout=30)
    return [r for r in caplog.records if "claim failed" in r.getMessage()]


def test_an_unexpected_claim_error_is_logged_in_full_once(own_pg: str, caplog: pytest.LogCaptureFixture) -> None:
    store = CountingStore(own_pg)
    try:
        with store.engine.begin() as conn:  # every claim now fails with a ProgrammingError: not an outage
            conn.exec_driver_sql("ALTER TABLE raysaga_runs RENAME COLUMN lease_owner TO lease_owner_gone")
        failed = _claim_failures(store, caplog, 3)
        assert len(failed) >= 30
        assert [r.levelname for r in failed if r.exc_info] == ["ERROR"], "a traceback per poll"
        assert {r.levelname for r in failed if not r.exc_info} == {"DEBUG"}
    finally:
        store.close()


def test_claim_errors_whose_text_varies_are_one_cause(own_pg: str, caplog: pytest.LogCaptureFixture) -> None:
    """A claim error naming a transaction id differed at every poll: 200 tracebacks in 15 s."""
    store = CountingStore(own_pg)
    try:
        with store.engine.begin() as conn:  # every claim's UPDATE of a run fails, naming its transaction
            conn.exec_driver_sql(
                "CREATE FUNCTION stop44_refuse() RETURNS trigger AS $$ BEGIN "
                "RAISE EXCEPTION 'claim refused (request %%)', txid_current(); END $$ LANGUAGE plpgsql")
            conn.exec_driver_sql("CREATE TRIGGER stop44_refuse BEFORE UPDATE ON raysaga_runs "
                                 "FOR EACH ROW EXECUTE FUNCTION stop44_refuse()")
        Client(store).submit(gates, 1)  # something to claim
        failed = _claim_failures(store, caplog, 2)
        assert len(failed) >= 10  # (a claim that finds no run to update raises nothing)
        assert len([r for r in failed if r.exc_info]) == 1, "a traceback per transaction id"
    finally:
        store.close()

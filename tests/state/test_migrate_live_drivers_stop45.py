"""Migrating a store while an older raysaga drives runs on it (review stop 45): the migration
rebuilt tables under a schema-6 driver, which died mid-step with a raw SQL error ("table
raysaga_nodes has no column named run_id"), its run left ``running``. A store with live leases is
now refused, naming the runs and their owners, unless ``raysaga db upgrade --force``.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import text

from raysaga.errors import SchemaVersionError
from raysaga.state import SqlStore, migrate
from raysaga.state.engine import make_engine
from raysaga.state.migrate import current_version, upgrade
from raysaga.state.schema import SCHEMA_VERSION
from tests.support.cli import invoke
from tests.support.old_schema import store_at


def _schema_7_with(url: str, lease_until: float | None) -> None:
    """A schema-7 store with one run, driven by ``old-worker`` until ``lease_until`` (None: no lease)."""
    with store_at(url, "0007") as engine, engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, "
            "version, fence, event_seq, retries_used, tokens_used, cost_used, trace_id, created_at, "
            "updated_at, lease_owner, lease_expires_at) VALUES ('busy', 'wf', '1', 'h', 'running', 3, 1, 4, 0, 0, "
            "0.0, 't', 1.0, 1.0, :owner, :until)"),
            {"owner": None if lease_until is None else "old-worker@host:123", "until": lease_until})


def test_a_store_an_older_raysaga_is_driving_is_not_migrated_under_it(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    _schema_7_with(url, time.time() + 3600)
    with pytest.raises(SchemaVersionError) as refused:
        SqlStore(url)  # any write command migrates on open
    said = str(refused.value)
    assert "1 run(s) are being driven on it now by an older raysaga (busy by old-worker@host:123)" in said
    assert "raysaga db upgrade --force" in said
    engine = make_engine(url)
    try:
        assert current_version(engine) == 7  # nothing migrated, the old driver's tables as they were
    finally:
        engine.dispose()

    code, out, err = invoke("db", "upgrade", "--db", url)
    assert code == 2 and "being driven on it now" in out + err
    code, out, err = invoke("db", "upgrade", "--db", url, "--force")
    assert code == 0, out + err
    assert f"schema version {SCHEMA_VERSION}" in out


def test_a_lease_that_ran_out_or_none_lets_the_migration_go_on(tmp_path: Path) -> None:
    for name, until in (("expired", time.time() - 5), ("free", None)):
        url = f"sqlite:///{tmp_path / f'{name}.db'}"
        _schema_7_with(url, until)
        engine = make_engine(url)
        try:
            assert upgrade(engine) == SCHEMA_VERSION
        finally:
            engine.dispose()


def test_a_store_migrated_meanwhile_by_another_process_is_not_refused_for_its_leases(tmp_path: Path) -> None:
    """Processes of this raysaga queued on the migration lock: the first migrated and began driving
    runs; the next ones, which had read the old version, found its leases and exited blaming "an
    older raysaga". The version is read again under the lock first."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    store = SqlStore(url)
    try:
        store.engine.dispose()
        with store.engine.begin() as conn:  # a run this raysaga is driving now
            conn.execute(text("INSERT INTO raysaga_runs (run_id, run_key, workflow_name, workflow_version, "
                              "definition_hash, status, version, fence, event_seq, retries_used, tokens_used, "
                              "cost_used, trace_id, created_at, updated_at, lease_owner, lease_expires_at) VALUES "
                              "('mine', 1, 'wf', '1', 'h', 'running', 1, 1, 1, 0, 0, 0.0, 't', 1.0, 1.0, 'me', "
                              ":until)"),
                         {"until": time.time() + 3600})
        migrate._migrate(store.engine)  # as a process that read an older version before the lock does
    finally:
        store.close()

"""Databases of their own on the PostgreSQL test server (``RAYSAGA_TEST_PG_URL``, see conftest.py)."""

from __future__ import annotations

import atexit
import contextlib
import functools
import uuid


def pg_admin(url: str, sql: str) -> None:
    """Run one statement outside a transaction (``CREATE DATABASE`` cannot run in one)."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(sql)


def _url_of(base_url: str, name: str) -> str:
    head, _, _ = base_url.rpartition("/")
    return f"{head}/{name}"


@functools.cache
def migrated_template(base_url: str) -> str:
    """The name of a database on ``base_url``'s server that a store's first open migrated (made on
    first use in this process, dropped at its exit): the PostgreSQL twin of
    ``tests.support.store_template``. Nothing stays connected to it, so ``CREATE DATABASE ...
    TEMPLATE`` copies it (~0.1 s) where a new database's first open runs alembic (~0.5-0.8 s, and
    ~0.4 s more to import alembic in a driver subprocess)."""
    from raysaga.state import SqlStore

    name = "raysaga_tpl_" + uuid.uuid4().hex[:12]
    pg_admin(base_url, f'CREATE DATABASE "{name}"')
    atexit.register(_drop_quietly, base_url, name)
    SqlStore(_url_of(base_url, name)).close()
    return name


def _drop_quietly(base_url: str, name: str) -> None:
    with contextlib.suppress(Exception):
        pg_admin(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def make_pg_database(base_url: str, *, migrated: bool = False) -> str:
    """Create a fresh database on the server of ``base_url`` and return its URL: empty, or with
    ``migrated`` a copy of ``migrated_template`` (what a new store is after its first open; for
    tests that only need an empty store, not those of creating and migrating one)."""
    name = "raysaga_t_" + uuid.uuid4().hex[:12]
    template = f' TEMPLATE "{migrated_template(base_url)}"' if migrated else ""
    pg_admin(base_url, f'CREATE DATABASE "{name}"{template}')
    return _url_of(base_url, name)


def drop_pg_database(base_url: str, url: str) -> None:
    name = url.rpartition("/")[2]
    pg_admin(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

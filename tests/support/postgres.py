"""Databases of their own on the PostgreSQL test server (``RAYSAGA_TEST_PG_URL``, see conftest.py)."""

from __future__ import annotations

import uuid


def pg_admin(url: str, sql: str) -> None:
    """Run one statement outside a transaction (``CREATE DATABASE`` cannot run in one)."""
    import psycopg

    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.execute(sql)


def make_pg_database(base_url: str) -> str:
    """Create a fresh database on the server of ``base_url`` and return its URL."""
    name = "raysaga_t_" + uuid.uuid4().hex[:12]
    pg_admin(base_url, f'CREATE DATABASE "{name}"')
    head, _, _ = base_url.rpartition("/")
    return f"{head}/{name}"


def drop_pg_database(base_url: str, url: str) -> None:
    name = url.rpartition("/")[2]
    pg_admin(base_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

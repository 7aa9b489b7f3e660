"""Fixtures shared by the store's tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import drop_pg_database, make_pg_database


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A database of its own that nothing has migrated yet (a migration test builds an old schema in it)."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'raysaga.db'}"
        return
    base = request.getfixturevalue("pg_base_url")
    url = make_pg_database(base)
    try:
        yield url
    finally:
        drop_pg_database(base, url)

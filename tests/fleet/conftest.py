"""The fleet tests' own store: a SQLite file, or a fresh PostgreSQL database dropped after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import drop_pg_database, make_pg_database


@pytest.fixture(params=["sqlite", "postgres"])
def fleet_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store of this test's own: the workers it starts claim every runnable run in it."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fleet.db'}"
        return
    base = str(request.getfixturevalue("pg_base_url"))
    url = make_pg_database(base)
    try:
        yield url
    finally:
        drop_pg_database(base, url)

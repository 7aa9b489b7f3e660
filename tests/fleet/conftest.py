"""The fleet tests' own store: a SQLite file, or a fresh PostgreSQL database dropped after."""

from __future__ import annotations

import pytest


@pytest.fixture
def fleet_url(own_store_url: str) -> str:
    """A store of this test's own: the workers it starts claim every runnable run in it."""
    return own_store_url

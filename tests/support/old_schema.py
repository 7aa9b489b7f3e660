"""A store an older raysaga left behind: the tests of upgrades start from one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

from raysaga.state import migrate
from raysaga.state.engine import make_engine


def migrate_to(url: str, revision: str) -> None:
    """Migrate the database at ``url`` up to ``revision`` only (``"0007"``: schema 7), as the
    raysaga of that schema made it."""
    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            migrate.upgrade_to(conn, revision)
    finally:
        engine.dispose()


@contextmanager
def store_at(url: str, revision: str) -> Iterator[Engine]:
    """``migrate_to``, then an engine on it for the test to write rows as that schema wrote them;
    disposed after (the store under test opens its own)."""
    migrate_to(url, revision)
    engine = make_engine(url)
    try:
        yield engine
    finally:
        engine.dispose()


def downgrade(url: str, revision: str) -> None:
    """alembic's downgrade of the store at ``url`` to ``revision`` (raysaga never downgrades by itself)."""
    from alembic import command
    from alembic.config import Config

    engine = make_engine(url)
    try:
        with engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(migrate.MIGRATIONS_DIR))
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, revision)
    finally:
        engine.dispose()

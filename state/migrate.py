"""Schema migrations (alembic), applied on first use, and the refuse-newer check."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, inspect, select, text

from raysaga.errors import SchemaVersionError
from raysaga.state.schema import SCHEMA_VERSION, schema_info

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def current_version(engine: Engine) -> int | None:
    """The schema version recorded in the database, or None for an empty database."""
    if not inspect(engine).has_table(schema_info.name):
        return None
    with engine.connect() as conn:
        return conn.execute(select(schema_info.c.version).where(schema_info.c.id == 1)).scalar_one_or_none()


def check_version(found: int | None) -> None:
    if found is not None and found > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"the database has schema version {found}, newer than this raysaga understands "
            f"({SCHEMA_VERSION}): upgrade raysaga (pip install -U raysaga) before using it"
        )


def upgrade(engine: Engine) -> int:
    """Bring the database to this raysaga's schema; return the version now in force."""
    found = current_version(engine)
    check_version(found)
    if found == SCHEMA_VERSION:
        return found
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            # two processes migrating one database at once: the second waits, then finds it done
            conn.execute(text("SELECT pg_advisory_xact_lock(7355608)"))
        cfg = Config()
        cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    found = current_version(engine)
    check_version(found)
    return found or 0

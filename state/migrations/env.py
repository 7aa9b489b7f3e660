"""Alembic environment: raysaga always hands over an open connection."""

from __future__ import annotations

from alembic import context

from raysaga.state.schema import metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata)
with context.begin_transaction():
    context.run_migrations()

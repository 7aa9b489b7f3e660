"""Alembic environment: raysaga always hands over an open connection."""

from __future__ import annotations

from alembic import context

from raysaga.state.schema import metadata

connection = context.config.attributes["connection"]
# no primary key on alembic's one-row table: on SQLite a key is an automatic index, a page of its
# own (schema 9). A store created before keeps its key; either works
context.configure(connection=connection, target_metadata=metadata, version_table_pk=False)
with context.begin_transaction():
    context.run_migrations()

"""Alembic migrations for the raysaga store."""

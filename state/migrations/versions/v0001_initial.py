"""Initial schema: runs, nodes, effects ledger, events, blobs, signals.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from raysaga.state.schema import JsonText, blobs, effects, events, nodes, runs, schema_info, signals

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_TABLES = (schema_info, runs, nodes, effects, events, blobs, signals)
#: Columns later migrations add: version 1 is created without them, so a database made by
#: this file is exactly a version-1 database and every later migration runs on it.
ADDED_LATER = {"raysaga_runs": {"token_budget", "cost_budget", "input_digest", "output_digest", "output_key",
                                "run_key", "labels", "max_driver_deaths"}}
#: Schema 8 keys node rows by ``run_key`` (0008 rebuilds the table): before, by the run id.
_RUN_ID = "run_id"
#: Indexes schema 4 adds (it creates them itself).
INDEXES_ADDED_LATER = {"ix_raysaga_runs_created", "ix_raysaga_runs_status_created",
                       "ix_raysaga_runs_workflow_created", "ix_raysaga_runs_status_updated",
                       "ix_raysaga_runs_input_digest", "ix_raysaga_runs_output_digest",
                       "ix_raysaga_nodes_output_digest"}
#: Columns version 1 declared NOT NULL that a later migration relaxes (schema 9: NULL is 'completed').
NULLABLE_LATER = {"raysaga_nodes": {"status"}}


def _as_of_v1(table: sa.Table, v1: sa.MetaData) -> sa.Table:
    later = ADDED_LATER.get(table.name, set())
    columns = [c._copy() for c in table.columns if c.name not in later]
    if table.name == "raysaga_nodes":
        columns = [sa.Column(_RUN_ID, sa.String(200), primary_key=True),
                   *(c for c in columns if c.name != "run_key")]
    for c in columns:
        if c.name in NULLABLE_LATER.get(table.name, set()):
            c.nullable = False
    kept = {c.name for c in columns}
    for c in columns:
        if isinstance(c.type, JsonText):
            c.type = sa.JSON()  # version 1 declared JSON columns as JSON; schema 4 makes them TEXT on SQLite
    indexes = [sa.Index(i.name, *[c.name for c in i.columns]) for i in table.indexes
               if i.name not in INDEXES_ADDED_LATER and all(c.name in kept for c in i.columns)]
    fks = []
    for c in columns:
        c.foreign_keys.clear()
        c.constraints = set()
    for fk in table.foreign_key_constraints:
        if fk.column_keys == ["run_key"]:  # schema 8's; before it, the run id
            fks.append(sa.ForeignKeyConstraint([_RUN_ID], ["raysaga_runs.run_id"], ondelete=fk.ondelete))
            continue
        fks.append(sa.ForeignKeyConstraint([c.name for c in fk.columns], [e.target_fullname for e in fk.elements],
                                           ondelete=fk.ondelete))
    return sa.Table(table.name, v1, *columns, *fks, *indexes)


def upgrade() -> None:
    bind = op.get_bind()
    v1 = sa.MetaData()  # one, so that foreign keys find raysaga_runs
    for table in _TABLES:
        _as_of_v1(table, v1).create(bind, checkfirst=True)
    bind.execute(sa.delete(schema_info))
    bind.execute(sa.insert(schema_info).values(id=1, version=1))

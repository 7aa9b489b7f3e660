"""``queries.steps`` reads a run's counts in one snapshot (stop 50).

``raysaga status`` sets a fan-out's size (its ``fanout_expanded`` event) against its rows: the
items' rows, less the fan-out's own row, which is not one of its items. The rows were counted in
one SELECT and the fan-out's own row looked for in a second; on PostgreSQL (READ COMMITTED: a
snapshot per statement) a fan-out that ended between the two had its own row counted as missing
from the first and present in the second: a phantom ``pending`` item in a fan-out that had none.
The test commits the fan-out's own row from another connection exactly between two statements of
the read (an engine event: no timing), on a real store.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete, event, insert, select

import raysaga
from raysaga import Workflow
from raysaga.state import SqlStore, queries
from raysaga.state.fork_rows import run_key_of
from raysaga.state.schema import nodes


def _flow() -> Workflow:
    wf = Workflow("stop50_snapshot")

    @wf.step()
    def numbers() -> list[int]:
        return list(range(5))

    @wf.map("numbers")
    def square(numbers: int) -> int:
        return numbers * numbers

    del square
    return wf


def test_a_fan_out_ending_mid_read_adds_no_phantom_pending_item(store_url: str) -> None:
    record = raysaga.run(_flow(), None, store=store_url, run_id="snap", executor="inline")
    assert record.status.value == "completed"
    store = SqlStore(store_url)
    try:
        own = (nodes.c.run_key == run_key_of("snap")) & (nodes.c.node_id == "square") & (nodes.c.fan_index == -1)
        with store.engine.begin() as conn:  # the fan-out as a reader met it under way: no own row yet
            row: dict[str, Any] = dict(conn.execute(select(nodes).where(own)).one()._mapping)
            conn.execute(delete(nodes).where(own))
        statements: list[str] = []

        def end_the_fan_out(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
            if statements and "GROUP BY" in statements[-1] and len(statements) < 99:  # the rows counted:
                statements.append("-- the fan-out ends")  # it ends now, committed from another connection
                with store.engine.begin() as other:
                    other.execute(insert(nodes).values(**row))
            statements.append(statement)

        event.listen(store.reader, "before_cursor_execute", end_the_fan_out)
        try:
            infos = {s.node_id: s for s in queries.steps(store, "snap")}
        finally:
            event.remove(store.reader, "before_cursor_execute", end_the_fan_out)
        assert "-- the fan-out ends" in statements[:-1], statements  # the row went in mid-read
        square = infos["square"]
        assert square.no_row == 0, square
        assert "pending" not in square.counts, square.counts
    finally:
        store.close()

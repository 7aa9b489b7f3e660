"""Every row of a store that holds some text: how the security tests prove a secret never landed."""

from __future__ import annotations

from sqlalchemy import select

from raysaga.state import SqlStore
from raysaga.state.schema import metadata


def rows_holding(url: str, texts: list[str]) -> str:
    """Every row of every raysaga table, as text, that holds one of ``texts`` (around the first),
    one line each ("" when none does)."""
    store = SqlStore(url)
    found = []
    try:
        with store.engine.connect() as conn:
            for table in metadata.sorted_tables:
                for row in conn.execute(select(table)).all():
                    shown = " ".join(c.decode("utf-8", "replace") if isinstance(c, bytes) else str(c) for c in row)
                    hits = [t for t in texts if t in shown]
                    if hits:
                        at = shown.index(hits[0])
                        found.append(f"{table.name}: ...{shown[max(0, at - 40):at + 40]!r}")
    finally:
        store.close()
    return "\n".join(found)

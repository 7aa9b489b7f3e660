"""A run's node rows by label, read through a store opened (and closed) for the look."""

from __future__ import annotations

from raysaga.state import NodeRecord, SqlStore


def nodes_of(url: str, run_id: str) -> dict[str, NodeRecord]:
    store = SqlStore(url)
    try:
        return {n.label: n for n in store.nodes(run_id)}
    finally:
        store.close()

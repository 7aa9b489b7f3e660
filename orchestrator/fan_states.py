"""A fan-out's state from its items' counts: one rule for ``raysaga status`` (which loads no
networkx), the DAG drawings (``dag_svg``) and, in TypeScript, the dashboard's ``fanState``."""

from __future__ import annotations


def fan_state(counts: dict[str, int]) -> str:
    """A fan-out's state from its items' counts."""
    if counts.get("running") or counts.get("retrying"):
        return "running"
    for state in ("waiting", "failed"):
        if counts.get(state):
            return state
    total = sum(counts.values())
    if total and counts.get("cancelled") and not counts.get("pending"):  # a cancel ended it: none goes on
        return "cancelled"
    return "completed" if total and counts.get("completed") == total else "running" if total else "pending"


__all__ = ["fan_state"]

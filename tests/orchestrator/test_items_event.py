"""A fan-out's plain items are reported by one ``items_completed`` event per step per commit (the
items in the order they completed), not one ``node_completed`` event each; an effect's items keep
their own event, and every item keeps its own row."""

from __future__ import annotations

from pathlib import Path

import raysaga
from raysaga.state import SqlStore
from raysaga.state.item_events import add_item, item_indexes

wf = raysaga.Workflow("items_event")


@wf.step()
def plan(input: int) -> list[int]:
    return list(range(input))


@wf.step(map_over="plan")
def square(plan: int) -> int:
    return plan * plan


@wf.step(map_over="plan", effect=True)
def record(plan: int, ctx: raysaga.StepContext) -> int:
    return plan


@wf.step()
def total(square: list[int], record: list[int]) -> int:
    return sum(square) + len(record)


def test_plain_items_are_one_event_per_commit_effect_items_one_each(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'run.db'}")
    try:
        run = raysaga.run(wf, 300, store=store, executor="inline")
        assert run.status == raysaga.RunStatus.COMPLETED and run.output == {"total": 8_955_050 + 300}
        events = store.events(run.run_id)
        rows = {(n.node_id, n.fan_index): n.status.value for n in store.nodes(run.run_id)}
    finally:
        store.close()
    batches = [e for e in events if e.kind == "items_completed"]
    assert batches and all(e.node_id == "square" and e.fan_index is None for e in batches)
    listed = [i for e in batches for i in item_indexes(e.data)]
    assert sorted(listed) == list(range(300)) and len(listed) == 300  # each item once
    assert len(batches) < 300  # grouped: one per commit, not one per item
    # as runs of consecutive indexes: inline, items complete in order, so one run per commit
    assert all(set(e.data) == {"ranges"} and len(e.data["ranges"]) == 1 for e in batches), [e.data for e in batches]
    def completed_items(step: str) -> list[int]:
        return [e.fan_index for e in events if e.kind == "node_completed" and e.node_id == step
                and e.fan_index is not None and e.fan_index >= 0]

    assert completed_items("square") == []
    effect_items = sorted(completed_items("record"))
    assert effect_items == list(range(300))  # an effect's items: an event each, as before
    assert all(rows[("square", i)] == "completed" for i in range(300))  # a row per item either way


def test_ranges_give_back_the_indexes_in_the_order_they_completed() -> None:
    order = [0, 1, 2, 7, 8, 3, 5, 4, 9]
    ranges: list[list[int]] = []
    for i in order:
        add_item(ranges, i)
    assert ranges == [[0, 2], [7, 8], [3, 3], [5, 5], [4, 4], [9, 9]]
    assert item_indexes({"ranges": ranges}) == order
    assert item_indexes({"items": [3, 4, 1]}) == [3, 4, 1]  # an event a store kept from before
    assert item_indexes({"ranges": [[2, 1], [1.0, 2], "x", [True, 1]], "items": [5]}) == []  # (bad data: nothing)
    assert item_indexes(None) == [] and item_indexes({"ranges": None, "items": "x"}) == []

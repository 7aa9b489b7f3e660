"""Schema 12, tried adversarially: a store whose items were written as chunks reads, through
every reader, exactly as one written the pre-schema-12 way (a compact row per item,
``statements.item_rows``), whatever the mix: items written again (in one batch or in another:
an ambiguous commit's retry, a chunk shorter or longer than the first), gaps, several steps, rows
of other states for the same items, outputs of every kind of JSON text. On SQLite and PostgreSQL.

The reference run is written by the same store with ``statements.item_writes`` patched to give
every item a row, which is what the commit wrote before schema 12.
"""

from __future__ import annotations

import importlib
import itertools
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import event, select, text, update

from raysaga.state import Batch, NewRun, NodeStatus, NodeWrite, SqlStore, queries, statements
from raysaga.state.fork_rows import run_key_of
from raysaga.state.jsoncodec import digest as jsoncodec_digest
from raysaga.state.jsoncodec import dumps
from raysaga.state.models import ItemRow
from raysaga.state.schema import item_chunks
from raysaga.state.schema import runs as runs_table
from raysaga.state.statements import (
    MAX_CHUNK_ITEMS,
    MAX_CHUNK_OUTPUT,
    MAX_CHUNK_OUTPUTS,
    ItemWrites,
    item_rows,
    item_writes,
)
from tests.support.old_schema import store_at

#: the module (``raysaga.state.pruning``; ``raysaga.state.prune`` is the function): its batch cap and its batches
prune_module = importlib.import_module("raysaga.state.pruning")
STEPS = ("a", "b")
#: item outputs as a worker's canonical JSON text could hold them, beyond what a value
#: strategy draws: escapes of a lone surrogate and of a NUL, numbers a re-rendering would change
RAW_OUTPUTS = ('"\\ud800 lone"', '"\\u0000 nul \\\\u0000"', "12345678901234567890123456789", "-0.0", "1e+308",
               "5e-324", '"\\"\\\\/\\b\\f\\n\\r\\t"', '"\u2028\u2029\U0001f600"', '[[[[[[[[[]]]]]]]]]')
#: a start and finish whose difference does not give the finish back (``item_rows``)
ODD_TIMES = (684787713.5377197, 1704904018694.3918)


def _new(run_id: str, parent: str | None = None) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="w", workflow_version="1", definition_hash="c" * 64,
                  trace_id=uuid.uuid4().hex, parent_run_id=parent)


@contextmanager
def _rows_only() -> Iterator[None]:
    """``item_writes`` as before schema 12: every item a compact row of its own."""
    real = statements.item_writes
    statements.item_writes = lambda run_key, items: ItemWrites([], [], item_rows(run_key, items))
    try:
        yield
    finally:
        statements.item_writes = real


def _write(store: SqlStore, batches: list[Batch], rows_only: bool = False) -> str:
    run_id = ("rows-" if rows_only else "chunks-") + uuid.uuid4().hex[:10]
    store.create_run(_new(run_id))
    lease = store.claim(run_id, "me", 30)
    for batch in batches:
        if rows_only:
            with _rows_only():
                store.commit(lease, batch)
        else:
            store.commit(lease, batch)
    return run_id


def _same(value: Any, run_id: str) -> str:
    """``value`` as text to compare to the bit (-0.0 is not 0.0, 1 is not 1.0), run ids blanked."""
    return repr(value).replace(run_id, "RUN")


def _reads(store: SqlStore, run_id: str, probes: list[tuple[str, int]]) -> dict[str, str]:
    """What every reader of node rows returns for ``run_id`` (``probes``: keys looked up one by one)."""
    def key(row: Any) -> tuple[str, int]:
        return (row["node_id"], row["fan_index"])

    def dumped(records: list[Any]) -> list[dict[str, Any]]:
        return sorted((r.model_dump(mode="python") for r in records), key=key)

    out: dict[str, Any] = {
        "snapshot": dumped(store.snapshot(run_id).nodes),
        "nodes": [r.model_dump() for r in store.nodes(run_id)],  # ordered by start, then key
        "node_states": dumped(store.node_states(run_id)),
        "iter_nodes": list(queries.iter_nodes(store, run_id, list(STEPS), chunk=3)),
        "iter_nodes_after": list(queries.iter_nodes(store, run_id, list(STEPS), after=probes[0], limit=7, chunk=2)),
        "node_rows": sorted(store.node_rows(run_id, probes), key=key),
        # (counts by status: which status a reader lists first is no difference)
        "step_counts": {n: sorted(c.items()) for n, c in store.step_counts(run_id, STEPS).items()},
        "step_rows": sorted(store.step_rows(run_id, 40), key=key),
        "steps": [(i.node_id, i.first_started, i.rows, sorted(i.counts.items())) for i in queries.steps(store, run_id)],
        "failed": queries.failed_nodes(store, run_id),
        "waiting": store.waiting_approvals(run_id=run_id),
    }
    for node_id in STEPS:
        out[f"unfinished {node_id}"] = queries.unfinished_items(store, run_id, node_id)
        for after, limit, status in ((-1, 500, None), (5, 3, None), (126, 4, None), (-1, 50, "completed"),
                                     (-1, 50, "failed"), (3, 10, "retrying")):
            out[f"fan_items {node_id} {after} {limit} {status}"] = store.fan_items(run_id, node_id, after, limit,
                                                                                    status)
    for node_id, index in probes:
        out[f"node_row {node_id}[{index}]"] = store.node_row(run_id, node_id, index)
        out[f"node_error {node_id}[{index}]"] = queries.node_error(store, run_id, node_id, index)
    with store.engine.connect() as conn:  # plain SQL on the view
        out["view"] = sorted(tuple(r) for r in conn.execute(
            text("SELECT node_id, fan_index, status, attempt, not_before, CAST(output AS TEXT), output_digest, "
                 "started_at, finished_at, duration, origin_run_id FROM raysaga_node_rows WHERE run_id = :r"),
            {"r": run_id}).all())
    return {name: _same(value, run_id) for name, value in out.items()}


def _assert_reads_alike(store: SqlStore, chunked: str, rows: str, probes: list[tuple[str, int]]) -> None:
    got, want = _reads(store, chunked, probes), _reads(store, rows, probes)
    for name in want:
        assert got[name] == want[name], name


# ---------------------------------------------------------------- drawn mixes

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**30, 10**30) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=8)
#: (and strings about as long as a chunk's item takes: some go in, some keep rows)
_outputs = st.one_of(st.sampled_from(RAW_OUTPUTS), _json_values.map(dumps),
                     st.text(st.characters(exclude_categories=["Cs"]), min_size=MAX_CHUNK_OUTPUT - 10,
                             max_size=MAX_CHUNK_OUTPUT + 10).map(dumps)).map(lambda t: None if t == "null" else t)


@st.composite
def _segment(draw: st.DrawFn) -> list[ItemRow]:
    """Items of one step with consecutive indexes (in order, reversed or shuffled), as a Ray task's come back."""
    node_id = draw(st.sampled_from(STEPS))
    start = draw(st.integers(0, 2 * MAX_CHUNK_ITEMS + 5))
    length = draw(st.integers(1, MAX_CHUNK_ITEMS + 12))
    attempt = draw(st.sampled_from([1, 1, 2, 7]))
    pool = draw(st.lists(_outputs, min_size=1, max_size=5))
    base = draw(st.floats(1.5e9, 2.0e9))
    step = draw(st.sampled_from([0.0, 1e-6, 0.013, 1.7]))
    odd = draw(st.sets(st.integers(0, length - 1), max_size=2))
    items: list[ItemRow] = []
    for n in range(length):
        index = start + n
        started = base + n * step
        finished = started + (n % 5) * 3.3e-5
        if n in odd:
            started, finished = ODD_TIMES
        items.append((node_id, index, attempt, pool[n % len(pool)], None, started, finished))
    order = draw(st.sampled_from(["in order", "reversed", "shuffled"]))
    if order == "reversed":
        items.reverse()
    elif order == "shuffled":
        items = draw(st.permutations(items))
    return items


@st.composite
def _batches(draw: st.DrawFn) -> list[Batch]:
    batches = []
    for _ in range(draw(st.integers(1, 4))):
        items = [item for seg in draw(st.lists(_segment(), min_size=1, max_size=3)) for item in seg]
        writes = [NodeWrite(node_id=draw(st.sampled_from(STEPS)), fan_index=draw(st.integers(0, 2 * MAX_CHUNK_ITEMS)),
                            status=NodeStatus(status), attempt=1,
                            error={"message": "flaky"} if status != "running" else None,
                            started_at=1.6e9, not_before=1.7e9 if status == "retrying" else None)
                  for status in draw(st.lists(st.sampled_from(["failed", "retrying", "running", "cancelled"]),
                                              max_size=3))]
        batches.append(Batch(items=items, nodes=writes))
    return batches


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batches=_batches(), probe=st.integers(0, 2 * MAX_CHUNK_ITEMS + 20))
def test_every_reader_reads_a_chunked_run_as_the_same_run_written_in_rows(store: SqlStore, batches: list[Batch],
                                                                          probe: int) -> None:
    chunked, rows = _write(store, batches), _write(store, batches, rows_only=True)
    probes = [("a", probe), ("b", probe), ("a", 0), ("b", MAX_CHUNK_ITEMS), ("a", probe + 1), ("nope", 1)]
    _assert_reads_alike(store, chunked, rows, probes)
    # a fork of each inherits the same rows (its items as rows of its own), and so does a fork of that fork
    keys = sorted({(n.node_id, n.fan_index) for n in store.node_states(rows)
                   if n.status == NodeStatus.COMPLETED and n.fan_index % 3 != probe % 3})
    for parent_chunked, parent_rows in ((chunked, rows),) * 2:
        forks = []
        for parent in (parent_chunked, parent_rows):
            child = "fork-" + uuid.uuid4().hex[:10]
            store.fork_run(_new(child, parent), keys, {"from": "a"})
            forks.append(child)
        pairs = zip(forks, (parent_chunked, parent_rows), strict=True)
        got, want = ([(r.model_dump(exclude={"run_id", "origin_run_id"}), r.origin_run_id == parent)
                      for r in store.nodes(child)] for child, parent in pairs)
        assert _same(got, "") == _same(want, "")
        chunked, rows = forks


# ---------------------------------------------------------------- one case each


def _items(indexes: range | list[int], tag: str, node_id: str = "a", attempt: int = 1) -> list[ItemRow]:
    return [(node_id, i, attempt, json.dumps(f"{tag}{i}"), None, 1.7e9 + i, 1.7e9 + i + 0.25) for i in indexes]


def _chunks(store: SqlStore, run_id: str) -> list[tuple[str, int, int]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(
            select(item_chunks.c.node_id, item_chunks.c.first_index, item_chunks.c.item_count)
            .where(item_chunks.c.run_key == run_key_of(run_id))
            .order_by(item_chunks.c.node_id, item_chunks.c.first_index)).all()]


@pytest.mark.parametrize("second", [range(3, 7), range(0, 2), range(0, 9), range(2, 4), range(4, 5)],
                         ids=["overlapping", "shorter-same-start", "longer-same-start", "inside", "lone-last"])
def test_items_written_again_in_another_batch_read_as_their_last_write(store: SqlStore, second: range) -> None:
    """An item is written again (an ambiguous commit's retry whose batch took more items, a
    retry round): before the fix, a chunk overlapping an older one showed its items twice
    (``overlapping``, ``inside``) and one written again shorter from the same index dropped the
    older chunk's other items (``shorter-same-start``: items 2..4 gone)."""
    batches = [Batch(items=_items(range(5), "old-")), Batch(items=_items(second, "new-"))]
    chunked, rows = _write(store, batches), _write(store, batches, rows_only=True)
    got = [(n.fan_index, n.output) for n in store.nodes(chunked)]
    assert got == [(i, f"new-{i}" if i in second else f"old-{i}") for i in sorted({*range(5), *second})]
    _assert_reads_alike(store, chunked, rows, [("a", i) for i in range(10)])
    spans = _chunks(store, chunked)
    assert all(a[1] + a[2] <= b[1] for a, b in itertools.pairwise(spans)), spans  # no item in two chunks


def test_an_item_twice_in_one_batch_is_its_last_write(store: SqlStore) -> None:
    """Batch.items are upserts as Batch.nodes are: an item twice in one batch ends as its last
    write. Before the fix, [2, 3] then [3, 4] made two chunks holding item 3: it read twice."""
    batch = Batch(items=_items([2, 3], "first-") + _items([3, 4], "then-") + _items([7, 8, 7], "x-"))
    assert [(c[1], c[2], c[3]) for c in item_writes(1, batch.items).chunks] == [("a", 2, 3)]
    chunked, rows = _write(store, [batch]), _write(store, [batch], rows_only=True)
    assert [(n.fan_index, n.output) for n in store.nodes(chunked)] == [
        (2, "first-2"), (3, "then-3"), (4, "then-4"), (7, "x-7"), (8, "x-8")]
    _assert_reads_alike(store, chunked, rows, [("a", i) for i in range(10)])


def test_a_row_kept_from_an_older_chunk_never_hides_a_later_row(store: SqlStore) -> None:
    """The older chunk's items a new write does not cover become rows, unless the item has one
    (a later write, the item's state): a failed row for item 4 stays failed."""
    failed = NodeWrite(node_id="a", fan_index=4, status=NodeStatus.FAILED, attempt=2, error={"message": "boom"})
    batches = [Batch(items=_items(range(6), "old-")), Batch(nodes=[failed]), Batch(items=_items(range(1, 3), "new-"))]
    chunked, rows = _write(store, batches), _write(store, batches, rows_only=True)
    states = {n.fan_index: (n.status.value, n.output) for n in store.nodes(chunked)}
    assert states == {0: ("completed", "old-0"), 1: ("completed", "new-1"), 2: ("completed", "new-2"),
                      3: ("completed", "old-3"), 4: ("failed", None), 5: ("completed", "old-5")}
    _assert_reads_alike(store, chunked, rows, [("a", i) for i in range(7)])


def test_an_infinite_finish_is_stored_as_before(store: SqlStore) -> None:
    """A finish that is inf (a clock gone wrong) was a row before schema 12; a chunk's JSON
    cannot hold it: before the fix the commit failed (ValueError: out of range float)."""
    items: list[ItemRow] = [("a", i, 1, "1", None, 1.7e9 + i, float("inf") if i == 1 else 1.7e9 + i + 1)
                            for i in range(3)]
    chunked, rows = _write(store, [Batch(items=items)]), _write(store, [Batch(items=items)], rows_only=True)
    assert [n.finished_at for n in store.nodes(chunked)] == [1.7e9 + 1, float("inf"), 1.7e9 + 3]
    _assert_reads_alike(store, chunked, rows, [("a", i) for i in range(3)])


def test_long_outputs_read_back_exactly_and_big_ones_keep_rows(store: SqlStore) -> None:
    """Outputs heavy in what a JSON string escapes (a chunk stores the output's text as a JSON
    string: every quote and backslash doubled) read back to the byte, at the longest a chunk
    takes and longer. An output over ``MAX_CHUNK_OUTPUT`` keeps a row, and a chunk's outputs add up
    to ``MAX_CHUNK_OUTPUTS`` at most: before, 2,000 items of 50 KB went into chunks and reading one
    of them (the dashboard's item page) took 475 ms on SQLite instead of 0.8 (the view parses
    every chunk of the step), a page of 50 items 473 ms instead of 27."""
    near = dumps('"\\' * ((MAX_CHUNK_OUTPUT - 2) // 4))  # 2 + 4 * n characters: at the limit
    assert len(near) <= MAX_CHUNK_OUTPUT
    heavy = dumps('"\\' * 40_000 + "\u00e9" * 20_000 + "\x00\x1f")
    plain = dumps(["x" * 250_000, {"k": list(range(2000))}])
    outputs = [near, near, heavy, plain, near, near, dumps("y" * 600), near, near]
    items: list[ItemRow] = [("a", i, 1, out, None, 1.7e9 + i, 1.7e9 + i + 0.5) for i, out in enumerate(outputs)]
    chunked, rows = _write(store, [Batch(items=items)]), _write(store, [Batch(items=items)], rows_only=True)
    assert _chunks(store, chunked) == [("a", 0, 2), ("a", 4, 2), ("a", 7, 2)]
    _assert_reads_alike(store, chunked, rows, [("a", i) for i in range(len(outputs))])
    small = dumps("z" * (MAX_CHUNK_OUTPUT - 2))
    many = _items(range(MAX_CHUNK_ITEMS), "")
    many = [(n, i, a, small, d, s, f) for n, i, a, _, d, s, f in many]
    per_chunk = MAX_CHUNK_OUTPUTS // MAX_CHUNK_OUTPUT
    assert [c[3] for c in item_writes(1, many).chunks] == [per_chunk] * (MAX_CHUNK_ITEMS // per_chunk)


def test_a_store_from_schema_11_reads_its_item_rows_alike_and_a_run_finished_after_the_upgrade_mixes_both(
        empty_url: str) -> None:
    """Item rows written by schema 11 (one compact row each) read as before the upgrade; the run
    resumed after it writes chunks over some of those items again (a retried task) and beside
    them: every reader reads it as a run written in rows all along."""
    before = [*_items(range(0, 10), "v11-"), *_items(range(30, 34), "v11-", node_id="b")]
    after = [Batch(items=_items(range(5, 40), "v12-")), Batch(items=_items(range(34, 40), "v12-", node_id="b"))]
    with store_at(empty_url, "0011") as engine, engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, "
            "version, fence, event_seq, retries_used, tokens_used, cost_used, trace_id, created_at, "
            "updated_at) VALUES ('old', 'wf', '1', :h, 'running', 1, 0, 1, 0, 0, 0.0, 't', 1.0, 2.0)"),
            {"h": "d" * 64})
        run_key = conn.execute(text("SELECT run_key FROM raysaga_runs WHERE run_id = 'old'")).scalar_one()
        conn.exec_driver_sql(statements.driver_sql(conn.dialect.name).nodes, item_rows(run_key, before))
    store = SqlStore(empty_url)
    try:
        assert _chunks(store, "old") == []
        reference = "rows-" + uuid.uuid4().hex[:10]
        store.create_run(_new(reference))
        ref_lease = store.claim(reference, "me", 30)
        with _rows_only():
            store.commit(ref_lease, Batch(items=before))
        probes = [("a", 0), ("a", 7), ("b", 31), ("b", 36), ("a", 39), ("a", 40)]
        _assert_reads_alike(store, "old", reference, probes)
        lease = store.claim("old", "me", 30)
        for batch in after:
            store.commit(lease, batch)
            with _rows_only():
                store.commit(ref_lease, batch)
        assert _chunks(store, "old") == [("a", 5, 35), ("b", 34, 6)]
        _assert_reads_alike(store, "old", reference, probes)
        assert [(n.node_id, n.fan_index, n.output) for n in store.nodes("old")
                if (n.node_id, n.fan_index) in {("a", 4), ("a", 5), ("b", 33), ("b", 34)}] == [
            ("a", 4, "v11-4"), ("a", 5, "v12-5"), ("b", 33, "v11-33"), ("b", 34, "v12-34")]
    finally:
        store.close()


def test_prune_counts_and_caps_chunked_and_row_runs_alike_and_still_collects_blobs(
        store: SqlStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs with chunks, with rows only and with both: the dry run and the prune report the
    items each run shows; a batch is capped by items, not chunk rows (the chunked run, 152 items
    in 2 chunks and 2 rows, goes alone); a blob only a pruned run's item named is deleted, one a
    kept run names too stays."""
    only, shared = (jsoncodec_digest(b'"only"'), b'"only"'), (jsoncodec_digest(b'"shared"'), b'"shared"')
    blob_item = [("a", 200, 1, None, only[0], 1.7e9, 1.7e9 + 1), ("a", 300, 1, None, shared[0], 1.7e9, 1.7e9 + 1)]
    chunky = _write(store, [Batch(items=[*_items(range(150), "c-"), *blob_item, *_items([500], "lone-")],
                                  blobs=dict([only, shared]))])
    rowsy = _write(store, [Batch(items=_items(range(40), "r-"))], rows_only=True)
    mixed = _write(store, [Batch(items=_items(range(10), "m-"))], rows_only=True)
    lease = store.claim(mixed, "me", 30, take_from="me")
    store.commit(lease, Batch(items=_items(range(5, 20), "m2-")))
    kept = _write(store, [Batch(items=[*_items(range(30), "k-"), ("b", 300, 1, None, shared[0], 1.7e9, 1.7e9 + 1)])])
    doomed = [chunky, rowsy, mixed]
    assert [len(_chunks(store, r)) for r in doomed] == [2, 0, 1]
    shown = {r: len(store.nodes(r)) for r in doomed}
    assert shown == {chunky: 153, rowsy: 40, mixed: 20}
    with store.engine.begin() as conn:
        conn.execute(update(runs_table).where(runs_table.c.run_id.in_([*doomed, kept])).values(status="completed"))
        conn.execute(update(runs_table).where(runs_table.c.run_id.in_(doomed)).values(updated_at=1.0))
    monkeypatch.setattr(prune_module, "ROWS_PER_BATCH", shown[chunky] + 10)
    deleted: list[set[str]] = []
    one_batch = prune_module._one_batch

    def recorded(conn: Any, report: Any, prunable: Any, batch_size: int) -> bool:
        before = {r for (r,) in conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id.in_(doomed)))}
        more: bool = one_batch(conn, report, prunable, batch_size)
        after = {r for (r,) in conn.execute(select(runs_table.c.run_id).where(runs_table.c.run_id.in_(doomed)))}
        deleted.append(before - after)
        return more

    dry = prune_module.prune(store, 10, statuses=["completed"], dry_run=True, now=100.0)
    monkeypatch.setattr(prune_module, "_one_batch", recorded)
    done = prune_module.prune(store, 10, statuses=["completed"], now=100.0)
    for report in (dry, done):
        assert (report.runs, report.nodes, report.blobs, report.blob_bytes) == (3, sum(shown.values()), 1, 6), report
    assert {chunky} in deleted and set().union(*deleted) == set(doomed)
    with store.engine.connect() as conn:
        assert conn.execute(select(item_chunks.c.run_key).where(item_chunks.c.run_key.in_(
            select(runs_table.c.run_key).where(runs_table.c.run_id.in_(doomed))))).all() == []
    assert store.get_blobs([only[0], shared[0]]) == {shared[0]: shared[1]}
    assert len(store.nodes(kept)) == 31


def test_a_fork_expands_the_parents_chunks_once_whatever_it_inherits(store: SqlStore) -> None:
    """A fork copied inherited chunk items with a statement per 400 keys, each expanding every
    chunk of the parent through the view: quadratic in the fan-out (a 10,000-item fork: 25
    passes, 1.3 s on SQLite and 5.8 s on PostgreSQL against 0.58 s and 4.6 s for rows). Now no
    statement reads the view: one reads the step's chunks, and every inherited item is copied
    (as chunks of the fork's: ``fork_rows._copy_chunks``)."""
    items = _items(range(1000), "p-")
    parent = _write(store, [Batch(items=items[i:i + 64]) for i in range(0, 1000, 64)])
    keys = [("a", i) for i in range(1000) if i % 7]
    views: list[str] = []
    chunk_reads: list[str] = []

    def seen(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        if "raysaga_node_rows" in statement:
            views.append(statement)
        if statement.lstrip().upper().startswith("SELECT") and "raysaga_item_chunks" in statement:
            chunk_reads.append(statement)

    child = "fork-" + uuid.uuid4().hex[:10]
    event.listen(store.engine, "before_cursor_execute", seen)
    try:
        store.fork_run(_new(child, parent), keys, {"from": "a"})
    finally:
        event.remove(store.engine, "before_cursor_execute", seen)
    assert (len(views), len(chunk_reads)) == (0, 1), f"{len(views)} read the view, {len(chunk_reads)} the chunks"
    got = [(n.fan_index, n.output, n.origin_run_id) for n in store.nodes(child)]
    assert got == [(i, f"p-{i}", parent) for _, i in keys]


def test_items_at_the_top_of_the_index_range_are_written_again(store: SqlStore) -> None:
    """A chunk ending at the largest index a fan_index holds (2**31 - 1), written again: the
    look-up of overlapping chunks computed first_index + item_count, out of PostgreSQL's integer
    range (a DataError failing the commit) before it compared without the sum."""
    top = 2**31 - 1
    batches = [Batch(items=_items(range(top - 4, top + 1), "old-")),
               Batch(items=_items(range(top - 2, top + 1), "new-"))]
    chunked, rows = _write(store, batches), _write(store, batches, rows_only=True)
    assert [(n.fan_index, n.output) for n in store.nodes(chunked)] == [
        (i, f"{'new' if i > top - 3 else 'old'}-{i}") for i in range(top - 4, top + 1)]
    _assert_reads_alike(store, chunked, rows, [("a", top), ("a", top - 4)])

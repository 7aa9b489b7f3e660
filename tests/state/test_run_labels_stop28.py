"""Run labels (``RunOptions.labels``) are stored with the run, read back, and found by
``list_runs(labels=...)``; bounded at every way in; an older store's runs get none; a fork keeps
its parent's. On SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from sqlalchemy import func, select, text

from raysaga import RunOptions
from raysaga.errors import InvalidOptionError
from raysaga.state import NewRun, SqlStore
from raysaga.state.schema import runs
from raysaga.types import MAX_LABEL_KEY, MAX_LABEL_VALUE, MAX_LABELS
from tests.support.old_schema import store_at


def _new(run_id: str, labels: dict[str, str] | None = None, **extra: Any) -> NewRun:
    return NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                  trace_id=uuid.uuid4().hex, labels=labels, **extra)


def _ids(store: SqlStore, **kwargs: Any) -> list[str]:
    """The ids listed, oldest first. (The PostgreSQL database is the session's: a test's labels
    carry a value of its own, ``TAG``, so no other test's runs match.)"""
    return sorted(r.run_id for r in store.list_runs(limit=100, **kwargs))


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:10]


def test_labels_are_stored_and_read_back(store: SqlStore, tag: str) -> None:
    tags = {"team": "billing", "ticket": "OPS-12", "empty": "", "odd key.with \"quotes\"": "ünï cødé ✓"}
    created = store.create_run(_new(f"{tag}-tagged", tags))
    assert created.labels == tags
    assert store.get_run(f"{tag}-tagged").labels == tags
    assert store.snapshot(f"{tag}-tagged").run.labels == tags
    assert store.create_run(_new(f"{tag}-plain")).labels == {}
    assert store.create_run(_new(f"{tag}-none", {})).labels == {}
    with store.engine.connect() as conn:  # no labels: NULL, no bytes in the row
        assert conn.execute(select(runs.c.labels).where(runs.c.run_id.in_([f"{tag}-plain", f"{tag}-none"]))
                            ).scalars().all() == [None, None]


def test_list_runs_by_labels_all_must_match(store: SqlStore, tag: str) -> None:
    store.create_run(_new(f"{tag}-a", {"team": "billing", "env": "prod", "t": tag}))
    store.create_run(_new(f"{tag}-b", {"team": "billing", "env": "staging", "t": tag}))
    store.create_run(_new(f"{tag}-c", {"team": "search", "env": "prod", "t": tag}))
    store.create_run(_new(f"{tag}-d"))
    # lookalikes that must not match: a dotted key (a JSON path), '=' in a value
    store.create_run(_new(f"{tag}-e", {"team.env": "billing", "x": "team=billing", "t": tag}))
    assert _ids(store, labels={"team": "billing", "t": tag}) == [f"{tag}-a", f"{tag}-b"]
    assert _ids(store, labels={"t": tag, "team": "billing", "env": "prod"}) == [f"{tag}-a"]
    assert _ids(store, labels={"t": tag, "team": "nobody"}) == []
    assert _ids(store, labels={"t": tag, "odd \"key\"": "x"}) == []
    assert _ids(store, labels={"t": tag}) == [f"{tag}-a", f"{tag}-b", f"{tag}-c", f"{tag}-e"]
    assert f"{tag}-d" in _ids(store, labels={})  # no labels: no filter
    assert _ids(store, labels={"team.env": "billing", "t": tag}) == [f"{tag}-e"]
    assert _ids(store, labels={"t": tag}, workflow="other") == []
    # with keyset paging
    page = store.list_runs(limit=1, labels={"team": "billing", "t": tag})
    assert len(page) == 1
    rest = store.list_runs(limit=10, labels={"team": "billing", "t": tag}, before=page[0].cursor)
    assert sorted([page[0].run_id, *(r.run_id for r in rest)]) == [f"{tag}-a", f"{tag}-b"]


def test_labels_that_are_not_an_object_match_nothing_and_fail_nothing(store: SqlStore, tag: str) -> None:
    for name in ("ok", "array", "number", "corrupt"):
        store.create_run(_new(f"{tag}-{name}", {"t": tag}))
    with store.engine.begin() as conn:  # rows written by hand, as no raysaga writes them
        conn.execute(text("UPDATE raysaga_runs SET labels = '[1, 2]' WHERE run_id = :r"), {"r": f"{tag}-array"})
        conn.execute(text("UPDATE raysaga_runs SET labels = '7' WHERE run_id = :r"), {"r": f"{tag}-number"})
        if store.dialect == "sqlite":  # PostgreSQL's json type refuses text that is not JSON
            conn.execute(text("UPDATE raysaga_runs SET labels = 'not json' WHERE run_id = :r"),
                         {"r": f"{tag}-corrupt"})
    expected = [f"{tag}-ok"] if store.dialect == "sqlite" else [f"{tag}-corrupt", f"{tag}-ok"]
    assert _ids(store, labels={"t": tag}) == expected


@pytest.mark.parametrize(("labels", "says"), [
    ({f"k{i}": "v" for i in range(MAX_LABELS + 1)}, f"above the limit of {MAX_LABELS}"),
    ({"k" * (MAX_LABEL_KEY + 1): "v"}, f"1 to {MAX_LABEL_KEY} printable characters"),
    ({"": "v"}, f"1 to {MAX_LABEL_KEY} printable characters"),
    ({"team": "v" * (MAX_LABEL_VALUE + 1)}, f"0 to {MAX_LABEL_VALUE} printable characters"),
    ({"team\x00": "v"}, "holds '\\x00', which is not printable"),
    ({"team": "bill\ud800ing"}, "holds '\\ud800', which is not printable"),
    ({"team": "line\nbreak"}, "holds '\\n', which is not printable"),
    ({"a=b": "v"}, "holds '='"),
    ({"team": 3}, "0 to 500 printable characters (a str), got int"),
    ({3: "v"}, "1 to 100 printable characters (a str), got int"),
])
def test_a_bad_label_is_refused_naming_it_and_nothing_is_stored(store: SqlStore, tag: str, labels: Any,
                                                               says: str) -> None:
    with pytest.raises(InvalidOptionError, match=r"RunOptions\.labels") as exc:
        RunOptions(labels=labels)
    assert says in str(exc.value)
    with pytest.raises(InvalidOptionError) as at_store:  # the store checks too: every caller's way in
        store.create_run(NewRun.model_construct(**_new(f"{tag}-hostile").model_dump() | {"labels": labels}))
    assert says in str(at_store.value)
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(runs).where(
            runs.c.run_id == f"{tag}-hostile")).scalar_one() == 0
    with pytest.raises(InvalidOptionError):
        store.list_runs(labels=labels)


def test_the_largest_label_set_allowed_is_stored_whole(store: SqlStore, tag: str) -> None:
    tags = {f"{i:03d}" + "k" * (MAX_LABEL_KEY - 3): tag + "v" * (MAX_LABEL_VALUE - len(tag)) for i in range(MAX_LABELS)}
    assert store.create_run(_new(f"{tag}-big", tags)).labels == tags
    assert _ids(store, labels=dict(list(tags.items())[-2:])) == [f"{tag}-big"]


def test_a_fork_keeps_its_parents_labels_unless_given_its_own(store: SqlStore, tag: str) -> None:
    store.create_run(_new(f"{tag}-parent", {"team": "billing", "t": tag}))
    child = store.fork_run(_new(f"{tag}-child", None, parent_run_id=f"{tag}-parent", forked_from="a"), [], {})
    assert child.labels == {"team": "billing", "t": tag}
    own = store.fork_run(_new(f"{tag}-own", {"team": "search", "t": tag}, parent_run_id=f"{tag}-parent",
                              forked_from="a"), [], {})
    assert own.labels == {"team": "search", "t": tag}
    store.create_run(_new(f"{tag}-bare"))
    bare = store.fork_run(_new(f"{tag}-bare-child", None, parent_run_id=f"{tag}-bare", forked_from="a"), [], {})
    assert bare.labels == {}
    assert _ids(store, labels={"team": "billing", "t": tag}) == [f"{tag}-child", f"{tag}-parent"]


def test_an_older_store_is_upgraded_and_its_runs_have_no_labels(empty_url: str) -> None:
    with store_at(empty_url, "0010") as engine, engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO raysaga_runs (run_id, workflow_name, workflow_version, definition_hash, status, "
            "version, fence, event_seq, retries_used, tokens_used, cost_used, trace_id, created_at, "
            "updated_at) VALUES ('old', 'wf', '1', :h, 'completed', 3, 1, 4, 0, 0, 0.0, 't', 1.0, 2.0)"),
            {"h": "d" * 64})
    store = SqlStore(empty_url)
    try:
        old = store.get_run("old")
        assert (old.labels, old.status.value, old.version) == ({}, "completed", 3)
        store.create_run(_new("new", {"team": "billing"}))
        assert _ids(store, labels={"team": "billing"}) == ["new"]
        assert sorted(_ids(store)) == ["new", "old"]
    finally:
        store.close()


@pytest.mark.parametrize("labels", [{"key": "sk-ant-api03-abcdefghijklmnop"}, {"password: hunter2x": "v"},
                                    {"deploy": "password: hunter2x"}])
def test_a_label_holding_a_secret_is_refused_not_stored(store: SqlStore, tag: str, labels: dict[str, str]) -> None:
    """Invariant 7: an API key given as a label reached the run row, and status, list and the
    dashboard showed it. The store refuses it (labels are matched as written: masking one would
    store a label nobody gave), naming the label but not the secret."""
    with pytest.raises(InvalidOptionError, match="looks like a secret") as exc:
        store.create_run(_new(f"{tag}-secret", labels))
    assert "hunter2x" not in str(exc.value) and "abcdefghijklmnop" not in str(exc.value)
    with store.engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(runs).where(
            runs.c.run_id == f"{tag}-secret")).scalar_one() == 0

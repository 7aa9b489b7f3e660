"""Errors at rest as ``ErrorRecord``: rows written before errors had a type read back, and
round-trip to the very same bytes, on SQLite and PostgreSQL (so the type needed no migration).

The old rows are inserted with plain SQL, as the text the earlier store wrote: canonical JSON
(``jsoncodec.dumps``) of the dicts its writers built (``NodeOutcome.failure``, retry
exhaustion, skipped dependents, fan-out policies, a parked blob, a failed critical node, a
rollback's report) and of shapes it never wrote (unknown keys, exact numbers).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import ValidationError
from sqlalchemy import text

from raysaga.state import (
    Batch,
    ErrorRecord,
    NewRun,
    NodeStatus,
    NodeWrite,
    RunStatus,
    RunUpdate,
    SqlStore,
    jsoncodec,
)

#: Node errors in the shapes raysaga wrote before ``ErrorRecord``.
#: The run ``:r``'s key: node rows carry it, not the run id (schema 8).
RUN_KEY = "(SELECT run_key FROM raysaga_runs WHERE run_id = :r)"
NODE_ERRORS: dict[str, dict[str, Any]] = {
    "attempt": {"type": "TimeoutError", "message": "step 'a' exceeded its timeout of 2.0s", "transient": True,
                "traceback": "Traceback (most recent call last):\n  ...\nTimeoutError\n",
                "reason": "2 attempts exhausted"},
    "permanent": {"type": "ValueError", "message": "bad card", "transient": False, "traceback": "Traceback\n"},
    "budget": {"type": "ConnectionError", "message": "down", "transient": True, "reason": "retry budget exhausted"},
    "skipped": {"reason": "upstream step 'enrich' failed"},
    "not_sent": {"reason": "not sent: the run failed"},
    "cancelled": {"type": "Cancelled", "message": "cancelled"},
    "fan_out": {"type": "FanOutError", "transient": False, "message": "step 'm' maps over 'x', whose output is a "
                "dict, not a list"},
    "fan_item": {"type": "FanOutItemFailed", "message": "item 3 failed"},
    "policy": {"type": "FanOutPolicy", "message": "quorum not met: 4 of 5 succeeded, 5 needed", "verdict": "fail"},
    "agent": {"type": "MaxTurns", "message": "agent 'solve' used its 10 turns", "transient": False},
    "prompt": {"type": "PromptError", "message": "the prompt builder of 'ask' failed", "transient": False},
    "empty": {},
    "unknown keys": {"type": "HTTPError", "status_code": 503, "retry_after": 2.0, "headers": {"x-id": "a"},
                     "numbers": [12345678901234567891, 1e16, -0.0, 0.1, 7], "node": None, "message": None},
}

#: Run errors in the shapes raysaga wrote before ``ErrorRecord``.
RUN_ERRORS: dict[str, dict[str, Any]] = {
    "critical": {"node": "charge", "type": "ValueError", "message": "card declined", "transient": False},
    "deadline": {"type": "DeadlineExceeded", "message": "the run passed its deadline"},
    "blob": {"type": "BlobIntegrityError", "digest": "sha256:" + "ab" * 32, "problem": "is missing", "node": None,
             "message": "blob sha256:abab... is missing"},
    "rollback report": {
        "failed_compensations": [{"node": "book[1]", "type": "RuntimeError", "message": "undo failed",
                                  "transient": False, "reason": "3 attempts exhausted", "attempts_note": 3}],
        "blocked_compensations": ["pay", "reserve[0]"],
        "cause": {"node": "ship", "type": "ValueError", "message": "no stock", "transient": False},
    },
    "report without cause": {"failed_compensations": [{"node": "a"}], "blocked_compensations": [], "cause": None},
    "report of a retried report": {
        "failed_compensations": [], "blocked_compensations": ["x"],
        "cause": {"failed_compensations": [{"node": "y", "type": "E"}], "blocked_compensations": [], "cause": None},
    },
}


def shape(value: Any) -> str:
    """Type and repr all the way down (``2 == 2.0`` and ``-0.0 == 0.0`` in Python, not here)."""
    def typed(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: typed(x) for k, x in sorted(v.items())}
        if isinstance(v, list):
            return [typed(x) for x in v]
        return (type(v).__name__, repr(v))
    return repr(typed(value))


def json_cast(store: SqlStore) -> str:
    return "CAST(:e AS JSON)" if store.dialect == "postgresql" else ":e"


def new_run(store: SqlStore, tag: str) -> str:
    run_id = f"{tag}-{uuid.uuid4().hex[:10]}"
    store.create_run(NewRun(run_id=run_id, workflow_name="wf", workflow_version="1", definition_hash="d" * 64,
                            trace_id=uuid.uuid4().hex))
    return run_id


def insert_old_rows(store: SqlStore, run_id: str, run_error: dict[str, Any]) -> None:
    """The rows as the earlier store left them, written with plain SQL."""
    with store.engine.begin() as conn:
        conn.execute(text(f"UPDATE raysaga_runs SET status = 'failed', error = {json_cast(store)} "
                          "WHERE run_id = :r"), {"r": run_id, "e": jsoncodec.dumps(run_error)})
        for i, (name, error) in enumerate(NODE_ERRORS.items()):
            conn.execute(text("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt, error) "
                              f"VALUES ({RUN_KEY}, :n, -1, 'failed', :a, {json_cast(store)})"),
                         {"r": run_id, "n": name, "a": i, "e": jsoncodec.dumps(error)})


def raw_errors(store: SqlStore, run_id: str) -> tuple[str, dict[str, str]]:
    """The error columns' stored text, byte for byte (PostgreSQL's json type keeps it verbatim)."""
    with store.engine.connect() as conn:
        run = conn.execute(text("SELECT CAST(error AS TEXT) FROM raysaga_runs WHERE run_id = :r"),
                           {"r": run_id}).scalar_one()
        nodes = conn.execute(text("SELECT node_id, CAST(error AS TEXT) FROM raysaga_node_rows WHERE run_id = :r"),
                             {"r": run_id}).all()
    return run, {n: e for n, e in nodes}


@pytest.mark.parametrize("run_shape", list(RUN_ERRORS))
def test_old_rows_read_back_typed_and_round_trip_byte_for_byte(store: SqlStore, run_shape: str) -> None:
    old = new_run(store, "old")
    insert_old_rows(store, old, RUN_ERRORS[run_shape])

    # read back: typed, and every key and value exactly as stored (through every read path)
    run = store.get_run(old)
    snap = store.snapshot(old)
    nodes = {n.node_id: n for n in store.nodes(old)}
    assert {n.node_id for n in snap.nodes} == set(NODE_ERRORS) == set(nodes)
    assert isinstance(run.error, ErrorRecord) and snap.run.error == run.error
    assert shape(run.error.as_dict()) == shape(RUN_ERRORS[run_shape])
    for name, error in NODE_ERRORS.items():
        record = nodes[name].error
        assert isinstance(record, ErrorRecord), name
        assert shape(record.as_dict()) == shape(error), name
        assert record == error and dict(record) == error  # it still reads as the dict it is stored as
        assert {n.node_id: n for n in snap.nodes}[name].error == record

    # the typed fields carry what the writers put there
    assert nodes["attempt"].error is not None and nodes["attempt"].error.transient is True
    assert nodes["attempt"].error.reason == "2 attempts exhausted" and nodes["attempt"].error.type == "TimeoutError"
    assert nodes["policy"].error is not None and nodes["policy"].error.verdict == "fail"
    unknown = nodes["unknown keys"].error
    assert unknown is not None and unknown.type == "HTTPError" and unknown["status_code"] == 503
    assert unknown.model_extra is not None and set(unknown.model_extra) == {"status_code", "retry_after", "headers",
                                                                            "numbers"}
    if run_shape == "rollback report":
        assert run.error.failed_compensations is not None and run.error.cause is not None
        assert run.error.failed_compensations[0].node == "book[1]" and run.error.cause.node == "ship"
        assert run.error.blocked_compensations == ["pay", "reserve[0]"]

    # written back (as records, through a driver's batch): the very same bytes
    new = new_run(store, "new")
    lease = store.claim(new, "driver", 30.0)
    store.commit(lease, Batch(
        run=RunUpdate(status=RunStatus.RUNNING),
        nodes=[NodeWrite(node_id=n.node_id, status=NodeStatus.FAILED, attempt=n.attempt, error=n.error)
               for n in nodes.values()]))
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.FAILED, error=run.error, set_error=True)))
    old_run_text, old_node_texts = raw_errors(store, old)
    new_run_text, new_node_texts = raw_errors(store, new)
    assert new_run_text == old_run_text == jsoncodec.dumps(RUN_ERRORS[run_shape])
    assert new_node_texts == old_node_texts
    assert old_node_texts == {name: jsoncodec.dumps(error) for name, error in NODE_ERRORS.items()}


def test_a_write_takes_a_dict_or_a_record_and_stores_the_same_text(store: SqlStore) -> None:
    error = NODE_ERRORS["unknown keys"]
    run_id = new_run(store, "w")
    lease = store.claim(run_id, "driver", 30.0)
    store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING), nodes=[
        NodeWrite(node_id="as_dict", status=NodeStatus.FAILED, error=error),
        NodeWrite(node_id="as_record", status=NodeStatus.FAILED, error=ErrorRecord.model_validate(error)),
        NodeWrite(node_id="built", status=NodeStatus.FAILED, error=ErrorRecord(type="X", reason="r")),
        NodeWrite(node_id="none", status=NodeStatus.COMPLETED, output=1)]))
    _, texts = raw_errors(store, run_id)
    assert texts["as_dict"] == texts["as_record"] == jsoncodec.dumps(error)
    assert texts["built"] == '{"reason":"r","type":"X"}'  # fields never set are absent, not null
    assert texts["none"] is None
    assert {n.node_id: n.error for n in store.nodes(run_id)}["none"] is None


def test_a_write_coerces_a_dict_and_refuses_what_is_no_error_record() -> None:
    write = NodeWrite(node_id="a", status=NodeStatus.FAILED, error={"type": "X", "transient": True})
    assert isinstance(write.error, ErrorRecord) and write.error.transient is True
    assert isinstance(RunUpdate(error={"reason": "r"}).error, ErrorRecord)
    bad_errors: tuple[Any, ...] = (5, "boom", [1], {"transient": "yes"}, {"message": 3})  # deliberately mistyped
    for bad in bad_errors:  # values are never coerced
        with pytest.raises(ValidationError):
            NodeWrite(node_id="a", status=NodeStatus.FAILED, error=bad)


def test_a_stored_error_with_a_mistyped_known_field_is_a_corrupt_record_naming_it(store: SqlStore) -> None:
    from raysaga.errors import CorruptRecordError

    run_id = new_run(store, "bad")
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO raysaga_nodes (run_key, node_id, fan_index, status, attempt, error) "
                          f"VALUES ({RUN_KEY}, 'b', -1, 'failed', 1, {json_cast(store)})"),
                     {"r": run_id, "e": jsoncodec.dumps({"transient": "maybe"})})
    with pytest.raises(CorruptRecordError) as exc:
        store.snapshot(run_id)
    assert run_id in str(exc.value) and "raysaga_nodes.error.transient" in str(exc.value)

"""Stop 30: a retried ``Client.submit`` (same ``run_id``) compared the workflow, the input and the
labels, and returned the recorded run whatever queue, deadline or retry budget the retry gave: a
retry meant for another queue was silently the run on the first one. Now it is refused like a
``raysaga.run`` resume (``run_identity.same_options``), naming the option and both values."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from raysaga import Client, RunOptions, UserError, Workflow

wf = Workflow("submit_options_stop30")


@wf.step
def total(input: dict[str, int]) -> int:
    return input["amount"] * 2


def _client(tmp_path: Path) -> Client:
    return Client(f"sqlite:///{tmp_path / 'runs.db'}")


def test_a_retried_submit_on_another_queue_is_refused(tmp_path: Path) -> None:
    run_id = f"order-{uuid.uuid4().hex[:8]}"
    with _client(tmp_path) as client:
        first = client.submit(wf, {"amount": 3}, run_id=run_id, queue="payments")
        with pytest.raises(UserError) as raised:
            client.submit(wf, {"amount": 3}, run_id=run_id, queue="reports")
        message = str(raised.value)
        assert "queue" in message and "'payments'" in message and "'reports'" in message
        again = client.submit(wf, {"amount": 3}, run_id=run_id, queue="payments")
        assert again.run_id == first.run_id and again.queue == "payments"
        assert [r.run_id for r in client.store.list_runs(workflow=wf.name, limit=100)] == [run_id]


def test_a_retried_submit_with_another_deadline_or_retry_budget_is_refused(tmp_path: Path) -> None:
    run_id = f"order-{uuid.uuid4().hex[:8]}"
    with _client(tmp_path) as client:
        client.submit(wf, {"amount": 3}, run_id=run_id, options=RunOptions(deadline=600, retry_budget=4))
        with pytest.raises(UserError, match="deadline"):
            client.submit(wf, {"amount": 3}, run_id=run_id, options=RunOptions(deadline=60, retry_budget=4))
        with pytest.raises(UserError, match="retry_budget"):
            client.submit(wf, {"amount": 3}, run_id=run_id, options=RunOptions(deadline=600, retry_budget=9))
        same = client.submit(wf, {"amount": 3}, run_id=run_id, options=RunOptions(deadline=600, retry_budget=4))
        assert same.run_id == run_id
        # options left out are not given: the retry returns the run as recorded
        assert client.submit(wf, {"amount": 3}, run_id=run_id).run_id == run_id

"""A submit under a run id is idempotent: a retry returns the run already recorded instead of
starting the work a second time (the id is the caller's business key: an order, a request).

Found by the fleet's database-restart test: a ``Client.submit`` whose commit landed before its
answer was lost, retried, recorded a second run of the same order, and charged it twice.
"""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import raysaga
from raysaga import Client, UserError, Workflow
from raysaga.state import RunStatus
from tests.support import REPO

wf = Workflow("submit_once")


@wf.step
def total(input: dict[str, int]) -> int:
    return input["amount"] * 2


other = Workflow("submit_other")


def _ids(client: Client) -> list[str]:
    """Run ids of this workflow in the store (a PostgreSQL database is shared by a module's tests)."""
    return [r.run_id for r in client.store.list_runs(workflow="submit_once", limit=10_000)]


def _key(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@other.step
def noop(input: dict[str, int]) -> int:
    return 0


def test_a_retried_submit_returns_the_run_already_recorded(store_url: str) -> None:
    with Client(store_url) as client:
        before = _ids(client)
        key = _key("order-42")
        first = client.submit(wf, {"amount": 21}, run_id=key)
        again = client.submit(wf, {"amount": 21}, run_id=key)
        assert again.run_id == first.run_id == key
        assert again.created_at == first.created_at  # the same row, not a new one
        assert sorted(_ids(client)) == sorted([*before, key])


def test_a_retry_after_the_run_finished_does_not_start_it_again(store_url: str) -> None:
    with Client(store_url) as client:
        key = _key("order-7")
        client.submit(wf, {"amount": 5}, run_id=key)
        done = raysaga.run(wf, run_id=key, store=client.store, executor="inline")
        assert done.status == RunStatus.COMPLETED
        before = _ids(client)
        again = client.submit(wf, {"amount": 5}, run_id=key)
        assert again.status == RunStatus.COMPLETED  # as it stands now: nothing re-recorded
        assert again.output == done.output == {"total": 10}
        assert _ids(client) == before


def test_the_same_id_with_another_input_or_workflow_is_refused(store_url: str) -> None:
    with Client(store_url) as client:
        key = _key("order-1")
        client.submit(wf, {"amount": 1}, run_id=key)
        before = _ids(client)
        with pytest.raises(UserError, match="different input"):
            client.submit(wf, {"amount": 2}, run_id=key)
        with pytest.raises(UserError, match="belongs to workflow 'submit_once'"):
            client.submit(other, {"amount": 1}, run_id=key)
        stored = client.get_run(key)
        assert stored.input == {"amount": 1}  # the refused calls changed nothing
        assert _ids(client) == before


def test_without_a_run_id_every_submit_is_a_new_run(store_url: str) -> None:
    with Client(store_url) as client:
        before = _ids(client)
        a = client.submit(wf, {"amount": 3})
        b = client.submit(wf, {"amount": 3})
        assert a.run_id != b.run_id
        assert sorted(_ids(client)) == sorted([*before, a.run_id, b.run_id])


def test_the_cli_submit_prints_the_same_run_for_a_retry(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    cmd = [sys.executable, "-m", "raysaga", "submit", "tests.fleet.test_submit_once:wf",
           "--input", '{"amount": 4}', "--run-id", "order-4", "--db", db]
    outs = [subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120) for _ in range(2)]
    assert [o.returncode for o in outs] == [0, 0], [o.stderr for o in outs]
    assert [o.stdout.strip() for o in outs] == ["order-4", "order-4"]
    with Client(db) as client:
        assert _ids(client) == ["order-4"]

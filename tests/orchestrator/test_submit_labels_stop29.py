"""Stop 29: a retried ``Client.submit`` (same ``run_id``) must ask for the run that is recorded,
labels included. It compared the workflow and the input, and returned the recorded run whatever
labels the retry gave: the caller believed the run tagged as asked, and ``raysaga list --label``
never found it by those tags. Now labels that differ are a ``UserError`` naming them, and nothing
is written; the same labels (in any order) return the recorded run, as before.
"""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest
from sqlalchemy import update

from raysaga import Client, RunOptions, UserError, Workflow
from raysaga.state import SqlStore
from raysaga.state.schema import runs
from tests.support.cli import invoke, one_line_error

wf = Workflow("submit_labels_stop29")


@wf.step
def total(input: dict[str, int]) -> int:
    return input["amount"] * 2


def _key() -> str:
    return f"order-{uuid.uuid4().hex[:10]}"


def _labels(**labels: str) -> RunOptions:
    return RunOptions(labels=labels)


def _ids(client: Client) -> list[str]:
    return sorted(r.run_id for r in client.store.list_runs(workflow=wf.name, limit=10_000))


def test_a_retry_with_the_same_labels_returns_the_recorded_run(store_url: str) -> None:
    with Client(store_url) as client:
        key = _key()
        first = client.submit(wf, {"amount": 1}, run_id=key, options=_labels(team="search", env="prod"))
        before = _ids(client)
        again = client.submit(wf, {"amount": 1}, run_id=key, options=_labels(env="prod", team="search"))
        assert (again.run_id, again.created_at, again.labels) == (key, first.created_at, first.labels)
        assert _ids(client) == before
        plain = _key()
        client.submit(wf, {"amount": 1}, run_id=plain)
        assert client.submit(wf, {"amount": 1}, run_id=plain, options=RunOptions()).labels == {}  # none, none


@pytest.mark.parametrize(("recorded", "given", "says"), [
    ({"team": "search"}, {"team": "billing"}, "'team': recorded 'search', given 'billing'"),
    ({"team": "search"}, {}, "'team': recorded 'search', given none"),
    ({}, {"team": "search"}, "'team': recorded none, given 'search'"),
    ({"team": "search"}, {"team": "search", "env": "prod"}, "'env': recorded none, given 'prod'"),
    ({"team": "a_c"}, {"team": "abc"}, "'team': recorded 'a_c', given 'abc'"),
    ({f"k{i}": "x" for i in range(8)}, {f"k{i}": "y" for i in range(8)}, "(and 3 more)"),
])
def test_a_retry_with_other_labels_is_refused_naming_them(store_url: str, recorded: dict[str, str],
                                                          given: dict[str, str], says: str) -> None:
    with Client(store_url) as client:
        key = _key()
        client.submit(wf, {"amount": 1}, run_id=key, options=RunOptions(labels=recorded))
        before = _ids(client)
        with pytest.raises(UserError) as refused:
            client.submit(wf, {"amount": 1}, run_id=key, options=RunOptions(labels=given))
        message = str(refused.value)
        assert message.startswith(f"run {key!r} exists with other labels (") and says in message, message
        assert message.endswith("submit again with the labels it was recorded with, or choose another run_id")
        assert client.get_run(key).labels == recorded  # nothing was written
        assert _ids(client) == before


def test_a_retry_without_options_is_refused_when_the_run_has_labels(store_url: str) -> None:
    with Client(store_url) as client:
        key = _key()
        client.submit(wf, {"amount": 1}, run_id=key, options=_labels(team="search"))
        with pytest.raises(UserError, match="'team': recorded 'search', given none"):
            client.submit(wf, {"amount": 1}, run_id=key)


def test_a_secret_in_a_label_recorded_before_they_were_refused_is_not_shown(store_url: str) -> None:
    """A row written before the store refused secret-shaped labels (6867918) may hold one: the
    refusal names the label, never the secret (invariant 7: the error reaches logs)."""
    secret = "sk-ant-" + "z" * 30
    with Client(store_url) as client:
        key = _key()
        client.submit(wf, {"amount": 1}, run_id=key, options=_labels(note="plain"))
    store = SqlStore(store_url)
    try:
        with store.engine.begin() as conn:  # as the row was written then: past the store's check
            conn.execute(update(runs).where(runs.c.run_id == key).values(labels={"note": secret}))
    finally:
        store.close()
    with Client(store_url) as client:
        with pytest.raises(UserError) as refused:
            client.submit(wf, {"amount": 1}, run_id=key, options=_labels(note="plain"))
        assert "'note': recorded '[redacted]', given 'plain'" in str(refused.value)
        assert secret not in str(refused.value)


def test_another_input_is_still_named_before_the_labels(store_url: str) -> None:
    with Client(store_url) as client:
        key = _key()
        client.submit(wf, {"amount": 1}, run_id=key, options=_labels(team="search"))
        with pytest.raises(UserError, match="different input"):
            client.submit(wf, {"amount": 2}, run_id=key, options=_labels(team="billing"))


FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("submit_labels_cli_stop29", version="1")

    @wf.step()
    def one() -> int:
        return 1
''')


def test_raysaga_submit_retried_with_another_label_says_so(tmp_path: Path, store_url: str) -> None:
    path = tmp_path / "submit_labels_flow_stop29.py"
    path.write_text(FLOW)
    key = _key()
    argv = ["submit", f"{path}:wf", "--db", store_url, "--run-id", key]
    code, out, err = invoke(*argv, "--label", "team=search")
    assert (code, out.strip()) == (0, key), err
    code, out, err = invoke(*argv, "--label", "team=search")
    assert (code, out.strip()) == (0, key), err  # the same: the recorded run, once
    code, out, err = invoke(*argv, "--label", "team=billing")
    assert out == "", out
    one_line_error(code, err, "exists with other labels ('team': recorded 'search', given 'billing')")

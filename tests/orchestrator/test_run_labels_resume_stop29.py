"""Stop 29: ``raysaga.run(wf, run_id=EXISTING, options=RunOptions(labels=...))`` resumed the
recorded run and dropped the labels it was given without a word, so the caller believed the run
tagged as asked (helper-30's note; ``Client.submit`` refuses the same since this stop). Now labels
given with an existing run must be the run's (``UserError`` naming those that differ, nothing
written); left out, the run resumes as it was recorded.
"""

from __future__ import annotations

import uuid

import pytest

import raysaga
from raysaga import RunOptions, UserError, Workflow
from raysaga.state import RunStatus, SqlStore

wf = Workflow("run_labels_resume_stop29")


@wf.step
def double(input: int) -> int:
    return input * 2


def test_labels_given_again_must_be_the_runs(store_url: str) -> None:
    run_id = f"tagged-{uuid.uuid4().hex[:8]}"
    first = raysaga.run(wf, 2, store=store_url, run_id=run_id, executor="inline",
                        options=RunOptions(labels={"team": "search", "tier": "gold"}))
    assert first.status == RunStatus.COMPLETED and first.labels == {"team": "search", "tier": "gold"}
    store = SqlStore(store_url)
    try:
        events = len(store.events(run_id))
        with pytest.raises(UserError, match=r"exists with other labels \('team': recorded 'search', given 'ads'; "
                                            r"'tier': recorded 'gold', given none\): run again"):
            raysaga.run(wf, store=store_url, run_id=run_id, executor="inline",
                        options=RunOptions(labels={"team": "ads"}))
        assert len(store.events(run_id)) == events and store.get_run(run_id).labels == first.labels
        # the same labels, in another order, or none at all: the run as recorded
        for options in (RunOptions(labels={"tier": "gold", "team": "search"}), RunOptions(), None):
            again = raysaga.run(wf, store=store_url, run_id=run_id, executor="inline", options=options)
            assert (again.run_id, again.output, again.labels) == (run_id, {"double": 4}, first.labels)
    finally:
        store.close()


def test_a_secret_in_a_recorded_label_is_not_printed(store_url: str) -> None:
    """A label given with a resume is shown scrubbed in the refusal, as a recorded one is."""
    run_id = f"plain-{uuid.uuid4().hex[:8]}"
    raysaga.run(wf, 1, store=store_url, run_id=run_id, executor="inline", options=RunOptions(labels={"k": "v"}))
    secret = "sk-ant-api03-" + "x" * 40
    with pytest.raises(UserError) as refused:
        raysaga.run(wf, store=store_url, run_id=run_id, executor="inline", options=RunOptions(labels={"k": secret}))
    assert secret not in str(refused.value) and "recorded 'v'" in str(refused.value)

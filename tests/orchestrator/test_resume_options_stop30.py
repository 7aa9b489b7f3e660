"""``raysaga.run(wf, run_id=EXISTING, options=...)`` resumes the run; the identity options given
with it must be the recorded ones (``run_identity.same_options``), on SQLite and PostgreSQL.

Before, only labels were compared: a resume with another ``deadline`` or ``retry_budget`` went on
under the recorded ones and said nothing (both are fixed when the run is recorded). Now it is
refused naming the option, the recorded value and the given one, before anything is claimed.
Options that belong to one drive (lease, release, thresholds, budgets of tokens and cost, the
crash-loop limit) may change on a resume, as before.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest

import raysaga
from raysaga import RunOptions, Workflow
from raysaga.errors import UserError
from raysaga.orchestrator.run_identity import same_options
from raysaga.state import RunStatus, SqlStore

wf = Workflow("stop30_resume_options", version="1")


@wf.step()
def only(input: dict[str, Any]) -> int:
    return int(input["n"]) + 1


RECORDED = RunOptions(deadline=600, retry_budget=2, labels={"team": "a"})


def _recorded(store: SqlStore, name: str) -> str:
    """A pending run recorded with ``RECORDED``; its id (unique: the PostgreSQL database is the session's)."""
    return raysaga.create_run(wf, {"n": 1}, store=store, run_id=f"{name}-{uuid.uuid4().hex[:8]}",
                              options=RECORDED).run_id


def _new_id(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.mark.parametrize(("given", "message"), [
    (RunOptions(deadline=1200), "deadline: recorded 600.0s, given 1200s"),
    (RunOptions(retry_budget=5), "retry_budget: recorded 2, given 5"),
    (RunOptions(retry_budget=0), "retry_budget: recorded 2, given 0"),
    (RunOptions(deadline=30, retry_budget=1),
     "deadline: recorded 600.0s, given 30s; retry_budget: recorded 2, given 1"),
])
def test_a_resume_with_other_identity_options_is_refused_naming_them(store: SqlStore, given: RunOptions,
                                                                     message: str) -> None:
    run_id = _recorded(store, "r-refused")
    with pytest.raises(UserError) as refused:
        raysaga.run(wf, store=store, run_id=run_id, executor="inline", options=given)
    assert message in str(refused.value) and f"{run_id!r} exists with other options" in str(refused.value)
    run = store.get_run(run_id)
    assert run.status == RunStatus.PENDING and run.fence == 0  # nothing claimed, nothing driven


def test_a_deadline_given_to_a_run_recorded_without_one_is_refused(store: SqlStore) -> None:
    run_id = raysaga.create_run(wf, {"n": 1}, store=store, run_id=_new_id("r-none")).run_id
    with pytest.raises(UserError, match=r"deadline: recorded none, given 60s"):
        raysaga.run(wf, store=store, run_id=run_id, executor="inline", options=RunOptions(deadline=60))


def test_the_recorded_identity_and_other_drive_options_resume(store: SqlStore) -> None:
    same = _recorded(store, "r-same")
    per_drive = RunOptions(deadline=600, retry_budget=2, labels={"team": "a"}, lease_ttl=7, release_after=5,
                           token_budget=10, cost_budget=1.0, max_driver_deaths=9, blob_threshold=10,
                           max_output_bytes=10**6, allow_changed=True)
    done = raysaga.run(wf, store=store, run_id=same, executor="inline", options=per_drive)
    assert done.status == RunStatus.COMPLETED and done.output == {"only": 2}
    bare = _recorded(store, "r-bare")  # options left at their defaults: not given, the run resumes as recorded
    assert raysaga.run(wf, store=store, run_id=bare, executor="inline",
                       options=RunOptions(lease_ttl=7)).status == RunStatus.COMPLETED


def test_labels_are_still_compared(store: SqlStore) -> None:
    run_id = _recorded(store, "r-labels")
    with pytest.raises(UserError, match=r"exists with other labels"):
        raysaga.run(wf, store=store, run_id=run_id, executor="inline", options=RunOptions(labels={"team": "b"}))


def test_a_submit_queue_is_identity(store: SqlStore) -> None:
    """The check ``Client.submit`` can make of a retried submit (its ``queue``): a run recorded in
    the foreground (no queue) is never claimed by a worker while pending."""
    submitted = raysaga.create_run(wf, {"n": 1}, store=store, run_id=_new_id("r-q"), queue="default")
    same_options(submitted, None, "submit", queue="default")
    with pytest.raises(UserError, match=r"queue: recorded 'default', given 'urgent'"):
        same_options(submitted, None, "submit", queue="urgent")
    foreground = raysaga.create_run(wf, {"n": 1}, store=store, run_id=_new_id("r-fg"))
    with pytest.raises(UserError, match=r"queue: recorded none, given 'default'"):
        same_options(foreground, None, "submit", queue="default")

"""Options are validated at the edge, and ``run`` never silently ignores what it is given.

* ``RunOptions``/``RetryPolicy`` refuse nonsense (0, negative, NaN, inf TTLs; negative or NaN
  deadlines, budgets, thresholds) with ``InvalidOptionError`` — a ``UserError`` (and, as before,
  a ``ValueError``) naming the field and its allowed range; the CLI says so with exit 2 and
  creates no run.
* ``run --run-id EXISTING --input NEW`` refuses a different input instead of resuming the old
  run with the old input; the same input (after validation, canonical JSON) or none resumes.
* An executor that cannot be made leaves no ``pending`` run behind.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import raysaga
from raysaga import RetryPolicy, RunOptions, UserError, Workflow
from raysaga.errors import RunNotFoundError
from raysaga.orchestrator.options import InvalidOptionError
from raysaga.state import Batch, RunStatus, RunUpdate, SqlStore

BAD_RUN_OPTIONS = [
    ("lease_ttl", 0), ("lease_ttl", -1), ("lease_ttl", math.nan), ("lease_ttl", math.inf), ("lease_ttl", 0.01),
    ("deadline", -5), ("deadline", 0), ("deadline", math.nan), ("deadline", math.inf),
    ("retry_budget", -1), ("retry_budget", 1.5), ("token_budget", -10), ("cost_budget", math.nan),
    ("cost_budget", -0.01), ("blob_threshold", -1), ("max_output_bytes", 0), ("lease_ttl", True),
]


@pytest.mark.parametrize(("name", "value"), BAD_RUN_OPTIONS, ids=[f"{n}={v}" for n, v in BAD_RUN_OPTIONS])
def test_run_options_refuse_nonsense_naming_the_field(name: str, value: Any) -> None:
    with pytest.raises(InvalidOptionError) as info:
        RunOptions(**{name: value})
    assert isinstance(info.value, UserError) and isinstance(info.value, ValueError)
    message = str(info.value)
    assert f"RunOptions.{name} must be" in message and repr(value) in message, message


@pytest.mark.parametrize(("name", "value"), [("max_attempts", 0), ("max_attempts", 2.5), ("base", math.nan),
                                             ("cap", math.inf), ("base", -1.0)])
def test_retry_policy_refuses_nonsense_as_a_user_error(name: str, value: Any) -> None:
    with pytest.raises(InvalidOptionError, match=rf"RetryPolicy\.{name} must be"):
        RetryPolicy(**{name: value})


def test_sensible_options_pass() -> None:
    RunOptions(lease_ttl=0.5, deadline=0.5, retry_budget=0, token_budget=0, cost_budget=0.0, blob_threshold=0)
    RunOptions(lease_ttl=3600, deadline=86400.0, retry_budget=10, cost_budget=2.5)
    RetryPolicy(max_attempts=1, base=0.0, cap=0.0)


def test_cli_refuses_a_zero_lease_ttl_and_creates_no_run(tmp_path: Path) -> None:
    flow = tmp_path / "tiny_flow.py"
    flow.write_text("from raysaga import Workflow\nwf = Workflow('tiny')\n\n@wf.step()\ndef one() -> int:\n"
                    "    return 1\n")
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    for ttl in ("0", "-1", "nan", "0.1"):
        done = subprocess.run([sys.executable, "-m", "raysaga", "run", f"{flow}:wf", "--db", db, "--run-id", "t",
                               "--executor", "inline", "--lease-ttl", ttl, "--quiet"], cwd=tmp_path,
                              capture_output=True, text=True, timeout=120, env=dict(os.environ))
        assert done.returncode == 2, done.stdout + done.stderr
        assert re.search(r"lease.ttl must be", done.stderr) and "Traceback" not in done.stderr, done.stderr
    store = SqlStore(db)
    try:
        with pytest.raises(RunNotFoundError):
            store.get_run("t")
    finally:
        store.close()


# ---------------------------------------------------------------------- run --run-id EXISTING --input NEW


def _counting_flow(calls: list[Any]) -> Workflow:
    wf = Workflow("runtime_input")

    @wf.step()
    def echo(input: dict[str, Any]) -> dict[str, Any]:
        calls.append(input)
        return input

    return wf


def test_existing_run_id_with_a_different_input_is_refused(store_url: str) -> None:
    calls: list[Any] = []
    wf = _counting_flow(calls)
    first = raysaga.run(wf, {"n": 1, "s": "a"}, store=store_url, run_id="same-id", executor="inline")
    assert first.status == RunStatus.COMPLETED and first.output == {"echo": {"n": 1, "s": "a"}}
    with pytest.raises(UserError, match="exists with a different input") as info:
        raysaga.run(wf, {"n": 2, "s": "a"}, store=store_url, run_id="same-id", executor="inline")
    assert "same-id" in str(info.value) and "--run-id" in str(info.value)
    # the same input (key order does not matter: canonical JSON) or none resumes the run
    again = raysaga.run(wf, {"s": "a", "n": 1}, store=store_url, run_id="same-id", executor="inline")
    assert again.status == RunStatus.COMPLETED and again.output == first.output
    assert raysaga.run(wf, store=store_url, run_id="same-id", executor="inline").output == first.output
    # None is JSON null, an input like any other (leaving `input` out, runner.NO_INPUT, resumes):
    # it used to mean "no input" and resumed a run whose stored input was not null
    with pytest.raises(UserError):
        raysaga.run(wf, None, store=store_url, run_id="same-id", executor="inline")
    assert calls == [{"n": 1, "s": "a"}], "the step ran once; nothing ran for the refused or resumed calls"


def test_an_executor_that_cannot_be_made_leaves_no_pending_run(store_url: str) -> None:
    wf = _counting_flow([])
    with pytest.raises(UserError, match="unknown executor"):
        raysaga.run(wf, {"n": 1}, store=store_url, run_id="no-executor", executor="nonesuch")
    store = SqlStore(store_url)
    try:
        with pytest.raises(RunNotFoundError):
            store.get_run("no-executor")
    finally:
        store.close()


# ---------------------------------------------------------------------- cancel of a rollback under way


def test_cancel_does_not_cut_a_rollback_half_way(store_url: str) -> None:
    wf = _counting_flow([])
    raysaga.create_run(wf, {"n": 1}, store=store_url, run_id="rolling")
    store = SqlStore(store_url)
    try:  # a driver started rolling back, then died (its lease released here, as if expired)
        lease = store.claim("rolling", "test-driver", 5.0)
        store.commit(lease, Batch(run=RunUpdate(status=RunStatus.RUNNING)))
        store.commit(lease, Batch(run=RunUpdate(status=RunStatus.COMPENSATING, status_reason="step failed")))
        store.release(lease)
        with pytest.raises(UserError, match="rolling back") as info:
            raysaga.cancel("rolling", store=store_url)
        assert "raysaga resume rolling" in str(info.value)
        assert store.get_run("rolling").status == RunStatus.COMPENSATING
        # with --compensate it is what the operator asks for: the rollback is finished
        done = raysaga.cancel("rolling", store=store_url, compensate=True, workflow=wf, executor="inline")
        assert done.status == RunStatus.COMPENSATED
    finally:
        store.close()


@pytest.mark.parametrize("bad", ["a\0b", "tab\there", "", "x" * 201])
def test_the_python_api_checks_run_ids_like_the_cli(bad: str, sqlite_url: str) -> None:
    # the rule lives in raysaga.types: a NUL reached PostgreSQL as a raw error from raysaga.run
    wf = raysaga.Workflow("ids")

    @wf.step()
    def only() -> int:
        return 1

    with pytest.raises(UserError, match="run-id"):
        raysaga.create_run(wf, store=sqlite_url, run_id=bad)

"""Stop 42, what the CLI tells an operator: ``raysaga approve`` of the first of a quorum's two
approvals said "a worker takes the run up now" while the run still waited for the second; and
``resume``/``cancel`` of a ``compensation_failed`` run suggested ``raysaga retry RUN``, which is
refused for such a run (``--compensations`` finishes its rollback)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import raysaga
from raysaga import Approval, Ask, Permanent, Workflow
from raysaga.state import RunStatus
from tests.support.cli import invoke

quorum = Workflow("quorum42", version="1")


@quorum.step()
def prep(input: dict[str, Any]) -> dict[str, int]:
    return {"amount": 5}


@quorum.approval(approvers=["alice", "bob", "carol"], quorum=2, timeout=3600)
def gate(prep: dict[str, int]) -> Ask:
    return Ask(prompt=f"pay {prep['amount']}?", payload=prep)


@quorum.step()
def act(gate: Approval) -> str:
    return "done"


def test_the_first_of_two_approvals_says_what_the_quorum_still_needs(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'q.db'}"
    assert raysaga.run(quorum, {}, store=db, run_id="q", executor="inline").status == RunStatus.WAITING_HUMAN
    code, out, err = invoke("approve", "q", "gate", "--by", "alice", "--db", db)
    assert code == 0, err
    assert "1 of 2 approvals so far (alice): it waits for 1 more of bob, carol" in out, out
    assert "takes the run up now" not in out
    code, out, err = invoke("approve", "q", "gate", "--by", "bob", "--db", db)
    assert code == 0, err
    assert "takes the run up now" in out and "approvals so far" not in out, out


undo = Workflow("undo42", version="1")


def refund(ctx: raysaga.StepContext, output: str) -> None:
    raise Permanent("the refund service refused")


@undo.step(effect=True, compensate=refund)
def charge() -> str:
    return "charged"


@undo.step()
def ship(charge: str) -> str:
    raise Permanent("shipping failed")


def test_a_compensation_failed_run_is_pointed_at_retry_compensations(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'u.db'}"
    record = raysaga.run(undo, {}, store=db, run_id="u", executor="inline")
    assert record.status == RunStatus.COMPENSATION_FAILED, record.status_reason
    for verb in ("resume", "cancel"):
        code, out, err = invoke(verb, "u", "--db", db, "--workflow", "tests.cli.test_views_cli_stop42:undo")
        assert "`raysaga retry u --compensations` finishes its rollback" in out + err, (verb, code, out, err)
        assert "`raysaga retry u` revives it" not in out + err

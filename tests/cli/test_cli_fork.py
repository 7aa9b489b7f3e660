"""``raysaga fork``, ``raysaga replay``, ``raysaga resume --allow-changed`` and the lineage in
``raysaga status`` (docs/fork.md), through the typer app in-process."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import raysaga
from examples.order import workflow as order
from raysaga.state import RunStatus, SqlStore
from raysaga.testing import CrashAt, SimulatedCrash, drive_inline
from tests.support.cli import invoke, one_line_error
from tests.support.services import FakeServices

ORDER = "examples.order.workflow:wf"


@pytest.fixture
def parent(sqlite_url: str) -> Iterator[tuple[str, Any]]:
    with FakeServices() as services:
        done = raysaga.run(order.wf, order.sample_input(services.url), store=sqlite_url, run_id="p",
                           executor="inline")
        assert done.status == RunStatus.COMPLETED
        services.reset()
        yield sqlite_url, services


def test_fork_then_status_shows_the_lineage(parent: tuple[str, Any]) -> None:
    db, services = parent
    code, out, err = invoke("fork", "p", "--from", "send_email", "--workflow", ORDER, "--run-id", "c",
                            "--executor", "inline", "--db", db)
    assert code == 0, out + err
    assert "forked p from send_email: run c is completed" in err
    assert "lineage: forked from p at send_email" in out
    assert "inherited from p" in out  # reserve_stock and charge_card rows
    assert sorted(services.log()["kinds"].values()) == ["email"]  # the charge was not called again
    store = SqlStore(db)
    try:
        assert store.get_run("c").workflow_ref == ORDER  # `raysaga resume c` finds the code it forked with
    finally:
        store.close()
    code, out, _ = invoke("status", "p", "--db", db)
    assert code == 0 and "lineage: forks: c (from send_email, completed)" in out
    code, out, _ = invoke("status", "c", "--db", db, "--json")
    doc = json.loads(out)
    assert (doc["parent_run_id"], doc["forked_from"]) == ("p", "send_email")
    inherited = {n["node"]: n["inherited_from"] for n in doc["nodes"]}
    assert inherited == {"reserve_stock": "p", "charge_card": "p", "send_email": None, "ship": None}
    effects = [(e["node"], e.get("inherited_from")) for e in doc["effects"]]
    assert effects == [("send_email", None), ("charge_card", "p")]
    code, out, _ = invoke("status", "c", "--db", db)
    assert "effects inherited (not executed again): charge_card (committed, p)" in out


def test_fork_errors_are_one_line_naming_the_fix(parent: tuple[str, Any], sqlite_url: str) -> None:
    db, _ = parent
    code, _, err = invoke("fork", "p", "--from", "shpi", "--workflow", ORDER, "--executor", "inline", "--db", db)
    one_line_error(code, err, "has no node 'shpi': the nodes there are: reserve_stock, charge_card, send_email, ship")
    code, _, err = invoke("fork", "p", "--from", "ship", "--workflow", ORDER, "--input-patch", "{nope",
                          "--executor", "inline", "--db", db)
    one_line_error(code, err, "--input-patch is not JSON")
    for patch, said in (('{"qty": 1, "qty": 100}', "the key 'qty' is given twice in one object"),
                        ('{"qty": 1e400}', "the number 1e400 is too large for a 64-bit float")):
        code, _, err = invoke("fork", "p", "--from", "ship", "--workflow", ORDER, "--input-patch", patch,
                              "--executor", "inline", "--db", db)
        one_line_error(code, err, said)  # (was: the last qty kept silently; "is inf", which nobody typed)
    raysaga.create_run(order.wf, order.sample_input("http://127.0.0.1:9"), store=db, run_id="live")
    code, _, err = invoke("fork", "live", "--from", "ship", "--workflow", ORDER, "--executor", "inline", "--db", db)
    one_line_error(code, err, "run 'live' is pending: only a run at rest")


def test_replay_reports_and_exits(parent: tuple[str, Any]) -> None:
    db, services = parent
    code, out, err = invoke("replay", "p", "--workflow", ORDER, "--db", db)
    assert code == 0, out + err
    assert "0 of 4 nodes differ" in out and "charge_card" in out and "ledger" in out
    code, out, _ = invoke("replay", "p", "--workflow", ORDER, "--db", db, "--json", "--until", "charge_card")
    assert code == 0 and [n["node"] for n in json.loads(out)["nodes"]] == ["reserve_stock", "charge_card"]
    assert services.log()["raw"] == {}


VERSIONED = textwrap.dedent('''
    from raysaga import RetryPolicy, Workflow

    wf = Workflow("versioned_cli")

    @wf.step()
    def first(input: int) -> int:
        return input + 1

    @wf.step(retry=RetryPolicy(max_attempts={attempts}))
    def second(first: int) -> int:
        return first * 10
''')


def test_resume_after_a_definition_change_needs_allow_changed(tmp_path: Path, sqlite_url: str) -> None:
    before, after = tmp_path / "before_flow.py", tmp_path / "after_flow.py"
    before.write_text(VERSIONED.format(attempts=3))
    after.write_text(VERSIONED.format(attempts=9))
    from raysaga.orchestrator.loader import load_workflow

    wf = load_workflow(f"{before}:wf")
    raysaga.create_run(wf, 1, store=sqlite_url, run_id="v")
    with pytest.raises(SimulatedCrash):
        drive_inline(wf, "v", store=sqlite_url, crash_at=CrashAt("after_commit", "first"))
    code, _, err = invoke("resume", "v", "--workflow", f"{after}:wf", "--executor", "inline", "--db", sqlite_url)
    one_line_error(code, err, "was started by another definition of workflow 'versioned_cli' (steps changed: second;")
    assert "--allow-changed" in err
    code, out, err = invoke("resume", "v", "--workflow", f"{after}:wf", "--executor", "inline", "--db", sqlite_url,
                            "--allow-changed")
    assert code == 0, out + err
    assert "completed" in out

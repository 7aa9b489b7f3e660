"""The operations CLI as the stop-39 review found it: ``launch``'s job lost a run whose id starts
with ``-`` and took a lease TTL its ``resume`` refuses; ``worker --config`` let its file override
``--executor`` and answered wrongly typed keys with Python errors; ``status --node`` did not show
the decision its docs (and the refusal of a late decision) promised."""

from __future__ import annotations

import json
import shlex
import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer

import raysaga
from raysaga import Approval, Ask, Workflow
from raysaga.orchestrator import cli_ops
from raysaga.orchestrator import launch as lx
from raysaga.orchestrator.cli import app
from raysaga.state import RunStatus, SqlStore
from tests.support.cli import invoke, one_line_error
from tests.support.ports import refused_port

gated = Workflow("ops39_cli_gated")


@gated.step()
def prep(input: dict[str, Any]) -> int:
    return 1


@gated.approval(approvers=["alice", "bob"], quorum=2)
def review(prep: int) -> Ask:
    return Ask(prompt="ship?", payload=prep)


@gated.step()
def ship(review: Approval) -> list[str]:
    return review.by


# ---------------------------------------------------------------- launch


def _resume_params(entrypoint: str) -> dict[str, Any]:
    """What ``raysaga resume`` would parse from a job's entrypoint (``python -m raysaga resume ...``)."""
    argv = shlex.split(entrypoint)
    assert argv[:3] == ["python", "-m", "raysaga"], argv
    group: Any = typer.main.get_command(app)  # (typer's own click: not ``click.Group``)
    parent = group.context_class(group, info_name="raysaga")
    resume = group.get_command(parent, argv[3])
    assert resume is not None
    params: dict[str, Any] = resume.make_context(argv[3], argv[4:], parent=parent).params
    return params


@pytest.mark.parametrize("run_id", ["--help", "-x", "run 1", "--lease-ttl"])
def test_the_jobs_resume_reads_any_run_id_as_the_run_id(run_id: str) -> None:
    params = _resume_params(lx.entrypoint(run_id, 15.0))
    assert params["run_id"] == run_id
    assert params["lease_ttl"] == 15.0 and params["quiet"] is True


def test_a_lease_ttl_resume_would_refuse_is_refused_before_the_cluster_is_asked(tmp_path: Path) -> None:
    code, _, err = invoke("launch", "nowhere:wf", "--address", f"http://127.0.0.1:{refused_port()}",
                          "--run-id", "L1", "--lease-ttl", "0.1", "--db", f"sqlite:///{tmp_path / 'l.db'}")
    one_line_error(code, err, "lease_ttl must be a finite number of seconds >= 0.5")
    assert not (tmp_path / "l.db").exists()


# ---------------------------------------------------------------- worker settings


def _config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "worker.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_the_executor_flag_wins_over_the_config_and_the_config_over_the_default(tmp_path: Path) -> None:
    config = _config(tmp_path, 'workflows = ["flows.py:wf"]\nexecutor = "inline"\n')
    assert cli_ops._worker_settings(config, None, None, None, "ray", None)["executor"] == "ray"
    assert cli_ops._worker_settings(config, None, None, None, None, None)["executor"] == "inline"
    assert cli_ops._worker_settings(None, ["flows.py:wf"], None, None, None, None)["executor"] == "ray"
    bogus = _config(tmp_path, 'workflows = ["flows.py:wf"]\nexecutor = "bogus"\n')
    assert cli_ops._worker_settings(bogus, None, None, None, "inline", None)["executor"] == "inline"


@pytest.mark.parametrize(("toml", "message"), [
    ('workflows = ["flows.py:wf"]\naddress = 5\n', "address must be a Ray address, a string"),
    ('workflows = "flows.py:wf"\n', 'workflows must be a list of "MODULE:WF" strings, got str'),
    ('workflows = ["flows.py:wf", 3]\n', 'workflows must be a list of "MODULE:WF" strings'),
    ('workflows = ["flows.py:wf"]\nlimits = [1, 2]\n', "limits must be a table of whole numbers"),
    ('workflows = ["flows.py:wf"]\nexecutor = 1\n', 'executor must be "ray" or "inline", got int 1'),
    ('workflows = ["flows.py:wf"]\nexecutor = "bogus"\n', "executor must be ray or inline, got 'bogus'"),
])
def test_a_wrongly_typed_config_key_is_one_line_naming_it(tmp_path: Path, toml: str, message: str) -> None:
    config = _config(tmp_path, toml)
    code, _, err = invoke("worker", "--config", str(config), "--db", f"sqlite:///{tmp_path / 'w.db'}")
    one_line_error(code, err, f"--config {config}: {message}")
    assert not (tmp_path / "w.db").exists()  # refused before the store is opened


def test_an_unknown_executor_flag_is_refused_before_the_store_is_opened(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'w.db'}"
    code, _, err = invoke("worker", "-w", "flows.py:wf", "--executor", "bogus", "--db", db)
    one_line_error(code, err, "--executor must be ray or inline, got 'bogus'")
    assert not (tmp_path / "w.db").exists()


# ---------------------------------------------------------------- status --node shows decisions


broken = Workflow("ops39_cli_broken_ask")


@broken.approval(approvers=["alice"])
def ask() -> Ask:
    raise ValueError("no prompt to show")


def test_an_approval_that_failed_to_ask_shows_no_attempt_number(sqlite_url: str) -> None:
    """An approval's failure event carries no attempt: ``status --node`` printed ``attempt ?``."""
    assert raysaga.run(broken, {}, store=sqlite_url, executor="inline", run_id="b1").status == RunStatus.FAILED
    code, out, _ = invoke("status", "b1", "--node", "ask", "--db", sqlite_url)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "ask: failed" and "?" not in lines[1]
    assert lines[1].startswith("  at ") and lines[1].endswith("ValueError: no prompt to show — failed for good")


def test_status_node_shows_who_decided_when_and_the_comment(sqlite_url: str) -> None:
    secret = "sk-ant-api03-" + "Q" * 40
    rested = raysaga.run(gated, {}, store=sqlite_url, executor="inline", run_id="g1")
    assert rested.status == RunStatus.WAITING_HUMAN
    store = SqlStore(sqlite_url)
    try:
        store.decide("g1", "review", "approve", by="alice", comment=f"fine, key {secret}", decision_id="click-1")
        store.decide("g1", "review", "approve", by="bob", comment="agreed")
    finally:
        store.close()
    done = raysaga.resume(gated, "g1", store=sqlite_url, executor="inline")
    assert done.status == RunStatus.COMPLETED

    code, out, _ = invoke("status", "g1", "--node", "review", "--db", sqlite_url)
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "review: completed"
    assert lines[1].startswith("  asked at ") and "approvers alice, bob, quorum 2" in lines[1]
    assert lines[2].startswith("  approve by alice at ")
    assert lines[2].endswith("(decision click-1): fine, key [redacted]")
    assert lines[3].startswith("  approve by bob at ") and lines[3].endswith(": agreed")
    assert secret not in out

    code, out, _ = invoke("status", "g1", "--node", "review", "--json", "--db", sqlite_url)
    assert code == 0, out
    [line] = out.splitlines()
    story = json.loads(line)
    assert (story["run_id"], story["node"], story["status"]) == ("g1", "review", "completed")
    first = story["decisions"][0]
    assert (first["verdict"], first["by"], first["comment"], first["decision_id"]) == \
        ("approve", "alice", "fine, key [redacted]", "click-1")
    assert [d["by"] for d in story["decisions"]] == ["alice", "bob"]
    assert all(isinstance(d["at"], float) for d in story["decisions"])
    assert story["requests"][0]["approvers"] == ["alice", "bob"] and story["requests"][0]["quorum"] == 2
    assert secret not in out


def test_a_late_decision_points_at_what_status_node_shows(sqlite_url: str) -> None:
    raysaga.run(gated, {}, store=sqlite_url, executor="inline", run_id="g2")
    store = SqlStore(sqlite_url)
    try:
        store.decide("g2", "review", "reject", by="alice", comment="no")
    finally:
        store.close()
    raysaga.resume(gated, "g2", store=sqlite_url, executor="inline")
    code, _, err = invoke("approve", "g2", "review", "--by", "bob", "--db", sqlite_url)
    one_line_error(code, err, "`raysaga status g2 --node review` shows who decided, when, and the comment")
    code, out, _ = invoke("status", "g2", "--node", "review", "--db", sqlite_url)
    assert code == 0, out
    assert "reject by alice at " in out and "): no" in out  # the decision, its id and comment


def test_the_config_files_address_wins_over_ray_address_in_the_environment(tmp_path: Path) -> None:
    """Stop 47: ``RAY_ADDRESS`` filled ``--address`` (typer's envvar), so a leftover one (a Ray job's)
    beat the file's ``address``, against "a flag over its key in the file over the default"."""
    flows = tmp_path / "flows_addr.py"
    flows.write_text("from raysaga import Workflow\nwf = Workflow('addr')\n\n@wf.step()\ndef a() -> int:\n"
                     "    return 1\n")
    config = _config(tmp_path, f'workflows = ["{flows}:wf"]\naddress = "not an address!"\n')
    assert cli_ops._worker_settings(config, None, None, None, None, None)["address"] == "not an address!"
    code, _, err = invoke("worker", "--config", str(config), "--db", f"sqlite:///{tmp_path / 'w.db'}",
                          env={"RAY_ADDRESS": "127.0.0.1:1"})
    assert code == 2 and "not an address!" in err and "127.0.0.1:1" not in err, err
    # the flag over the file; the environment when neither gives one
    assert cli_ops._worker_settings(config, None, None, None, None, "10.0.0.1:6390")["address"] == "10.0.0.1:6390"
    bare = _config(tmp_path, f'workflows = ["{flows}:wf"]\n')
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_ADDRESS", "127.0.0.1:1")
        assert cli_ops._worker_settings(bare, None, None, None, None, None)["address"] == "127.0.0.1:1"

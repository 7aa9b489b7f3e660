"""``raysaga list``: summary columns only, full run ids, human (UTC) times, keyset paging with a
next-page hint, filters, and a corrupt row shown as such while the others are listed."""

from __future__ import annotations

import json
import re
import shlex
import textwrap
import time
from pathlib import Path

import pytest
from sqlalchemy import update
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app
from raysaga.state import open_store
from raysaga.state.schema import runs

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    alpha = Workflow("alpha", version="1")
    beta = Workflow("beta", version="3")

    @alpha.step()
    def one() -> int:
        return 1

    @beta.step()
    def two() -> int:
        return 2
''')

LONG_ID = "order-2026-11-23-" + "0123456789abcdef" * 8  # 145 characters: shown whole, never cut


def invoke(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture
def filled(tmp_path: Path, store_url: str) -> tuple[str, list[str]]:
    """Seven runs (five alpha, two beta), created in a known order; their ids, newest first."""
    path = tmp_path / "list_flow.py"
    path.write_text(FLOW)
    tag = f"{time.time_ns()}"
    ids = []
    for i, (wf, run_id) in enumerate([("alpha", f"a{i}-{tag}") for i in range(4)] + [("beta", f"b-{tag}")]
                                     + [("alpha", LONG_ID + tag), ("beta", f"b2-{tag}")]):
        code, _, err = invoke("run", f"{path}:{wf}", "--db", store_url, "--executor", "inline", "--run-id", run_id)
        assert code == 0, err
        ids.append(run_id)
        del i
    store = open_store(store_url)
    try:  # distinct, ordered creation times (runs started within one clock tick would tie)
        with store.engine.begin() as conn:
            for n, run_id in enumerate(ids):
                conn.execute(update(runs).where(runs.c.run_id == run_id).values(created_at=1_700_000_000.0 + n))
    finally:
        store.close()
    return store_url, list(reversed(ids))


def test_list_shows_full_ids_and_utc_times(filled: tuple[str, list[str]]) -> None:
    url, ids = filled
    code, out, err = invoke("list", "--db", url, "--limit", "1000")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["run", "workflow", "status", "created", "(UTC)", "updated", "(UTC)", "reason"]
    mine = [line for line in lines if line.split()[0] in ids]
    assert [line.split()[0] for line in mine] == ids  # full ids, newest first
    assert any(line.startswith(LONG_ID) for line in mine)
    assert "2023-11-14 22:13:26" in out  # created_at 1_700_000_006 as a UTC time
    assert not re.search(r"\b1700000\d{3}(\.\d+)?\b", out)  # never an epoch float


def test_list_pages_with_before_and_prints_the_next_page_hint(filled: tuple[str, list[str]]) -> None:
    url, ids = filled
    seen: list[str] = []
    argv = ["list", "--db", url, "--limit", "3"]
    for _ in range(1000):
        code, out, err = invoke(*argv)
        assert code == 0, err
        rows = [line.split()[0] for line in out.splitlines()[1:] if not line.startswith("more:")]
        seen += [r for r in rows if r in ids]
        hint = [line for line in out.splitlines() if line.startswith("more: raysaga list --before ")]
        if not hint:
            break
        assert "--limit 3" in hint[0] and hint[0].endswith(f"--db {shlex.quote(url)}")
        # the hint is a shell command line (a run id is shell-quoted: ``'a]b[/c-1'``): split as a shell would;
        # pasted as it is, it lists the same store (it dropped --db: the paste listed the default store)
        argv = ["list", *shlex.split(hint[0].removeprefix("more: raysaga list "))]
    assert seen == ids


def test_the_next_page_hint_never_prints_a_password() -> None:
    from raysaga.orchestrator.cli_store import db_option

    assert db_option("postgresql://ada:s3cret@db.example/runs") == "--db ..."
    assert db_option("postgresql://ada@db.example/runs") == "--db postgresql://ada@db.example/runs"
    assert db_option("runs/my store.db") == "--db 'runs/my store.db'"
    assert db_option(None) == ""


def test_list_filters_by_workflow_and_status(filled: tuple[str, list[str]]) -> None:
    url, ids = filled
    code, out, _ = invoke("list", "--db", url, "--workflow", "beta", "--json", "--limit", "1000")
    assert code == 0
    rows = json.loads(out)
    mine = [r for r in rows if r["run_id"] in ids]
    assert [r["run_id"] for r in mine] == [i for i in ids if i.startswith("b")]
    assert {r["workflow"] for r in rows} == {"beta"}
    assert {"run_id", "workflow", "status", "created_at", "updated_at", "reason", "corrupt"} <= set(rows[0])
    code, out, _ = invoke("list", "--db", url, "--status", "completed", "--workflow", "alpha", "--json")
    assert {r["status"] for r in json.loads(out)} == {"completed"}


def test_a_corrupt_row_is_shown_and_the_others_listed(filled: tuple[str, list[str]]) -> None:
    url, ids = filled
    store = open_store(url)
    try:
        with store.engine.begin() as conn:
            conn.execute(update(runs).where(runs.c.run_id == ids[2]).values(status="exploded"))
    finally:
        store.close()
    code, out, err = invoke("list", "--db", url, "--limit", "1000")
    assert code == 0, err
    mine = {line.split()[0]: line for line in out.splitlines() if line.split()[0] in ids}
    assert set(mine) == set(ids)
    assert "corrupt: " in mine[ids[2]] and "'exploded'" in mine[ids[2]]
    code, out, _ = invoke("list", "--db", url, "--json", "--limit", "1000")
    bad = next(r for r in json.loads(out) if r["run_id"] == ids[2])
    assert "'exploded'" in bad["corrupt"] and bad["status"] is None

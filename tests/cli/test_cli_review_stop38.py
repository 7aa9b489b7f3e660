"""Fixes from the stop-38 review of the CLI, each through the real CLI on a real SQLite file:
a workflow file named like a module (``json.py``) replaced that module for the whole process;
``str.isdigit`` took '²' and '٣'; a fork's bad ``--input-patch`` printed pydantic's raw error list
with the whole value; an approval answer that fit JSON Schema's "integer" (1.0) or carried a key
the model does not know reached the step; ``cancel --reason`` and ``Client`` ``by=`` unchecked."""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

import raysaga
from raysaga import Client, InvalidInputError, UserError
from raysaga.orchestrator.loader import load_workflow
from raysaga.state import RunStatus, open_store
from tests.support.cli import invoke, one_line_error

STEP = textwrap.dedent('''
    from raysaga import Workflow
    wf = Workflow("shadow38", version="1")

    @wf.step()
    def a(input: dict) -> dict:
        return {"v": input}
''')

ORDER = textwrap.dedent('''
    from pydantic import BaseModel
    from raysaga import Approval, Ask, Workflow

    wf = Workflow("order38", version="1")

    class Order(BaseModel):
        sku: str
        qty: int

    @wf.step()
    def take(input: Order) -> int:
        return input.qty

    class Edit(BaseModel):
        amount: int
        note: str = ""

    gate = Workflow("gate38", version="1")

    @gate.step()
    def look(input: dict) -> dict:
        return {"amount": 5}

    @gate.approval(approvers=["alice", "bob"], quorum=2, answer=Edit)
    def review(look: dict) -> Ask:
        return Ask(prompt="ok?", payload=look)

    @gate.step()
    def done(review: Approval) -> dict:
        return {"answer": review.answer, "by": review.by}
''')


@pytest.fixture
def order_flow(tmp_path: Path) -> str:
    path = tmp_path / "order38_flow.py"
    path.write_text(ORDER)
    return str(path)


# ------------------------------------------------------------------ 1: a file named like a module


@pytest.mark.parametrize("name", ["json.py", "types.py", "sub/typing.py", "pydantic.py"])
def test_a_workflow_file_named_like_a_module_is_refused_naming_the_file(tmp_path: Path, sqlite_url: str,
                                                                        name: str) -> None:
    """``raysaga run json.py:wf`` registered the file as module ``json`` for the whole process:
    ``AttributeError: module 'json' has no attribute 'dumps'``, naming no file. It is refused,
    naming the file and asking for a rename, and ``json`` (or ``pydantic``) is still itself."""
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STEP)
    real = sys.modules.get(path.stem)
    code, _, err = invoke("run", f"{path}:wf", "--input", "{}", "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, "rename it")
    assert name in err and f"module {path.stem!r}" in err
    assert sys.modules.get(path.stem) is real
    assert json.dumps({"ok": 1}) == '{"ok": 1}'


def test_a_sibling_module_imports_first(tmp_path: Path, sqlite_url: str) -> None:
    """The file's folder comes first on ``sys.path``, as a script's does: its sibling module is the
    one it imports (only the workflow file's own name is checked: it is registered for the process)."""
    folder = tmp_path / "flows38"
    folder.mkdir()
    (folder / "helper38.py").write_text("LABEL = 'from-helper'\n")
    (folder / "sibling38_flow.py").write_text(STEP.replace('{"v": input}', '{"v": helper38.LABEL}')
                                              .replace("from raysaga import Workflow",
                                                       "import helper38\nfrom raysaga import Workflow"))
    code, out, err = invoke("run", f"{folder / 'sibling38_flow.py'}:wf", "--input", "{}", "--db", sqlite_url,
                            "--executor", "inline", "--json")
    assert code == 0, err
    assert json.loads(out)["output"] == {"a": {"v": "from-helper"}}


def test_a_worker_refuses_two_workflow_files_of_one_name(tmp_path: Path) -> None:
    """Ray's workers import a step by its module's name: two ``flows38.py`` were one module."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "twin38.py").write_text(STEP)
    (tmp_path / "a-file").write_text("")
    no_store = f"sqlite:///{tmp_path / 'a-file' / 'raysaga.db'}"  # without the check: an error, not a worker
    code, _, err = invoke("worker", "-w", f"{tmp_path / 'a' / 'twin38.py'}:wf", "-w",
                          f"{tmp_path / 'b' / 'twin38.py'}:wf", "--db", no_store, "--executor", "inline")
    one_line_error(code, err, "would both be imported as module 'twin38': rename one of them")


# ------------------------------------------------------------------ 2: ASCII digits only


@pytest.mark.parametrize("node", ["review[²]", "review[٣]", "review[99999999999]"])
def test_an_approval_index_is_ascii_digits(sqlite_url: str, node: str) -> None:
    """'²' passed ``isdigit`` and ``int`` raised a bare ValueError; '٣' was read as item 3."""
    code, _, err = invoke("approve", "some-run", node, "--by", "alice", "--db", sqlite_url)
    one_line_error(code, err, f"NODE {node!r}: a fan-out item is NAME[N]")
    assert "ASCII digits" in err


def test_worker_limit_page_size_and_duration_take_ascii_digits_only(tmp_path: Path, sqlite_url: str) -> None:
    code, _, err = invoke("worker", "-w", "tests.support.fleet_flows:short", "--limit", "short=²",
                          "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, "--limit 'short=²': write WORKFLOW=N, N a whole number in ASCII digits")
    db = tmp_path / "paged.db"
    code, _, err = invoke("db", "upgrade", "--db", f"sqlite:///{db}", env={"RAYSAGA_SQLITE_PAGE_SIZE": "²"})
    one_line_error(code, err, "RAYSAGA_SQLITE_PAGE_SIZE='²' is not a SQLite page size")
    assert not db.exists()
    code, _, err = invoke("prune", "--older-than", "٣d", "--db", sqlite_url)
    one_line_error(code, err, "--older-than '٣d' is not a duration")


# ------------------------------------------------------------------ 3: a short, bounded input mismatch


def test_a_fork_patch_that_breaks_the_input_is_one_short_line(order_flow: str, sqlite_url: str) -> None:
    """The fork printed pydantic's error list, the 100 KB value whole, on one line."""
    code, _, err = invoke("run", f"{order_flow}:wf", "--input", '{"sku": "a", "qty": 1}', "--run-id", "m1",
                          "--db", sqlite_url, "--executor", "inline", "--quiet")
    assert code == 0, err
    patch = json.dumps({"qty": "x" * 100_000, "sku": 5})
    code, _, err = invoke("fork", "m1", "--from", "take", "--input-patch", patch, "--db", sqlite_url,
                          "--workflow", f"{order_flow}:wf", "--executor", "inline")
    one_line_error(code, err, "input does not match Order of workflow 'order38': ")
    assert "qty: Input should be a valid integer" in err and "sku: Input should be a valid string (got 5)" in err
    assert len(err) < 600 and "{'type'" not in err


def test_the_python_api_names_the_mismatch_the_same_short_way(order_flow: str, sqlite_url: str) -> None:
    wf = load_workflow(f"{order_flow}:wf")
    bad = {"sku": "y" * 50_000, "qty": ["z" * 50_000] * 40, **{f"k{i}": i for i in range(100)}}
    with pytest.raises(InvalidInputError) as info:
        raysaga.run(wf, {"sku": 1, "qty": "q" * 100_000}, store=sqlite_url, executor="inline")
    message = str(info.value)
    assert message.startswith("input does not match Order of workflow 'order38': ")
    assert "qty: Input should be a valid integer" in message and len(message) < 600
    assert "{'type'" not in message
    with pytest.raises(InvalidInputError) as info:
        wf.check_input([bad] * 50)
    assert len(str(info.value)) < 600


# ------------------------------------------------------------------ 4: approval answers


def test_an_answer_is_refused_unless_it_fits_the_model_and_earlier_approvals_stand(order_flow: str,
                                                                                   sqlite_url: str) -> None:
    """``amount: int`` took 1.0 and -0.0 (JSON Schema's "integer") and the step got the float; an
    unknown key passed through. Each is refused (exit 2) and changes nothing: alice's approval,
    recorded before, still counts towards the quorum, and the step gets the int."""
    code, _, err = invoke("run", f"{order_flow}:gate", "--input", "{}", "--run-id", "g1", "--db", sqlite_url,
                          "--executor", "inline", "--quiet")
    assert code == 1, err
    code, _, err = invoke("approve", "g1", "review", "--by", "alice", "--answer", '{"amount": 7}',
                          "--db", sqlite_url)
    assert code == 0, err
    refused = {'{"amount": 1.0}': "1.0 is not of type 'integer' (a whole number is written without a fraction",
               '{"amount": -0.0}': "-0.0 is not of type 'integer'",
               '{"amount": 1.5}': "1.5 is not of type 'integer'",
               '{"amount": 1, "extra": 1}': "('extra' was unexpected)",
               '{"amount": 7, "amout": 1}': "('amout' was unexpected)",
               '{}': "'amount' is a required property"}
    for answer, why in refused.items():
        code, _, err = invoke("approve", "g1", "review", "--by", "bob", "--answer", answer, "--db", sqlite_url)
        one_line_error(code, err, why)
    code, _, err = invoke("approve", "g1", "review", "--by", "bob", "--answer", '{"amount": 8}', "--db", sqlite_url)
    assert code == 0, err
    code, out, err = invoke("resume", "g1", "--db", sqlite_url, "--workflow", f"{order_flow}:gate",
                            "--executor", "inline", "--json")
    assert code == 0, err
    done = json.loads(out)["output"]["done"]
    assert done == {"answer": {"amount": 8}, "by": ["alice", "bob"]}
    assert type(done["answer"]["amount"]) is int


def test_a_store_only_schema_takes_whole_integers_only(order_flow: str, sqlite_url: str) -> None:
    """The store checks an answer against the schema its row keeps, with no model: "integer" is a
    JSON integer there too (the Python API, as the CLI)."""
    wf = load_workflow(f"{order_flow}:gate")
    rested = raysaga.run(wf, {}, store=sqlite_url, run_id="g2", executor="inline")
    assert rested.status == RunStatus.WAITING_HUMAN
    client = Client(sqlite_url)
    try:
        with pytest.raises(UserError, match="not of type 'integer'"):
            client.approve("g2", "review", by="alice", answer={"amount": 2.0})
        assert client.approve("g2", "review", by="alice", answer={"amount": 2}).answer == {"amount": 2}
    finally:
        client.close()


# ------------------------------------------------------------------ 5: cancel --reason, by=


def test_cancel_reason_is_bounded_and_client_by_is_checked(order_flow: str, sqlite_url: str) -> None:
    wf = load_workflow(f"{order_flow}:gate")
    raysaga.run(wf, {}, store=sqlite_url, run_id="g3", executor="inline")
    code, _, err = invoke("cancel", "g3", "--reason", "r" * 10_001, "--db", sqlite_url, "--executor", "inline")
    one_line_error(code, err, "--reason is 10,001 characters: at most 10,000")
    client = Client(sqlite_url)
    try:
        calls: list[Callable[[], object]] = [lambda: client.pause("g3", by="a\x00b"),
                                             lambda: client.cancel("g3", by="\x1b[2J"),
                                             lambda: client.cancel("g3", reason="r" * 10_001)]
        for call in calls:
            with pytest.raises(UserError, match=r"by \(who acts\)|reason must be"):
                call()
    finally:
        client.close()
    store = open_store(sqlite_url)
    try:
        assert store.get_run("g3").status == RunStatus.WAITING_HUMAN
    finally:
        store.close()
    code, _, err = invoke("cancel", "g3", "--reason", "r" * 10_000, "--db", sqlite_url, "--executor", "inline")
    assert code == 0, err

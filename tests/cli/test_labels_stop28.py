"""Run labels on the command line: ``run``/``submit --label KEY=VALUE`` store them, ``status``
shows them (and ``--json``), ``list --label`` (repeatable, all must match) finds runs by them;
a bad ``--label`` is refused naming it, before any store is opened or written."""

from __future__ import annotations

import json
import textwrap
import uuid
from pathlib import Path

import pytest
from sqlalchemy import text

from raysaga import Client, RunOptions
from raysaga.state import open_store
from tests.support.cli import invoke, one_line_error

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("labelled", version="1")

    @wf.step()
    def one() -> int:
        return 1
''')


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "labels_flow_stop28.py"
    path.write_text(FLOW)
    return f"{path}:wf"


def _listed(url: str, *labels: str) -> list[str]:
    args = [a for pair in labels for a in ("--label", pair)]
    code, out, err = invoke("list", "--db", url, "--json", "--limit", "1000", *args)
    assert code == 0, err
    return sorted(r["run_id"] for r in json.loads(out))


def test_run_stores_labels_status_shows_them_list_finds_them(flow: str, store_url: str) -> None:
    tag = uuid.uuid4().hex[:10]
    for name, labels in (("a", ["team=billing", "env=prod"]), ("b", ["team=billing", "env=staging"]),
                         ("c", ["team=search", "env=prod"]), ("d", [])):
        code, _, err = invoke("run", flow, "--db", store_url, "--executor", "inline", "--run-id", f"{tag}-{name}",
                              "--quiet", "--label", f"t={tag}", *[a for p in labels for a in ("--label", p)])
        assert code == 0, err
    code, out, err = invoke("status", f"{tag}-a", "--db", store_url)
    assert code == 0, err
    assert f"labels: env=prod, t={tag}, team=billing" in out
    code, out, err = invoke("status", f"{tag}-d", "--db", store_url)
    assert code == 0 and f"labels: t={tag}\n" in out
    code, out, err = invoke("status", f"{tag}-a", "--db", store_url, "--json")
    assert code == 0, err
    assert json.loads(out)["labels"] == {"team": "billing", "env": "prod", "t": tag}
    assert _listed(store_url, f"t={tag}") == [f"{tag}-{n}" for n in "abcd"]
    assert _listed(store_url, f"t={tag}", "team=billing") == [f"{tag}-a", f"{tag}-b"]
    assert _listed(store_url, f"t={tag}", "team=billing", "env=prod") == [f"{tag}-a"]
    assert _listed(store_url, f"t={tag}", "team=nobody") == []
    code, out, err = invoke("list", "--db", store_url, "--label", f"t={tag}", "--label", "team=nobody")
    assert code == 0 and f"no runs labelled t={tag}, team=nobody in" in out
    code, out, err = invoke("list", "--db", store_url, "--label", f"t={tag}", "--limit", "1")
    hint = [line for line in out.splitlines() if line.startswith("more: ")]
    assert hint and f"--label t={tag}" in hint[0]


def test_submit_and_the_client_store_labels(flow: str, store_url: str) -> None:
    tag = uuid.uuid4().hex[:10]
    code, out, err = invoke("submit", flow, "--db", store_url, "--label", f"t={tag}", "--label", "via=cli")
    assert code == 0, err
    from raysaga.orchestrator.loader import load_workflow

    with Client(store_url) as client:
        run = client.submit(load_workflow(flow), options=RunOptions(labels={"t": tag, "via": "client"}))
        assert client.get_run(run.run_id).labels == {"t": tag, "via": "client"}
        assert client.get_run(out.strip()).labels == {"t": tag, "via": "cli"}
    assert _listed(store_url, f"t={tag}", "via=cli") == [out.strip()]


@pytest.mark.parametrize(("label", "says"), [
    ("team", "--label 'team' is not KEY=VALUE"),
    ("=billing", "1 to 100 printable characters"),
    ("team=" + "v" * 501, "0 to 500 printable characters"),
    ("team=a\tb", "printable"),
])
def test_a_bad_label_is_refused_before_any_store_is_touched(flow: str, tmp_path: Path, label: str,
                                                           says: str) -> None:
    db = tmp_path / "never" / "raysaga.db"
    for argv in (["run", flow, "--executor", "inline"], ["submit", flow], ["list"]):
        code, _, err = invoke(*argv, "--db", f"sqlite:///{db}", "--label", label)
        one_line_error(code, err, says)
        assert "--label" in err
    assert not db.parent.exists()


def test_status_of_a_run_without_labels_shows_no_labels_line(flow: str, sqlite_url: str) -> None:
    code, _, err = invoke("run", flow, "--db", sqlite_url, "--executor", "inline", "--run-id", "bare", "--quiet")
    assert code == 0, err
    code, out, _ = invoke("status", "bare", "--db", sqlite_url)
    assert code == 0 and "labels" not in out
    code, out, _ = invoke("status", "bare", "--db", sqlite_url, "--json")
    assert json.loads(out)["labels"] == {}


def test_a_label_given_twice_is_refused(flow: str, tmp_path: Path) -> None:
    code, _, err = invoke("run", flow, "--db", f"sqlite:///{tmp_path / 'x.db'}", "--executor", "inline",
                          "--label", "team=a", "--label", "team=b")
    one_line_error(code, err, "--label 'team' is given twice ('a' and 'b')")
    store = open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        assert store.list_runs() == []
    finally:
        store.close()


def test_list_json_shows_each_runs_labels_and_survives_a_damaged_one(flow: str, store_url: str) -> None:
    tag = uuid.uuid4().hex[:10]
    for name, extra in (("a", ["--label", "team=billing"]), ("b", []), ("c", ["--label", "team=search"])):
        code, _, err = invoke("run", flow, "--db", store_url, "--executor", "inline", "--run-id", f"{tag}-{name}",
                              "--quiet", *extra)
        assert code == 0, err
    store = open_store(store_url)
    try:
        with store.engine.begin() as conn:  # written by hand, as no raysaga writes it
            conn.execute(text("UPDATE raysaga_runs SET labels = '[1, 2]' WHERE run_id = :r"), {"r": f"{tag}-c"})
    finally:
        store.close()
    code, out, err = invoke("list", "--db", store_url, "--json", "--limit", "1000")
    assert code == 0, err
    shown = {r["run_id"]: r["labels"] for r in json.loads(out) if r["run_id"].startswith(tag)}
    assert shown == {f"{tag}-a": {"team": "billing"}, f"{tag}-b": {}, f"{tag}-c": {}}

"""``raysaga run`` and ``raysaga submit`` refuse a label holding a secret before they open the store
or start Ray (``cli_input.run_labels``, as ``launch`` does): it was refused only at the run's
insert, after the store had been created and migrated and, for ``run --executor ray``, Ray started.
Checked by the store the command was pointed at: its file must not exist afterwards."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.cli import invoke, one_line_error, project_folder

MODULE = "secret_labels_early_stop32_flow"
FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("secret_labels_early_stop32")

    @wf.step()
    def only() -> int:
        return 1
''')
SECRET_LABEL = "token=sk-ant-api03-abcdefghijklmnop"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return project_folder(tmp_path, monkeypatch, MODULE, FLOW)


@pytest.mark.parametrize("command", [("run", "--executor", "inline"), ("run", "--executor", "ray"), ("submit",)])
def test_a_secret_label_is_refused_before_the_store_is_opened(project: Path, command: tuple[str, ...]) -> None:
    db = project / "runs.db"
    code, out, err = invoke(*command, f"{MODULE}:wf", "--db", str(db), "--label", SECRET_LABEL)
    one_line_error(code, err, "holds what looks like a secret")
    assert "sk-ant-api03" not in err and out == ""
    assert not db.exists(), "the store was opened (created and migrated) for a run that could not be recorded"


def test_a_plain_label_still_records_the_run(project: Path) -> None:
    db = project / "runs.db"
    code, out, err = invoke("submit", f"{MODULE}:wf", "--db", str(db), "--label", "team=search")
    assert code == 0, err
    assert db.exists() and out.strip()

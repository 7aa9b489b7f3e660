"""A folder that shadows a module in Ray's workers: the executor puts the workflow's folder (and
the current one) first on the workers' ``PYTHONPATH``, so a ``raysaga.py`` or a ``pydantic/``
beside the workflow was what every worker imported for ``raysaga`` or ``pydantic``: each step
failed with Ray's "The remote function failed to import on the worker", naming no file (found
by hand in stop 39). The load is refused at once, naming the file, before anything runs."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from raysaga.state import open_store
from tests.support.cli import invoke, one_line_error

STEP = textwrap.dedent('''
    from raysaga import Workflow
    wf = Workflow("shadow39", version="1")

    @wf.step()
    def a(input: dict) -> dict:
        return {"v": input}
''')


@pytest.mark.parametrize("sibling", ["raysaga.py", "pydantic/__init__.py"])
def test_a_sibling_named_like_an_imported_module_is_refused_naming_it(tmp_path: Path, sqlite_url: str,
                                                                      sibling: str) -> None:
    folder = tmp_path / "flows39"
    (folder / sibling).parent.mkdir(parents=True, exist_ok=True)
    (folder / sibling).write_text("x = 1\n")
    (folder / "shadow39_flow.py").write_text(STEP)
    code, _, err = invoke("run", f"{folder / 'shadow39_flow.py'}:wf", "--input", "{}", "--db", sqlite_url,
                          "--executor", "inline")
    one_line_error(code, err, "rename it")
    name = sibling.partition("/")[0]
    assert str(folder / name) in err and f"module {name.removesuffix('.py')!r}" in err
    store = open_store(sqlite_url, create=True)
    try:
        assert store.list_runs() == []  # refused before any run was recorded
    finally:
        store.close()


def test_siblings_of_their_own_names_still_load(tmp_path: Path, sqlite_url: str) -> None:
    """Only names this process imported from elsewhere are refused: a ``helpers39.py`` (or a data
    folder, or a file that is no module) beside the workflow is fine."""
    folder = tmp_path / "flows39"
    folder.mkdir()
    (folder / "helpers39.py").write_text("x = 1\n")
    (folder / "data").mkdir()
    (folder / "notes-39.py").write_text("not a module name\n")
    (folder / "shadow39_flow.py").write_text(STEP)
    code, out, err = invoke("run", f"{folder / 'shadow39_flow.py'}:wf", "--input", "{}", "--db", sqlite_url,
                            "--executor", "inline")
    assert code == 0, err
    assert 'output: {"a": {"v": {}}}' in out, out

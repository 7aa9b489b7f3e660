"""Third adversarial round, ``raysaga fork --input-patch``: NaN and Infinity.

``--input`` is strict JSON (``NaN is not JSON``), but ``--input-patch`` was read with Python's
``json.loads``, which takes ``NaN``, ``Infinity`` and ``-Infinity``: the fork was recorded and
driven with the value turned into ``null`` (``{"x": NaN}`` -> input ``{"x": null}``), the
operator's patch silently changed. Now it is refused, one line, and no fork is recorded.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import raysaga
from raysaga.state import RunStatus, SqlStore
from tests.support.cli import invoke, one_line_error

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("stop28_patch")

    @wf.step()
    def first(input: dict) -> dict:
        return input

    @wf.step()
    def second(first: dict) -> str:
        return "done"
''')


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_an_input_patch_holding_nan_is_refused_not_stored_as_null(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   constant: str) -> None:
    (tmp_path / "stop28_patch_flow.py").write_text(FLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    from stop28_patch_flow import wf  # type: ignore[import-not-found]

    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    assert raysaga.run(wf, {"x": 1}, store=db, run_id="p", executor="inline").status == RunStatus.COMPLETED
    code, _, err = invoke("fork", "p", "--from", "second", "--input-patch", f'{{"x": {constant}}}',
                          "--workflow", "stop28_patch_flow:wf", "--executor", "inline", "--db", db)
    one_line_error(code, err, f"--input-patch is not JSON ({constant} is not JSON)")
    store = SqlStore(db)
    try:
        assert [r.run_id for r in store.list_runs()] == ["p"]  # no fork recorded
    finally:
        store.close()

"""``raysaga fork --input-patch`` with a key the run's input type does not declare (stop 51).

A new run's input with a misspelt key is refused (stop 49), but a fork's patched input was read
as a stored one, with no key refused: ``--input-patch '{"amout": 5}'`` was dropped by pydantic and
the fork ran, recorded as patched, on its parent's amount. The keys the patch brings are now
checked; the keys the parent's stored input holds (a computed field) are not the patch's.

Real inline runs on a real SQLite file; the CLI through typer's runner.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

import raysaga
from raysaga.errors import InvalidInputError
from raysaga.state import RunStatus, SqlStore
from tests.support.cli import invoke, one_line_error

FLOW = textwrap.dedent('''
    from pydantic import BaseModel, computed_field

    from raysaga import Workflow

    class Line(BaseModel):
        sku: str
        qty: int = 1

    class Charge(BaseModel):
        amount: int
        lines: list[Line] = []

        @computed_field
        @property
        def label(self) -> str:
            return f"charge-{self.amount}"

    wf = Workflow("stop51_patch_keys")

    @wf.step()
    def price(input: Charge) -> int:
        return input.amount + sum(line.qty for line in input.lines)

    @wf.step()
    def done(price: int) -> int:
        return price
''')


@pytest.fixture
def flow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[object, str]:
    (tmp_path / "stop51_patch_flow.py").write_text(FLOW)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    from stop51_patch_flow import wf  # type: ignore[import-not-found]

    db = f"sqlite:///{tmp_path / 'raysaga.db'}"
    parent = raysaga.run(wf, {"amount": 3, "lines": [{"sku": "a"}]}, store=db, run_id="p", executor="inline")
    assert parent.status == RunStatus.COMPLETED and parent.input["label"] == "charge-3"
    return wf, db


def _runs(db: str) -> list[str]:
    store = SqlStore(db)
    try:
        return sorted(r.run_id for r in store.list_runs())
    finally:
        store.close()


def test_a_misspelt_patch_key_is_refused_naming_the_field_and_no_fork_is_recorded(flow: tuple[object, str]) -> None:
    _, db = flow
    code, _, err = invoke("fork", "p", "--from", "price", "--input-patch", '{"amout": 5}',
                          "--workflow", "stop51_patch_flow:wf", "--executor", "inline", "--db", db)
    one_line_error(code, err, "unknown key 'amout' (did you mean 'amount'?)")
    assert "input patch" in err
    assert _runs(db) == ["p"]


def test_a_misspelt_key_inside_a_patched_list_is_refused(flow: tuple[object, str]) -> None:
    wf, db = flow
    with pytest.raises(InvalidInputError, match=r"lines\.0: unknown key 'qyt' \(did you mean 'qty'\?\)"):
        raysaga.fork(wf, "p", from_node="price", store=db, new_run_id="f", executor="inline",  # type: ignore[arg-type]
                     input_patch={"lines": [{"sku": "a", "qyt": 4}]})
    assert _runs(db) == ["p"]


def test_a_good_patch_forks_with_the_parents_computed_field_in_its_input(flow: tuple[object, str]) -> None:
    wf, db = flow
    fork = raysaga.fork(wf, "p", from_node="price", store=db, new_run_id="f", executor="inline",  # type: ignore[arg-type]
                        input_patch={"amount": 5, "lines": [{"sku": "a", "qty": 4}]})
    assert fork.status == RunStatus.COMPLETED and fork.output == {"done": 9}, fork.output

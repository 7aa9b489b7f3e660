"""``raysaga worker --max-driver-deaths N``: the fleet's crash-loop limit, checked before any store
is opened. Real worker processes parking a pill after N deaths are in
``tests/fleet/test_crash_neighbours_stop30.py``."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from raysaga.errors import UserError
from raysaga.orchestrator.worker import checked_max_driver_deaths
from tests.support.cli import invoke, one_line_error

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("deaths_stop30")

    @wf.step()
    def one() -> int:
        return 1
''')


@pytest.mark.parametrize("value", ["0", "-1", "-1000000"])
def test_a_limit_below_one_is_refused_naming_the_flag(tmp_path: Path, value: str) -> None:
    flow = tmp_path / "deaths_flow_stop30.py"
    flow.write_text(FLOW)
    db = tmp_path / "never" / "raysaga.db"
    code, _, err = invoke("worker", "-w", f"{flow}:wf", "--db", f"sqlite:///{db}", "--executor", "inline",
                          "--max-driver-deaths", value)
    one_line_error(code, err, "--max-driver-deaths must be a whole number >= 1")
    assert f"got {int(value)}" in err
    assert not db.parent.exists()  # refused before the store was opened


@pytest.mark.parametrize("value", ["two", "1.5", ""])
def test_a_limit_that_is_no_whole_number_is_refused_naming_the_flag(tmp_path: Path, value: str) -> None:
    flow = tmp_path / "deaths_flow_stop30.py"
    flow.write_text(FLOW)
    code, _, err = invoke("worker", "-w", f"{flow}:wf", "--db", f"sqlite:///{tmp_path / 'x.db'}",
                          "--max-driver-deaths", value)
    assert code == 2 and "--max-driver-deaths" in err and "Traceback" not in err, err


@pytest.mark.parametrize("value", [0, -3, True, 2.0, "3", None])
def test_the_check_refuses_what_is_no_count(value: object) -> None:
    with pytest.raises(UserError, match=r"--max-driver-deaths must be a whole number >= 1 .*, got "):
        checked_max_driver_deaths(value)


def test_the_check_takes_a_count() -> None:
    assert checked_max_driver_deaths(1) == 1 and checked_max_driver_deaths(10**9) == 10**9

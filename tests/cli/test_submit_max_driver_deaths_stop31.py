"""``raysaga submit --max-driver-deaths N``: checked as the worker's flag before the store is
opened, recorded with the run (which a worker of another limit keeps), and a retried submit of the
same ``--run-id`` with another limit is refused, one line naming both."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from raysaga.state import SqlStore
from tests.support.cli import invoke, one_line_error

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("deaths_submit_cli_stop31")

    @wf.step()
    def one() -> int:
        return 1
''')


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "deaths_submit_cli_stop31_flow.py"
    path.write_text(FLOW)
    return f"{path}:wf"


@pytest.mark.parametrize("value", ["0", "-1"])
def test_a_limit_below_one_is_refused_before_the_store_is_opened(flow: str, tmp_path: Path, value: str) -> None:
    db = tmp_path / "never" / "raysaga.db"
    code, out, err = invoke("submit", flow, "--db", f"sqlite:///{db}", "--max-driver-deaths", value)
    one_line_error(code, err, "--max-driver-deaths must be a whole number >= 1 (drivers of a run that die in a row")
    assert out == "" and not db.parent.exists()


def test_the_limit_is_recorded_and_a_retry_with_another_is_refused(flow: str, store_url: str) -> None:
    run_id = f"order-{uuid.uuid4().hex[:8]}"
    code, out, err = invoke("submit", flow, "--db", store_url, "--run-id", run_id, "--max-driver-deaths", "5")
    assert code == 0 and out.strip() == run_id, err
    code, out, err = invoke("submit", flow, "--db", store_url, "--run-id", run_id, "--max-driver-deaths", "5")
    assert code == 0 and out.strip() == run_id, err  # the same: idempotent
    code, _, err = invoke("submit", flow, "--db", store_url, "--run-id", run_id, "--max-driver-deaths", "2")
    one_line_error(code, err, f"run {run_id!r} exists with other options (max_driver_deaths: recorded 5, given 2)")
    code, _, err = invoke("submit", flow, "--db", store_url, "--run-id", run_id)
    one_line_error(code, err, "max_driver_deaths: recorded 5, given 3")
    store = SqlStore(store_url)
    try:
        assert store.get_run(run_id).max_driver_deaths == 5
    finally:
        store.close()

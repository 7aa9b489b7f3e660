"""A run started with ``raysaga.Saga`` is resumed, retried and shown by the CLI (stop 51, a review).

``saga.py`` says "so resume, status, cancel and retry work the same", but the loader refused the
module's ``Saga`` ("'m:saga' is a Saga, not a raysaga Workflow"), and a run started without a
``workflow_ref`` recorded none (the module holds the Saga, not its workflow): the advice printed
on ``compensation_failed`` (``raysaga retry RUN --compensations``) could not be followed.

Real inline runs on a real SQLite file; the CLI through typer's runner.
"""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from raysaga.state import RunStatus, SqlStore
from tests.support.cli import invoke

FLOW = textwrap.dedent('''
    from pathlib import Path

    from raysaga import Permanent, Saga

    BROKEN = Path(__file__).with_name("refund-broken")


    def charge(input: dict) -> dict:
        return {"charge": 1}


    def refund(output: dict) -> None:
        if BROKEN.exists():
            raise Permanent("the refund service is down")


    def book(charge: dict) -> dict:
        raise Permanent("no rooms")


    saga = Saga("trip51")
    saga.step(charge, compensate=refund).step(book)
''')


@pytest.fixture
def saga_dir(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "trip51_flow.py").write_text(FLOW)
    (tmp_path / "refund-broken").touch()
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    sys.modules.pop("trip51_flow", None)


@pytest.mark.parametrize("ref", [None, "trip51_flow:saga"], ids=["no-ref", "saga-ref"])
def test_a_saga_run_is_retried_by_the_cli_as_its_advice_says(saga_dir: Path, ref: str | None) -> None:
    from trip51_flow import saga  # type: ignore[import-not-found]

    url = f"sqlite:///{saga_dir / 'raysaga.db'}"
    parked = saga.run({"t": 1}, store=url, run_id="t51", workflow_ref=ref)
    assert parked.status == RunStatus.COMPENSATION_FAILED, parked.status_reason
    (saga_dir / "refund-broken").unlink()  # fixed
    code, out, err = invoke("retry", "t51", "--compensations", "--executor", "inline", "--db", url)
    assert code == 0, out + err
    store = SqlStore(url)
    try:
        assert store.get_run("t51").status == RunStatus.COMPENSATED
    finally:
        store.close()
    code, out, err = invoke("status", "t51", "--dag", "--db", url)  # the DAG drawn from the recorded ref
    assert code == 0 and "charge" in out and "book" in out and "dag:" not in out, out + err


def test_cancel_compensate_of_a_failed_rollback_says_how_it_finishes_and_changes_nothing(saga_dir: Path) -> None:
    """``cancel --compensate`` of a ``compensation_failed`` run flipped it to ``compensating`` and back,
    retried nothing and said nothing (a review): it now says what finishes the rollback, as a plain
    cancel does, and writes nothing; ``Client.cancel(compensate=True)`` leaves it as it is."""
    from trip51_flow import saga

    import raysaga

    url = f"sqlite:///{saga_dir / 'raysaga.db'}"
    assert saga.run({"t": 1}, store=url, run_id="c51").status == RunStatus.COMPENSATION_FAILED
    store = SqlStore(url)
    try:
        events = len(store.events("c51"))
        code, out, err = invoke("cancel", "c51", "--compensate", "--executor", "inline", "--db", url)
        assert code == 1, out + err
        assert "already compensation_failed: nothing to cancel" in out and "retry c51 --compensations" in out, out
        assert raysaga.Client(url).cancel("c51", compensate=True, by="ops").status == RunStatus.COMPENSATION_FAILED
        assert len(store.events("c51")) == events and store.get_run("c51").status == RunStatus.COMPENSATION_FAILED
    finally:
        store.close()

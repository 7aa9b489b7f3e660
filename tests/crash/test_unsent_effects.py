"""An effect issued in the very round a restored failure stops the run is never sent, and leaves
no ``pending`` ledger row behind.

Found by the random kill sweep: the commit that failed the run (``gate``'s fan-out decision) also
completed ``feed``, so ``pay``'s items were not ready before the failure. A driver killed right
after that commit leaves a store in which, on resume, the failure and ``pay``'s items come back
in one round: the items were prepared, their ledger rows written ``pending``, then dropped
unsent ("not sent: the run failed"). Those rows stayed ``pending`` for ever on a finished run;
the calls were never made, so now they are never written (``Calls.unissue``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from examples.order.fake_services import FakeServices
from tests.support.chaos_sweep import fault_case, golden_run

SPEC = {"name": "unsent_effects", "steps": [
    {"name": "plan", "kind": "plan", "deps": [], "items": 3},
    {"name": "gate", "kind": "map", "over": "plan", "deps": ["plan"], "fail_items": [0, 2], "compensate": True,
     "policy": {"kind": "ratio", "r": 0.75}},
    {"name": "feed", "kind": "plan", "deps": ["plan"], "items": 2},
    {"name": "pay", "kind": "map", "over": "feed", "deps": ["feed"], "effect": True, "policy": {"kind": "all"}},
]}


@pytest.fixture(scope="module")
def services() -> Iterator[FakeServices]:
    with FakeServices() as fake:
        yield fake


def test_effects_never_sent_after_a_restored_failure_leave_no_ledger_row(services: FakeServices,
                                                                         tmp_path: Path) -> None:
    (tmp_path / "golden").mkdir()
    golden = golden_run(SPEC, tmp_path / "golden", services)
    assert golden.run["status"] == "compensated", golden.run
    assert not any(label.startswith("pay") for label in golden.ledger), golden.ledger  # never reached
    folder = tmp_path / "killed"
    folder.mkdir()
    # resumed, compared with golden: no pending row (and the ledger holds golden's keys, none of pay's)
    fault_case(golden, ("after_commit", "gate"), "kill", services, folder)

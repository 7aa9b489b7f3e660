"""The refund approval example does what its README says: the run rests waiting for finance,
an approval with an edit is recorded, a worker finishes the run with the edited amount, and the
provider sees one refund."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.support import REPO


def test_refund_approval_demo(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RAYSAGA_FAULTS", "RAYSAGA_DB")}
    done = subprocess.run([sys.executable, "-m", "examples.refund_approval.workflow", "--db",
                           f"sqlite:///{tmp_path / 'refund.db'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "waiting_human — waiting for a decision on review" in lines[0]
    assert "review: Refund 5000 cents on order o-42?" in lines[1]
    assert lines[3].endswith("completed: refunded 4000 cents (approved by finance-lead)")
    assert lines[4].strip() == "the provider saw 1 refund call(s)"

"""Stop 33 audit, signals: an operator's cancel reason was kept in the signal row unscrubbed.

``Client.cancel(compensate=True, reason=...)`` (``raysaga cancel --compensate --reason``) and a
cancel or pause of a run a live driver holds send a signal whose payload holds the reason. The
run's reason and its events are scrubbed at the store's write boundary; ``send_signal`` writes the
payload as given (decisions scrub their own): an API key pasted into a reason stayed in
``raysaga_signals``. Fixed: ``state/shared_rows.send_signal`` scrubs the payload.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import select

import raysaga
from raysaga import RunStatus, Workflow
from raysaga.orchestrator.client import Client
from raysaga.state import SqlStore
from raysaga.state.schema import signals

KEY = "sk-ant-api03-" + "V" * 40

wf = Workflow("audit_stop33_signals")


@wf.step()
def draft(input: str) -> str:
    return input


@wf.approval(after=["draft"])
def send(draft: str) -> str:
    return "send it?"


def test_a_cancel_reason_holding_a_key_is_not_kept_in_the_signal(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'signals.db'}")
    try:
        record = raysaga.run(wf, "x", store=store, executor="inline")
        assert record.status == RunStatus.WAITING_HUMAN
        Client(store).cancel(record.run_id, compensate=True, by="ops", reason=f"the token leaked: {KEY}")
        done = raysaga.resume(wf, record.run_id, store=store, executor="inline")
        assert done.status == RunStatus.COMPENSATED and KEY not in (done.status_reason or "")
        with store.engine.connect() as conn:
            payloads = [str(p) for p in conn.execute(select(signals.c.payload)).scalars()]
        assert payloads and not [p for p in payloads if KEY in p], payloads
    finally:
        store.close()

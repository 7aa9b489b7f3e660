"""Stop 33 audit, the dashboard: its error answers were the only text it did not scrub.

A damaged row (changed outside raysaga) makes a read fail with ``CorruptRecordError``, whose
message quotes the row's first 80 characters, and a step's output is stored as it came (never
scrubbed: an output is the user's data). ``raysaga status`` scrubs every error it prints; the
dashboard answered ``{"error": str(exc)}`` as it was: an API key in the damaged output reached
the page, while the same output, readable, is shown masked. Every error answer is scrubbed now.
The quote is cut with ``...``: a declared secret's piece before it is masked too.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

import raysaga
from raysaga import Workflow
from raysaga.orchestrator.dashboard.server import build
from raysaga.state import SqlStore
from raysaga.state.redact import MARKER, register_secret

KEY = "sk-ant-api03-" + "Q" * 60
DECLARED = "audit33-dash-declared-" + "v" * 30

wf = Workflow("audit_stop33_dash")


@wf.step()
def fetch(input: str) -> dict[str, str]:
    return {"ok": input}


@pytest.mark.parametrize("damaged", [
    # (the column, its text: not JSON, so every read of the row fails quoting it)
    ("raysaga_nodes", '{"authorization": "Bearer ' + KEY + '", "x": '),
    ("raysaga_runs", '{"token": "' + KEY + '" '),
    ("raysaga_nodes", '{"note": "' + "y" * 20 + DECLARED + '", '),  # its quote cut inside the secret
], ids=["node_key", "run_key", "node_declared"])
def test_a_damaged_rows_text_in_an_error_answer_is_scrubbed(tmp_path: Path, damaged: tuple[str, str]) -> None:
    register_secret(DECLARED)
    url = f"sqlite:///{tmp_path / 'dash.db'}"
    store = SqlStore(url)
    try:
        raysaga.run(wf, "x", store=store, executor="inline", run_id="dmg")
        table, value = damaged
        with store.engine.begin() as conn:
            conn.execute(text(f"UPDATE {table} SET output = :v"), {"v": value})
        app, _ = build(store)
        client = TestClient(app, base_url="http://127.0.0.1:8765", raise_server_exceptions=False)
        for path in ("/api/runs/dmg", "/api/runs/dmg/nodes/fetch", "/api/runs/dmg/nodes/fetch/output"):
            answer = client.get(path)
            if answer.status_code == 200:
                continue  # this read does not touch the damaged column
            assert answer.status_code == 500 and "changed outside raysaga" in answer.json()["error"], answer.text
            assert KEY[:20] not in answer.text and DECLARED[:10] not in answer.text, answer.text
            assert MARKER in answer.json()["error"]
    finally:
        store.close()

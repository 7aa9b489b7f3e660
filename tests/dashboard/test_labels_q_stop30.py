"""The dashboard's ``q`` (``/api/runs?q=...``) searches run labels too: a label's key, its value or
``key=value`` as the list shows it, case-insensitive and matched as written like the rest of
``q``, on SQLite and PostgreSQL. Before, ``q`` read only the run id, workflow and reason: a run
labelled ``team=billing`` was not found by ``q=billing``.

The PostgreSQL database is the session's: each test's runs carry ``t=<tag>`` and the lists are
filtered by it (``label=t=<tag>``), so only what ``q`` adds is compared.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

from fastapi.testclient import TestClient
from sqlalchemy import text

from raysaga import RunOptions
from raysaga.orchestrator.dashboard.server import build
from raysaga.orchestrator.runner import create_run
from raysaga.state import SqlStore
from tests.dashboard.test_labels_stop29 import _run
from tests.support import dashboard_flows as flows

BASE = "http://127.0.0.1:8765"


def _found(client: TestClient, tag: str, q: str) -> list[str]:
    response = client.get("/api/runs?" + urlencode([("label", f"t={tag}"), ("q", q)]))
    assert response.status_code == 200, (q, response.status_code, response.text[:300])
    return sorted(r["run_id"] for r in response.json()["runs"])


def test_q_finds_a_label_by_its_key_its_value_or_the_pair(api: tuple[TestClient, SqlStore, str]) -> None:
    client, store, tag = api
    billing = _run(store, tag, {"Team": "Billing", "env": "prod"})
    search = _run(store, tag, {"team": "search", "ticket": "OPS-12"})
    plain = _run(store, tag, {})
    assert _found(client, tag, "billing") == [billing]  # a value, case-insensitive
    assert _found(client, tag, "TEAM") == sorted([billing, search])  # a key
    assert _found(client, tag, "team=sea") == [search]  # key=value, as the list shows it
    assert _found(client, tag, "ops-12") == [search]
    assert _found(client, tag, "ticket=ops") == [search]
    assert _found(client, tag, "env=dev") == []
    assert _found(client, tag, "") == sorted([billing, search, plain])  # no q: all
    # the run id, workflow and reason are still searched beside the labels
    assert _found(client, tag, plain[-6:].upper()) == [plain]


def test_q_is_no_pattern_in_labels_either(api: tuple[TestClient, SqlStore, str]) -> None:
    client, store, tag = api
    percent = _run(store, tag, {"share": "50%"})
    under = _run(store, tag, {"k_1": "a"})
    other = _run(store, tag, {"kx1": "abc"})
    assert _found(client, tag, "50%") == [percent]
    assert _found(client, tag, "%") == [percent]  # '%' is no wildcard
    assert _found(client, tag, "k_1") == [under]  # '_' is no wildcard: kx1 is not found
    assert _found(client, tag, "k_") == [under]
    assert _found(client, tag, "=abc") == [other]


def test_q_matches_unicode_and_quotes_in_labels_as_written(api: tuple[TestClient, SqlStore, str]) -> None:
    client, store, tag = api
    quoted = _run(store, tag, {'say "hi"': "it's"})
    accents = _run(store, tag, {"city": "zürich"})
    assert _found(client, tag, 'say "hi"=it') == [quoted]
    assert _found(client, tag, "zürich") == [accents]
    assert _found(client, tag, '"') == [quoted]  # the JSON's own quotes are not searched
    assert _found(client, tag, "{") == []


def test_a_damaged_labels_value_fails_no_search(tmp_path: Path) -> None:
    """SQLite keeps any text: a labels value that is not JSON, or not an object, matches nothing
    and fails no page."""
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        ids = [create_run(flows.wide, {"items": 1}, store=store, options=RunOptions(labels={"a": "b"})).run_id
               for _ in range(3)]
        with store.engine.begin() as conn:
            for run_id, damaged in zip(ids, ["not json {team", '["team", "b"]', '{"team": 1}'], strict=True):
                conn.execute(text("UPDATE raysaga_runs SET labels = :v WHERE run_id = :r"), {"v": damaged, "r": run_id})
        good = create_run(flows.wide, {"items": 1}, store=store, options=RunOptions(labels={"team": "b"})).run_id
        app, _ = build(store)
        client = TestClient(app, base_url=BASE)
        response = client.get("/api/runs?q=team")
        assert response.status_code == 200, response.text[:300]
        # the object {"team": 1} is an object: its key matches (its value is no string, so it lists as {})
        assert sorted(r["run_id"] for r in response.json()["runs"]) == sorted([good, ids[2]])
        assert client.get("/api/runs?q=team").json()["counts"] == {"pending": 2}
    finally:
        store.close()

"""Stop 29, run labels on the dashboard's JSON API: each run of the list carries its labels, and
``/api/runs?label=KEY=VALUE`` (repeatable, every one must hold) lists the runs that carry them,
as ``raysaga list --label`` does. Tried as a hostile or careless client would: a pair without
'=', a key twice, too long, unprintable, too many, text that is not UTF-8, SQL LIKE wildcards,
JSON-path characters in a key, unicode, a stored label shaped like a secret, a damaged row.

Every test runs on SQLite and PostgreSQL; the PostgreSQL database is the session's, so each test
tags its runs with a label of its own (``t=<uuid>``) and filters by it.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any
from urllib.parse import quote, urlencode

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text, update

from raysaga import RunOptions
from raysaga.orchestrator.dashboard.server import build
from raysaga.orchestrator.runner import create_run
from raysaga.state import SqlStore
from raysaga.state.schema import runs
from tests.support import dashboard_flows as flows

BASE = "http://127.0.0.1:8765"


def _run(store: SqlStore, tag: str, labels: dict[str, str]) -> str:
    """A pending run of ``wide`` labelled ``labels`` and t=tag; its id."""
    return create_run(flows.wide, {"items": 1}, store=store, workflow_ref=f"{flows.MODULE}:wide",
                      options=RunOptions(labels={"t": tag, **labels})).run_id


def _url(tag: str, *pairs: str, **params: Any) -> str:
    return "/api/runs?" + urlencode([("label", f"t={tag}"), *(("label", p) for p in pairs), *params.items()])


def _listed(client: TestClient, url: str) -> list[str]:
    response = client.get(url)
    assert response.status_code == 200, (url[:120], response.status_code, response.text[:300])
    return sorted(r["run_id"] for r in response.json()["runs"])


def test_each_run_carries_its_labels_and_the_filter_ands_them(api: tuple[TestClient, SqlStore, str]) -> None:
    client, store, tag = api
    search = _run(store, tag, {"team": "search", "env": "prod"})
    search_dev = _run(store, tag, {"team": "search", "env": "dev"})
    billing = _run(store, tag, {"team": "billing", "env": "prod"})
    bare = create_run(flows.wide, {"items": 1}, store=store).run_id  # no labels at all
    page = client.get(_url(tag)).json()
    assert {r["run_id"]: r["labels"] for r in page["runs"]} == {
        search: {"t": tag, "team": "search", "env": "prod"}, search_dev: {"t": tag, "team": "search", "env": "dev"},
        billing: {"t": tag, "team": "billing", "env": "prod"}}
    assert page["counts"] == {"pending": 3}  # the counts obey the filter too
    assert _listed(client, _url(tag, "team=search")) == sorted([search, search_dev])
    assert _listed(client, _url(tag, "team=search", "env=prod")) == [search]  # every label must hold
    assert _listed(client, _url(tag, "team=search", "env=staging")) == []
    assert client.get(_url(tag, "team=search")).json()["counts"] == {"pending": 2}
    [unlabelled] = client.get(f"/api/runs?q={bare}").json()["runs"]
    assert unlabelled["labels"] == {}  # a run without labels shows none (the row holds NULL)
    assert client.get(f"/api/runs/{search}").json()["run"]["labels"] == {"t": tag, "team": "search", "env": "prod"}


def test_the_label_filter_pages_with_the_cursor(api: tuple[TestClient, SqlStore, str]) -> None:
    client, store, tag = api
    made = [_run(store, tag, {"n": "x"}) for _ in range(5)]
    _run(store, tag, {"n": "y"})
    seen: list[str] = []
    cursor = ""
    for _ in range(6):
        page = client.get(_url(tag, "n=x", limit=2, before=cursor)).json()
        seen += [r["run_id"] for r in page["runs"]]
        if page["next"] is None:
            break
        cursor = page["next"]
    assert sorted(seen) == sorted(made) and len(seen) == 5


@pytest.mark.parametrize(("value", "others"), [
    ("a_c", ["abc", "a%c", "a\\c"]),
    ("a%c", ["abc", "a_c", "a\\c", "a%%c"]),
    ("a\\c", ["abc", "a_c", "a%c"]),
    ("%", ["", "x", "%%"]),
    ("_", ["x", "__"]),
    ("", ["x", " "]),
])
def test_like_wildcards_in_a_label_match_literally(api: tuple[TestClient, SqlStore, str], value: str,
                                                   others: list[str]) -> None:
    """A filter by `team=a_c` must not find `team=abc` (nor `%` every run): labels are compared,
    never matched as a LIKE pattern."""
    client, store, tag = api
    wanted = _run(store, tag, {"team": value})
    for other in others:
        _run(store, tag, {"team": other})
    assert _listed(client, _url(tag, f"team={value}")) == [wanted]


@pytest.mark.parametrize("key", ["équipe", "チーム 🎉", 'a"b', "a.b", "$.team", "a'b", "[0]", "k\\", "a b", "+x",
                                 "%", "_", "#frag", "&x", "a/b"])
def test_any_key_the_store_takes_is_found_by_the_filter(api: tuple[TestClient, SqlStore, str], key: str) -> None:
    """Unicode, JSON-path characters (`$`, `.`, quotes, brackets) and characters a URL treats
    specially, in the key and the value, are found as written (urlencode sends them escaped)."""
    client, store, tag = api
    wanted = _run(store, tag, {key: f"v {key} é"})
    _run(store, tag, {key: "other"})
    _run(store, tag, {"team": f"v {key} é"})
    assert _listed(client, _url(tag, f"{key}=v {key} é")) == [wanted]
    listed = client.get(_url(tag, f"{key}=v {key} é")).json()["runs"][0]["labels"]
    assert listed == {"t": tag, key: f"v {key} é"}


def test_a_value_holding_equals_signs_splits_at_the_first(api: tuple[TestClient, SqlStore, str]) -> None:
    client, store, tag = api
    wanted = _run(store, tag, {"expr": "a=b=c"})
    _run(store, tag, {"expr": "a"})
    assert _listed(client, _url(tag, "expr=a=b=c")) == [wanted]


@pytest.mark.parametrize(("query", "starts", "says"), [
    ("label=team", "label='team' is not KEY=VALUE", "label=team=billing"),
    ("label=", "label='' is not KEY=VALUE", "KEY=VALUE"),
    ("label==x", "label=: the key '' must be 1 to 100 printable characters", "got 0"),
    ("label=team=a&label=team=b", "label='team' is given twice", "give each key once"),
    ("label=" + "k" * 101 + "=v", "label=: the key 'kkk", "1 to 100 printable characters"),
    ("label=team=" + "v" * 501, "label=['team'] must be 0 to 500 printable characters", "got 501"),
    ("label=team=" + "v" * 60_000, "label=['team'] must be 0 to 500 printable characters", "got 60,000"),
    ("label=team%3Da%00b", "label=['team'] must be 0 to 500 printable characters", "'\\x00', which is not printable"),
    ("label=te%1Bam%3Dx", "label=: the key 'te\\x1bam' must be 1 to 100 printable", "'\\x1b'"),
    ("label=team%3Da%0Ab", "label=['team'] must be 0 to 500", "'\\n', which is not printable"),
    ("&".join(f"label=k{i}=v" for i in range(65)), "label= is given 65 times", "filter by fewer"),
    ("&".join("label=k=v" for _ in range(6_000)), "label= is given 6000 times", "a run carries at most 64"),
    ("label=team%3D%ED%A0%80", "label=: percent-decoded, it is not UTF-8 text", "lone surrogate"),
    ("label=team%3D%FF", "label=: percent-decoded, it is not UTF-8 text", "percent-encode text as UTF-8"),
    ("q=%ED%B2%A9", "q=: percent-decoded, it is not UTF-8 text", "percent-encode"),
])
def test_a_bad_label_filter_is_a_400_naming_it_and_the_fix(api: tuple[TestClient, SqlStore, str], query: str,
                                                           starts: str, says: str) -> None:
    """Each was a 200 listing no runs (a filter no run could match, or on PostgreSQL a NUL: a 500),
    as if none carried the label; a lone surrogate's bytes were read as U+FFFD."""
    client, store, tag = api
    _run(store, tag, {"team": "a"})
    response = client.get("/api/runs?" + query)
    assert response.status_code == 400, (query[:80], response.status_code, response.text[:300])
    error = response.json()["error"]
    assert error.startswith(starts), error[:300]
    assert says in error and len(error) < 400, error[:600]


def test_raw_bytes_above_ascii_in_the_query_are_refused_not_read_as_latin1(store_url: str) -> None:
    """curl sends `?label=équipe=x` unencoded; Starlette reads such bytes as Latin-1 ('Ã©quipe') and
    the filter would find nothing. uvicorn (h11) refuses them before the app; a server or proxy
    that passes them on gets this 400. Called as ASGI, with the query string's bytes as sent."""
    import anyio

    store = SqlStore(store_url)
    app, _ = build(store)
    sent: list[dict[str, Any]] = []

    async def receive() -> MutableMapping[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(dict(message))

    scope: MutableMapping[str, Any] = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
        "path": "/api/runs", "raw_path": b"/api/runs", "query_string": "label=équipe=x".encode(), "root_path": "",
        "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8765)}
    try:
        anyio.run(app, scope, receive, send)
    finally:
        store.close()
    assert sent[0]["status"] == 400, sent
    body = b"".join(m.get("body", b"") for m in sent[1:]).decode()
    assert "label=: the query string holds bytes that are not percent-encoded" in body, body


def test_a_label_stored_before_secrets_were_refused_is_shown_masked(api: tuple[TestClient, SqlStore, str]) -> None:
    """Invariant 7: the store refuses a label holding a secret now (6867918); a row written before
    that still holds it, and the dashboard must not show it."""
    client, store, tag = api
    run_id = _run(store, tag, {"note": "plain"})
    secret = "sk-ant-" + "q" * 30
    with store.engine.begin() as conn:  # as the row was written then: past the store's check
        conn.execute(update(runs).where(runs.c.run_id == run_id).values(
            labels={"t": tag, "note": secret, "password": "hunter22hunter", "sk-ant-" + "k" * 20: "x"}))
    for url in (_url(tag), f"/api/runs/{quote(run_id, safe='')}"):
        response = client.get(url)
        assert response.status_code == 200, response.text
        assert secret not in response.text and "hunter22hunter" not in response.text and "k" * 20 not in response.text
        assert "[redacted]" in response.text


def test_a_damaged_labels_value_lists_the_run_without_labels(tmp_path: Any) -> None:
    """A labels value that is not a JSON object of strings (SQLite keeps any text) lists the run
    with no labels, as `raysaga list --json` does, instead of failing the page."""
    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    store = SqlStore(url)
    try:
        ids = [create_run(flows.wide, {"items": 1}, store=store, options=RunOptions(labels={"a": "b"})).run_id
               for _ in range(3)]
        with store.engine.begin() as conn:
            for run_id, damaged in zip(ids, ["not json {", "[1, 2]", '{"a": 1}'], strict=True):
                conn.execute(text("UPDATE raysaga_runs SET labels = :v WHERE run_id = :r"),
                             {"v": damaged, "r": run_id})
        good = create_run(flows.wide, {"items": 1}, store=store, options=RunOptions(labels={"a": "b"})).run_id
        app, _ = build(store)
        client = TestClient(app, base_url=BASE)
        page = client.get("/api/runs").json()
        assert {r["run_id"]: r["labels"] for r in page["runs"]} == {**{i: {} for i in ids}, good: {"a": "b"}}
        assert _listed(client, "/api/runs?label=a=b") == [good]
    finally:
        store.close()


@pytest.mark.parametrize(("method", "url", "body", "error"), [
    ("GET", "/api/runs?limit=abc", None, "limit='abc': it should be a valid integer"),
    ("GET", "/api/runs?label=k=v&limit=1.5", None, "limit='1.5': it should be a valid integer"),
    ("GET", "/api/runs/r1/events?after=zz", None, "after='zz': it should be a valid integer"),
    ("GET", "/api/runs/r1/items/square?after=x", None, "after='x': it should be a valid integer"),
    ("POST", "/api/runs/r1/actions/pause", b"[1, 2]", "body=[1, 2]: it should be a valid dictionary"),
    ("POST", "/api/runs/r1/actions/pause", b"{not json", 'the body is not JSON: send a JSON object'),
])
def test_a_parameter_of_the_wrong_type_is_a_400_naming_it(api: tuple[TestClient, SqlStore, str], method: str,
                                                          url: str, body: bytes | None, error: str) -> None:
    """FastAPI answered these 422 with a list under "detail", which the page showed as
    "422: [object Object]"; now a 400 whose "error" names the parameter, as every other refusal."""
    _, store, _ = api
    app, guard = build(store)
    client = TestClient(app, base_url=BASE)
    response = client.get(url) if method == "GET" else client.post(
        url, content=body, headers={"X-Raysaga-CSRF": guard.csrf, "Content-Type": "application/json"})
    assert response.status_code == 400, (url, response.status_code, response.text[:300])
    assert response.json()["error"].startswith(error), response.text[:300]

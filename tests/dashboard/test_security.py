"""Who may talk to the dashboard: a non-loopback bind needs a token, a request without it is 401,
a foreign Host 403 (DNS rebinding), a state-changing request without the page's CSRF header 403."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from fastapi.testclient import TestClient

from raysaga.errors import UserError
from raysaga.orchestrator.dashboard.security import TOKEN_ENV
from raysaga.orchestrator.dashboard.server import build
from raysaga.state import SqlStore

TOKEN = "a-long-enough-test-token"


def test_a_non_loopback_bind_without_a_token_refuses_to_start(demo: tuple[SqlStore, dict[str, str]],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(UserError, match="needs a token"):
        build(demo[0], host="0.0.0.0")
    with pytest.raises(UserError, match="too short"):
        build(demo[0], host="0.0.0.0", token="short")
    build(demo[0], host="0.0.0.0", token=TOKEN)  # accepted
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    build(demo[0], host="0.0.0.0")  # the environment's token counts too


def test_the_cli_refuses_before_binding(demo: tuple[SqlStore, dict[str, str]]) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != TOKEN_ENV}
    done = subprocess.run([sys.executable, "-m", "raysaga", "dashboard", "--db", demo[0].url, "--host", "0.0.0.0",
                           "--port", "0"], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 2, done.stderr
    assert "needs a token" in done.stderr and "RAYSAGA_DASHBOARD_TOKEN" in done.stderr


@pytest.fixture(scope="module")
def guarded(demo: tuple[SqlStore, dict[str, str]]) -> tuple[TestClient, str]:
    app, guard = build(demo[0], host="0.0.0.0", token=TOKEN)
    return TestClient(app, base_url="http://127.0.0.1:8765"), guard.csrf


def test_a_request_without_the_token_is_401(guarded: tuple[TestClient, str]) -> None:
    client, _ = guarded
    client.cookies.clear()
    for url in ("/", "/api/runs", "/metrics", "/static/app.js"):
        assert client.get(url).status_code == 401, url
    assert client.get("/api/runs", headers={"Authorization": "Bearer wrong-token-of-length"}).status_code == 401
    assert client.get("/api/runs", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    # the browser's way: /?token= once sets an HttpOnly, SameSite=Strict cookie and drops the token from the URL
    first = client.get(f"/?token={TOKEN}", follow_redirects=False)
    assert first.status_code == 303 and first.headers["location"] == "/"
    cookie = first.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie.replace("Strict", "strict")
    assert client.get("/api/runs").status_code == 200
    client.cookies.clear()


def test_a_foreign_host_is_403(guarded: tuple[TestClient, str], demo: tuple[SqlStore, dict[str, str]]) -> None:
    client, _ = guarded
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.get("/api/runs", headers={**auth, "Host": "evil.example:8765"}).status_code == 403
    assert client.get("/api/runs", headers={**auth, "Host": "localhost:8765"}).status_code == 200
    # on loopback without a token the Host check is the defence against DNS rebinding
    loopback = TestClient(build(demo[0])[0], base_url="http://127.0.0.1:8765")
    assert loopback.get("/api/runs", headers={"Host": "rebound.example"}).status_code == 403
    assert loopback.get("/api/runs", headers={"Host": "127.0.0.1:8765"}).status_code == 200
    assert loopback.get("/api/runs", headers={"Host": "[::1]:8765"}).status_code == 200


def test_a_state_changing_request_needs_the_csrf_header(guarded: tuple[TestClient, str],
                                                        demo: tuple[SqlStore, dict[str, str]]) -> None:
    client, csrf = guarded
    run = demo[1]["refund"]
    url = f"/api/runs/{run}/actions/pause"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    assert client.post(url, json={"confirm": True}, headers=auth).status_code == 403
    assert client.post(url, json={"confirm": True}, headers={**auth, "X-Raysaga-CSRF": "guess"}).status_code == 403
    cross = {**auth, "X-Raysaga-CSRF": csrf, "Origin": "http://evil.example"}
    assert client.post(url, json={"confirm": True}, headers=cross).status_code == 403
    # the header the page carries: the request reaches the action (unconfirmed: 400, nothing done)
    ok = {**auth, "X-Raysaga-CSRF": csrf, "Origin": "http://127.0.0.1:8765"}
    refused = client.post(url, json={}, headers=ok)
    assert refused.status_code == 400 and "confirm" in refused.json()["error"]
    assert demo[0].get_run(run).status.value == "waiting_human"
    # the page carries the value in a meta tag; it is this process's, never the token
    page = client.get("/", headers=auth).text
    assert re.search(r'name="raysaga-csrf" content="([^"]+)"', page).group(1) == csrf  # type: ignore[union-attr]
    assert TOKEN not in page


def test_security_headers(guarded: tuple[TestClient, str]) -> None:
    client, _ = guarded
    response = client.get("/api/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert "frame-ancestors 'none'" in response.headers["content-security-policy"]
    assert response.headers["x-content-type-options"] == "nosniff"


def test_the_command_serves_the_page_on_loopback(demo: tuple[SqlStore, dict[str, str]]) -> None:
    import httpx

    from tests.support.dashboard_serving import wait_until

    proc = subprocess.Popen([sys.executable, "-m", "raysaga", "dashboard", "--db", demo[0].url, "--port", "0"],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        found = re.search(r"on (http://127\.0\.0\.1:\d+/) over", line)
        assert found, line
        base = found.group(1)

        def page() -> str | None:
            try:
                return httpx.get(base, timeout=2).text
            except httpx.TransportError:
                return None  # not listening yet

        assert 'name="raysaga-csrf"' in wait_until(page, "the dashboard to answer", 30)
        assert httpx.get(base + "api/runs", timeout=5).json()["counts"]["completed"] == 3
    finally:
        proc.terminate()
        proc.wait(30)

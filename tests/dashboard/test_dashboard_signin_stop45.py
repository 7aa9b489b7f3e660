"""Stop 45, the dashboard's sign-in (a diff review of its per-person tokens): a page of another site
that sent the browser to ``/?token=<mallory's token>`` signed it in as mallory (a top-level
navigation sets even a SameSite=Strict cookie), and the page never said who was signed in: its
confirmations asked "approve ... as dashboard?" while the action was recorded as mallory. A
mistyped ``/?token=`` left the previous person signed in, silently, and there was no way out.

Over real HTTP (uvicorn on a free port, httpx) and in Debian's headless Chromium (skipped without
it, unless ``RAYSAGA_REQUIRE_BROWSER=1``), with a real second site on 127.0.0.2.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest

import raysaga
from raysaga import Approval, Ask, Workflow
from raysaga.errors import UserError
from raysaga.orchestrator.dashboard import security
from raysaga.orchestrator.runner import create_run
from raysaga.state import SqlStore
from tests.support.browser import checked_page, require_chromium
from tests.support.dashboard_serving import serving

if TYPE_CHECKING:
    from playwright.sync_api import Dialog, Page

MODULE = "tests.dashboard.test_dashboard_signin_stop45"
CFO, MALLORY = "cfo-token-0123456789abcd", "mallory-token-0123456789"
USERS = {"cfo": CFO, "mallory": MALLORY}

signin45 = Workflow("signin45", version="1")


@signin45.approval(approvers=["cfo"])
def gate(input: Any) -> Ask:
    return Ask(prompt="Pay 100 to ACME?", payload=input)


@signin45.step()
def pay(gate: Approval) -> str:
    return "paid, approved by " + ",".join(gate.by)


served = serving  # (tests/support/dashboard_serving.py: users= and host= go to build)


@contextmanager
def other_site(target: str) -> Iterator[str]:
    """Another site (http://127.0.0.2:PORT, cross-site to 127.0.0.1) whose page sends the browser
    to ``target``; yields the page's URL."""
    page = f'<!doctype html><title>cats</title><script>location = {target!r};</script>'.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="other-site45", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.2:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _waiting(url: str, run_id: str) -> str:
    create_run(signin45, {"amount": 100}, store=url, run_id=run_id, workflow_ref=f"{MODULE}:signin45")
    raysaga.resume(signin45, run_id, store=url, executor="inline")
    return run_id


#: What a browser sends with a link typed into its address bar (on loopback, or over https).
TYPED = {"Sec-Fetch-Site": "none"}


def _cleared(answer: httpx.Response) -> bool:
    """Whether ``answer`` expires the token cookie."""
    cookie = answer.headers.get("set-cookie", "")
    return cookie.startswith("raysaga_token=") and "Max-Age=0" in cookie


# ---------------------------------------------------------------- over HTTP


def test_a_sign_in_link_another_site_opened_is_refused(tmp_path: Path) -> None:
    """``Sec-Fetch-Site: cross-site`` (or ``same-site``) is a link another site opened: no cookie is
    set, the one held is kept; ``none`` (the address bar), ``same-origin`` and a client that sends
    no such header sign in."""
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with served(store, users=USERS) as base, httpx.Client(base_url=base) as http:
            for site in ("cross-site", "same-site", "Cross-Site"):
                refused = http.get(f"/?token={MALLORY}", headers={"Sec-Fetch-Site": site}, follow_redirects=False)
                assert refused.status_code == 403, (site, refused.text)
                assert "set-cookie" not in refused.headers, site
                assert "opened by another site" in refused.json()["error"]
                assert "paste it into the address bar" in refused.json()["error"]
            page = http.get(f"/?token={MALLORY}", headers={"Sec-Fetch-Site": "cross-site", "Accept": "text/html"})
            assert page.status_code == 403 and page.headers["content-type"].startswith("text/html")
            assert "opened by another site" in page.text and MALLORY not in page.text
            for headers in ({"Sec-Fetch-Site": "none"}, {"Sec-Fetch-Site": "same-origin"}):
                signed = http.get(f"/?token={CFO}", headers=headers, follow_redirects=False)
                assert signed.status_code == 303 and CFO in signed.headers["set-cookie"], (headers, signed.text)
            assert http.get("/api/me").json()["user"] == "cfo"
    finally:
        store.close()


def test_a_sign_in_link_no_browser_vouches_for_is_asked_about_first(tmp_path: Path) -> None:
    """Over plain http to a name or a LAN address a browser sends no ``Sec-Fetch-Site``: any site's
    link, ``<img>`` or form signed the browser in as mallory (the review's 10 vectors). Such a link
    now gets a page naming the person, whose button posts from this origin; a post from elsewhere
    (its ``Origin`` another site's, or ``null``) signs no one in."""
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with served(store, users=USERS) as base, httpx.Client(base_url=base) as http:
            asked = http.get(f"/?token={MALLORY}", follow_redirects=False)
            assert asked.status_code == 200 and "set-cookie" not in asked.headers
            assert "signs this browser in as <b>mallory</b>" in asked.text and 'action="/sign-in"' in asked.text
            for origin in ("http://attacker.example", "null", None):
                refused = http.post("/sign-in", data={"token": MALLORY}, follow_redirects=False,
                                    headers={} if origin is None else {"Origin": origin})
                assert refused.status_code == 403 and "set-cookie" not in refused.headers, origin
            assert http.get("/api/me").status_code == 401  # nobody signed in
            wrong = http.post("/sign-in", data={"token": CFO + "x"}, headers={"Origin": base}, follow_redirects=False)
            assert wrong.status_code == 401
            signed = http.post("/sign-in", data={"token": CFO}, headers={"Origin": base}, follow_redirects=False)
            assert signed.status_code == 303 and CFO in signed.headers["set-cookie"]
            assert http.get("/api/me").json()["user"] == "cfo"
    finally:
        store.close()


def test_a_wrong_sign_in_link_signs_out_and_says_so(tmp_path: Path) -> None:
    """A mistyped ``/?token=`` while another person's cookie was valid stayed signed in as them."""
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with served(store, users=USERS) as base, httpx.Client(base_url=base) as http:
            assert http.get(f"/?token={CFO}", headers=TYPED).status_code == 303  # signed in
            assert http.get("/api/me").json()["user"] == "cfo"
            wrong = http.get(f"/?token={MALLORY}x", follow_redirects=False)
            assert wrong.status_code == 401 and _cleared(wrong), (wrong.status_code, wrong.headers)
            assert "is not one this dashboard knows" in wrong.json()["error"]
            assert "this browser is signed out" in wrong.json()["error"]
            assert http.get("/api/me").status_code == 401
    finally:
        store.close()


def test_logout_clears_the_cookie_and_needs_the_csrf_header(tmp_path: Path) -> None:
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with served(store, users=USERS) as base, httpx.Client(base_url=base) as http:
            http.get(f"/?token={CFO}", headers=TYPED)
            assert http.post("/api/logout").status_code == 403  # no CSRF header: another site cannot sign anyone out
            assert http.get("/api/me").json()["user"] == "cfo"
            csrf = http.get("/api/csrf").json()["csrf"]
            out = http.post("/api/logout", headers={"X-Raysaga-CSRF": csrf})
            assert out.status_code == 200 and out.json() == {"ok": True, "signed_out": "cfo"}, out.text
            assert _cleared(out)
            assert http.get("/api/me").status_code == 401
    finally:
        store.close()


# ---------------------------------------------------------------- diff review: tokens a browser cannot carry


def test_a_token_is_printable_ascii_and_a_bom_is_no_name(tmp_path: Path) -> None:
    """A token holding '€' passed, then ``/?token=`` was a 500 (its cookie header cannot be
    encoded); a users file saved with a byte-order mark refused "the user name '\\ufeffalice'"."""
    with pytest.raises(UserError, match=r"the token of 'euro' holds the character U\+20AC: a token is printable ASCII"):
        security.resolve_users(["euro=price-€-0123456789abc"])
    with pytest.raises(UserError, match=r"the dashboard token \(--token, RAYSAGA_DASHBOARD_TOKEN\) holds the char"):
        security.resolve_token("tok-🔑-0123456789abcdef")
    people = tmp_path / "users"
    people.write_bytes(f"\ufeffalice={MALLORY}\r\nbob={CFO}\r\n".encode())
    people.chmod(0o600)
    assert security.resolve_users(file=str(people)) == {"alice": MALLORY, "bob": CFO}
    odd = 'odd ;,"\\+&%#=token-0123456789'  # printable ASCII, every character a cookie or a URL treats apart
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with served(store, users={"odd": odd}) as base, httpx.Client(base_url=base) as http:
            signed = http.get("/", params={"token": odd}, headers=TYPED, follow_redirects=False)
            assert signed.status_code == 303, signed.text
            cookie = signed.headers["set-cookie"].split(";")[0].split("=", 1)[1]
            me = http.get("/api/me", headers={"Cookie": f"raysaga_token={cookie}"})
            assert me.json()["user"] == "odd", me.text
    finally:
        store.close()


# ---------------------------------------------------------------- in the browser

DIALOGS: list[str] = []


@pytest.fixture
def page(request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page of the module's Chromium that accepts every confirmation and records its text."""
    require_chromium()

    def answer(dialog: Dialog) -> None:
        DIALOGS.append(dialog.message)
        dialog.accept()

    DIALOGS.clear()
    with checked_page(request.getfixturevalue("browser"), answer) as pg:
        yield pg


def test_the_page_says_who_is_signed_in_acts_as_them_and_signs_out(page: Page, tmp_path: Path) -> None:
    """The page showed an *acting as* box and asked "approve ... as dashboard?" whoever was signed
    in; another site's page could sign it in as mallory; there was no sign-out."""
    from playwright.sync_api import expect

    url = f"sqlite:///{tmp_path / 'raysaga.db'}"
    run_id = _waiting(url, "signin45")
    store = SqlStore(url)
    try:
        with served(store, users=USERS) as base, other_site(f"{base}/?token={MALLORY}") as elsewhere:
            page.goto(f"{base}/?token={CFO}")  # opened directly: signed in, and the token leaves the address bar
            assert page.url == f"{base}/"
            expect(page.locator("#signed-in-name")).to_have_text("cfo")
            expect(page.locator("#actor")).to_have_count(0)
            page.goto(elsewhere)  # another site sends this browser to a sign-in link of mallory's
            expect(page.locator("#refusal")).to_contain_text("opened by another site")
            assert page.evaluate("fetch('/api/me').then(r => r.json())") == {"user": "cfo", "session": True}
            page.goto(f"{base}/#/runs/{run_id}?node=gate")
            expect(page.locator("#signed-in-name")).to_have_text("cfo")
            panel = page.locator("#panel")
            panel.locator("button.approve").click()
            expect(page.locator("#run-head .reason")).to_contain_text("gate approved by cfo")
            assert list(DIALOGS) == [f"approve gate of run {run_id} as cfo?"]
            page.locator("#sign-out").click()
            expect(page.locator("#signed-out")).to_contain_text("Signed out")
            expect(page.locator("#signed-in")).to_have_count(0)
            assert page.evaluate("fetch('/api/me').then(r => r.status)") == 401
        assert raysaga.resume(signin45, run_id, store=url, executor="inline").output == {"pay": "paid, approved by cfo"}
    finally:
        store.close()


def test_without_users_the_page_keeps_its_acting_as_box(page: Page, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with served(store) as base:
            page.goto(f"{base}/")
            expect(page.locator("#actor")).to_be_visible()
            expect(page.locator("#signed-in")).to_have_count(0)
    finally:
        store.close()

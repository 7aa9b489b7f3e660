"""Stop 46: with a shared token (``--token``), a browser signed in by ``/?token=`` had no way out on
the page: only people (``--user``) got "Sign out", while ``POST /api/logout`` worked for both. A
shared machine's browser stayed signed in until its cookie was deleted by hand.

Over real HTTP (uvicorn on a free port, httpx) and in Debian's headless Chromium (skipped without
it, unless ``RAYSAGA_REQUIRE_BROWSER=1``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from raysaga.state import SqlStore
from tests.support.dashboard_serving import serving

if TYPE_CHECKING:
    from playwright.sync_api import Page

TOKEN = "shared-token-0123456789abcdef"


def test_me_says_whether_the_browser_holds_a_sign_in_cookie(tmp_path: Path) -> None:
    """``session`` is what the page decides on: true only for a cookie a sign-out can clear (not for
    a client carrying the token in its Authorization header, nor a dashboard without a token)."""
    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with serving(store, token=TOKEN) as base:
            bearer = httpx.get(f"{base}/api/me", headers={"Authorization": f"Bearer {TOKEN}"})
            assert bearer.json() == {"user": None, "session": False}
            with httpx.Client(base_url=base) as browser:
                assert browser.get(f"/?token={TOKEN}").status_code in (302, 303, 307)
                assert browser.get("/api/me").json() == {"user": None, "session": True}
        with serving(store) as base:  # no token: nobody signs in, nothing to sign out of
            assert httpx.get(f"{base}/api/me").json() == {"user": None, "session": False}
    finally:
        store.close()


def test_a_browser_signed_in_with_the_shared_token_can_sign_out(page: Page, tmp_path: Path) -> None:
    from playwright.sync_api import expect

    store = SqlStore(f"sqlite:///{tmp_path / 'raysaga.db'}")
    try:
        with serving(store, token=TOKEN) as base:
            page.goto(f"{base}/?token={TOKEN}")
            assert page.url == f"{base}/"
            expect(page.locator("#actor")).to_be_visible()  # a shared token: names stay labels
            expect(page.locator("#signed-in")).to_have_count(0)
            page.locator("#sign-out").click()
            expect(page.locator("#signed-out")).to_contain_text("Signed out")
            expect(page.locator("#sign-out")).to_have_count(0)
            assert page.evaluate("fetch('/api/me').then(r => r.status)") == 401
    finally:
        store.close()

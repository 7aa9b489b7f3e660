"""Debian's Chromium for the dashboard's browser tests, driven headless by Playwright (never a
downloaded browser: there is no internet here but the package registries).

A browser test module calls ``require_chromium()`` at its top, then uses the ``browser`` fixture
of ``tests/dashboard/conftest.py`` (one Chromium per module). Without ``/usr/bin/chromium`` (``apt-get
install chromium``) the module skips, unless ``RAYSAGA_REQUIRE_BROWSER=1`` (``.ci/run``) makes that
a failure.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Dialog, Page

CHROMIUM = "/usr/bin/chromium"
#: Milliseconds a page waits for what a test expects of it.
TIMEOUT_MS = 20_000


def require_chromium() -> None:
    """Skip the calling test module without Chromium; raise instead with RAYSAGA_REQUIRE_BROWSER=1."""
    if Path(CHROMIUM).exists():
        return
    if os.environ.get("RAYSAGA_REQUIRE_BROWSER") == "1":
        raise RuntimeError(f"{CHROMIUM} is missing: apt-get install -y chromium")
    pytest.skip(f"{CHROMIUM} is missing (apt-get install -y chromium)", allow_module_level=True)


@contextmanager
def headless_chromium() -> Iterator[Browser]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu"])
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def checked_page(browser: Browser, on_dialog: Callable[[Dialog], None] | None = None) -> Iterator[Page]:
    """A page of ``browser`` (1400x900, ``TIMEOUT_MS``) whose script errors fail the test when it
    ends; ``on_dialog`` answers its dialogs."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    if on_dialog is not None:
        page.on("dialog", on_dialog)
    yield page
    context.close()
    assert errors == [], errors

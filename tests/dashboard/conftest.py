"""Fixtures of the dashboard tests: a store with one run of each demo flow, and a served dashboard."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from fastapi.testclient import TestClient

from raysaga.orchestrator.dashboard.server import build
from raysaga.state import SqlStore
from tests.support import dashboard_flows as flows
from tests.support.browser import checked_page, headless_chromium, require_chromium

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

BASE = "http://127.0.0.1:8765"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SqlStore, dict[str, str]]]:
    """A SQLite store holding one run of each flow, at rest; (store, flow name -> run id)."""
    url = f"sqlite:///{tmp_path_factory.mktemp('dash') / 'raysaga.db'}"
    runs = flows.populate(url)
    store = SqlStore(url)
    yield store, runs
    store.close()


@pytest.fixture
def artifacts(tmp_path: Path) -> Path:
    """Where a test saves screenshots: $RAYSAGA_TEST_ARTIFACTS when set, else its tmp_path."""
    import os

    where = os.environ.get("RAYSAGA_TEST_ARTIFACTS")
    path = Path(where) if where else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def api(store_url: str) -> Iterator[tuple[TestClient, SqlStore, str]]:
    """(client, store, this test's tag) for the label tests: their runs carry the label t=tag."""
    store = SqlStore(store_url)
    app, _ = build(store)
    yield TestClient(app, base_url=BASE, raise_server_exceptions=False), store, uuid.uuid4().hex[:10]
    store.close()


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One headless Chromium per browser test module (which called ``require_chromium()`` first)."""
    with headless_chromium() as b:
        yield b


@pytest.fixture
def page(request: pytest.FixtureRequest) -> Iterator[Page]:
    """A page of the module's Chromium (``browser``, asked for only once Chromium is known there);
    a module whose page answers dialogs defines its own."""
    require_chromium()
    with checked_page(request.getfixturevalue("browser")) as pg:
        yield pg

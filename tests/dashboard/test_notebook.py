"""In a notebook: a workflow and a run render their DAG inline (``_repr_html_``, an SVG), a run
with each step's state as it stands when shown; ``RunView.watch`` redraws in place until it rests."""

from __future__ import annotations

import sys
import types
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from raysaga.orchestrator.run_views import RunView
from raysaga.state import SqlStore
from tests.support import dashboard_flows as flows

SVG = "{http://www.w3.org/2000/svg}"


def nodes(svg: str) -> dict[str | None, str | None]:
    return {g.get("data-node"): g.get("data-state") for g in ET.fromstring(svg).iter(SVG + "g")}


def test_a_workflow_displays_its_dag() -> None:
    svg = flows.refund._repr_html_()
    assert list(nodes(svg)) == ["hold", "note", "review", "pay"]
    assert "refund v1" in svg and "approval" in svg
    assert svg.count("<line") == len(flows.refund.graph.edges)


def test_a_run_displays_its_states(demo: tuple[SqlStore, dict[str, str]]) -> None:
    store, runs = demo
    view = RunView(runs["refund"], store)
    assert nodes(view._repr_html_()) == {"hold": "completed", "note": "completed", "review": "waiting",
                                         "pay": "pending"}
    assert "waiting_human" in view._repr_html_()
    shop = RunView(runs["shop"], store.url)
    assert nodes(shop._repr_html_())["ship"] == "failed"


def test_watch_redraws_until_the_run_rests(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[str] = []

    class Handle:
        def update(self, obj: Any) -> None:
            shown.append(obj.data)

    class HTML:
        def __init__(self, data: str) -> None:
            self.data = data

    def display(obj: HTML, display_id: bool = False) -> Handle:
        shown.append(obj.data)
        return Handle()

    fake = types.ModuleType("IPython.display")
    fake.HTML = HTML  # type: ignore[attr-defined]
    fake.display = display  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "IPython", types.ModuleType("IPython"))
    monkeypatch.setitem(sys.modules, "IPython.display", fake)
    url = f"sqlite:///{tmp_path / 'nb.db'}"
    run_id = flows.start(flows.wide, "wide", {"items": 2}, url)
    flows.drive(flows.wide, run_id, url)
    final = RunView(run_id, url).watch(interval=0.05, timeout=30)
    assert final.status.value == "completed"
    assert nodes(shown[-1]) == {"split": "completed", "square": "completed", "total": "completed"}

"""Worker limits and concurrency are checked once (``worker.checked_limits`` /
``checked_concurrency``), the same for ``Worker(...)`` and ``raysaga worker``: TOML's ``true``
(a Python ``True``, an ``int``) was taken as 1 by the CLI and refused by ``Worker``; now both
refuse it, naming it. The CLI still refuses before any store is opened."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path
from typing import Any

import pytest

from raysaga import Worker, Workflow
from raysaga.errors import UserError
from raysaga.orchestrator.cli_ops import _worker_settings
from raysaga.state import SqlStore
from tests.support.cli import invoke, one_line_error

FLOW = textwrap.dedent('''
    from raysaga import Workflow

    wf = Workflow("limited_stop28")

    @wf.step()
    def one() -> int:
        return 1
''')


@pytest.fixture
def flow(tmp_path: Path) -> str:
    path = tmp_path / "limited_flow_stop28.py"
    path.write_text(FLOW)
    return f"{path}:wf"


def _wf() -> Workflow:
    wf = Workflow("limited_stop28")

    @wf.step()
    def one() -> int:
        return 1

    return wf


BAD = {"true": ("true", True), "false": ("false", False), "zero": ("0", 0), "float": ("1.5", 1.5),
       "negative": ("-2", -2), "nan": ("nan", math.nan), "text": ('"3"', "3")}


@pytest.mark.parametrize(("toml", "value"), BAD.values(), ids=list(BAD))
def test_a_limit_that_is_no_count_is_refused_by_the_cli_and_by_worker_alike(
        flow: str, tmp_path: Path, sqlite_url: str, toml: str, value: Any) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(f"limits = {{limited_stop28 = {toml}}}\n")
    db = tmp_path / "never" / "raysaga.db"
    code, _, cli_err = invoke("worker", "-w", flow, "--config", str(config), "--db", f"sqlite:///{db}",
                              "--executor", "inline")
    one_line_error(code, cli_err, f"limits are whole numbers >= 1 (at most N runs of the workflow driven at once), "
                                  f"got limited_stop28={value!r}")
    assert not db.parent.exists()  # refused before the store was opened
    store = SqlStore(sqlite_url)
    try:
        with pytest.raises(UserError) as refused:
            Worker([_wf()], store, executor="inline", limits={"limited_stop28": value})
    finally:
        store.close()
    assert str(refused.value) in cli_err  # one message, whichever way in
    if isinstance(value, bool):
        assert "true/false is not a count" in cli_err


@pytest.mark.parametrize("value", [True, 0, 2.0, "4"])
def test_concurrency_that_is_no_count_is_refused_by_both(tmp_path: Path, sqlite_url: str, flow: str,
                                                          value: Any) -> None:
    config = tmp_path / "worker.toml"
    config.write_text(f"concurrency = {str(value).lower() if isinstance(value, bool) else repr(value)}\n"
                      .replace("'", '"'))
    with pytest.raises(UserError, match="--concurrency must be a whole number >= 1") as cli:
        _worker_settings(config, [flow], None, None, "inline", None)
    store = SqlStore(sqlite_url)
    try:
        with pytest.raises(UserError, match="--concurrency must be a whole number >= 1") as api:
            Worker([_wf()], store, executor="inline", concurrency=value)
    finally:
        store.close()
    assert str(cli.value) == str(api.value)


def test_good_limits_pass_both_ways(tmp_path: Path, sqlite_url: str, flow: str) -> None:
    config = tmp_path / "worker.toml"
    config.write_text("concurrency = 3\nlimits = {limited_stop28 = 2}\n")
    settings = _worker_settings(config, [flow], None, ["other=5"], "inline", None)
    assert (settings["concurrency"], settings["limits"]) == (3, {"limited_stop28": 2, "other": 5})
    store = SqlStore(sqlite_url)
    try:
        worker = Worker([_wf()], store, executor="inline", concurrency=3, limits={"limited_stop28": 2})
        assert (worker.concurrency, worker.limits) == (3, {"limited_stop28": 2})
        with pytest.raises(UserError, match="keyed by workflow name"):
            Worker([_wf()], store, executor="inline", limits={1: 2})  # type: ignore[dict-item]
    finally:
        store.close()

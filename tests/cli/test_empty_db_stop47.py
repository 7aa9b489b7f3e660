"""An empty ``--db`` (``--db "$DB"`` with ``DB`` unset) or ``store=""`` is refused (stop 47): it
silently meant the default store, and ``raysaga run``, ``prune`` or ``cancel`` went to the wrong one.
An empty ``RAYSAGA_DB`` in the environment stays "not set", as shells mean it."""

from __future__ import annotations

from pathlib import Path

import pytest

import raysaga
from raysaga.errors import StoreUnavailableError
from tests.support.cli import invoke


def test_an_empty_db_option_is_refused_and_nothing_is_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYSAGA_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("RAYSAGA_DB", raising=False)
    for argv in (["list", "--db", ""], ["prune", "--older-than", "30d", "--db", ""], ["cancel", "r1", "--db", " "]):
        code, _, err = invoke(*argv)
        assert code == 2 and "--db (or RAYSAGA_DB) is empty" in err, (argv, err)
    assert not (tmp_path / "home").exists()
    _, _, err = invoke("list", env={"RAYSAGA_DB": ""})  # unset, as a shell's `RAYSAGA_DB=` means:
    assert "is empty" not in err and str(tmp_path / "home" / "raysaga.db") in err, err  # the default store


def test_an_empty_store_argument_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAYSAGA_HOME", str(tmp_path / "home"))
    wf = raysaga.Workflow("empty_db_stop47")

    @wf.step()
    def only() -> int:
        return 1

    with pytest.raises(StoreUnavailableError, match="is empty"):
        raysaga.run(wf, store="", executor="inline")
    assert not (tmp_path / "home").exists()

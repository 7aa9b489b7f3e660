"""A malformed ``RAYSAGA_FAULTS`` is refused before the run is recorded (stop 47): its driver
raised ``ValueError`` (the CLI's unexpected-error form) with the run already created and claimed,
left ``running`` with a dead driver's lease."""

from __future__ import annotations

from pathlib import Path

import pytest

import raysaga
from raysaga.errors import InvalidOptionError
from raysaga.state import SqlStore


@pytest.mark.parametrize("spec", ["nowhere:a", "before_commit:a=explode", "after_commit=stall:-1"])
def test_a_bad_fault_spec_records_no_run(spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    wf = raysaga.Workflow("faults_env_stop47")

    @wf.step()
    def only() -> int:
        return 1

    monkeypatch.setenv("RAYSAGA_FAULTS", spec)
    url = f"sqlite:///{tmp_path / 'run.db'}"
    with pytest.raises(InvalidOptionError, match="RAYSAGA_FAULTS: "):
        raysaga.run(wf, store=url, executor="inline")
    store = SqlStore(url)
    try:
        assert store.list_runs() == []
    finally:
        store.close()

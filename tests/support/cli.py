"""What the CLI tests share: invoking the typer app in-process, the one-line error check, and a
project folder holding a workflow module the CLI imports as ``MODULE:wf``."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from raysaga.orchestrator.cli import app


def invoke(*args: str, input: str | None = None, env: dict[str, str] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), input=input, env=env)
    # a traceback would surface as an exception other than SystemExit
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exc_info
    return result.exit_code, result.stdout, result.stderr


def one_line_error(code: int, err: str, message: str) -> None:
    assert code == 2, err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err


def project_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, flow: str) -> Path:
    """``tmp_path/project`` holding ``module``.py (``flow``'s text), made the working directory and
    importable, as a user's project is when they run ``raysaga run module:wf`` in it."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / f"{module}.py").write_text(flow)
    monkeypatch.chdir(folder)
    monkeypatch.syspath_prepend(str(folder))
    return folder

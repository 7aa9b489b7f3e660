"""What the CLI tests share: invoking the typer app in-process, and the one-line error check."""

from __future__ import annotations

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

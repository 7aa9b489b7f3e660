"""The CLI's error edge: every exception becomes one plain line and a documented exit code.

Exit codes: 0 the run completed (or the command succeeded); 1 the run ended not completed
(failed, cancelled, compensated, waiting, or a cancel that found nothing to cancel); 2 a usage
or store error; 3 another live driver owns the run; 4 this driver lost its lease; 130 interrupted
by SIGINT (Ctrl-C); 143 stopped by SIGTERM. Without ``--debug`` (or ``RAYSAGA_DEBUG=1``) no
traceback is printed; user data is never read as rich markup.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
import traceback
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import click
import typer
from rich.console import Console
from rich.segment import Segment
from rich.text import Text

from raysaga.errors import DriverInterrupted, LeaseHeldError, LeaseLostError, RaySagaError, StoreOutageError
from raysaga.orchestrator.unrecorded import InterruptedBeforeRecorded, abandon_ray
from raysaga.state.redact import scrub_text

EXIT_OK, EXIT_NOT_COMPLETED, EXIT_USAGE, EXIT_LEASE_HELD, EXIT_LEASE_LOST = 0, 1, 2, 3, 4
EXIT_SIGINT, EXIT_SIGTERM, EXIT_BROKEN_PIPE = 130, 143, 141

#: What a terminal would act on in text that is user data (a step's error, a traceback, a run id):
#: C0 controls but tab and newline (ESC starts colour, cursor, clear-screen, title and clipboard
#: sequences; CR overwrites the line), DEL, C1 controls, and the bidi overrides that reorder text.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def visible(text: str) -> str:
    """``text`` with every control character shown escaped (``\\x1b``), never acted on."""
    return _CONTROLS.sub(_escaped, text)


class _Console(Console):
    """A console whose reader going away (``raysaga status RUN | head -1``) ends the command with
    exit 141, quietly, like ``status --json`` (rich's own default exits 1), and that never writes
    a control character it did not make itself: the text of every segment is shown escaped, only
    rich's own control segments (a live display's cursor moves) and styles reach the terminal."""

    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control or not _CONTROLS.search(segment.text)
            else Segment(visible(segment.text), segment.style, segment.control) for segment in buffer)

    def on_broken_pipe(self) -> None:
        self.quiet = True
        _silence_stdout()
        raise typer.Exit(EXIT_BROKEN_PIPE)


out = _Console(soft_wrap=True, highlight=False, emoji=False)
err = _Console(stderr=True, soft_wrap=True, highlight=False, emoji=False)

#: Longest message printed for an exception raysaga did not raise itself.
MAX_FOREIGN_MESSAGE = 500


class _Settings:
    debug: bool = False


settings = _Settings()


def debug_enabled() -> bool:
    return settings.debug or os.environ.get("RAYSAGA_DEBUG", "").strip().lower() in ("1", "true", "yes", "on")


def say(console: Console, *parts: str | tuple[str, str]) -> None:
    """Print plain text parts (or (text, style) pairs): never parsed as markup or emoji codes."""
    console.print(Text.assemble(*parts), highlight=False)


def _one_line(message: str, limit: int | None = None) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    if limit is not None and len(first) > limit:
        first = first[:limit] + " …"
    return first


def _fail(label: str, style: str, message: str, code: int, *, hint: bool = False) -> typer.Exit:
    # an exception's text can hold a key (a provider's error body, a URL with a password)
    message = scrub_text(message)
    if debug_enabled():
        sys.stderr.write(visible(scrub_text(traceback.format_exc())))
    if label:
        say(err, (label, style), " ", message)
    else:
        say(err, (message, style))
    if hint and not debug_enabled():
        say(err, "(run with --debug for the traceback)")
    return typer.Exit(code)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def interrupted_message(signal_name: str | None, run_id: str | None, recorded: bool = True) -> str:
    """``signal_name`` given: the driver settled and released its lease (DriverInterrupted).
    Not ``recorded``: the run did not exist yet (``unrecorded``), there is nothing to resume."""
    if not recorded:
        return (f"interrupted before run {run_id} was recorded: nothing ran; run the command again" if run_id
                else "interrupted before the run was recorded: nothing ran; run the command again")
    head = f"interrupted by {signal_name}: lease released" if signal_name else "interrupted"
    if run_id:
        return f"{head}; `raysaga resume {shlex.quote(run_id)}` continues it" if signal_name \
            else f"{head}: `raysaga resume {shlex.quote(run_id)}` continues it"
    return head


@contextmanager
def errors(current: object = None) -> Iterator[None]:
    """One-line messages and the documented exit codes instead of tracebacks. ``current``: an
    object whose ``run_id`` (read when the error happens) is the run this command drives, named in
    the message after a Ctrl-C."""
    try:
        yield
    except (typer.Exit, click.exceptions.Exit, click.ClickException, click.exceptions.Abort):
        raise
    except LeaseHeldError as exc:
        raise _fail("busy:", "yellow", str(exc), EXIT_LEASE_HELD) from None
    except LeaseLostError as exc:
        raise _fail("lease lost:", "red", str(exc), EXIT_LEASE_LOST) from None
    except DriverInterrupted as exc:
        run_id = getattr(current, "run_id", None)
        code = EXIT_SIGTERM if exc.signal_name == "SIGTERM" else EXIT_SIGINT
        raise _fail("", "yellow", interrupted_message(exc.signal_name, exc.run_id or run_id), code) from None
    except InterruptedBeforeRecorded as exc:  # Ray still starting: the run never existed
        abandon_ray()  # this process exits now: its Ray, which ran nothing, goes at once
        run_id = exc.run_id or getattr(current, "run_id", None)
        raise _fail("", "yellow", interrupted_message(None, run_id, recorded=False), EXIT_SIGINT) from None
    except KeyboardInterrupt:
        run_id = getattr(current, "run_id", None)
        raise _fail("", "yellow", interrupted_message(None, run_id), EXIT_SIGINT) from None
    except BrokenPipeError:  # `raysaga status --json | head`: the reader left; stop quietly
        _silence_stdout()
        raise typer.Exit(EXIT_BROKEN_PIPE) from None
    except StoreOutageError as exc:  # the store dropped out under a driver, which stopped as after a crash
        raise _fail("store unreachable:", "red", _outage_advice(exc.cause, exc.run_id), EXIT_USAGE) from None
    except RaySagaError as exc:
        raise _fail("error:", "red", str(exc), EXIT_USAGE) from None
    except RecursionError:
        raise _fail("error:", "red", "RecursionError: a value is nested too deeply to handle", EXIT_USAGE,
                    hint=True) from None
    except Exception as exc:  # anything else: one line, the type named, the traceback behind --debug
        message = _one_line(str(exc), MAX_FOREIGN_MESSAGE)
        run_id = getattr(current, "run_id", None)
        from raysaga.state.engine import is_outage, outage_cause  # sqlalchemy: only once something failed

        if run_id and is_outage(exc):  # as above, from a path that raised the driver's own error
            raise _fail("store unreachable:", "red", _outage_advice(outage_cause(exc), run_id), EXIT_USAGE) from None
        if is_outage(exc) and "database is locked" in outage_cause(exc):  # no run of its own (submit, approve..)
            raise _fail("store busy:", "red", _locked_advice(outage_cause(exc)), EXIT_USAGE) from None
        raise _fail("error:", "red", f"{type(exc).__name__}: {message}" if message else type(exc).__name__,
                    EXIT_USAGE, hint=True) from None


def _locked_advice(cause: str) -> str:
    """A command without a run of its own met SQLite's write lock held past the busy timeout: who
    holds it, that nothing was committed (the transaction never began writing), what to do."""
    from raysaga.state.engine import BUSY_TIMEOUT_MS

    return (f"{cause}: another process held the SQLite file's write lock for over {BUSY_TIMEOUT_MS / 1000:g} s "
            "(a long transaction, a backup, a sqlite3 shell); nothing was committed; try it again once the store "
            "answers (a submit with --run-id is safe to repeat)")


def _outage_advice(cause: str, run_id: str) -> str:
    return (f"{cause}; what was committed is intact: `raysaga resume {shlex.quote(run_id)}` continues the run "
            "once the store answers")

"""Stored rows back into records, and a row that cannot be read into one clear error.

A row changed outside raysaga (an unknown status, text that is not JSON, text that is not
UTF-8, a blob that no longer matches its digest) must fail only its own run, with one
``CorruptRecordError`` naming the run, the table and the column: never a pydantic traceback,
and never a failure of other runs. ``list`` goes further and still shows such a row, flagged.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import Any

from pydantic import ValidationError
from sqlalchemy import Connection, LargeBinary, Row, cast, select
from sqlalchemy.exc import DataError, OperationalError

from raysaga.errors import BlobIntegrityError, CorruptRecordError, RunNotFoundError
from raysaga.state import blob_rows
from raysaga.state.chunk_codec import ADVICE
from raysaga.state.models import RunRecord, RunStatus, RunSummary
from raysaga.state.schema import runs


def no_such_id(dialect: str, run_id: str) -> None:
    """Raise ``RunNotFoundError`` for a run id no row can hold: a lone surrogate is not UTF-8 and
    PostgreSQL text refuses NUL, so the look-up itself failed with a driver's raw encoding error
    (``UnicodeEncodeError``, psycopg's ``DataError``) instead of saying the run does not exist."""
    if not isinstance(run_id, str):
        return
    try:
        run_id.encode("utf-8")
    except UnicodeEncodeError:
        raise RunNotFoundError(run_id) from None
    if dialect == "postgresql" and "\x00" in run_id:
        raise RunNotFoundError(run_id)


@contextmanager
def reading(run_id: str, table: str) -> Iterator[None]:
    """Turn a stored row that cannot be read back into one ``CorruptRecordError`` naming the run,
    the table and the column: never a pydantic traceback, and never a failure of other runs."""
    try:
        yield
    except CorruptRecordError as exc:
        if str(exc).startswith("run "):
            raise
        raise CorruptRecordError(f"run {run_id!r}: {exc}{ADVICE}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        column = ".".join(str(p) for p in first["loc"])
        raise CorruptRecordError(f"run {run_id!r}: {table}.{column} is {short(first.get('input'))}: "
                                 f"{first['msg']}{ADVICE}") from None
    except OperationalError as exc:
        if undecodable(exc):
            raise CorruptRecordError(f"run {run_id!r}: {table} holds text that is not UTF-8 ({exc.orig})"
                                     f"{ADVICE}") from None
        if "malformed json" not in str(exc.orig).lower():  # (SQLite, the view reading a chunk's items)
            raise
        raise CorruptRecordError(f"run {run_id!r}: {table} holds text that is not JSON ({exc.orig}){ADVICE}") \
            from None
    except DataError as exc:  # PostgreSQL: a stored value that does not cast (the view reading a chunk's items)
        raise CorruptRecordError(f"run {run_id!r}: {table} holds a value of the wrong type "
                                 f"({str(exc.orig).splitlines()[0]}){ADVICE}") from None


def short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def undecodable(exc: OperationalError) -> bool:
    """Whether SQLite refused a result because a text column holds bytes that are not UTF-8."""
    return "could not decode" in str(exc.orig).lower()


def records(model: Any, rows: Sequence[Row[Any]]) -> list[Any]:
    if not rows:
        return []
    names = tuple(rows[0]._fields)  # (``Row._asdict`` per row was 6x the cost of a zip, measured at 10,000 rows)
    validate = model.model_validate
    return [validate(dict(zip(names, r, strict=True))) for r in rows]


def run_status(conn: Connection, run_id: str) -> RunStatus:
    """The run's status column only (never its input or output, which may be damaged blobs)."""
    row = conn.execute(select(runs.c.status).where(runs.c.run_id == run_id)).first()
    if row is None:
        raise RunNotFoundError(run_id)
    return status_of(run_id, row[0])


def status_of(run_id: str, stored: Any) -> RunStatus:
    """A stored status column as a ``RunStatus``; ``CorruptRecordError`` when it is not a run state."""
    with reading(run_id, runs.name):
        try:
            return RunStatus(stored)
        except ValueError:
            raise CorruptRecordError(f"raysaga_runs.status is {short(stored)}, not a run state") from None


def run_record(conn: Connection, row: Row[Any], *, lenient: bool = False) -> RunRecord:
    """A run row as its record, with its input and output read from their blobs when kept there.

    ``lenient``: a value whose blob is missing, altered or not JSON reads as None (its
    ``*_digest`` still names it) instead of raising; for status checks and operator commands
    on a damaged run, never for data a step receives."""
    return record_of(conn, row._asdict(), lenient=lenient)


def record_of(conn: Connection, values: dict[str, Any], *, lenient: bool = False) -> RunRecord:
    """``run_record`` of a row already as column -> value (``values`` is consumed)."""
    run_id = values["run_id"]
    output_key = values.pop("output_key", None)
    wanted = {values[f"{name}_digest"]: f"{name} of run {run_id!r}" for name in ("input", "output")
              if values[f"{name}_digest"]}
    if wanted:
        if lenient:
            found: dict[str, Any] = {}
            for digest, where in wanted.items():
                with suppress(BlobIntegrityError):
                    found.update(blob_rows.load(conn, {digest: where}))
        else:
            found = blob_rows.load(conn, wanted)
        for name in ("input", "output"):
            digest = values[f"{name}_digest"]
            if digest:
                values[name] = found.get(digest)
        if output_key is not None and values["output_digest"]:
            values["output"] = {output_key: values["output"]}
    with reading(run_id, runs.name):
        return RunRecord.model_validate(values)


# ---------------------------------------------------------------- run summaries (``list``)

#: The columns ``list`` reads: never a run's input, output or error.
SUMMARY = (runs.c.run_id, runs.c.workflow_name, runs.c.workflow_version, runs.c.status, runs.c.status_reason,
           runs.c.created_at, runs.c.updated_at, runs.c.lease_owner, runs.c.lease_expires_at)
_TEXT_SUMMARY = ("run_id", "workflow_name", "workflow_version", "status", "status_reason", "lease_owner")
_STATES = frozenset(s.value for s in RunStatus)


def summary(values: dict[str, Any]) -> RunSummary:
    """A summary row as a ``RunSummary``; what cannot be read is replaced and named in ``corrupt``."""
    problem = values.pop("corrupt", None)
    status = values["status"]
    if status not in _STATES:
        problem = problem or f"raysaga_runs.status is {status!r}, not a run state"
        values["status"] = None
    for name in ("created_at", "updated_at"):
        if isinstance(values[name], bool) or not isinstance(values[name], int | float):
            problem = problem or f"raysaga_runs.{name} is {values[name]!r}, not a time"
            values[name] = 0.0
    if values["lease_expires_at"] is not None and not isinstance(values["lease_expires_at"], int | float):
        problem = problem or f"raysaga_runs.lease_expires_at is {values['lease_expires_at']!r}, not a time"
        values["lease_expires_at"] = None
    for name in ("run_id", "workflow_name", "workflow_version"):
        if not isinstance(values[name], str):
            problem = problem or f"raysaga_runs.{name} is {values[name]!r}, not text"
            values[name] = str(values[name])
    for name in ("status_reason", "lease_owner"):
        if values[name] is not None and not isinstance(values[name], str):
            problem = problem or f"raysaga_runs.{name} is {values[name]!r}, not text"
            values[name] = str(values[name])
    return RunSummary.model_validate({**values, "corrupt": problem})


def summary_as_bytes(query: Any) -> Any:
    """``query`` with its text summary columns read as raw bytes (SQLite: CAST AS BLOB)."""
    cols = [cast(c, LargeBinary).label(c.name) if c.name in _TEXT_SUMMARY else c for c in SUMMARY]
    return query.with_only_columns(*cols)


def decode_summary(values: dict[str, Any]) -> dict[str, Any]:
    """A summary row read as bytes, decoded; a column that is not UTF-8 sets ``corrupt``."""
    problem = None
    for name in _TEXT_SUMMARY:
        raw = values[name]
        if isinstance(raw, bytes | bytearray | memoryview):
            try:
                values[name] = bytes(raw).decode("utf-8")
            except UnicodeDecodeError:
                values[name] = bytes(raw).decode("utf-8", "replace")
                problem = problem or f"raysaga_runs.{name} holds bytes that are not UTF-8 text"
    values["corrupt"] = problem
    return values

"""Errors at rest: the JSON object a failed node or run keeps in its ``error`` column.

``ErrorRecord`` types what raysaga writes there (a failed attempt's type, message, traceback
and classification; why a node was settled without running; which node failed a run; a
rollback's report) and keeps anything else it finds (``extra="allow"``), so every stored shape
reads back. Its dump is the stored object exactly, key for key: fields never set stay absent
(not ``null``), and values are never coerced (the fields are strict), so giving errors a type
needed no migration, and rows written before read back and round-trip unchanged.

It also reads as the read-only mapping it is stored as (``error["type"]``, ``error.get(...)``,
``{**error}``, ``error == {...}``), as it did when records held plain dicts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    model_serializer,
)

from raysaga.state import jsoncodec


class ErrorRecord(BaseModel, Mapping[str, Any]):
    """A stored error: every field optional, unknown keys kept as they are."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    type: str | None = None
    """The exception's class name, or raysaga's name for the failure (``Cancelled``,
    ``FanOutPolicy``, ``BlobIntegrityError``, ``MaxTurns``, ``DeadlineExceeded``...)."""
    message: str | None = None
    """What went wrong, scrubbed of secrets and cut to 2,000 characters."""
    transient: bool | None = None
    """The attempt failed on an error classified transient: it may have taken effect."""
    took_effect: bool | None = None
    """The step's function returned, so its effect took place, but what it returned was refused
    (not its declared type, no JSON form, above the output cap): a rollback undoes it."""
    reason: str | None = None
    """Why the node was settled as it was (``3 attempts exhausted``, ``retry budget exhausted``,
    ``upstream step 'x' failed``, ``not sent: the run failed``)."""
    traceback: str | None = None
    """The last frames of the attempt's traceback, scrubbed."""
    node: str | None = None
    """The node the error is about: a run's failed critical node, the node of a damaged blob, a
    compensation that failed (in ``failed_compensations``)."""
    digest: str | None = None
    """A blob that is missing or altered (with ``problem``: what is wrong with it)."""
    problem: str | None = None
    verdict: str | None = None
    """A fan-out policy's verdict that failed its step."""
    item: int | None = None
    """A fan-out's row: the index of the item whose failure failed the step (its error is
    ``cause``), so a resume settles the step as that failure did."""
    failed_compensations: list[ErrorRecord] | None = None
    """A rollback's report: each compensation that failed for good, with its error."""
    blocked_compensations: list[str] | None = None
    """A rollback's report: the nodes not compensated because they wait on a failed one."""
    cause: ErrorRecord | None = None
    """A rollback's report: the run's error when the rollback started. A fan-out's row: the
    error of its failed ``item``."""

    @model_serializer(mode="wrap")
    def _as_stored(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        # the stored object has only the keys that were given (a field never set is absent), in
        # the order a stored object reads back in (canonical JSON sorts its keys)
        data: dict[str, Any] = handler(self)
        given = self.model_fields_set
        return {k: data[k] for k in sorted(data) if k in given or k not in ErrorRecord.model_fields}

    def as_dict(self) -> dict[str, Any]:
        """The stored JSON object (a new dict each call)."""
        return self.model_dump()

    def __repr_args__(self) -> Iterator[tuple[str, Any]]:
        return iter(self.as_dict().items())  # what is stored, not a None for every field never set

    def __getitem__(self, key: str) -> Any:
        return self.as_dict()[key]

    def __iter__(self) -> Iterator[str]:  # type: ignore[override]  # a mapping's keys, not pydantic's pairs
        return iter(self.as_dict())

    def __len__(self) -> int:
        return len(self.as_dict())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.as_dict() == dict(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(jsoncodec.dumps(self.as_dict()))


def as_error(value: ErrorRecord | Mapping[str, Any] | None) -> ErrorRecord | None:
    """``value`` as an ``ErrorRecord`` (a mapping is validated; None stays None)."""
    if value is None or isinstance(value, ErrorRecord):
        return value
    return ErrorRecord.model_validate(dict(value))


def stored_error(value: ErrorRecord | Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The JSON object an error is stored as (None: SQL NULL)."""
    record = as_error(value)
    return None if record is None else record.as_dict()


def _to_record(value: Any) -> Any:
    return as_error(value) if isinstance(value, Mapping) else value


#: The type of a write's ``error``: an ``ErrorRecord``, or a dict made into one.
ErrorInput = Annotated[ErrorRecord | dict[str, Any] | None, BeforeValidator(_to_record)]

"""An approval's answer checked against its JSON Schema, as the answer model will read it.

The store holds the schema (``ApprovalRequest.answer_schema``), not the model: any process checks
an answer with no workflow code. Two ways the schema was looser than the model:

* JSON Schema counts 1.0 and -0.0 as integers, but the answer reaches the step as written: a
  model's ``amount: int`` got the float 1.0 (``_whole_integers``: an int only);
* jsonschema ignores ``format`` unless given a format checker: ``{"ship_on": "next tuesday"}``
  for a ``date`` was accepted, the decision used up, and the step after the approval failed with
  pydantic's raw text. The checker here reads ``date-time``, ``date``, ``time``, ``duration`` and
  ``uuid`` strings with pydantic, as the answer model does (jsonschema's own ``date-time`` check
  needs the ``rfc3339-validator`` package, not installed: pydantic's rule is the one that counts);
  the other formats are jsonschema's built-in checks (``email``, ``ipv4``, ``ipv6``, ``regex``...;
  ``uri`` needs ``rfc3987``, so a ``uri`` format is not checked).
"""

from __future__ import annotations

import datetime
import functools
import uuid
from collections.abc import Callable
from typing import Any

from pydantic import ValidationError

from raysaga.state.type_adapters import type_adapter

#: JSON Schema formats pydantic writes, by the Python type its models read them as.
PYDANTIC_FORMATS: dict[str, Any] = {"date-time": datetime.datetime, "date": datetime.date, "time": datetime.time,
                                    "duration": datetime.timedelta, "uuid": uuid.UUID}


def validate_answer(answer: Any, schema: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` if ``answer`` does not fit ``schema`` (formats checked)."""
    import jsonschema  # only when an answer is given

    jsonschema.validate(answer, schema, cls=_whole_integers(schema), format_checker=_format_checker())


def _reads_as(tp: Any) -> Callable[[Any], bool]:
    def check(instance: Any) -> bool:
        if not isinstance(instance, str):  # a format constrains strings only
            return True
        try:
            type_adapter(tp).validate_python(instance)
        except ValidationError:
            return False
        return True

    return check


@functools.cache
def _format_checker() -> Any:
    import jsonschema

    checker = jsonschema.FormatChecker()
    for name, tp in PYDANTIC_FORMATS.items():
        checker.checks(name)(_reads_as(tp))
    return checker


def _whole_integers(schema: dict[str, Any]) -> Any:
    """The schema's validator class, where "integer" is an int only. JSON Schema counts 1.0 and
    -0.0 as integers, but the answer reaches the step as written: a model's ``amount: int`` got
    the float 1.0 (the store holds no model to turn it into 1, so it refuses it instead)."""
    import jsonschema

    base = jsonschema.validators.validator_for(schema)
    found = _STRICT.get(base)
    if found is None:
        checker = base.TYPE_CHECKER.redefine(
            "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
        found = _STRICT[base] = jsonschema.validators.extend(base, type_checker=checker)  # type: ignore[no-untyped-call]
    return found


#: ``_whole_integers`` by the jsonschema validator class it extends (one per draft).
_STRICT: dict[Any, Any] = {}

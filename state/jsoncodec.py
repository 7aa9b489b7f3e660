"""Strict, canonical JSON: the only format raysaga writes at rest.

Python's ``json`` happily writes ``NaN``, turns tuples into lists silently and encodes lone
surrogates that no other JSON reader accepts. Values here are checked first, so a bad
value is a clear error naming where it sits, not a corrupt row.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from typing import Any

from pydantic import BaseModel

from raysaga.errors import NotJSONableError
from raysaga.state.json_form import model_json, read_back_problem

JSONValue = Any  # None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]

#: Deeper values are refused: real data is never this deep, and hostile data must not blow the stack.
MAX_DEPTH = 100


def to_jsonable(value: Any, where: str = "value", nested: int = 0) -> JSONValue:
    """Return ``value`` as plain JSON data, or raise naming the offending path.

    Pydantic models are dumped in JSON mode (their declared types decide); everything else
    must already be JSON: no sets, bytes, arbitrary objects, NaN/inf or lone surrogates.
    ``nested``: how deep the value will sit in what is stored (its depth counts from there).
    """
    if isinstance(value, BaseModel):
        value = _model_json(value, where)
    return _check(value, where, nested)


def _model_json(model: BaseModel, where: str) -> JSONValue:
    """``model_dump(mode="json")`` by alias, computed fields left out (``json_form.model_json``: the
    form that reads back as the model), refusing the NaN and infinities it would quietly turn into null.

    Pydantic writes a non-finite float held by an ``Any`` field (``dict[str, Any]``, ``list[Any]``...)
    as ``None`` (its ``ser_json_inf_nan="null"`` default), where a typed ``float`` field keeps it:
    a step returning ``Report(data={"mean": nan})`` stored ``null`` with no error, downstream saw a
    missing value, while a bare NaN was refused. A model that sets ``ser_json_inf_nan`` itself asked
    for what it gets; otherwise a dump holding a null is looked at again in Python mode."""
    dumped = model_json(model)
    if "ser_json_inf_nan" not in model.model_config and _holds_null(dumped, 0):
        try:
            python = model.model_dump(mode="python")
        except Exception:  # a serializer written for JSON mode only: nothing more to look at
            return dumped
        _refuse_non_finite(python, where, 0)
    return dumped


def _holds_null(value: Any, depth: int) -> bool:
    if value is None:
        return True
    if depth > MAX_DEPTH:
        return False  # refused as too deep by _check
    if isinstance(value, dict):
        return any(_holds_null(v, depth + 1) for v in value.values())
    if isinstance(value, list):
        return any(_holds_null(v, depth + 1) for v in value)
    return False


def refuse_non_finite(value: Any, where: str) -> None:
    """``NotJSONableError`` naming where ``value`` (a Python value, before any JSON form is made of
    it) holds a NaN or an infinity: pydantic's JSON mode writes them as null, quietly."""
    _refuse_non_finite(value, where, 0)


def _refuse_non_finite(value: Any, where: str, depth: int) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise NotJSONableError(f"{_bounded(where)} is {value!r}: JSON has no NaN or infinity; use None or a string")
    if depth > MAX_DEPTH:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_non_finite(item, f"{where}[{key!r}]", depth + 1)
    elif isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            _refuse_non_finite(item, f"{where}[{i}]", depth + 1)


#: A path in a message is cut to its first and last this-many characters (a deep value with long
#: keys has a path of megabytes: the message stays one readable line).
PATH_SHOWN = 200


def _bounded(where: str) -> str:
    if len(where) <= 2 * PATH_SHOWN + 5:
        return where
    return f"{where[:PATH_SHOWN]} ... {where[-PATH_SHOWN:]}"


def _check(value: Any, where: str, depth: int) -> JSONValue:
    if value is None or isinstance(value, bool | int):
        if isinstance(value, int) and value.bit_length() > _LONG_INT_BITS:
            _check_int_digits(value, where)
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise NotJSONableError(f"{_bounded(where)} is {value!r}: JSON has no NaN or infinity; use None or a string")
        return value
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise NotJSONableError(
                f"{_bounded(where)} holds a lone surrogate at index {exc.start}: it is not valid UTF-8 text"
            ) from None
        return value
    if depth >= MAX_DEPTH and isinstance(value, list | tuple | dict):
        raise NotJSONableError(f"{_bounded(where)} is nested deeper than {MAX_DEPTH} levels")
    if isinstance(value, list | tuple):
        return [_check(item, f"{where}[{i}]", depth + 1) for i, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, JSONValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise NotJSONableError(
                    f"{_bounded(where)} has key {key!r} of type {type(key).__name__}: keys must be str")
            _check(key, f"{where} key", depth + 1)
            out[key] = _check(item, f"{where}[{key!r}]", depth + 1)
        return out
    if isinstance(value, BaseModel):  # in a list or a dict: read back as its own type, where it is made
        form = _check(_model_json(value, where), where, depth)
        problem = read_back_problem(type(value), value, form, _bounded(where), unreadable=False)
        if problem:  # (a set in its Any field became a list, an int key a str: silently, to its reader)
            raise NotJSONableError(problem)
        return form
    raise NotJSONableError(
        f"{_bounded(where)} is a {type(value).__name__}, which is not JSON: return a pydantic model, "
        "a dict, a list, a str, a number, a bool or None"
    )


#: Below this many bits an int has fewer than Python's default 4300 digits: only a longer one is tried.
_LONG_INT_BITS = 14_000


def _check_int_digits(value: int, where: str) -> None:
    """Refuse an int too long for Python to write as text (``sys.get_int_max_str_digits``): its
    write raised a bare ``ValueError`` that named neither the value nor the step (a step failed
    with it; a run input with it was no ``InvalidInputError``), and no reader could parse it back."""
    try:
        str(value)
    except ValueError:
        raise NotJSONableError(f"{_bounded(where)} is an integer of more than {sys.get_int_max_str_digits()} "
                               "digits: store it as a string (str(n)), or its digits elsewhere") from None


# one encoder: json.dumps with any keyword argument builds a new JSONEncoder per call
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _plain(value: Any, depth: int) -> bool:
    """Whether ``value`` is already plain JSON that ``to_jsonable`` would return unchanged: only
    exact ``dict``/``list``/``str``/``int``/finite ``float``/``bool``/None, str keys, valid UTF-8,
    at most ``MAX_DEPTH`` deep. No path strings are built (those are for the error, made by ``_check``)."""
    if value is None or value is True or value is False:
        return True
    kind = type(value)
    if kind is int:
        return True
    if kind is str:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True
    if kind is float:
        return math.isfinite(value)
    if depth >= MAX_DEPTH:
        return False
    if kind is dict:
        return all(type(key) is str and _plain(key, depth) and _plain(item, depth + 1) for key, item in value.items())
    if kind is list:
        # numbers and None checked in line: a wide fan-out's lists (its plan's output, the item
        # indexes of its events) hold 10,000s of them, and a call each cost ~3x the check
        for item in value:
            if item is None or type(item) is int or type(item) is bool:
                continue
            if not _plain(item, depth + 1):
                return False
        return True
    return False


def printable(text: str) -> str:
    """``text`` as UTF-8 (so JSON and a text column) can hold it: a lone surrogate (an exception's
    message, an operator's reason or comment) becomes its escape, ``\\ud800``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class JSONText(str):
    """JSON text its producer made canonical and checked already: a JSON column stores it as it
    is (``statements.json_param``), not dumped again (a run's output, whose sink outputs are each
    checked as the node outputs they are: ``run_values``)."""


def dumps(value: Any, where: str = "value", nested: int = 0) -> str:
    """Canonical JSON text (sorted keys, no spaces) of a checked value; ``nested``: how many levels
    deep it will also sit in another stored value (a fan-out item's output in its step's result),
    which its own depth must leave room for."""
    if _plain(value, nested):  # the common case, checked without building the paths an error would name
        try:
            return _ENCODER.encode(value)
        except ValueError:  # an int too long to write as text: to_jsonable names it
            pass
    return _ENCODER.encode(to_jsonable(value, where, nested))


def encode_plain(value: Any) -> str:
    """Canonical JSON text of a value raysaga built itself from parts known to be plain JSON (an
    item chunk: finite floats, ints, JSON text as str, None), without ``dumps``' walk over it that
    checks a caller's value: on a wide fan-out's commit the walk cost a quarter of the encoding."""
    return _ENCODER.encode(value)


def _no_constants(name: str) -> Any:
    raise NotJSONableError(f"JSON constant {name} is not allowed")


# one decoder: json.loads with any keyword argument builds a new JSONDecoder per call (~15 us)
_DECODER = json.JSONDecoder(parse_constant=_no_constants)


def loads(text: str | bytes) -> JSONValue:
    """Parse JSON, refusing NaN/Infinity constants."""
    if isinstance(text, bytes | bytearray):
        text = text.decode(json.detect_encoding(text), "surrogatepass")  # as json.loads does
    return _DECODER.decode(text)  # anything else but str raises TypeError, as json.loads does (SQLAlchemy relies on it)


def digest(data: bytes) -> str:
    """Content address of a blob."""
    return "sha256:" + hashlib.sha256(data).hexdigest()


def fingerprint(value: Any) -> str:
    """Short stable hash of a JSON value (idempotency keys, argument digests)."""
    return hashlib.sha256(dumps(value).encode("utf-8")).hexdigest()

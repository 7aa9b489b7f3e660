"""pydantic's validation errors as one short, bounded line: a run's input that does not match its
workflow (``run``, ``submit``, ``fork``, the Python API), a step's output or input that is not
its declared type.

Why its own module: the CLI formats an input's mismatch before any workflow is loaded, and must
not import the DSL (networkx) for it (``tests/test_public_api.py``).
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from raysaga.orchestrator.secrets import Secret, SecretValueError
from raysaga.state.redact import scrub_text

#: Problems a mismatch names (then "and N more"), and the characters shown of each part of one.
MAX_PROBLEMS = 20
MAX_GOT = 60
MAX_WHERE = 100
MAX_MSG = 200


def mismatch(workflow: str, tp: Any, exc: ValidationError) -> str:
    """``input does not match Order of workflow 'w': sku: Input should be a valid string (got 5)``:
    one short form for ``run``, ``submit``, ``fork`` and the Python API. pydantic's own error list
    repeats each bad value whole (a fork's 100 KB patch made a 100 KB line): here every part is cut."""
    return (f"input does not match {type_name(tp)} of workflow {workflow!r}: "
            f"{problems(exc, holds_secret(tp))}")


def type_name(tp: Any) -> str:
    """``tp`` as a message shows it: ``list[Annotated[int, Field(gt=0)]]``, not ``list`` or ``Annotated``."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Annotated:
        return f"Annotated[{type_name(args[0])}, {', '.join(_metadata(m) for m in args[1:])}]"
    if origin is None or not args or origin is typing.Literal:
        return getattr(tp, "__name__", None) if isinstance(tp, type) else str(tp).replace("typing.", "")  # type: ignore[return-value]
    if origin in (typing.Union, types.UnionType):
        return " | ".join("None" if a is type(None) else type_name(a) for a in args)
    inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
    return f"{getattr(origin, '__name__', None) or str(origin).replace('typing.', '')}[{inner}]"


def _metadata(meta: Any) -> str:
    """An ``Annotated`` constraint in short: ``Field(gt=0, le=100)``, ``AfterValidator(upper)``."""
    if isinstance(meta, FieldInfo):
        return f"Field({', '.join(_metadata(m).partition('(')[2].rstrip(')') for m in meta.metadata)})"
    func = getattr(meta, "func", None)
    if func is not None:
        return f"{type(meta).__name__}({getattr(func, '__qualname__', None) or repr(func)})"
    shown = repr(meta)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def problems(exc: ValidationError, secret_inside: bool = False) -> str:
    """pydantic's errors as ``field: problem (got value)`` joined by "; ", at most ``MAX_PROBLEMS``. The
    value of a ``Secret`` field (``{"pin": 4817}``: a PIN as a number) is left out, as is, when the type
    holds a Secret (``secret_inside``), the whole input's and any object's or list's: either may hold one."""
    errors = exc.errors(include_url=False)
    # a Secret field's place (without a union's branch tag): its other branches' errors show the value too
    secret_locs = [_field_loc(e.get("loc", ())) for e in errors
                   if isinstance((e.get("ctx") or {}).get("error"), SecretValueError)]
    shown = []
    for e in errors[:MAX_PROBLEMS]:
        loc = tuple(e.get("loc", ()))
        where = _cut(".".join(str(p) for p in loc), MAX_WHERE) or "(the input)"
        got = e.get("input")
        hide = any(loc[:len(s)] == s for s in secret_locs) or (
            secret_inside and (not loc or isinstance(got, dict | list | tuple)))
        value = "" if got is None or e.get("type") == "missing" else _kind(got) if hide else _preview(got)
        shown.append(f"{where}: {_cut(str(e.get('msg', 'invalid')), MAX_MSG)}" + (f" (got {value})" if value else ""))
    if len(errors) > MAX_PROBLEMS:
        shown.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return "; ".join(shown)


def _field_loc(loc: Any) -> tuple[Any, ...]:
    """``loc`` without the union branch tags at its end (``('pin', 'function-plain[_validate()]')``)."""
    place: tuple[Any, ...] = tuple(loc)
    while place and isinstance(place[-1], str) and "[" in place[-1]:
        place = place[:-1]
    return place


def _kind(value: Any) -> str:
    """What a value is, never what it says (``a number``)."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an object" if isinstance(value, dict) else "a list" if isinstance(value, list | tuple) else "a value"


def holds_secret(tp: Any, seen: frozenset[int] = frozenset()) -> bool:
    """Whether type ``tp`` has a ``Secret`` anywhere in it (a field, an item, a union's member)."""
    if tp is Secret:
        return True
    if id(tp) in seen or len(seen) > 50:
        return False
    seen |= {id(tp)}
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return any(holds_secret(f.annotation, seen) for f in tp.model_fields.values())
    if (dataclasses.is_dataclass(tp) and isinstance(tp, type)) or typing.is_typeddict(tp):
        try:
            hints = typing.get_type_hints(tp)
        except Exception:  # a hint pydantic resolved and typing cannot: hide values (the safe side)
            return True
        return any(holds_secret(h, seen) for h in hints.values())
    return any(holds_secret(arg, seen) for arg in typing.get_args(tp))


def _preview(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (ValueError, TypeError, RecursionError):  # a circular value, an odd object
        text = object.__repr__(value)
    return _cut(scrub_text(text[: MAX_GOT * 4]), MAX_GOT)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

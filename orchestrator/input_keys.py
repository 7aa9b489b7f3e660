"""The keys of a run's input that its type does not declare, which pydantic drops without a word.

A model whose ``extra`` is not set (pydantic's default: ignore) drops a key it does not know, so a
misspelt field (``{"dealy": 0}``) left ``delay`` at its default and the run went on with it.
``unknown_keys`` finds those keys, walking the input as given beside the value pydantic made of it
(the value says which model a union chose); ``run_input.check_input`` refuses them, naming the
fields there are and the closest one, as ``approve --answer`` refuses an answer's. A model (or a
dataclass, a TypedDict) that sets ``extra`` itself (``"allow"``, ``"ignore"``) keeps its behaviour;
so does one whose validators may rename keys (a ``mode="before"`` model validator).
"""

from __future__ import annotations

import collections.abc
import dataclasses
import difflib
import functools
import typing
from dataclasses import dataclass
from typing import Any

import typing_extensions
from pydantic import AliasChoices, AliasPath, BaseModel, RootModel
from pydantic.fields import FieldInfo
from pydantic.functional_validators import BeforeValidator, PlainValidator, WrapValidator

from raysaga.orchestrator.input_errors import MAX_PROBLEMS, MAX_WHERE, type_name
from raysaga.state.redact import scrub_text

#: Levels of the input walked: a deeper one is left to pydantic (a self-referencing model).
MAX_DEPTH = 100
#: Field names a refusal lists (then "and N more").
MAX_FIELDS = 30
_REWRITES = (BeforeValidator, PlainValidator, WrapValidator)


@dataclass(frozen=True)
class Unknown:
    """Keys of the object at ``where`` that its type ``owner`` does not declare, and the keys it takes."""

    where: tuple[Any, ...]
    owner: Any
    keys: tuple[Any, ...]
    fields: tuple[str, ...]


def unknown_keys(tp: Any, given: Any, made: Any) -> list[Unknown]:
    """The objects of input ``given`` (validated as ``tp`` into ``made``) holding keys their type
    does not declare and would drop; at most ``MAX_PROBLEMS`` + 1 (the last says "and more")."""
    found: list[Unknown] = []
    _walk(tp, given, made, (), found, 0)
    return found


def message(workflow: str, tp: Any, found: list[Unknown]) -> str:
    """``input does not match In of workflow 'slow': unknown key 'dealy' (did you mean 'delay'?),
    where In declares n, delay, text. ...``: each object's unknown keys, then what to do."""
    parts = []
    for place in found[:MAX_PROBLEMS]:
        keys = [_key(k, place.fields) for k in place.keys[:MAX_PROBLEMS]]
        if len(place.keys) > MAX_PROBLEMS:
            keys.append(f"{len(place.keys) - MAX_PROBLEMS} more")
        where = scrub_text(".".join(str(p) for p in place.where))
        where = where if len(where) <= MAX_WHERE else where[:MAX_WHERE - 3] + "..."
        fields = ", ".join(place.fields[:MAX_FIELDS]) + (
            f" and {len(place.fields) - MAX_FIELDS} more" if len(place.fields) > MAX_FIELDS else "")
        parts.append(f"{where + ': ' if where else ''}unknown key{'s' if len(place.keys) > 1 else ''} "
                     f"{_joined(keys)}, where {type_name(place.owner)} declares {fields or 'no keys'}")
    if len(found) > MAX_PROBLEMS:
        parts.append("and more objects")
    owners = {place.owner for place in found}
    owner = next(iter(owners)) if len(owners) == 1 else None
    model = owner is None or (isinstance(owner, type) and issubclass(owner, BaseModel))
    config, close = ("model_config = ConfigDict", "") if model else ("@pydantic.with_config(ConfigDict", ")")
    return (f"input does not match {type_name(tp)} of workflow {workflow!r}: {'; '.join(parts)}. pydantic would "
            "drop such a key, and its field would keep its default: fix the key, or set extra on "
            f"{'the type' if owner is None else type_name(owner)} to take such keys on purpose "
            f"({config}(extra=\"ignore\"){close} drops them, extra=\"allow\" keeps them)")


def _joined(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _key(key: Any, fields: tuple[str, ...]) -> str:
    shown = scrub_text(repr(key))
    shown = shown if len(shown) <= 60 else shown[:57] + "..."
    if not isinstance(key, str):
        return shown
    lowered = {f.lower(): f for f in fields}
    close = difflib.get_close_matches(key.lower(), list(lowered), n=1)
    return f"{shown} (did you mean {lowered[close[0]]!r}?)" if close else shown


#: Types whose values hold no key to check: a list of them is not walked item by item (a review:
#: ``list[int]`` of 1M items took 2.2 s to walk, 0.5 s to validate).
_KEYLESS = frozenset({int, float, str, bool, bytes, type(None), Any})


def _keyless(tp: Any) -> bool:
    """Whether no value of ``tp`` can hold a key (a scalar, or a list, tuple or set of scalars)."""
    try:
        if tp in _KEYLESS:
            return True
    except TypeError:  # (an unhashable annotation)
        return False
    origin = typing.get_origin(tp)
    if origin in (list, tuple, set, frozenset, collections.abc.Sequence):
        return all(a is Ellipsis or _keyless(a) for a in typing.get_args(tp))
    return origin is typing.Literal


def _walk(tp: Any, given: Any, made: Any, where: tuple[Any, ...], found: list[Unknown], depth: int) -> None:
    if depth > MAX_DEPTH or len(found) > MAX_PROBLEMS or given is None or _keyless(tp):
        return
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *meta = typing.get_args(tp)
        if not any(isinstance(m, _REWRITES) for m in meta):  # a validator that may rewrite the value: left alone
            _walk(base, given, made, where, found, depth)
        return
    if isinstance(made, BaseModel):  # (a union's branch, a subclass: the model pydantic made)
        _model(type(made), given, made, where, found, depth)
    elif dataclasses.is_dataclass(made) and not isinstance(made, type):
        _dataclass(type(made), given, made, where, found, depth)
    elif typing_extensions.is_typeddict(tp):
        _typeddict(tp, given, made, where, found, depth)
    elif origin in (typing.Union, _UnionType):
        branches = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(branches) == 1:  # ``X | None``; another union's branch is not known from a plain value
            _walk(branches[0], given, made, where, found, depth)
    elif origin in (list, tuple, collections.abc.Sequence, collections.abc.MutableSequence):
        _items(tp, origin, given, made, where, found, depth)
    elif origin in (dict, collections.abc.Mapping, collections.abc.MutableMapping):
        args = typing.get_args(tp)
        if len(args) == 2 and isinstance(given, collections.abc.Mapping) and isinstance(made, dict) \
                and len(given) == len(made):  # (pydantic keeps the order of the keys)
            for (key, value), kept in zip(given.items(), made.values(), strict=True):
                _walk(args[1], value, kept, (*where, key), found, depth + 1)


_UnionType = type(int | str)


def _items(tp: Any, origin: Any, given: Any, made: Any, where: tuple[Any, ...], found: list[Unknown],
           depth: int) -> None:
    if not isinstance(given, list | tuple) or not isinstance(made, list | tuple) or len(given) != len(made):
        return
    args = typing.get_args(tp)
    if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
        types = list(args) if len(args) == len(given) else []
    else:
        types = [args[0] if args else Any] * len(given)
    for i, (item_tp, item, kept) in enumerate(zip(types, given, made, strict=False)):
        _walk(item_tp, item, kept, (*where, i), found, depth + 1)


def _model(cls: type[BaseModel], given: Any, made: BaseModel, where: tuple[Any, ...], found: list[Unknown],
           depth: int) -> None:
    decorators = cls.__pydantic_decorators__
    if any(d.info.mode in ("before", "wrap") for d in decorators.model_validators.values()):
        return  # it may rename or drop keys before the fields see them
    if isinstance(made, RootModel):
        _walk(cls.model_fields["root"].annotation, given, made.root, where, found, depth)
        return
    if not isinstance(given, collections.abc.Mapping):
        return  # a model instance given as it is: it holds no key it does not declare
    taken, walked = _model_keys(cls)
    if "extra" not in cls.model_config:
        _note(cls, given, taken, where, found)
    for key, value in given.items():
        own = taken.get(key) if isinstance(key, str) else None
        if own is not None and own in walked:
            _walk(cls.model_fields[own].annotation, value, getattr(made, own, None), (*where, key), found,
                  depth + 1)


@functools.lru_cache(maxsize=256)
def _model_keys(cls: type[BaseModel]) -> tuple[dict[str, str], frozenset[str]]:
    """Each key the model takes with its field, and the fields whose values are walked (none a
    validator may rewrite, none that holds no key): once per model, not once per object of it."""
    config = cls.model_config
    by_alias = config.get("validate_by_alias", True)
    by_name = config.get("validate_by_name", config.get("populate_by_name", False))
    taken: dict[str, str] = {}
    for name, field in cls.model_fields.items():
        aliases = _aliases(field)
        if not aliases or by_name:
            taken[name] = name
        if by_alias:
            taken.update(dict.fromkeys(aliases, name))
    decorators = cls.__pydantic_decorators__
    rewritten = {f for d in decorators.field_validators.values() if d.info.mode != "after" for f in d.info.fields}
    walked = frozenset() if "*" in rewritten else frozenset(
        name for name, field in cls.model_fields.items() if name not in rewritten
        and not any(isinstance(m, _REWRITES) for m in field.metadata) and not _keyless(field.annotation))
    return taken, walked


def _dataclass(cls: type, given: Any, made: Any, where: tuple[Any, ...], found: list[Unknown], depth: int) -> None:
    if not isinstance(given, collections.abc.Mapping):
        return
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except Exception:  # a hint pydantic resolved and typing cannot: left to pydantic
        return
    taken: dict[str, str] = {}
    pyd_fields: dict[str, FieldInfo] = getattr(cls, "__pydantic_fields__", None) or {}
    for f in dataclasses.fields(cls):
        taken[f.name] = f.name  # (a pydantic dataclass's alias is taken too: the lenient side)
        if f.name in pyd_fields:
            taken.update(dict.fromkeys(_aliases(pyd_fields[f.name]), f.name))
    taken.update({name: name for name, hint in hints.items() if isinstance(hint, dataclasses.InitVar)})
    if "extra" not in (getattr(cls, "__pydantic_config__", None) or {}):
        _note(cls, given, taken, where, found)
    for key, value in given.items():
        name = taken.get(key) if isinstance(key, str) else None
        if name is not None and name in hints:
            _walk(hints[name], value, getattr(made, name, None), (*where, key), found, depth + 1)


def _typeddict(tp: Any, given: Any, made: Any, where: tuple[Any, ...], found: list[Unknown], depth: int) -> None:
    if not isinstance(given, collections.abc.Mapping) or not isinstance(made, dict):
        return
    try:
        hints = typing.get_type_hints(tp, include_extras=True)
    except Exception:
        return
    config = getattr(tp, "__pydantic_config__", None) or {}
    if config.get("alias_generator") is not None:
        return  # its keys are what the generator makes of its fields': left to pydantic
    taken: dict[str, str] = {}  # by name and by alias (the lenient side), as a model's
    for name, hint in hints.items():
        taken[name] = name
        info = _field_info(_required_stripped(hint))
        if info is not None:
            taken.update(dict.fromkeys(_aliases(info), name))
    if "extra" not in config:
        _note(tp, given, taken, where, found)
    for key, value in given.items():
        own = taken.get(key) if isinstance(key, str) else None
        if own is not None:
            _walk(_required_stripped(hints[own]), value, made.get(own), (*where, key), found, depth + 1)


def _field_info(hint: Any) -> FieldInfo | None:
    """The ``Field(...)`` of an ``Annotated`` TypedDict key (its alias), if any."""
    if typing.get_origin(hint) is typing.Annotated:
        return next((m for m in typing.get_args(hint)[1:] if isinstance(m, FieldInfo)), None)
    return None


def _required_stripped(hint: Any) -> Any:
    """A TypedDict key's type without ``Required`` / ``NotRequired`` / ``ReadOnly`` around it."""
    while getattr(typing.get_origin(hint), "_name", None) in ("Required", "NotRequired", "ReadOnly"):
        hint = typing.get_args(hint)[0]
    return hint


def _note(owner: Any, given: collections.abc.Mapping[Any, Any], taken: dict[str, str], where: tuple[Any, ...],
          found: list[Unknown]) -> None:
    keys = tuple(k for k in given if not (isinstance(k, str) and k in taken))
    if keys:
        found.append(Unknown(where, owner, keys, tuple(dict.fromkeys(taken))))


def _aliases(field: FieldInfo) -> list[str]:
    """The keys a field's alias lets it be given by (a path's first key)."""
    alias = field.validation_alias if field.validation_alias is not None else field.alias
    choices = alias.choices if isinstance(alias, AliasChoices) else [alias] if alias is not None else []
    keys = []
    for choice in choices:
        first = (choice.path[0] if choice.path else None) if isinstance(choice, AliasPath) else choice
        if isinstance(first, str):
            keys.append(first)
    return keys

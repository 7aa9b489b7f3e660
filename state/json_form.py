"""A typed value's JSON form: made one way, and read back with its declared type where that can differ.

A value is checked as a Python object where it is made, but its JSON form is what the next step,
a compensation, a tool or a resume reads. Three ways those parted, silently:

* a model with field aliases (or a ``computed_field`` under ``extra="forbid"``) was dumped by field
  name and read back by alias only: the next step, and the step's own compensation, could not read it;
* a union of models (``Refund | Charge``) has no type in its JSON form: the reader's union picked
  the first member that fit, another type than the one returned;
* a field typed ``Any`` holding a set, bytes, a datetime, a ``Decimal`` or an int-keyed dict became
  a list, a str, a str-keyed dict (a bare value of these is refused); a pydantic ``SecretStr`` became
  its mask, ``'**********'``, which the next step then used as the credential.

``model_json`` is the one dump of a pydantic value (``dump_options``, per type): keyed as the model
dumps itself (by field name unless ``serialize_by_alias``), the way raysaga always stored it, and
read back by name and by alias (``read_back``, ``workflow.coerce``), whatever aliases the model has;
computed fields left out only where the model would refuse them on the way back (``extra="forbid"``);
``read_back_problem`` reads a JSON form back with the declared type, once, and says where it
differs from the value made, for the producer to fail with.
``needs_read_back`` is cached per type: plain JSON types (``int``, ``dict[str, int]``, ``list[str]``,
``Any``...) cannot differ, and pay nothing.
"""

from __future__ import annotations

import functools
import math
import types
import typing
from typing import Any

from pydantic import BaseModel, SecretBytes, SecretStr, ValidationError

from raysaga.state.type_adapters import type_adapter

#: Types whose JSON form reads back as the same value (``jsoncodec`` refuses what has no JSON form).
_PLAIN: frozenset[Any] = frozenset({int, float, str, bool, type(None), None, Any, dict, list, object})

#: Containers whose JSON form is a JSON array or object of the members' forms.
_CONTAINERS: frozenset[Any] = frozenset({list, dict, tuple, typing.Union, types.UnionType})

def model_json(model: BaseModel) -> Any:
    """The JSON form of ``model`` that reads back as it (``dump_options``)."""
    return model.model_dump(**dump_options(type(model)))


def adapter_json(tp: Any, value: Any) -> Any:
    """The JSON form of ``value`` as type ``tp`` dumps it, with ``model_json``'s options."""
    return type_adapter(tp).dump_python(value, **dump_options(tp))


def dump_options(tp: Any) -> dict[str, Any]:
    """How a value of type ``tp`` is dumped, cached per type: JSON mode, keyed as each model dumps
    itself (by field name unless ``serialize_by_alias``: the form raysaga always stored, read back
    by name and by alias), computed fields kept unless a model in ``tp`` with one refuses extra keys
    (``extra="forbid"`` would refuse them on the way back)."""
    try:
        return _options(tp)
    except TypeError:  # unhashable annotation
        return _options.__wrapped__(tp)


@functools.lru_cache(maxsize=1024)
def _options(tp: Any) -> dict[str, Any]:
    models = _models_in(tp, {}).values()
    computed_out = any(cls.model_computed_fields and cls.model_config.get("extra") == "forbid" for cls in models)
    # keyed as each model dumps itself (by name unless ``serialize_by_alias``): the form raysaga
    # always stored, read back by name and by alias (``read_back``, ``workflow.coerce``)
    return {"mode": "json", "by_alias": None, "exclude_computed_fields": computed_out}


def serializer_hint(tp: Any) -> str:
    """The serializers of the models in ``tp``, in words for a form that does not read back ("" if none)."""
    try:
        named = [f"{cls.__name__}.{field} ({fn})" for cls in _models_in(tp, {}).values()
                 for field, fn in _serialized_fields(cls).items()]
        named += [f"{cls.__name__} (@model_serializer)" for cls in _models_in(tp, {}).values()
                  if cls.__pydantic_decorators__.model_serializers]
    except Exception:  # (a model pydantic has not finished building: no hint)
        return ""
    if not named:
        return ""
    return (f"; written by a serializer: {', '.join(named[:5])}, whose form must read back as the value: "
            "store the value, and format it where it is shown")


def _serialized_fields(cls: type[BaseModel]) -> dict[str, str]:
    """Field name -> the name of the ``@field_serializer`` that writes it."""
    return {field: deco.cls_var_name for deco in cls.__pydantic_decorators__.field_serializers.values()
            for field in deco.info.fields}


def _models_in(tp: Any, found: dict[int, type[BaseModel]]) -> dict[int, type[BaseModel]]:
    """The model classes in annotation ``tp``, its fields' annotations included (by id: a recursive model ends)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if id(tp) in found:
            return found
        found[id(tp)] = tp
        for field in tp.model_fields.values():
            _models_in(field.annotation, found)
        return found
    for arg in typing.get_args(tp):
        if not isinstance(arg, list | tuple):  # (Callable's parameter list)
            _models_in(arg, found)
    return found


def needs_read_back(tp: Any) -> bool:
    """Whether a value declared ``tp`` can have a JSON form that reads back as another value
    (a model, a dataclass, a union of several, a datetime...): cached per type."""
    try:
        return _needs(tp)
    except TypeError:  # unhashable annotation: look at it each time
        return _needs.__wrapped__(tp)


@functools.lru_cache(maxsize=1024)
def _needs(tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:  # (first: its metadata may not hash, ``Annotated[int, {"doc": 1}]``)
        return True  # its metadata may hold a validator or a serializer
    try:
        plain = tp in _PLAIN
    except TypeError:  # a type holding metadata that does not hash (``list[Annotated[int, {...}]]``)
        plain = False
    if plain or isinstance(tp, typing.TypeVar):  # (a TypeVar's value is checked as given)
        return False
    if origin is typing.Literal:
        return False
    if origin in _CONTAINERS:
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if origin in (typing.Union, types.UnionType) and sum(a not in _PLAIN for a in args) > 1:
            return True
        return any(needs_read_back(a) for a in args)
    return True


def read_back(tp: Any, form: Any) -> Any:
    """``form`` (JSON data) read as ``tp``, the way a step's parameter reads it (``workflow.coerce``:
    by field name and by alias, so the form stored by name reads back whatever aliases a model has)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp.model_validate(form, by_alias=True, by_name=True)
    return type_adapter(tp).validate_python(form, by_alias=True, by_name=True)


def read_back_problem(tp: Any, value: Any, form: Any, where: str, unreadable: bool = True) -> str | None:
    """Where ``form``, the JSON form of ``value`` (a value of type ``tp``), reads back as ``tp``
    as another value, in words (None: it reads back as ``value``). A validator raising any error on
    the form (a ``TypeError`` on a str where it expected a datetime) is a form that cannot be read
    back, said so, not raised. ``unreadable=False``: a form that cannot be read back at all is no
    problem (nothing says its reader reads it as ``tp``: a model in an ``Any`` field, or returned
    undeclared, is read as a dict unless the reader declares it, which then says why it cannot).
    Raises what building ``tp``'s validator raises (an annotation pydantic has no validator for)."""
    if not (isinstance(tp, type) and issubclass(tp, BaseModel)):
        type_adapter(tp)  # (built outside the guard below: a type with no validator is no value's fault)
    try:
        back = read_back(tp, form)
    except ValidationError as exc:
        if not unreadable:
            return None
        errors = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'value'}: {e['msg']}"
                           for e in exc.errors(include_url=False)[:3])
        return f"its JSON form cannot be read back as {_name(tp)} ({errors}){serializer_hint(tp)}"
    except RecursionError:
        return f"its JSON form cannot be read back as {_name(tp)} (nested too deep)" if unreadable else None
    except Exception as exc:  # a validator's own error (user code): the form cannot be read back either
        if not unreadable:
            return None
        return (f"its JSON form cannot be read back as {_name(tp)} ({type(exc).__name__} in a validator: "
                f"{_shown(str(exc))}): a validator must accept the JSON form (a str for a datetime, a dict "
                "for a model) as well as the value")
    return difference(value, back, where)


def difference(made: Any, back: Any, where: str) -> str | None:
    """Where ``back`` (a value read back from the JSON form of ``made``) differs from ``made``, in
    words; None if it does not. A tuple read back as a list is the same (a bare tuple's JSON form is
    a list too); a model's private attributes are not data, and not compared."""
    try:
        if made == back:
            return None
    except Exception:  # an __eq__ that raises (user code): compared field by field below
        pass
    return _secret_in(made, where, 0) or _differs(made, back, where, 0)


def _differs(made: Any, back: Any, where: str, depth: int) -> str | None:
    if depth > 120:
        return None
    if isinstance(made, BaseModel):
        if not isinstance(back, BaseModel):  # an ``Any`` field's model: its reader gets the dict stored;
            try:  # what must hold is the model's own fields' forms in it (a set in its Any field...)
                return read_back_problem(type(made), made, back, where, unreadable=False)
            except Exception:  # no validator for the model (cannot happen for a model): nothing to add
                return None
        if type(back) is not type(made) and not isinstance(made, type(back)):
            return (f"{where} is a {type(made).__name__} but its JSON form reads back as a {type(back).__name__} "
                    "(a union of models has no type in its JSON form: give it a discriminator, "
                    "Field(discriminator=...), or members with distinct fields)")
        # (a subclass of the declared model reads back as the declared model: its reader gets that)
        fields = type(back).model_fields
        serialized = _serialized_fields(type(back))
        for name, info in fields.items():
            found = _differs(getattr(made, name, None), getattr(back, name, None), f"{where}.{name}", depth + 1)
            if found and name in serialized:
                return (f"{where}.{name} is written by its @field_serializer {serialized[name]!r} as a form it does "
                        f"not read back ({_shown(getattr(made, name, None))} reads back as "
                        f"{_shown(getattr(back, name, None))}): store the value, and format it where it is shown")
            if found and info.exclude is True:
                return (f"{where}.{name} is excluded from the dump (Field(exclude=True)): the next step reads "
                        f"its default, not {_shown(getattr(made, name, None))}; keep it out of what is returned, "
                        "or include the field")
            if found:
                return found
        if type(back) is not type(made):
            return None
        computed = type(back).model_computed_fields  # (stored with the fields, read back as extras)
        extra_back = {k: v for k, v in (back.__pydantic_extra__ or {}).items() if k not in computed}
        return _differs(made.__pydantic_extra__ or {}, extra_back, where, depth + 1)
    if isinstance(made, dict) and isinstance(back, dict):
        if made.keys() != back.keys():
            odd = next((k for k in made if k not in back), None)
            return (f"{where} has key {odd!r} of type {type(odd).__name__}, which its JSON form reads back as "
                    f"{str(odd)!r}: keys must be str" if odd is not None and not isinstance(odd, str)
                    else f"{where} has keys {sorted(map(str, made))[:10]} but its JSON form reads back with keys "
                    f"{sorted(map(str, back))[:10]}")
        for key, item in made.items():
            found = _differs(item, back[key], f"{where}[{key!r}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(made, list | tuple) and isinstance(back, list | tuple):
        if len(made) != len(back):
            return f"{where} has {len(made)} items but its JSON form reads back with {len(back)}"
        for i, (a, b) in enumerate(zip(made, back, strict=True)):
            found = _differs(a, b, f"{where}[{i}]", depth + 1)
            if found:
                return found
        return None
    if isinstance(made, float) and not math.isfinite(made):  # a model's ser_json_inf_nan asked for it
        return None  # (``jsoncodec`` refused a NaN or an infinity written as null unless it did)
    try:
        same = bool(made == back)
    except Exception:
        same = False
    if same:
        return None
    return (f"{where} is {_shown(made)} ({type(made).__name__}) but its JSON form reads back as {_shown(back)} "
            f"({type(back).__name__}): store a JSON value (str, number, bool, None, list, dict with str keys) "
            "or give the field that type")


def _secret_in(value: Any, where: str, depth: int) -> str | None:
    """A pydantic ``SecretStr``/``SecretBytes`` in ``value``: its JSON form is the mask ``'**********'``."""
    if isinstance(value, SecretStr | SecretBytes):
        return (f"{where} is a pydantic {type(value).__name__}, whose JSON form is its mask '**********' (the "
                "next step would read the mask as the value): use raysaga.Secret in a run input, or pass a "
                "reference (an environment variable's name, a vault path) and read the value where it is used")
    if depth > 120:
        return None
    if isinstance(value, BaseModel):
        for name in type(value).model_fields:
            found = _secret_in(getattr(value, name, None), f"{where}.{name}", depth + 1)
            if found:
                return found
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            found = _secret_in(item, f"{where}[{key!r}]", depth + 1)
            if found:
                return found
    elif isinstance(value, list | tuple | set | frozenset):
        for i, item in enumerate(value):
            found = _secret_in(item, f"{where}[{i}]", depth + 1)
            if found:
                return found
    return None


def _shown(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= 80 else text[:80] + "..."


def _name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")

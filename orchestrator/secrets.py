"""``Secret``: a run-input field whose value is never stored (DESIGN invariant 7).

    class Order(BaseModel):
        amount: int
        vendor_token: Secret

    raysaga.run(wf, {"amount": 3, "vendor_token": {"env": "VENDOR_TOKEN"}})   # durable: a reference
    raysaga.run(wf, {"amount": 3, "vendor_token": "tok-..."})                 # literal: this process only

    @wf.step()
    def pay(input: Order) -> str:
        call_vendor(token=input.vendor_token.get())

The store keeps a reference, never the value: ``{"$secret": {"env": NAME}}`` for an env
reference (read when a step calls ``get()``, so it works across resumes and on Ray workers,
which inherit the environment), ``{"$secret": {"memory": ID, "field": NAME}}`` for a literal
(kept in this process's memory only). ``get()`` of a literal in another process (a resume after
a crash, a Ray worker) reads ``RAYSAGA_SECRET_<FIELD>`` if it is set, else raises
``SecretUnavailableError`` naming the field and how to re-supply it: never a wrong value.
Every value seen is registered with ``raysaga.state.redact``, so it is scrubbed from errors,
events and logs: 8+ characters anywhere, 3 to 7 as a whole word in text only (a PIN ``1234`` in
"pin 1234", not in "order 912345", never in a run's data: outputs, tool calls, answers, labels);
a shorter one cannot be scrubbed without mangling text, and a warning naming the field says so.
``str``/``repr`` show ``**********``.
"""

from __future__ import annotations

import os
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import core_schema

from raysaga.errors import InvalidOptionError, SecretUnavailableError
from raysaga.state.redact import register_secret, register_secret_env

#: The durable form's key: ``{"$secret": {"env": NAME}}`` or ``{"$secret": {"memory": ID, "field": F}}``.
REF_KEY = "$secret"
#: Re-supply a literal secret to another process: ``RAYSAGA_SECRET_<FIELD, upper-cased>``.
RESUPPLY_PREFIX = "RAYSAGA_SECRET_"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_HIDDEN = "**********"

_MEMORY: dict[str, str] = {}
_LOCK = threading.Lock()


class SecretValueError(ValueError):
    """A ``Secret`` field's value of the wrong kind (``{"pin": 4817}``): an input error names it
    without the value (``input_errors``), which may be the secret written as a number."""


def resupply_env(field: str) -> str:
    """The environment variable that re-supplies literal secret ``field`` to another process."""
    return RESUPPLY_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", field).upper()


class Secret:
    """A secret input value: stored as a reference, revealed only by ``get()``."""

    __slots__ = ("_env", "_field", "_memory")

    def __init__(self, *, env: str | None = None, memory: str | None = None, field: str = "") -> None:
        if (env is None) == (memory is None):
            raise InvalidOptionError("a Secret is either an env reference or a literal kept in memory: "
                                     "use Secret.from_env('NAME') or Secret.literal(value)")
        self._env = env
        self._memory = memory
        self._field = field

    @classmethod
    def from_env(cls, name: str, field: str = "") -> Secret:
        """A secret read from environment variable ``name`` whenever it is used."""
        if not _ENV_NAME.fullmatch(name):
            raise InvalidOptionError(f"Secret.from_env({name!r}): not an environment variable name "
                                     "(letters, digits and underscores, not starting with a digit)")
        register_secret_env(name)
        return cls(env=name, field=field)

    @classmethod
    def literal(cls, value: str, field: str = "") -> Secret:
        """A secret given by value: kept in this process's memory, never stored."""
        key = uuid.uuid4().hex
        with _LOCK:
            _MEMORY[key] = value
        register_secret(value, _what(field))
        return cls(memory=key, field=field)

    @property
    def field(self) -> str:
        return self._field

    def reference(self) -> dict[str, Any]:
        """The durable form (what the store keeps)."""
        if self._env is not None:
            return {REF_KEY: {"env": self._env}}
        return {REF_KEY: {"memory": self._memory, "field": self._field}}

    def available(self) -> bool:
        try:
            self.get()
        except SecretUnavailableError:
            return False
        return True

    def get(self) -> str:
        """The value; ``SecretUnavailableError`` if this process cannot have it."""
        name = self._field or "input"
        if self._env is not None:
            value = os.environ.get(self._env)
            if value is None:
                raise SecretUnavailableError(
                    f"secret input field {name!r} reads environment variable {self._env}, which is not set in "
                    f"this process (pid {os.getpid()}): export {self._env} where the driver and every Ray "
                    "worker run, then resume the run (or retry it, if the run failed)")
            register_secret(value, f"{_what(self._field)} (environment variable {self._env})", env=self._env)
            return value
        assert self._memory is not None
        value = _MEMORY.get(self._memory)
        if value is None:
            value = os.environ.get(resupply_env(name))
            if value is None:
                raise SecretUnavailableError(
                    f"secret input field {name!r} was given as a literal value, which raysaga keeps only in the "
                    f"memory of the process that started the run (it is never stored), and this process "
                    f"(pid {os.getpid()}) does not have it: export {resupply_env(name)}=<the value> here (and on "
                    f"the Ray workers) and resume the run again (or retry it, if the run failed); to avoid this, "
                    f"start runs with "
                    f'{{"{name}": {{"env": "VAR"}}}} so every process reads it from its environment')
            register_secret(value, f"{_what(name)} (environment variable {resupply_env(name)})")
        return value

    get_secret_value = get  # the name pydantic's SecretStr uses

    def __repr__(self) -> str:
        source = f"env={self._env!r}" if self._env is not None else "literal"
        return f"Secret({_HIDDEN}, {source})"

    def __str__(self) -> str:
        return _HIDDEN

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secret) and self.reference() == other.reference()

    def __hash__(self) -> int:
        return hash((self._env, self._memory))

    def __reduce__(self) -> Any:  # the reference only, never the value
        return (_rebuild, (self._env, self._memory, self._field))

    # ------------------------------------------------------------------ pydantic

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.with_info_plain_validator_function(
            _validate,
            serialization=core_schema.plain_serializer_function_ser_schema(_serialize, when_used="always"),
        )

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        return {"anyOf": [{"type": "string", "writeOnly": True},
                          {"type": "object", "properties": {"env": {"type": "string"}}, "required": ["env"]}],
                "description": "a secret: a literal (kept in memory only) or {\"env\": \"VAR\"}"}


def _what(field: str) -> str:
    """The secret named in a warning that it is too short to be scrubbed."""
    return f"secret input field {field!r}" if field else "a Secret input"


def _rebuild(env: str | None, memory: str | None, field: str) -> Secret:
    return Secret(env=env, memory=memory, field=field)


def _serialize(value: Any) -> Any:
    return value.reference() if isinstance(value, Secret) else value


def _validate(value: Any, info: core_schema.ValidationInfo) -> Secret:
    field = info.field_name or ""
    if isinstance(value, Secret):
        return value
    if isinstance(value, str):
        if not value:
            raise ValueError("a secret cannot be empty")
        return Secret.literal(value, field)
    if isinstance(value, dict):
        if set(value) == {"env"} and isinstance(value["env"], str):
            return Secret.from_env(value["env"], field)
        ref = value.get(REF_KEY) if set(value) == {REF_KEY} else None
        if isinstance(ref, dict):
            if set(ref) == {"env"} and isinstance(ref["env"], str):
                return Secret.from_env(ref["env"], field)
            if set(ref) == {"memory", "field"} and isinstance(ref["memory"], str) and isinstance(ref["field"], str):
                return Secret(memory=ref["memory"], field=ref["field"] or field)
    raise SecretValueError('a secret is a string (kept in memory only) or {"env": "VARIABLE"} (read from the '
                           "environment when used)")


def _references(node: Any, path: str = "") -> Iterator[tuple[str, Secret]]:
    """The secrets referenced in a stored JSON value, with where they sit."""
    if isinstance(node, dict):
        ref = node.get(REF_KEY) if len(node) == 1 else None
        if isinstance(ref, dict):
            if set(ref) == {"env"} and isinstance(ref["env"], str):
                yield path or "input", Secret.from_env(ref["env"], path)
            elif set(ref) == {"memory", "field"} and isinstance(ref["memory"], str):
                yield path or "input", Secret(memory=ref["memory"], field=str(ref["field"] or path))
            return
        for key, item in node.items():
            yield from _references(item, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _references(item, f"{path}[{i}]")


def missing_secrets(value: Any) -> list[SecretUnavailableError]:
    """Why each secret of a stored run input is unavailable to this process (``[]``: all are)."""
    problems: list[SecretUnavailableError] = []
    for _, secret in _references(value):
        try:
            secret.get()
        except SecretUnavailableError as exc:
            problems.append(exc)
    return problems


def check_secrets(run_id: str, value: Any) -> None:
    """Raise ``SecretUnavailableError`` before a resume of ``run_id`` in a process that cannot
    have one of its input's secrets (a literal given to another process, an unset env var)."""
    problems = missing_secrets(value)
    if problems:
        raise SecretUnavailableError(f"run {run_id!r}: " + "; ".join(str(p) for p in problems))


def comparable(value: Any) -> Any:
    """A stored (JSON) input with every secret reference normalised, for "is this the same input?":
    a literal's value is never stored (each literal gets a new random memory id), so any two
    literals compare equal; an env reference compares by the variable's name."""
    if isinstance(value, dict):
        ref = value.get(REF_KEY) if len(value) == 1 else None
        if isinstance(ref, dict) and set(ref) == {"memory", "field"}:
            return {REF_KEY: {"memory": "*"}}
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value

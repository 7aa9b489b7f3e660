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
(kept in this process's memory only), ``{"memory": ID, "field": PATH, "resupply": VAR}`` for one
deeper in the input (``name_literals``: each its own variable, ``RAYSAGA_SECRET_VENDORS_1_TOKEN``;
a top-level field's is ``RAYSAGA_SECRET_<NAME>``, as it always was). ``get()`` of a literal in
another process (a resume after a crash, a Ray worker) reads that variable if it is set, else raises
``SecretUnavailableError`` naming the field and how to re-supply it: never a wrong value. (A run
stored before literals had a variable each holds ``{"memory": ID, "field": NAME}`` for every one,
a list's items too: two sharing one variable are refused, ``check_secrets``.)
Every value seen is registered with ``raysaga.state.redact``, so it is scrubbed from errors,
events and logs: 8+ characters anywhere, 3 to 7 as a whole word in text only (a PIN ``1234`` in
"pin 1234", not in "order 912345", never in a run's data: outputs, tool calls, answers, labels);
a shorter one cannot be scrubbed without mangling text, and a warning naming the field says so.
``str``/``repr`` show ``**********``.
"""

from __future__ import annotations

import os
import re
import shlex
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
    """The environment variable that re-supplies literal secret ``field`` (stored without a variable
    of its own: before ``name_literals``) to another process."""
    return RESUPPLY_PREFIX + re.sub(r"[^A-Za-z0-9_]", "_", field).upper()


def path_env(path: str) -> str:
    """The variable ``name_literals`` gives the literal at ``path`` (``vendors[1].token``:
    ``RAYSAGA_SECRET_VENDORS_1_TOKEN``; a top-level field's is ``resupply_env``'s, as before)."""
    return RESUPPLY_PREFIX + (re.sub(r"[^A-Za-z0-9_]+", "_", path).strip("_").upper() or "INPUT")


class Secret:
    """A secret input value: stored as a reference, revealed only by ``get()``."""

    __slots__ = ("_env", "_field", "_memory", "_resupply")

    def __init__(self, *, env: str | None = None, memory: str | None = None, field: str = "",
                 resupply: str | None = None) -> None:
        if (env is None) == (memory is None):
            raise InvalidOptionError("a Secret is either an env reference or a literal kept in memory: "
                                     "use Secret.from_env('NAME') or Secret.literal(value)")
        self._env = env
        self._memory = memory
        self._field = field
        self._resupply = resupply  # a literal's own variable (None: stored before they had one)

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

    @property
    def resupply(self) -> str | None:
        """The variable that re-supplies this literal to another process (None: an env reference)."""
        if self._env is not None:
            return None
        return self._resupply or resupply_env(self._field or "input")

    @property
    def in_memory(self) -> bool:
        """Whether this process holds this literal's value (it started the run, or was given it again)."""
        return self._memory is not None and self._memory in _MEMORY

    def reference(self) -> dict[str, Any]:
        """The durable form (what the store keeps)."""
        if self._env is not None:
            return {REF_KEY: {"env": self._env}}
        if self._resupply is not None:
            return {REF_KEY: {"memory": self._memory, "field": self._field, "resupply": self._resupply}}
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
                    f"worker run, then {go_on()}")
            register_secret(value, f"{_what(self._field)} (environment variable {self._env})", env=self._env)
            return value
        assert self._memory is not None
        value = _MEMORY.get(self._memory)
        if value is None:
            var = self.resupply
            assert var is not None
            value = os.environ.get(var)
            if value is None:
                raise SecretUnavailableError(
                    f"secret input field {name!r} was given as a literal value, which raysaga keeps only in the "
                    f"memory of the process that started the run (it is never stored), and this process "
                    f"(pid {os.getpid()}) does not have it: export {var}=<the value> where the driver and every "
                    f"Ray worker run, then {go_on()}; to avoid this, start runs with an environment reference "
                    f'({{"env": "VAR"}} in place of the value) so every process reads it from its environment')
            register_secret(value, f"{_what(name)} (environment variable {var})")
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
        return (_rebuild, (self._env, self._memory, self._field, self._resupply))

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


def _rebuild(env: str | None, memory: str | None, field: str, resupply: str | None = None) -> Secret:
    return Secret(env=env, memory=memory, field=field, resupply=resupply)


def _serialize(value: Any) -> Any:
    return value.reference() if isinstance(value, Secret) else value


def _literal(ref: Any) -> tuple[str, str, str | None] | None:
    """A stored literal reference's memory id, field and own variable (None: stored before literals
    had one); None when ``ref`` is no literal reference."""
    if not isinstance(ref, dict) or not isinstance(ref.get("memory"), str) or not isinstance(ref.get("field"), str):
        return None
    if set(ref) == {"memory", "field"}:
        return ref["memory"], ref["field"], None
    if set(ref) == {"memory", "field", "resupply"} and isinstance(ref["resupply"], str) \
            and _ENV_NAME.fullmatch(ref["resupply"]):
        return ref["memory"], ref["field"], ref["resupply"]
    return None


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
            if (lit := _literal(ref)) is not None:
                return Secret(memory=lit[0], field=lit[1] or field, resupply=lit[2])
    raise SecretValueError('a secret is a string (kept in memory only) or {"env": "VARIABLE"} (read from the '
                           "environment when used)")


def _shown(path: str) -> str:
    """A place in the input as messages name it: ``vendors[1].token``, ``input`` for the whole."""
    return "input" + path if not path or path.startswith("[") else path


def _references(node: Any, path: str = "") -> Iterator[tuple[str, Secret]]:
    """The secrets referenced in a stored JSON value, with where they sit."""
    if isinstance(node, dict):
        ref = node.get(REF_KEY) if len(node) == 1 else None
        if isinstance(ref, dict):
            if set(ref) == {"env"} and isinstance(ref["env"], str):
                yield _shown(path), Secret.from_env(ref["env"], path)
            elif (lit := _literal(ref)) is not None:
                yield _shown(path), Secret(memory=lit[0], field=lit[1] or path, resupply=lit[2])
            return
        for key, item in node.items():
            yield from _references(item, f"{path}.{key}" if path else str(key))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            yield from _references(item, f"{path}[{i}]")


def name_literals(form: Any) -> Any:
    """A new run's stored input with each literal reference named by its place (``field``:
    ``vendors[1].token``) and given a variable of its own (``resupply``: ``path_env``; a suffix
    ``_2``... if two places make one name; a top-level field's is stored as before, its variable
    being ``resupply_env``'s). Named by field alone, every ``token`` of a list of vendors read one
    ``RAYSAGA_SECRET_TOKEN`` in another process: one vendor got the other's token."""
    taken: set[str] = set()

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, dict):
            lit = _literal(node.get(REF_KEY)) if len(node) == 1 else None
            if lit is not None:
                var = base = path_env(path)
                n = 1
                while var in taken:
                    n += 1
                    var = f"{base}_{n}"
                taken.add(var)
                if var == resupply_env(_shown(path)):  # a top-level field's: the form (and variable) it always had
                    return {REF_KEY: {"memory": lit[0], "field": _shown(path)}}
                return {REF_KEY: {"memory": lit[0], "field": _shown(path), "resupply": var}}
            if len(node) == 1 and REF_KEY in node:
                return node
            return {k: walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, f"{path}[{i}]") for i, v in enumerate(node)]
        return node

    return walk(form, "")


def adopt(given: Any, stored: Any) -> int:
    """Bind the literals of an input given again for an existing run (``given``: its checked JSON
    form) to the run's stored references, place by place, in this process: ``raysaga run --run-id RUN
    --input <the same input>`` then supplies them, as the process that started the run had them. A
    stored literal this process still holds keeps its value. Returns how many were bound."""
    values = {place: _MEMORY.get(s._memory) for place, s in _references(given) if s._memory is not None}
    bound = 0
    with _LOCK:
        for place, secret in _references(stored):
            value = values.get(place)
            if secret._memory is not None and value is not None and secret._memory not in _MEMORY:
                _MEMORY[secret._memory] = value
                bound += 1
    return bound


def go_on(run: str = "RUN") -> str:
    """What the advice of a missing secret says to do once it is exported: both are refused up front
    while a secret is missing (``check_secrets``), so doing it again after the export works."""
    return f"resume the run (`raysaga resume {run}`), or retry it, if the run failed (`raysaga retry {run}`)"


def missing_secrets(value: Any) -> list[SecretUnavailableError]:
    """Why each secret of a stored run input is unavailable to this process (``[]``: all are)."""
    return [p for _, p, _ in _missing(value, set())]


def _missing(value: Any, skip: set[str]) -> list[tuple[str, SecretUnavailableError, bool]]:
    """Each secret of ``value`` (but the literals ``skip`` names) this process cannot have: its place,
    why, and whether it is a literal."""
    problems: list[tuple[str, SecretUnavailableError, bool]] = []
    for place, secret in _references(value):
        if secret._memory in skip:
            continue
        try:
            secret.get()
        except SecretUnavailableError as exc:
            problems.append((place, exc, secret._memory is not None))
    return problems


def shared_literals(value: Any, *, remote: bool = False) -> dict[str, dict[str, list[str]]]:
    """Literals of a run stored before each had a variable of its own that share one (two vendors'
    ``token``: ``RAYSAGA_SECRET_TOKEN``): variable -> memory id -> places. That variable would give
    one the other's value. Those this process holds are left out, unless ``remote`` (steps run
    elsewhere: a Ray worker has only the variable)."""
    found: dict[str, dict[str, list[str]]] = {}
    for place, secret in _references(value):
        if secret._memory is None or secret._resupply is not None or (secret.in_memory and not remote):
            continue
        var = secret.resupply
        assert var is not None
        found.setdefault(var, {}).setdefault(secret._memory, []).append(place)
    return {var: ids for var, ids in found.items() if len(ids) > 1}


def check_secrets(run_id: str, value: Any, *, remote: bool = False) -> None:
    """Raise ``SecretUnavailableError`` before run ``run_id`` goes on (a resume, a retry, a worker's
    claim) in a process that cannot have one of its input's secrets (a literal given to another
    process, an unset env var), or whose old literals share a variable (``shared_literals``).
    Refused before anything runs, the error's advice (export, then resume again) works; refused by
    the step, the run's committed effects were rolled back and it ended for good."""
    quoted = shlex.quote(run_id)
    shared = shared_literals(value, remote=remote)
    missing = _missing(value, {m for ids in shared.values() for m in ids})
    problems = [str(p).replace(go_on(), go_on(quoted)) for _, p, _ in missing]
    if any(literal for _, _, literal in missing):
        problems.append(f"a literal can also be given again with the run's input: `raysaga run MODULE:WORKFLOW "
                        f"--run-id {quoted} --input ...` (raysaga.run(wf, input, run_id=...) in Python) takes each "
                        "for the run in that process")
    for var, ids in shared.items():
        places = ", ".join(repr(p) for ps in ids.values() for p in ps)
        problems.append(
            f"secret input fields {places} were given as literal values when raysaga named one variable, {var}, "
            f"for all of them: it cannot tell them apart, so it is not read for them (one would get another's "
            f"value); give the same input again in a process that runs the steps itself (`raysaga run WORKFLOW "
            f"--run-id {quoted} --input ... --executor inline`: each literal is taken for its own place), or "
            f'cancel the run and start it again with {{"env": "VAR"}} references')
    if problems:
        raise SecretUnavailableError(f"run {run_id!r}: nothing was run or changed: " + "; ".join(problems))


def comparable(value: Any) -> Any:
    """A stored (JSON) input with every secret reference normalised, for "is this the same input?":
    a literal's value is never stored (each literal gets a new random memory id), so any two
    literals compare equal; an env reference compares by the variable's name."""
    if isinstance(value, dict):
        ref = value.get(REF_KEY) if len(value) == 1 else None
        if _literal(ref) is not None:
            return {REF_KEY: {"memory": "*"}}
        return {k: comparable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [comparable(v) for v in value]
    return value

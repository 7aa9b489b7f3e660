"""What the CLI accepts, checked at the edge: ``--input`` (JSON text, ``@file`` or ``@-``), run
ids, durations and numeric options. Every refusal is a ``UserError`` naming the option and how to
fix it; nothing here has touched the store yet."""

from __future__ import annotations

import json
import math
import re
import stat
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from pydantic import BaseModel, ValidationError

from raysaga.errors import InputTooLargeError, InvalidInputError, UserError
from raysaga.orchestrator.input_errors import mismatch
from raysaga.orchestrator.type_adapters import type_adapter
from raysaga.state.jsoncodec import MAX_DEPTH
from raysaga.types import RunOptions, check_labels
from raysaga.types import check_run_id as check_types_run_id

if TYPE_CHECKING:
    from raysaga.orchestrator.workflow import Workflow

#: The store's own nesting limit (``jsoncodec.MAX_DEPTH``): a deeper input is refused here, named.
MAX_INPUT_DEPTH = MAX_DEPTH
#: Largest value of a 32-bit (``Integer``) column: retry budgets, fan-out indexes.
INT32_MAX = 2**31 - 1
#: Largest value of a 64-bit (``BigInteger``) column: event sequence numbers.
INT64_MAX = 2**63 - 1


def max_input_bytes() -> int:
    """The store's input cap (``RAYSAGA_MAX_INPUT_BYTES``): a file above it is refused unread."""
    from raysaga.state.sql_store import input_cap  # SQLAlchemy: only when an input is read

    return input_cap()


def _too_large(source: str, size: int | str, cap: int) -> InputTooLargeError:
    return InputTooLargeError(f"{source} is {size} bytes, above the input cap of {cap} bytes: pass a reference "
                              "(a path, a URL, an id) instead, or raise RAYSAGA_MAX_INPUT_BYTES")


def _read_capped(stream: BinaryIO, source: str, cap: int) -> bytes:
    data = stream.read(cap + 1)
    if len(data) > cap:
        raise _too_large(source, f"more than {cap}", cap)
    return data


def _read_file(spec: str, cap: int, option: str = "--input") -> tuple[str, bytes]:
    if not spec:
        raise UserError(f"{option} @ needs a file name (or @- for stdin)")
    if spec == "-":
        return f"{option} from stdin", _read_capped(sys.stdin.buffer, f"{option} from stdin", cap)
    path = Path(spec).expanduser()
    source = f"{option} file {spec!r}"
    try:
        info = path.stat()
    except FileNotFoundError:
        raise UserError(f"{source} does not exist") from None
    except OSError as exc:
        raise UserError(f"{source} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(info.st_mode):
        raise UserError(f"{source} is a directory: name a JSON file in it")
    if stat.S_ISREG(info.st_mode) and info.st_size > cap:  # checked before reading a byte of it
        raise _too_large(source, info.st_size, cap)
    try:
        with path.open("rb") as stream:
            return source, _read_capped(stream, source, cap)
    except OSError as exc:
        raise UserError(f"{source} cannot be read: {exc.strerror or exc}") from None


def parse_input(raw: str | None, option: str = "--input") -> Any:
    """``--input``: JSON text, ``@path`` (a file) or ``@-`` (stdin); strict JSON (no NaN), at most
    the input cap, at most ``MAX_INPUT_DEPTH`` levels deep. ``option``: the option named in errors
    (``--answer`` reads the same way)."""
    if raw is None:
        return None
    cap = max_input_bytes()
    if raw.startswith("@"):
        source, data = _read_file(raw[1:], cap, option)
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(f"{source} is not UTF-8: byte {exc.start} (0x{data[exc.start]:02x}) "
                                    "cannot be decoded") from None
        text = text.removeprefix("\ufeff")
    else:
        source, text = option, raw
        size = len(text.encode("utf-8", "surrogatepass"))
        if size > cap:
            raise _too_large(source, size, cap)
    try:
        value = strict_loads(text)
    except RecursionError:
        raise InvalidInputError(f"{source} is not valid JSON: nested deeper than this parser allows "
                                f"(at most {MAX_INPUT_DEPTH} levels are accepted)") from None
    except (json.JSONDecodeError, ValueError) as exc:
        raise InvalidInputError(f"{source} is not valid JSON: {exc}") from None
    depth = _depth(value)
    if depth > MAX_INPUT_DEPTH:
        raise InvalidInputError(f"{source} is not valid JSON for raysaga: nested {depth} levels deep, "
                                f"at most {MAX_INPUT_DEPTH} are accepted")
    return value


def strict_loads(text: str) -> Any:
    """JSON as an operator means it: no NaN or Infinity, no number beyond a float, no key twice in
    one object (``--input``, ``--answer``, ``--input-patch``); ``ValueError`` names what is wrong."""
    return json.loads(text, parse_constant=reject_json_constant, parse_float=_finite_float,
                      object_pairs_hook=_unique_keys)


def reject_json_constant(name: str) -> Any:
    """``json.loads``' ``parse_constant`` for strict JSON: NaN and Infinity are Python's, not JSON."""
    raise ValueError(f"{name} is not JSON")


def _finite_float(text: str) -> float:
    """``parse_float``: a number too large for a float (``1e400``) is refused as written, not
    stored as infinity nor named as "inf", which the user never typed."""
    value = float(text)
    if math.isinf(value):
        shown = text if len(text) <= 40 else text[:37] + "..."
        raise ValueError(f"the number {shown} is too large for a 64-bit float (at most ~1.8e308): "
                         "pass it as a string")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a key given twice in one object is refused, naming it. JSON parsers
    disagree on which value wins; Python's keeps the last silently (``{"qty": 1, "qty": 100}``)."""
    value: dict[str, Any] = {}
    for key, item in pairs:
        if key in value:
            shown = key if len(key) <= 60 else key[:57] + "..."
            raise ValueError(f"the key {shown!r} is given twice in one object: give each key once")
        value[key] = item
    return value


def _depth(value: Any) -> int:
    """Nesting depth, computed without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item.values())
        elif isinstance(item, list):
            deepest = max(deepest, level)
            stack.extend((v, level + 1) for v in item)
    return deepest


def check_input(wf: Workflow, value: Any, given: bool) -> None:
    """The workflow's declared input type against the value, with a readable message: a missing
    ``--input`` names the model and its fields; a mismatch is one ``field: problem`` per field."""
    tp = wf.input_type
    if tp is Any:
        return
    name = getattr(tp, "__name__", str(tp))
    if not given:
        try:
            type_adapter(tp).validate_python(None)
            return
        except ValidationError:
            pass
        fields = ""
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            fields = f" (fields: {', '.join(tp.model_fields)})"
        raise InvalidInputError(f"--input is required: workflow {wf.name} takes {_article(name)} {name}{fields}")
    try:
        type_adapter(tp).validate_python(value)
    except ValidationError as exc:
        raise InvalidInputError(mismatch(wf.name, tp, exc)) from None


def check_reason(text: str, option: str) -> str:
    """``cancel --reason`` at most 10,000 characters, as ``approve --comment`` (``MAX_COMMENT``): it
    is stored in the run's row and its event and shown by every view of the run (it was unbounded)."""
    from raysaga.state.decisions import MAX_COMMENT

    if len(text) > MAX_COMMENT:
        raise UserError(f"{option} is {len(text):,} characters: at most {MAX_COMMENT:,}")
    return text


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def check_run_id(value: str | None, what: str = "run id") -> str | None:
    """``raysaga.types.check_run_id`` for an optional option value."""
    return None if value is None else check_types_run_id(value, what)


def labels(option: str, given: list[str] | None) -> dict[str, str]:
    """``--label KEY=VALUE`` options as a run's labels (``raysaga.types.check_labels``: bounded,
    printable); a pair without ``=`` or a key given twice is refused, naming it."""
    found: dict[str, str] = {}
    for pair in given or []:
        key, sep, value = pair.partition("=")
        if not sep:
            raise UserError(f"{option} {pair!r:.80} is not KEY=VALUE: e.g. {option} team=billing")
        if key in found:
            raise UserError(f"{option} {key!r:.80} is given twice ({found[key]!r:.40} and {value!r:.40}): "
                            "give each label once")
        found[key] = value
    return check_labels(found, option)


def run_labels(option: str, given: list[str] | None) -> dict[str, str]:
    """``labels`` of a command that records a run, refused here as the store would refuse them
    (``state.run_labels.stored_labels``: a label holding a secret), so nothing is asked of a
    cluster or uploaded to it for a run that cannot be recorded."""
    found = labels(option, given)
    if found:
        from raysaga.state.run_labels import stored_labels  # SQLAlchemy: only when labels are given

        stored_labels(found)
    return found


def positive_seconds(option: str, value: float | None) -> float | None:
    """A positive, finite number of seconds (NaN, inf, 0 and negatives refused)."""
    if value is None:
        return None
    if not math.isfinite(value) or value <= 0:
        raise UserError(f"{option} must be a positive number of seconds, got {value}")
    return value


def int_in_range(option: str, value: int | None, low: int, high: int | None = None, *,
                 cap: int | None = None) -> int | None:
    """``low <= value <= high``; ``cap``: the largest value the store's column holds (``INT32_MAX``,
    ``INT64_MAX``), named only to a value above it."""
    if value is None:
        return None
    if value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise UserError(f"{option} must be {bound}, got {value}")
    if cap is not None and value > cap:
        raise UserError(f"{option} must be from {low} to {cap}, got {value}")
    return value


def max_driver_deaths(value: int | None) -> int | None:
    """``--max-driver-deaths`` of a command that records a run: the rule and the message of
    ``raysaga worker``'s flag (``worker.checked_max_driver_deaths``), so one limit reads alike on
    every command; None when the flag is not given."""
    if value is None:
        return None
    from raysaga.orchestrator.worker import checked_max_driver_deaths  # the driver: only when one is given

    return checked_max_driver_deaths(value)


def run_limit(deaths: int | None) -> int:
    """The ``RunOptions.max_driver_deaths`` of a checked ``--max-driver-deaths`` (``max_driver_deaths``):
    the default when the flag is not given, which records no limit of the run's own. Whether it
    was given is the caller's to keep (None): 3 given is a limit, left out it is none."""
    return RunOptions.max_driver_deaths if deaths is None else deaths


#: Longest duration accepted (``prune --older-than``): 1000 years.
MAX_DURATION_S = 1000 * 365.25 * 86400

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
#: ASCII digits only: ``\d`` alone also takes '٣' (Arabic-Indic three), which ``float`` reads as 3.
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE | re.ASCII)


def parse_duration(option: str, text: str) -> float:
    """``30d``, ``12h``, ``90m``, ``3600s``, ``2w``; positive and finite. A bare number is refused:
    ``prune --older-than 30`` meant 30 seconds and deleted every finished run older than that,
    where ``find -mtime 30`` and most readers take days."""
    match = _DURATION.match(text)
    if not match:
        raise UserError(f"{option} {text!r} is not a duration: use e.g. 30d, 12h, 90m or 3600s")
    if not match.group(2):
        number = match.group(1)
        raise UserError(f"{option} {text!r} has no unit: write {number}d (days), {number}h (hours), "
                        f"{number}m (minutes) or {number}s (seconds)")
    seconds = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not math.isfinite(seconds) or seconds <= 0:
        raise UserError(f"{option} {text!r} must be a positive duration")
    if seconds > MAX_DURATION_S:
        raise UserError(f"{option} {text!r} is longer than 1000 years: use e.g. 30d, 12h, 90m or 3600s")
    return seconds

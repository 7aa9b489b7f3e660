"""A run's input and output at rest: inline in the run's row while small, else a blob by digest.

Every transition and ``list`` read the run row, so the row stays small (DESIGN: rows stay
small); and a run's input is read whole by every resume, so it has a cap: large data belongs
elsewhere (a path, a URL, an id), with the run holding the reference.
"""

from __future__ import annotations

import json
import os
from typing import Any

from sqlalchemy import Connection

from raysaga.errors import InputTooLargeError, UserError
from raysaga.state import blob_rows, jsoncodec

#: A run's input or output whose JSON is larger than this is kept in raysaga_blobs, not in its
#: row. The default of ``RunOptions.blob_threshold``, which does the same for node outputs.
RUN_VALUE_INLINE_LIMIT = 64 * 1024
#: Default cap on a run's input (canonical JSON bytes); ``RAYSAGA_MAX_INPUT_BYTES`` or
#: ``SqlStore(max_input_bytes=...)`` changes it.
MAX_INPUT_BYTES = 16 * 1024 * 1024
MAX_INPUT_ENV = "RAYSAGA_MAX_INPUT_BYTES"


def input_cap(given: int | None = None) -> int:
    """The run-input cap in bytes: ``given``, else ``RAYSAGA_MAX_INPUT_BYTES``, else the default."""
    if given is None:
        env = os.environ.get(MAX_INPUT_ENV)
        if not env:
            return MAX_INPUT_BYTES
        if not (env.isascii() and env.strip().isdigit()):  # int() also reads '٣', '+3' and '1_0'
            raise UserError(f"{MAX_INPUT_ENV}={env!r} is not a whole number of bytes (ASCII digits)")
        if int(env) < 1:
            raise UserError(f"{MAX_INPUT_ENV}={env!r} must be a positive whole number of bytes")
        given = int(env)
    if isinstance(given, bool) or not isinstance(given, int) or given < 1:
        raise UserError(f"max_input_bytes {given!r} must be a positive whole number of bytes")
    return given


def store_run_value(conn: Connection, value: Any, what: str, *, inline_limit: int,
                    max_input_bytes: int) -> tuple[Any, str | None, str | None]:
    """A run's input or output (``what``) as (inline value, None, None), or (None, digest, None)
    once it is large; an output ``{key: large}`` is (None, digest of large, key): the sink node's
    blob of the same canonical bytes then holds it once (the digest is the same, the insert a
    no-op). ``InputTooLargeError`` for an input above ``max_input_bytes``."""
    if value is None:
        return None, None, None
    if what == "output" and isinstance(value, dict) and all(isinstance(key, str) for key in value):
        parts = {key: jsoncodec.dumps(inner, f"run output[{key!r}]") for key, inner in value.items()}
        if len(parts) == 1:
            ((key, text),) = parts.items()
            part = text.encode("utf-8")
            if len(part) > inline_limit and len(key) <= 200:
                digest = jsoncodec.digest(part)
                blob_rows.put(conn, [{"digest": digest, "size": len(part), "data": part}])
                return None, digest, key
        # each sink's output is checked as a value of its own (its node's output was, and
        # committed): the wrapper's level never makes one at the depth limit a refusal of the
        # run's end, which left the run 'running' with every resume refused the same way
        text = "{" + ",".join(f"{json.dumps(key, ensure_ascii=False)}:{parts[key]}" for key in sorted(parts)) + "}"
        data = text.encode("utf-8")
        inline: Any = jsoncodec.JSONText(text)
    else:
        data = jsoncodec.dumps(value, f"run {what}").encode("utf-8")
        inline = value
    if what == "input" and len(data) > max_input_bytes:
        raise InputTooLargeError(
            f"run input is {len(data):,} bytes of JSON, above the cap of {max_input_bytes:,} bytes: pass "
            f"a reference (a path, a URL, an id) instead, or raise the cap with {MAX_INPUT_ENV}=BYTES "
            "(or SqlStore(max_input_bytes=...))")
    if len(data) <= inline_limit:
        return inline, None, None
    digest = jsoncodec.digest(data)
    blob_rows.put(conn, [{"digest": digest, "size": len(data), "data": data}])
    return None, digest, None

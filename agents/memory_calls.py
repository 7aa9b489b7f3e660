"""The shared-memory tools' calls, pure: what is wrong with a call's input, and what the model is
told of a read or a compare-and-set write (``turns`` decides; the engine asks the store)."""

from __future__ import annotations

import json
from typing import Any

from raysaga.agents.agent import Agent
from raysaga.errors import UserError
from raysaga.types import check_text

__all__ = ["MAX_MEMORY_KEY", "SHOWN_CAP", "memory_problem", "memory_result", "too_big_to_read"]


#: A memory key is a row's key column (200 characters of text).
MAX_MEMORY_KEY = 200


def memory_problem(name: str, args: Any) -> str | None:
    if not isinstance(args, dict) or not isinstance(args.get("key"), str):
        return f"{name} needs a string 'key'"
    # the model's text: on PostgreSQL a longer key, or one holding NUL, failed the driver's read or
    # write of the row (DataError; the run left running, every resume the same)
    try:
        check_text(args["key"], f"{name}: the 'key'", MAX_MEMORY_KEY)
    except UserError as exc:
        return str(exc)
    if name != "memory_write":
        return None
    problems = []
    version = args.get("expected_version")
    # a JSON true is a Python int: it was taken for version 1 (and the conflict said "not True")
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        problems.append("an integer 'expected_version' >= 0 (0 for a new key, else the version memory_read gave), "
                        f"got {_shown(version) if 'expected_version' in args else 'none'}")
    if "value" not in args:  # run anyway, it overwrote the key with null
        problems.append("a 'value' (the JSON to store; null only to store null), got none")
    return f"memory_write needs {' and '.join(problems)}: nothing was written" if problems else None


def _shown(value: Any) -> str:
    try:
        return json.dumps(value)[:100]
    except (TypeError, ValueError):
        return repr(value)[:100]


#: The reading agent's ``max_tool_result_chars``, put in a ``memory_read``'s arguments for ``memory_result``.
SHOWN_CAP = "raysaga:max_tool_result_chars"


def _read_content(key: str, value: Any, version: int) -> str:
    """A memory read's result as the model is shown it."""
    return json.dumps({"key": key, "value": value, "version": version})


def too_big_to_read(agent: Agent, args: dict[str, Any]) -> str | None:
    """Why a write is refused: a read of its value (by this agent) would be longer than the agent is
    shown. Stored, it came back cut mid-JSON, and a read-merge-write lost the tail without a conflict."""
    cap = agent.max_tool_result_chars
    size = len(_read_content(args["key"], args["value"], args["expected_version"] + 1))
    if cap is None or size <= cap:
        return None
    return (f"memory_write: not written: a memory_read of {args['key']!r} with this value would be {size:,} "
            f"characters, more than the {cap:,} you are shown of a tool result (Agent.max_tool_result_chars), so "
            "it could not be read back whole. Split the value over several keys (e.g. "
            f"{args['key'] + '/1'!r}, {args['key'] + '/2'!r}), each well under that size.")


def memory_result(name: str, args: dict[str, Any], entry_key: str, value: Any, version: int,
                  won: bool) -> dict[str, Any]:
    """What the model is told of a memory read, or of a write that won (``won``) or lost the race.

    A read of a value longer than the reader is shown (``SHOWN_CAP``: written before writes were
    checked, or by an agent shown more) is an error saying so, never the value cut mid-JSON."""
    if name == "memory_read":
        content = _read_content(entry_key, value, version)
        cap = args.get(SHOWN_CAP)
        if isinstance(cap, int) and len(content) > cap:
            return {"content": f"memory_read: {entry_key!r} (version {version}) is not shown: read, it is "
                               f"{len(content):,} characters, more than the {cap:,} you are shown of a tool result "
                               "(Agent.max_tool_result_chars), and a value cut short cannot be merged. Do not write "
                               "it over from a guess; it must be split over smaller keys by an agent shown more, "
                               "or this agent given a larger max_tool_result_chars.", "is_error": True}
        return {"content": content, "is_error": False}
    if won:
        return {"content": json.dumps({"ok": True, "key": entry_key, "version": version}), "is_error": False}
    return {"content": f"conflict: {args['key']!r} is at version {version}, not {args.get('expected_version')} — "
                       f"another agent wrote it first. Read it again, merge, and write with "
                       f"expected_version={version}.",
            "is_error": True, "conflict": True}

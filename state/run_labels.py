"""Finding runs by their labels (``RunOptions.labels``, the JSON column ``raysaga_runs.labels``).

One condition per wanted label, all of which must hold, as SQL on either dialect: SQLite reads
the object's members with ``json_each`` (any key, quotes and dots included, with no JSON-path
quoting to get wrong), PostgreSQL with ``->>``. A row whose labels are NULL (no labels) or not
a JSON object matches no label; on SQLite a row whose text is not JSON is skipped (``json_valid``)
instead of failing the whole list, as ``list`` lists a corrupt row without failing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import String, bindparam, case, column, exists, func, literal, select

from raysaga.errors import InvalidOptionError
from raysaga.state.redact import scrub_text
from raysaga.state.schema import runs
from raysaga.state.text_match import folded_contains
from raysaga.types import check_labels


def stored_labels(labels: Mapping[str, str] | None) -> dict[str, str] | None:
    """A new run's labels as its row keeps them: checked (the store is every caller's way in),
    and NULL for none (the common case: no bytes in the row). A label that holds a secret (an API
    key's shape, a registered secret value of 8+ characters: what ``scrub_text`` would mask) is refused,
    not stored: labels are shown by ``status``, ``list`` and the dashboard, and matched as written. A
    short value (a PIN) is not looked for: some run's of the process, it refused another run's
    "fiscal_year=2024" (and told that run's caller it is a secret)."""
    if labels is None:
        return None
    checked = check_labels(dict(labels), "run labels")
    for key, value in checked.items():
        if scrub_text(key, short_values=False) != key or scrub_text(value, short_values=False) != value:
            raise InvalidOptionError(f"run labels: the label {scrub_text(key)!r:.60} holds what looks like a secret "
                                     "(an API key, a password): labels are stored and shown as written; keep "
                                     "secrets out of them")
    return checked or None


def labels_match(dialect: str, wanted: Mapping[str, str]) -> list[Any]:
    """The WHERE conditions of runs that carry every label of ``wanted`` (checked as labels are:
    ``InvalidOptionError`` naming a bad one)."""
    check_labels(dict(wanted), "the labels to list by")
    return [_has(dialect, key, value) for key, value in wanted.items()]


def _has(dialect: str, key: str, value: str) -> Any:
    k, v = bindparam(None, key, type_=String), bindparam(None, value, type_=String)
    if dialect != "sqlite":
        return runs.c.labels.op("->>", return_type=String)(k) == v
    members = func.json_each(case((func.json_valid(runs.c.labels) == 1, runs.c.labels))).table_valued("key", "value")
    return exists(select(literal(1)).select_from(members).where(members.c.key == k, members.c.value == v))


def labels_contain(dialect: str, needle: str) -> Any:
    """The WHERE condition of runs one of whose labels holds ``needle``, case ignored, in its key,
    its value or ``key=value`` as the run list shows it: the dashboard's ``q``, folded in SQL as the
    rest of ``q`` is (``text_match.folded_contains``: non-ASCII letters too, on SQLite as well) and
    matched as written (``%`` and ``_`` are no wildcards). A row whose labels are NULL or not a JSON
    object matches nothing (SQLite: not JSON either)."""
    key, value = column("key", String), column("value", String)
    if dialect == "sqlite":
        labels = case((func.json_valid(runs.c.labels) == 1, case((func.json_type(runs.c.labels) == "object",
                                                                 runs.c.labels))))
        members = func.json_each(labels).table_valued(key, value)
    else:
        labels = case((func.json_typeof(runs.c.labels) == "object", runs.c.labels))
        members = func.json_each_text(labels).table_valued(key, value)
    pair = members.c.key + literal("=") + func.coalesce(members.c.value, literal(""))
    return exists(select(literal(1)).select_from(members).where(folded_contains(pair, needle)))


__all__ = ["labels_contain", "labels_match", "stored_labels"]

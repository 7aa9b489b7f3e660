"""Text tests in SQL that answer the same on SQLite and PostgreSQL.

Case-insensitive search (the dashboard's ``q``): SQLite's ``lower()`` folds ASCII letters only, so
"Ärger", "ΣΙΓΜΑ" or "Ошибка" were never found there by any spelling but their own, while
PostgreSQL found them. Every SQLite connection of the store has ``raysaga_lower`` (``engine``
registers ``fold_case`` on connect): it folds as PostgreSQL's ``lower()`` does in a UTF-8 locale,
each character by its own lowercase mapping. ``folded`` compiles to it on SQLite and to ``lower``
elsewhere; ``folded_contains`` folds both the column and the needle in SQL, by the same function,
so the needle is never folded one way in Python and the column another in the database.

Case-sensitive prefixes (an agent's ``node@…`` rows, a compensation's ``node:…``): LIKE ignores
ASCII case on SQLite, so a prefix test through it also matched another step's rows (``Pay@1``
for ``pay``). ``has_prefix`` is a key range on SQLite (BINARY order is code point order; the
range can use an index) and a LIKE on PostgreSQL (case-sensitive there, where a collation other
than "C" need not order text by code point).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, String, and_, func, literal, true
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

#: The name of ``fold_case`` on every SQLite connection of the store.
SQLITE_LOWER = "raysaga_lower"
#: The escape character of the LIKE patterns built here (SQLAlchemy's ``autoescape`` uses it too).
ESCAPE = "/"

_DOTTED_I = "\u0130"  # İ: Python lowers it to "i" + a combining dot; PostgreSQL, to "i"
_SIGMA = "\u03a3"  # capital sigma: Python lowers a final one to the final form; PostgreSQL never does


def fold_case(value: Any) -> Any:
    """``value`` lower-cased as PostgreSQL's ``lower()`` does under a UTF-8 locale: each
    character by its simple lowercase mapping, so no final-sigma rule (Python's ``str.lower``
    has one) and "İ" becomes "i". Anything but text is returned as it is (SQLite passes the
    column's value, NULL included)."""
    if not isinstance(value, str):
        return value
    if value.isascii() or (_SIGMA not in value and _DOTTED_I not in value):
        return value.lower()
    return "".join("i" if c == _DOTTED_I else c.lower() for c in value)


def register(dbapi_conn: Any) -> None:
    """Give a SQLite DBAPI connection ``raysaga_lower`` (deterministic: SQLite may reuse a result)."""
    dbapi_conn.create_function(SQLITE_LOWER, 1, fold_case, deterministic=True)


class folded(FunctionElement[str]):  # a SQL function, named as one
    """``lower(x)``, folding non-ASCII letters on SQLite too (``raysaga_lower``)."""

    type = String()
    name = "lower"
    inherit_cache = True


@compiles(folded, "sqlite")
def _folded_sqlite(element: folded, compiler: SQLCompiler, **kw: Any) -> str:
    return f"{SQLITE_LOWER}({compiler.process(element.clauses, **kw)})"


@compiles(folded)
def _folded(element: folded, compiler: SQLCompiler, **kw: Any) -> str:
    return f"lower({compiler.process(element.clauses, **kw)})"


def like_escaped(text: str) -> str:
    """``text`` with LIKE's wildcards (and the escape character) escaped by ``ESCAPE``."""
    return text.replace(ESCAPE, ESCAPE * 2).replace("%", ESCAPE + "%").replace("_", ESCAPE + "_")


def folded_contains(expr: Any, needle: str) -> ColumnElement[bool]:
    """Whether ``expr`` holds ``needle`` ignoring case (both folded by ``folded``), ``%`` and
    ``_`` matched as written."""
    pattern = literal("%" + like_escaped(needle) + "%", String)
    return folded(expr).like(folded(pattern), escape=ESCAPE)


def has_prefix(column: Any, prefix: str, dialect: str) -> ColumnElement[bool]:
    """Whether ``column`` starts with ``prefix``, case-sensitively on every dialect."""
    if not prefix:
        return true()
    if dialect != "sqlite":
        return column.startswith(prefix, autoescape=True)  # type: ignore[no-any-return]
    last = ord(prefix[-1])
    if last == 0xD7FF or last >= 0x10FFFF:  # its successor is a surrogate, or there is none: compare the head
        return func.substr(column, 1, len(prefix)) == literal(prefix, String)
    # [prefix, prefix with its last character's successor): exactly the texts that start with prefix
    return and_(column >= literal(prefix, String), column < literal(prefix[:-1] + chr(last + 1), String))


__all__ = ["ESCAPE", "SQLITE_LOWER", "fold_case", "folded", "folded_contains", "has_prefix", "like_escaped",
           "register"]

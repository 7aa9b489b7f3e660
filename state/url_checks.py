"""What a store's path or URL may hold, checked before a driver sees it, so a mistake is one line
that names the part of the URL and the fix, never Python's or psycopg's own error:

- ``~user`` (``--db ~ops/x.db``, ``sqlite:///~ops/x.db``, ``RAYSAGA_HOME=~ops/r``) naming no user
  here: ``Path.expanduser`` raised ``RuntimeError: Could not determine home directory``;
- a PostgreSQL URL's query options: one libpq does not know (a typo, or psycopg's own
  ``prepare_threshold``/``autocommit``, which arrived as strings: a ``TypeError`` or autocommit on),
  one given twice, or a whole-number option that is not one (``?connect_timeout=abc``: psycopg's
  raw ``ProgrammingError``).

Messages never hold a password: URLs are shown ``redact``ed, and a secret-named option's value never.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

from sqlalchemy.engine import URL, make_url

from raysaga.errors import StoreUnavailableError

#: Query parameters of a database URL that hold a secret (libpq and SQLAlchemy take a password
#: there too: ``?password=``, ``?sslpassword=``), matched in their names.
SECRET_QUERY = re.compile(r"pass|pwd|secret|token", re.IGNORECASE)


def redact(url: str) -> str:
    """The URL with any password hidden (in its userinfo and in its query), for messages and logs."""
    try:
        parsed = make_url(url)
        if any(SECRET_QUERY.search(name) for name in parsed.query):
            parsed = parsed.set(query={name: "***" if SECRET_QUERY.search(name) else value
                                       for name, value in parsed.query.items()})
        return parsed.render_as_string(hide_password=True).replace("%2A%2A%2A", "***")
    except Exception:
        return "<unparseable database URL>"


def expand_user(path: str | Path, source: str | None = None) -> Path:
    """``path`` with a leading ``~`` or ``~user`` expanded; ``StoreUnavailableError`` naming the
    user when there is none such here (or no home folder to expand ``~`` to). ``source``: the URL
    the path is in, or the setting (``RAYSAGA_HOME``) that holds it; None for a path given as is."""
    try:
        return Path(path).expanduser()
    except RuntimeError:  # "Could not determine home directory."
        from raysaga.state.redact import scrub_text

        head = str(path).split("/", 1)[0]
        if source is None:
            where = f"the store path {str(path)!r}"
        elif "://" in source:
            where = f"the path of the store URL {redact(source)}"
        else:
            where = f"{source}={str(path)!r}"
        who = f"there is no user {head[1:]!r} on this machine" if head[1:] else "this process has no home folder"
        raise StoreUnavailableError(scrub_text(
            f"{where} starts with {head}, but {who} to expand it to: write the path in full (absolute), or fix the "
            "user name (check --db / RAYSAGA_DB / RAYSAGA_HOME)")) from None


#: libpq options whose value is a whole number: libpq refuses anything else, and psycopg reads
#: ``connect_timeout`` itself first (``bad value for connect_timeout``).
_WHOLE_NUMBERS = frozenset({"connect_timeout", "port", "keepalives", "keepalives_idle", "keepalives_interval",
                            "keepalives_count", "tcp_user_timeout"})
#: Options that may be repeated: several hosts (``?host=h1:p1&host=h2:p2``: SQLAlchemy joins them).
_REPEATABLE = frozenset({"host"})
_WHOLE = re.compile(r"\s*-?[0-9]+\s*")


@functools.cache
def _libpq_options() -> frozenset[str] | None:
    """The connection options the installed libpq knows; None when psycopg is not installed
    (opening the store says so)."""
    try:
        from psycopg import pq
    except ImportError:
        return None
    return frozenset(o.keyword.decode() for o in pq.Conninfo.get_defaults())


def _shown(url: URL, hide: str = "") -> str:
    """``url`` for a message: ``postgresql://``, its password and secret options hidden, and the
    option ``hide`` too (a misspelt ``?passwrod=`` may hold one)."""
    if hide:
        url = url.update_query_dict({hide: "***"})
    return "postgresql://" + redact(url.render_as_string(hide_password=False)).split("://", 1)[-1]


def check_pg_options(url: URL) -> None:
    """Refuse a PostgreSQL URL whose query holds an option libpq does not know, one given twice,
    or a whole-number option that is not one, naming the option and the fix."""
    known = _libpq_options()
    for name, value in url.query.items():
        values = value if isinstance(value, tuple) else (value,)
        if known is not None and name not in known:
            raise StoreUnavailableError(
                f"the PostgreSQL URL {_shown(url, name)} has the option ?{name}=, which is not a PostgreSQL "
                "connection option (raysaga sets psycopg's own settings itself): fix its name (such as "
                "connect_timeout, sslmode, application_name) or remove it")
        if len(values) > 1 and name not in _REPEATABLE:
            raise StoreUnavailableError(f"the PostgreSQL URL {_shown(url)} gives the option ?{name}= {len(values)} "
                                        "times: keep one")
        if name in _WHOLE_NUMBERS:
            # several hosts' ports: ?host=h1,h2&port=p1,p2
            for one in (part for v in values for part in (v.split(",") if name == "port" else [v])):
                if one.strip() and not (one.isascii() and _WHOLE.fullmatch(one)):
                    raise StoreUnavailableError(
                        f"the option ?{name}={one[:40]!r} of the PostgreSQL URL {_shown(url)} is not a whole "
                        f"number: write ?{name}=N in ASCII digits (such as ?{name}={5432 if name == 'port' else 10}), "
                        "or remove it")

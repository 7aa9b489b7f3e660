"""How the CLI opens and describes the store.

Read commands (status, list, events) open it with ``create=False``: they never create a file,
a directory or a schema, so a typo in ``--db`` is a clean error that leaves nothing behind. A SQLite
store they cannot write (a read-only folder or file) they read through read-only connections
(``state.sqlite_readonly``); the commands that write refuse it, with the fix.
"""

from __future__ import annotations

import shlex

from raysaga.errors import RunNotFoundError, StoreUnavailableError, UserError
from raysaga.state import SqlStore, describe_store, open_store
from raysaga.state import engine as _engine
from raysaga.state.redact import scrub_text
from raysaga.state.schema import SCHEMA_VERSION as SCHEMA_VERSION  # (`raysaga --version` says it)


def store_url(db: str | None) -> str:
    return _engine.given_url(db, "--db (or RAYSAGA_DB)")


def describe(url: str) -> str:
    """Where the store is, for people (absolute path, or the URL with its password hidden, in its
    userinfo or in its query: ``?password=``)."""
    return scrub_text(describe_store(url))


def _require_existing(url: str, run_id: str | None) -> None:
    """Refuse a SQLite store file that does not exist, before any engine (which would create its
    folder) is made: a typo in ``--db`` must leave nothing behind."""
    path = _engine.sqlite_path(url)
    if path is None:
        return
    try:
        exists = path.exists()
    except OSError as exc:  # a file name longer than the file system takes, and the like
        raise StoreUnavailableError(f"{path} cannot be a store file ({exc.strerror or exc}): check --db or "
                                    "RAYSAGA_DB") from None
    if exists:  # a directory, an empty file, another program's database: the engine's refusals
        _engine.probe_sqlite_store(url)
        return
    where = f"there is no raysaga store at {path}"
    fix = "check --db or RAYSAGA_DB (`raysaga run` creates a store; this command never does)"
    if run_id is not None:
        raise StoreUnavailableError(f"no run with id {run_id!r}: {where}; {fix}")
    raise StoreUnavailableError(f"{where}: {fix}")


def open_for_reads(db: str | None, run_id: str | None = None) -> SqlStore:
    """The store, never created nor migrated (``StoreUnavailableError`` if it is not there), and
    read-only when this process cannot write it (``SqlStore.read_only``). ``run_id``: the run the
    command is about, named when there is no store at all."""
    url = store_url(db)
    _require_existing(url, run_id)
    return open_store(url, create=False)


def open_for_writes(db: str | None, run_id: str | None = None, *, must_exist: bool = False) -> SqlStore:
    """The store, migrated if needed. With ``run_id`` (resume, retry, cancel: the run must exist)
    a missing SQLite file is refused instead of created."""
    url = store_url(db)
    if run_id is not None or must_exist:
        _require_existing(url, run_id)
    return open_store(url)


def db_option(db: str | None) -> str:
    """``--db DB`` for a command line this one prints for the user to run next (``list``'s "more:"
    line dropped it and its paste listed the default store); none when the store is the default,
    and the option's name alone when ``db`` holds a password, in its userinfo or query (never printed)."""
    if not db:
        return ""
    from sqlalchemy.engine import make_url

    from raysaga.state.url_checks import SECRET_QUERY

    try:  # a password in the userinfo, or in the query (``?password=``, ``?sslpassword=``)
        parsed = make_url(db)
        secret = parsed.password is not None or any(SECRET_QUERY.search(name) for name in parsed.query)
    except Exception:  # a plain file path
        secret = False
    return "--db ..." if secret else f"--db {shlex.quote(db)}"


def page_cursor(store: SqlStore, before: str) -> tuple[float, str]:
    """``list --before RUN``'s paging key. A run not in the store (pruned since the page that named
    it, or never there) is refused with how to page on: a run id does not say when its run was
    created (a generated one is the workflow's name and a random suffix), so there is no place to
    page on from (it failed with ``RunNotFoundError``'s advice: run ``raysaga list``)."""
    from raysaga.state import queries

    try:
        return queries.run_cursor(store, before)
    except RunNotFoundError:
        raise UserError(f"--before {before!r}: there is no run with that id in {describe(store.url)}: it was deleted "
                        "(`raysaga prune` deletes finished runs) or never existed, and a run id does not say when its "
                        "run was created, so there is no place to page on from: pass --before the run listed just "
                        "above it, or list from the newest again (`raysaga list`)") from None

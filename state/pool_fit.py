"""A worker's PostgreSQL pool, sized to its slots: refused when the server could never give it, a
warning when it has not that many free now.

A worker keeps a driver's and a heartbeat's connection per slot (``fit_pool``). PostgreSQL allows
``max_connections`` (100 by default) over every client: two ``-c 40`` workers (82 each) exceed it,
and the one that asks last is refused ("too many clients") in the middle of its runs, which then
wait out an outage. Said once at the start, with the figures and the fixes, instead.
"""

from __future__ import annotations

import logging

from sqlalchemy import Engine, text
from sqlalchemy.pool import QueuePool

from raysaga.errors import UserError
from raysaga.state.engine import POOL_SIZE_ENV, pool_size_env

log = logging.getLogger("raysaga.worker")

#: Connections open now and the ones the server gives to clients that are not superusers.
_CAPACITY = text(
    "SELECT (SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'), "
    "current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int "
    "- coalesce(nullif(current_setting('reserved_connections', true), '')::int, 0)")


def fit_pool(engine: Engine | None, connections: int) -> None:
    """Grow a PostgreSQL ``engine``'s pool to ``connections``, unless ``RAYSAGA_DB_POOL_SIZE`` sets it,
    and warn when the server has fewer connections free than the pool may open."""
    pool = engine.pool if isinstance(engine, Engine) and engine.dialect.name == "postgresql" else None
    if engine is None or not isinstance(pool, QueuePool):
        return  # (SQLite: its connections are file handles of this process, not a server's)
    if pool_size_env() is None and pool.size() < connections:
        engine.pool = QueuePool(pool._creator, pool_size=connections, max_overflow=pool._max_overflow,
                                timeout=pool._timeout, pre_ping=pool._pre_ping, recycle=pool._recycle,
                                reset_on_return=pool._reset_on_return, _dispatch=pool.dispatch, dialect=pool._dialect)
        pool.dispose()
    fitted = engine.pool
    assert isinstance(fitted, QueuePool)
    warn_if_short(engine, fitted.size(), max(fitted._max_overflow, 0))


def warn_if_short(engine: Engine, size: int, burst: int) -> None:
    """Log a warning when the pool's ``size`` + ``burst`` connections exceed what the server has free
    now (best effort: a server that will not say, or is down, is left to the runs' outage handling)."""
    try:
        with engine.connect() as conn:
            row = conn.execute(_CAPACITY).one()
    except Exception as exc:  # (a pooler in front may not answer it)
        log.debug("could not read the server's free connections: %s", type(exc).__name__)
        return
    in_use, allowed = int(row[0]), int(row[1])
    if size > allowed:  # never satisfiable: started anyway, it took every free connection of a shared server
        raise UserError(f"this worker's pool needs {size} connections to PostgreSQL (2 per --concurrency slot + 2, "
                        f"or {POOL_SIZE_ENV}) but the server allows {allowed} to its clients in all: lower "
                        f"--concurrency, raise max_connections, or put a pooler (PgBouncer) in front and set "
                        f"{POOL_SIZE_ENV}")
    free = allowed - in_use + 1  # (this check's own connection is the pool's, counted in use)
    wanted = size + burst
    if wanted <= free:
        return
    log.warning("this worker may open %d connections to PostgreSQL (%d: 2 per --concurrency slot + 2, or %s; and %d "
                "more at a burst), but the server "
                "has %d free (max_connections allows %d to clients, %d open now): past that it refuses connections "
                "(\"too many clients\") and runs wait. Lower --concurrency, raise max_connections, put a pooler "
                "(PgBouncer) in front, or set %s", wanted, size, POOL_SIZE_ENV, burst, max(free, 0), allowed, in_use,
                POOL_SIZE_ENV)

"""A migrated SQLite store to copy: what a new store file is after its first open, made once per process.

A new file is migrated by whichever process opens it first (alembic, 14 schema versions: ~0.1-0.3 s,
and ~0.4 s more to import alembic in a driver subprocess). The template is that file, byte for byte
(migrations write the same rows every time, then ``VACUUM``), so a test or harness that only needs
an empty store copies it instead. Opening, creating and migrating new files is what tests/state
(``test_migrations.py``, ``test_store_open.py``) and tests/cli test, on files of their own.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from raysaga.state import SqlStore

PREFIX = "sqlite:///"


@functools.cache
def template() -> Path:
    """The template file (made on first use in this process, removed at its exit)."""
    folder = Path(tempfile.mkdtemp(prefix="raysaga-store-template-"))
    atexit.register(shutil.rmtree, folder, True)
    path = folder / "template.db"
    SqlStore(f"{PREFIX}{path}").close()
    assert [p.name for p in folder.iterdir()] == [path.name], "the template left a -wal or -shm file"
    return path


def copy_template(url: str) -> None:
    """Put the template at ``url``'s SQLite file if nothing is there yet (a no-op for PostgreSQL, a
    URL with query parameters, or a folder that does not exist). Call it before any process that
    may open the store is started."""
    if not url.startswith(PREFIX) or "?" in url:
        return
    path = Path(url[len(PREFIX):])
    if path.is_absolute() and path.parent.is_dir() and not path.exists():
        shutil.copyfile(template(), path)

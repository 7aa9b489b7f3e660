"""Blobs by digest: every read is checked against its content address, every write is insert-once.

Large values live in ``raysaga_blobs`` under the sha256 of their canonical JSON bytes, so rows
stay small and equal values are stored once. Since the digest is of the content, bytes that do
not hash to it were changed behind raysaga's back: a read refuses them (``BlobIntegrityError``)
and a write of the right bytes repairs the row.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, select

from raysaga.errors import BlobIntegrityError
from raysaga.state import jsoncodec
from raysaga.state.schema import blobs
from raysaga.state.statements import insert_for


def verify(digest: str, data: bytes, where: str) -> None:
    """``BlobIntegrityError`` unless ``data`` hashes to ``digest``."""
    actual = jsoncodec.digest(data)
    if actual != digest:
        raise BlobIntegrityError(digest, f"does not match its content (the stored bytes hash to {actual})", where)


def read(conn: Connection, digests: list[str]) -> dict[str, bytes]:
    """The bytes of the blobs of ``digests`` that exist, each verified against its digest."""
    rows = conn.execute(select(blobs.c.digest, blobs.c.data).where(blobs.c.digest.in_(digests))).all()
    out = {d: bytes(b) for d, b in rows}
    for d, data in out.items():
        verify(d, data, "")
    return out


def load(conn: Connection, wanted: Mapping[str, str]) -> dict[str, Any]:
    """Fetch, verify and parse blobs: ``wanted`` maps digest -> where it is used."""
    rows = conn.execute(select(blobs.c.digest, blobs.c.data).where(blobs.c.digest.in_(list(wanted)))).all()
    found = {d: bytes(b) for d, b in rows}
    out: dict[str, Any] = {}
    for d, where in wanted.items():
        data = found.get(d)
        if data is None:
            raise BlobIntegrityError(d, "is missing", where)
        verify(d, data, where)
        try:
            out[d] = jsoncodec.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise BlobIntegrityError(d, f"is not JSON ({exc})", where) from None
    return out


_PUT: dict[str, Any] = {}


def put(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Write blobs by digest. Insert-once, except that a row whose stored bytes differ from the
    ones written (altered behind raysaga's back: the digest is of the content) is repaired, so a
    tampered blob never poisons later writes of the same content. An intact row is left as is
    (one byte comparison on a conflict). Only bytes that hash to their digest may repair a row:
    a body under another digest never replaces a stored one (it is ignored, insert-once)."""
    right = [r for r in rows if jsoncodec.digest(r["data"]) == r["digest"]]
    wrong = [r for r in rows if r not in right] if len(right) != len(rows) else []
    if right:
        stmt = _PUT.get(conn.dialect.name)
        if stmt is None:
            base = insert_for(conn, blobs)
            stmt = _PUT[conn.dialect.name] = base.on_conflict_do_update(
                index_elements=["digest"], set_={"data": base.excluded.data, "size": base.excluded.size},
                where=blobs.c.data != base.excluded.data)
        conn.execute(stmt, right)
    if wrong:
        conn.execute(insert_for(conn, blobs).on_conflict_do_nothing(index_elements=["digest"]), wrong)


def rows_of(blobs_by_digest: Mapping[str, bytes]) -> list[dict[str, Any]]:
    """``put``'s rows for blobs given as digest -> bytes."""
    return [{"digest": d, "size": len(b), "data": b} for d, b in blobs_by_digest.items()]

"""One pydantic ``TypeAdapter`` per annotation, not per call.

Building an adapter compiles a validator (~50 µs, a third of a no-op fan-out item's cost on a
worker, measured with cProfile); a step's parameter types are few and fixed, so each is built once
per process. An unhashable annotation (``Annotated[int, Field(gt=0), {"doc": 1}]``) is kept by its
object's identity instead: the one a step's spec holds comes again for every item (a fresh adapter
each time cost 0.7-1.9 ms an item, measured: 10,000 items spent seconds of worker CPU on them).
"""

from __future__ import annotations

import functools
from typing import Any

from pydantic import TypeAdapter


@functools.lru_cache(maxsize=512)
def _cached(tp: Any) -> TypeAdapter[Any]:
    return TypeAdapter(tp)


#: Adapters of unhashable annotations by ``id``, each kept with its annotation (so the id is never
#: another object's while its entry lives); cleared when full, as the lru cache evicts.
_by_identity: dict[int, tuple[Any, TypeAdapter[Any]]] = {}
_IDENTITY_KEPT = 512


def type_adapter(tp: Any) -> TypeAdapter[Any]:
    """The adapter for ``tp``, built once per process (per annotation object when it does not hash)."""
    try:
        return _cached(tp)
    except TypeError:  # unhashable (e.g. Annotated with a dict in its metadata)
        entry = _by_identity.get(id(tp))
        if entry is None or entry[0] is not tp:
            if len(_by_identity) >= _IDENTITY_KEPT:
                _by_identity.clear()
            entry = _by_identity[id(tp)] = (tp, TypeAdapter(tp))
        return entry[1]

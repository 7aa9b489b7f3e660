"""One pydantic ``TypeAdapter`` per annotation, not per call (``raysaga.state.type_adapters``: the
store's JSON forms are read back with the same adapters, ``raysaga.state.json_form``)."""

from __future__ import annotations

from raysaga.state.type_adapters import type_adapter

__all__ = ["type_adapter"]

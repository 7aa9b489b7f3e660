"""Idempotency keys: deterministic from what the effect is, never random or model-worded."""

from __future__ import annotations

from typing import Any

from raysaga.state import jsoncodec
from raysaga.types import COMPENSATE_SUFFIX, compensation_node, is_compensation

__all__ = ["COMPENSATE_SUFFIX", "args_digest", "compensation_node", "effect_key", "is_compensation"]


def effect_key(run_id: str, node_id: str, fan_index: int, effect_name: str, args: Any) -> str:
    """Key of one effect: the same (run, node, fan-out index, effect, canonical args) → same key."""
    digest = jsoncodec.fingerprint([run_id, node_id, fan_index, effect_name, args])
    return f"rs-{digest[:40]}"


def args_digest(args: Any) -> str:
    return jsoncodec.fingerprint(args)

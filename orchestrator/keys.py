"""Idempotency keys: deterministic from what the effect is, never random or model-worded."""

from __future__ import annotations

from typing import Any

from raysaga.state import jsoncodec


def effect_key(run_id: str, node_id: str, fan_index: int, effect_name: str, args: Any) -> str:
    """Key of one effect: the same (run, node, fan-out index, effect, canonical args) → same key."""
    digest = jsoncodec.fingerprint([run_id, node_id, fan_index, effect_name, args])
    return f"rs-{digest[:40]}"


def args_digest(args: Any) -> str:
    return jsoncodec.fingerprint(args)


#: A compensation's node id is the compensated node's + this; its key, the effect's key + this.
COMPENSATE_SUFFIX = ":compensate"


def is_compensation(node_id: str) -> bool:
    return node_id.endswith(COMPENSATE_SUFFIX)


def compensation_node(node_id: str) -> str:
    return node_id + COMPENSATE_SUFFIX

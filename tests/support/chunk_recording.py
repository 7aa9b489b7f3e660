"""What a fan-out's driver packs into each task: the fan indexes of a block's chunk, in order."""

from __future__ import annotations

import pytest

from raysaga.orchestrator import wire
from raysaga.orchestrator.item_block import ItemBlock


def record_chunks(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The fan indexes of each block task the driver packs from now on (``SpecPacker.pack_items``)."""
    sent: list[list[int]] = []
    original = wire.SpecPacker.pack_items

    def recording(self: wire.SpecPacker, block: ItemBlock, positions: list[int]) -> bytes:
        sent.append([block.keys[p].fan_index for p in positions])
        return original(self, block, positions)

    monkeypatch.setattr(wire.SpecPacker, "pack_items", recording)
    return sent

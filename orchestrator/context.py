"""What a running step can know about itself (``StepContext`` lives in ``raysaga.types``)."""

from __future__ import annotations

from raysaga.types import StepContext

__all__ = ["StepContext"]

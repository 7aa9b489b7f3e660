"""Flow modules that a test writes into its ``tmp_path`` and imports from there.

A driver script written next to such a module imports it by name: Python puts the script's own
folder first on ``sys.path``, so no path needs adding.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType


def import_file(path: Path, name: str) -> ModuleType:
    """Import the file ``path`` as module ``name``, without registering it in ``sys.modules``."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

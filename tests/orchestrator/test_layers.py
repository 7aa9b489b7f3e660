"""Layers point one way: the import-linter contracts in pyproject.toml hold (CI also runs
``lint-imports``), and the graph has no cycle beyond the debt the contract lists by name."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

from tests.support import REPO


def test_import_contracts_hold() -> None:
    # in its own process: import-linter's CLI calls logging.config.dictConfig, which disables every
    # logger that exists already (raysaga's included) for the rest of a test session
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or "lint-imports"
    proc = subprocess.run([exe], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_lower_layers_never_import_upper_ones_even_for_typing() -> None:
    graph = grimp.build_graph("raysaga", exclude_type_checking_imports=False)
    for lower, uppers in {
        "raysaga.types": ("raysaga.state", "raysaga.agents", "raysaga.sagas", "raysaga.orchestrator"),
        "raysaga.state": ("raysaga.agents", "raysaga.sagas", "raysaga.orchestrator"),
        "raysaga.agents": ("raysaga.sagas", "raysaga.orchestrator"),
        "raysaga.sagas": ("raysaga.agents", "raysaga.orchestrator"),
    }.items():
        for upper in uppers:
            chain = graph.find_shortest_chain(importer=lower, imported=upper, as_packages=True)
            assert chain is None, f"{lower} imports {upper}: {' -> '.join(chain or ())}"


#: A module a newcomer can read in one sitting: past this, split it by what it does.
MAX_MODULE_LINES = 500


def test_no_module_outgrows_a_reading() -> None:
    too_long = {}
    for package in ("orchestrator", "agents", "sagas", "state", "api"):
        for path in (REPO / package).rglob("*.py"):
            lines = len(path.read_text().splitlines())
            if lines > MAX_MODULE_LINES:
                too_long[str(path.relative_to(REPO))] = lines
    assert not too_long, f"modules over {MAX_MODULE_LINES} lines (split them by concern): {too_long}"

"""The workflow's own modules Ray would leave out of a launched job's code.

Ray builds a job's ``working_dir`` package honouring every ``.gitignore`` (unless
``RAY_RUNTIME_ENV_IGNORE_GITIGNORE=1`` is set where the package is built: the launching shell)
and every ``.rayignore`` in the folder and below. A module the workflow imports from that folder
but the project ignores (``local_settings.py``) was silently left out: the job failed on the
cluster with "No module named ..." after ``launch`` said "launched". ``ignored_modules`` names
them before anything is recorded, matching as Ray does (its vendored ``pathspec``'s gitwildmatch, each ignore
file against the paths below its own folder); git need not be installed.
"""

from __future__ import annotations

import fnmatch
import sys
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

#: The variable that makes Ray's package builder ship what ``.gitignore`` files ignore.
IGNORE_GITIGNORE = "RAY_RUNTIME_ENV_IGNORE_GITIGNORE"


def imported_files(root: Path) -> list[Path]:
    """The files of the modules this process imported from below ``root`` (the workflow's module
    and what it imports from its folder, as the launch loaded it); not those of an environment
    kept there (``proj/.venv``: its site-packages, ``sys.prefix``, any folder with a
    ``pyvenv.cfg``) nor what ``launch.EXCLUDES`` leaves out of the package anyway."""
    found: set[Path] = set()
    prefixes = {Path(p).resolve() for p in {sys.prefix, sys.base_prefix, sys.exec_prefix}}
    for module in list(sys.modules.values()):
        name = getattr(module, "__file__", None)
        if not isinstance(name, str):
            continue
        path = Path(name).resolve()
        if root in path.parents and not _environment_or_excluded(root, path, prefixes):
            found.add(path)
    return sorted(found)


def _environment_or_excluded(root: Path, path: Path, prefixes: set[Path]) -> bool:
    """Whether ``path`` (below ``root``) belongs to a Python environment, or to what the launch excludes."""
    from raysaga.orchestrator.launch import EXCLUDES

    if any(p in path.parents for p in prefixes if root in p.parents):
        return True
    parts = path.relative_to(root).parts
    if any(part in ("site-packages", "dist-packages") for part in parts):
        return True
    if any(fnmatch.fnmatchcase(part, pattern) for part in parts for pattern in EXCLUDES):
        return True
    return any((folder / "pyvenv.cfg").is_file() for folder in path.parents if root in folder.parents)


def ignored_modules(root: Path, files: Iterable[Path], environ: Mapping[str, str]) -> list[tuple[Path, Path]]:
    """``(file, ignore file)`` for each of ``files`` (below ``root``) an ignore file Ray reads
    would leave out of the package, matched by the copy of ``pathspec`` Ray itself packages with
    (vendored in Ray: the ``pathspec`` distribution is no dependency of raysaga's); [] without it."""
    try:
        from ray._private.thirdparty.pathspec import PathSpec  # type: ignore[attr-defined]
    except ImportError:  # (a Ray that moved it: no warning, the launch goes on as before)
        return []
    names = [".rayignore"] if environ.get(IGNORE_GITIGNORE, "0") == "1" else [".gitignore", ".rayignore"]
    specs: dict[Path, Any] = {}  # (pathspec's types differ between its versions)

    def spec(path: Path) -> Any:
        if path not in specs:
            try:
                lines = path.read_text(errors="replace").splitlines()
                with warnings.catch_warnings():  # Ray's own matching; newer pathspec calls it deprecated
                    warnings.simplefilter("ignore", DeprecationWarning)
                    specs[path] = PathSpec.from_lines("gitwildmatch", lines)  # type: ignore[no-untyped-call]
            except OSError:  # absent (the usual case), or unreadable: Ray reads only files there
                specs[path] = None
        return specs[path]

    ignored: list[tuple[Path, Path]] = []
    for file in files:
        folders = [root, *(p for p in reversed(file.parents) if root in p.parents)]
        hit = next(((folder / name) for folder in folders for name in names
                    if _matches(spec(folder / name), file, folder)), None)
        if hit is not None:
            ignored.append((file, hit))
    return ignored


def _matches(spec: Any, file: Path, folder: Path) -> bool:
    """Whether ``spec`` (an ignore file's patterns, or None) leaves ``file`` out: the file itself,
    or one of the folders between it and ``folder`` (Ray skips an ignored folder's whole tree).
    A folder is matched by its path as Ray matches it, with no trailing ``/``: ``sub/`` then
    ``!sub/keep.py`` leaves ``sub`` walked and ships ``sub/keep.py``."""
    if spec is None:
        return False
    rel = file.relative_to(folder)
    paths = [str(rel), *(str(p) for p in rel.parents if str(p) != ".")]
    return any(spec.match_file(p) for p in paths)


def warning_lines(root: Path, environ: Mapping[str, str]) -> list[str]:
    """One line per module file of the workflow Ray would leave out, naming the way to ship it."""
    lines = []
    for file, ignore in ignored_modules(root, imported_files(root), environ):
        fix = (f"export {IGNORE_GITIGNORE}=1 before launching to ship it anyway (Ray then reads no .gitignore)"
               if ignore.name == ".gitignore" else "take it out of that .rayignore")
        lines.append(f"{file.relative_to(root)} is imported by the workflow but {ignore.relative_to(root)} "
                     f"ignores it, so Ray leaves it out of the job's code and the cluster cannot import it: {fix}")
    return lines


__all__ = ["IGNORE_GITIGNORE", "ignored_modules", "imported_files", "warning_lines"]

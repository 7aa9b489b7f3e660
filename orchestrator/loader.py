"""Resolve ``MODULE:WORKFLOW`` to a ``Workflow``: what the operator typed, or what a run records.

Two doors, because they are trusted differently (docs/security.md):

- ``load_workflow(ref)``: a ref the operator typed (``raysaga run flows.py:wf``, ``--workflow``):
  a dotted module or a ``.py`` file path; the operator chose to run that code.
- ``load_recorded_workflow(ref, run_id)``: a ref read from the store (``resume``/``retry``
  without ``--workflow``). Anyone able to write one row could otherwise make the next operator
  execute a file of their choosing, so it must be a dotted module name (no path, no ``.py``,
  no leading dot) that resolves from the operator's own ``sys.path``.

``recordable_ref(ref)`` is what ``run`` stores: the module form of the typed ref, or None.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import re
import site
import sys
import sysconfig
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

from raysaga.errors import WorkflowLoadError
from raysaga.orchestrator.workflow import Workflow
from raysaga.state.redact import scrub_text

#: A recorded ref: dotted identifiers, ':', an identifier. No path separator, no '.py', no leading dot.
RECORDED_REF = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*")
#: ``sys.path`` as this process started (``load_workflow`` of a file adds the file's folder later).
_BASE_PATH = list(sys.path)
#: The module each file ``load_workflow`` loaded is registered as, by name: a later file of the same
#: name may replace it (a test process loads many ``flows.py``); a module imported otherwise may not.
_FROM_FILES: dict[str, object] = {}


def load_recorded_workflow(ref: str | None, run_id: str | None = None) -> Workflow:
    """The workflow of run ``run_id`` from the ``workflow_ref`` its row records; never a file."""
    hint = "pass --workflow MODULE:WORKFLOW (or a path like flows.py:wf) naming the workflow to use"
    run = f"run {run_id!r}" if run_id else "the run"
    if not ref:
        raise WorkflowLoadError(f"{run} does not record where its workflow lives: {hint}")
    if not RECORDED_REF.fullmatch(ref) or ref.partition(":")[0].endswith(".py"):
        raise WorkflowLoadError(f"{run} records workflow_ref {ref!r}, which is not an importable module "
                                f"name (a stored ref is never a file path): {hint}")
    module_ref = ref.partition(":")[0]
    refused = _refused_module(module_ref)
    if refused:
        raise WorkflowLoadError(f"{run} records workflow_ref {ref!r}, which names {refused}: a stored ref is "
                                f"never imported from there (importing it could run a program): {hint}")
    _add_cwd()
    try:
        found = importlib.util.find_spec(module_ref)
    except Exception:  # a parent package that is missing or fails: not importable here
        found = None
    if found is None:
        raise WorkflowLoadError(f"{run} records workflow_ref {ref!r}, but module {module_ref!r} is not "
                                f"importable in this environment (sys.path and {os.getcwd()!r}): {hint}")
    if _in_stdlib(found):
        raise WorkflowLoadError(f"{run} records workflow_ref {ref!r}, which names a module of the Python "
                                f"standard library: a stored ref is never imported from there: {hint}")
    return load_workflow(ref)


def _refused_module(module_ref: str) -> str | None:
    """Why a recorded module name is never imported, or None. Importing some modules runs a
    program (``venv.__main__`` makes virtualenvs, ``unittest.__main__`` runs tests, ``this``
    prints, ``antigravity`` opens a browser): a recorded ref never names a ``__main__`` module,
    a module of the standard library, or raysaga itself (no workflow lives in any of them)."""
    parts = module_ref.split(".")
    if "__main__" in parts:
        return "a __main__ module (a program's entry point)"
    if parts[0] in sys.stdlib_module_names:
        return f"a module of the Python standard library ({parts[0]!r})"
    if parts[0] == "raysaga":
        return "a module of raysaga itself"
    return None


def _in_stdlib(spec: ModuleSpec) -> bool:
    """The module lives in the standard library's folder (and not in a site-packages below it)."""
    if not spec.origin or not os.path.isabs(spec.origin):
        return False
    origin = Path(spec.origin).resolve()
    paths = sysconfig.get_paths()
    sites = {Path(paths[k]).resolve() for k in ("purelib", "platlib")}
    for key in ("stdlib", "platstdlib"):
        root = Path(paths[key]).resolve()
        if origin.is_relative_to(root) and not any(origin.is_relative_to(s) for s in sites) \
                and "site-packages" not in origin.parts and "dist-packages" not in origin.parts:
            return True
    return False


def recordable_ref(ref: str) -> str | None:
    """The ref to record for a run started with ``ref``: as typed if it is a module ref; for a
    ``path.py:wf``, ``module:wf`` if that file is importable under a module name from this
    process's own ``sys.path`` (e.g. ``flows:wf`` for ./flows.py); else None (``resume`` then
    asks for ``--workflow``)."""
    module_ref, sep, attr = ref.rpartition(":")
    if not sep:
        return None
    if not module_ref.endswith(".py"):
        return ref if RECORDED_REF.fullmatch(ref) and _refused_module(module_ref) is None else None
    path = Path(module_ref).resolve()
    roots = [os.getcwd(), *(p or os.getcwd() for p in _BASE_PATH)]
    for root in roots:
        try:
            rel = path.relative_to(Path(root).resolve()).with_suffix("")
        except (ValueError, OSError):
            continue
        name = ".".join(rel.parts)
        candidate = f"{name}:{attr}"
        if not RECORDED_REF.fullmatch(candidate) or _refused_module(name) is not None:
            continue
        spec = _spec_on(name, [str(r) for r in roots])
        if spec is not None and spec.origin and Path(spec.origin).resolve() == path:
            return candidate
    return None


def _spec_on(name: str, paths: list[str]) -> ModuleSpec | None:
    """Where ``name`` is found on ``paths``, without importing anything. Each part is looked up by
    its bare name in its parent's folders: given a dotted name, a folder without ``__init__.py`` (a
    namespace package) looked its parent up in ``sys.modules``, and ``raysaga run a/b/flows.py:wf``
    failed ``KeyError: 'a'``."""
    search: list[str] | None = paths
    spec = None
    for part in name.split("."):
        if search is None:
            return None
        spec = PathFinder.find_spec(part, search)
        if spec is None:
            return None
        if spec.submodule_search_locations is None:
            search = None
        elif spec.origin is None or spec.loader is None:  # a namespace package: its folders, read here
            search = [os.path.join(p, part) for p in search if os.path.isdir(os.path.join(p, part))]
        else:
            search = list(spec.submodule_search_locations)
    return spec


def _add_cwd() -> None:
    _add_path(os.getcwd())


def _add_path(folder: str) -> None:
    """First, as Python puts a script's folder: a workflow's sibling module (``helpers.py``) is
    the one it imports even when the environment has a module of that name. The workflow file's
    own name is what is checked (``_shadowed``): it is registered for the whole process."""
    if folder not in sys.path:
        sys.path.insert(0, folder)


def _shadowed(stem: str, path: Path) -> str | None:
    """What registering file ``path`` as module ``stem`` would replace, or None. A file is
    registered under its name so that Ray workers import its steps by that name (the executor puts
    the file's folder on their ``PYTHONPATH``): a ``json.py`` would otherwise become every later
    ``import json`` of the process (raysaga's own included), and a name importable from the
    environment would make the workers import that other module instead."""
    top = stem.partition(".")[0]
    if top in sys.stdlib_module_names:
        return f"a module of the Python standard library ({top!r})"
    existing = sys.modules.get(stem)
    if existing is not None and _FROM_FILES.get(stem) is not existing and not _same_file(existing, path):
        where = getattr(existing, "__file__", None)
        return f"module {stem!r}, already imported" + (f" from {where!r}" if where else "")
    if top.isidentifier():
        spec = _spec_on(top, [os.getcwd(), *(p or os.getcwd() for p in _BASE_PATH)])
        if spec is not None and not (spec.origin and Path(spec.origin).resolve() == path.resolve()):
            where = spec.origin or ", ".join(spec.submodule_search_locations or [])
            return f"module {top!r}, importable from {where!r}"
    return None


def _hidden_local(top: str) -> str | None:
    """Why the current folder's own module ``top`` is not what ``import top`` finds, or None (the
    folder is first on ``sys.path``, but a module of that name imported already is what an import
    returns): the operator typed the one here, and would otherwise run another without a word."""
    cwd = os.getcwd()
    if top in sys.modules or not top.isidentifier():  # imported already: the import returns it, as it always did
        return None
    local = PathFinder.find_spec(top, [cwd])
    if local is None:
        return None
    found = PathFinder.find_spec(top, [p or cwd for p in sys.path])
    where = found and (found.origin or next(iter(found.submodule_search_locations or []), None))
    mine = local.origin or next(iter(local.submodule_search_locations or []), None)
    if where and mine and Path(where).resolve() == Path(mine).resolve():
        return None
    return (f"{mine!r} is named like module {top!r} of the Python environment"
            + (f" ({where!r})" if where else " (built in)")
            + ", which every import of that name finds: rename it")


def _shadows_imported(folder: str, own: Path | None = None) -> str | None:
    """Why ``folder`` (put first on Ray workers' ``PYTHONPATH``, before the environment) cannot
    be: it holds a module named like one this process imported from elsewhere (a ``raysaga.py``,
    a ``pydantic/``), which every worker would import in its place, failing every step with Ray's
    "failed to import on the worker". ``own``: the workflow file itself (``_shadowed`` judges it)."""
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return None
    for entry in entries:
        name = entry.name.removesuffix(".py") if entry.name.endswith(".py") else entry.name
        is_package = entry.is_dir() and os.path.isfile(os.path.join(entry.path, "__init__.py"))
        if not (entry.name.endswith(".py") or is_package) or not name.isidentifier():
            continue
        if own is not None and Path(entry.path).resolve() == own.resolve():
            continue
        module = sys.modules.get(name)
        where = getattr(module, "__file__", None)
        if module is None or where is None or not _of_environment(Path(os.path.abspath(where))) \
                or Path(where).resolve().is_relative_to(Path(entry.path).resolve()):
            continue  # not imported, a user's own module (another folder's flows.py, in a test), or this one
        return (f"{entry.path!r} is named like module {name!r} ({where!r}): Ray's workers put {folder!r} first on "
                "their import path and would import it in place of that module, failing every step: rename it")
    return None


@functools.cache
def _environment_roots() -> tuple[Path, ...]:
    """Where the environment's modules live: the standard library, site-packages and raysaga's
    own package (an editable install lives in a checkout)."""
    import raysaga  # (its folder as imported: an editable install's links are not followed)

    paths = sysconfig.get_paths()  # not the prefixes: a project in /usr/src/app, or a venv made in it
    roots = {*(paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths),
             *site.getsitepackages(), site.getusersitepackages(),
             os.path.dirname(os.path.abspath(raysaga.__file__ or ""))}
    return tuple(Path(os.path.abspath(r)) for r in roots if r)


def _of_environment(where: Path) -> bool:
    return any(where.is_relative_to(root) for root in _environment_roots())


def _same_file(module: object, path: Path) -> bool:
    where = getattr(module, "__file__", None)
    return bool(where) and Path(str(where)).resolve() == path.resolve()


def load_workflow(ref: str) -> Workflow:
    """A workflow from a ref the operator typed: ``module.path:wf`` or ``path/to/flows.py:wf``."""
    module_ref, sep, attr = ref.rpartition(":")
    if not sep or not module_ref or not attr:
        raise WorkflowLoadError(f"{ref!r} is not MODULE:WORKFLOW (e.g. examples.order.workflow:wf or flows.py:wf)")
    _add_cwd()
    try:
        if module_ref.endswith(".py"):
            path = Path(module_ref)
            if not path.is_file():
                raise WorkflowLoadError(f"no such file {module_ref!r}")
            shadowed = _shadowed(path.stem, path)
            if shadowed:
                raise WorkflowLoadError(
                    f"workflow file {module_ref!r} would be imported as module {path.stem!r}, the name of "
                    f"{shadowed}: loading it would replace that module for the whole process (a workflow "
                    f"file is imported under its own name): rename it (e.g. {path.stem}_flow.py)")
            hidden = _shadows_imported(str(path.resolve().parent), path) or _shadows_imported(os.getcwd())
            if hidden:
                raise WorkflowLoadError(f"cannot load workflow file {module_ref!r}: {hidden}")
            _add_path(str(path.resolve().parent))
            spec = importlib.util.spec_from_file_location(path.stem, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                if sys.modules.get(path.stem) is module:  # no half-imported module left for the next import
                    del sys.modules[path.stem]
                raise
            _FROM_FILES[path.stem] = module
        else:
            hidden = _hidden_local(module_ref.partition(".")[0]) or _shadows_imported(os.getcwd())
            if hidden:
                raise WorkflowLoadError(f"cannot import {module_ref!r} from the current folder: {hidden}")
            module = importlib.import_module(module_ref)
    except WorkflowLoadError:
        raise
    except ModuleNotFoundError as exc:
        raise WorkflowLoadError(f"cannot import {module_ref!r}: {exc} (run from the folder that contains it, "
                                "or pass a path like flows/order.py:wf)") from None
    except SystemExit as exc:
        # a script's main() run at import: `raysaga run` once exited with its code (0: "success",
        # nothing run), and a dashboard or worker importing a recorded workflow ended with it
        raise WorkflowLoadError(f"importing {module_ref!r} failed: it called sys.exit({scrub_text(repr(exc.code))}) "
                                "while being imported: put the script part under "
                                "`if __name__ == \"__main__\":`") from None
    except (KeyboardInterrupt, GeneratorExit):
        raise
    except BaseException as exc:  # Exception and the odd BaseException a module raises: never a traceback
        raise WorkflowLoadError(f"importing {module_ref!r} failed: {type(exc).__name__}: "
                                f"{scrub_text(str(exc))}") from None
    workflow = getattr(module, attr, None)
    if workflow is None:
        found = sorted(k for k, v in vars(module).items() if isinstance(v, Workflow))
        raise WorkflowLoadError(f"module {module_ref!r} has no attribute {attr!r}"
                                + (f"; workflows there: {', '.join(found)}" if found else ""))
    workflow = _saga_workflow(workflow) or workflow  # a Saga's: resume, retry and status work the same
    if not isinstance(workflow, Workflow):
        raise WorkflowLoadError(f"{ref!r} is a {type(workflow).__name__}, not a raysaga Workflow")
    return workflow.validate()


def ref_of(workflow: Workflow) -> str | None:
    """The ``MODULE:ATTR`` to record for a run started from Python (``raysaga.run``, ``create_run``,
    ``Client.submit``) without a ``workflow_ref``: the module of the workflow's steps, where a
    module-level name holds this very workflow, if that module is importable under its name (a
    script's ``__main__``: under ``python -m NAME``, or as its file from ``sys.path``). Nothing is
    imported. None when not found: ``resume`` then asks for ``--workflow``. Without it, every run
    started from Python (all the examples) failed ``raysaga resume`` and drew no edges."""
    names = dict.fromkeys(getattr(getattr(s, "fn", None), "__module__", None) for s in workflow.steps.values())
    for name in names:
        module = sys.modules.get(name) if isinstance(name, str) else None
        attr = next((k for k, v in list(vars(module).items()) if k.isidentifier() and _holds(v, workflow)), None) \
            if module is not None else None
        ref = None if module is None or attr is None else _module_ref(name or "", module, attr)
        if ref is not None:
            return ref
    return None


def _holds(value: object, workflow: Workflow) -> bool:
    """``value`` is ``workflow``, or a ``raysaga.Saga`` built on it (``Saga.run`` recorded no ref)."""
    return value is workflow or _saga_workflow(value) is workflow


def _saga_workflow(value: object) -> Workflow | None:
    """The workflow of a ``raysaga.Saga`` (told by its class: ``saga`` imports ``runner``, which
    imports this module), else None."""
    kind = type(value)
    if kind.__name__ == "Saga" and kind.__module__ == "raysaga.orchestrator.saga":
        inner = getattr(value, "workflow", None)
        return inner if isinstance(inner, Workflow) else None
    return None


def _module_ref(name: str, module: object, attr: str) -> str | None:
    """``name:attr`` if ``name`` finds ``module``'s own file on ``sys.path`` (no import), else None."""
    where = getattr(module, "__file__", None)
    if name == "__main__":  # a script (`python flows.py`, `python -m flows`): never recorded by itself; the
        return None  # dashboard or `status --dag` importing it ran its top level again (a new run, a new charge)
    ref = f"{name}:{attr}"
    if not isinstance(where, str) or not RECORDED_REF.fullmatch(ref) or _refused_module(name) is not None:
        return None
    try:
        spec = _spec_on(name, [os.getcwd(), *(p or os.getcwd() for p in sys.path)])
    except (ImportError, OSError, ValueError):
        return None
    return ref if spec is not None and spec.origin and Path(spec.origin).resolve() == Path(where).resolve() else None

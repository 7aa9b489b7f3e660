"""The artifact, not the checkout: build the wheel, check what it holds, install it into a fresh
venv and import it from a directory full of look-alike modules.

The repo's top-level folders (``api/``, ``orchestrator/``, ``agents/``, ``sagas/``, ``state/``)
install under one namespace, ``raysaga``, through setuptools' ``package-dir``. That mapping
fails quietly: a subpackage missing from ``packages`` or a data file missing from
``package-data`` simply drops out of the wheel, while the editable install in the dev venv
keeps working. Only a built wheel shows it.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path, PurePosixPath

import pytest

import raysaga
from tests.support import REPO

# source folder -> where its files land in the wheel (pyproject.toml [tool.setuptools] package-dir)
MAPPING = {
    "api": "raysaga",
    "orchestrator": "raysaga/orchestrator",
    "agents": "raysaga/agents",
    "sagas": "raysaga/sagas",
    "state": "raysaga/state",
}
# data files the package needs at runtime or for typing, beyond the .py modules
REQUIRED_DATA = {"raysaga/py.typed", "raysaga/state/migrations/script.py.mako",
                 # the dashboard's committed front-end build: `pip install raysaga` needs no Node, no CDN
                 "raysaga/orchestrator/dashboard/static/index.html", "raysaga/orchestrator/dashboard/static/app.js",
                 "raysaga/orchestrator/dashboard/static/app.css"}
SHADOWS = ("state", "agents", "orchestrator", "sagas")

# The public surface, pinned: adding or removing an export is a deliberate API change that
# must show up in this diff.
EXPECTED_ALL = [
    "ALL",
    "Approval",
    "Ask",
    "BEST_EFFORT",
    "Client",
    "Compensate",
    "Continue",
    "DriverInterrupted",
    "Fail",
    "FanOutResult",
    "InvalidInputError",
    "InvalidOptionError",
    "LeaseHeldError",
    "LeaseLostError",
    "NOT_APPLIED",
    "NotJSONableError",
    "Permanent",
    "RateLimit",
    "RaySagaError",
    "RetryFailed",
    "RetryPolicy",
    "RunExistsError",
    "RunNotFoundError",
    "RunOptions",
    "RunRecord",
    "RunStatus",
    "RunView",
    "Saga",
    "Secret",
    "SecretUnavailableError",
    "StepContext",
    "StepFailed",
    "StepFailure",
    "Store",
    "StoreError",
    "StoreOutageError",
    "StoreUnavailableError",
    "Transient",
    "UserError",
    "Worker",
    "Workflow",
    "WorkflowDefinitionError",
    "cancel",
    "configure_tracing",
    "create_run",
    "fork",
    "min_success_ratio",
    "on_partial_failure",
    "open_store",
    "prune",
    "quorum",
    "replay",
    "resume",
    "retry",
    "run",
]

# Per-command ceiling; a healthy run of this module takes seconds.
TIMEOUT = 120

# Top-level entries of the checkout that are build output, caches or environments: a fresh
# clone does not have them, so neither does the copy the wheel is built from.
_NOT_SOURCE = {"build", "dist", ".git", ".venv", ".raysaga", ".mypy_cache", ".ruff_cache", ".pytest_cache",
               ".hypothesis"}


def _run(args: list[str | Path], *, cwd: Path, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, args))} exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    )
    return proc.stdout


def _ignore_non_source(directory: str, names: list[str]) -> set[str]:
    ignored = {n for n in names if n == "__pycache__" or n.endswith(".pyc")}
    if Path(directory) == REPO:
        ignored |= {n for n in names if n in _NOT_SOURCE or n.endswith(".egg-info")}
    return ignored


def _source_files(suffix: str | None = None) -> set[str]:
    """Files of the five package folders, as the wheel paths they map to."""
    files: set[str] = set()
    for folder, target in MAPPING.items():
        root = REPO / folder
        for path in root.rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            if suffix is not None and path.suffix != suffix:
                continue
            files.add(str(PurePosixPath(target, *path.relative_to(root).parts)))
    return files


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once per session from a clean copy of the checkout.

    Building in the checkout itself would write ``build/`` and ``raysaga.egg-info`` there (the
    strict editable install lives in ``build/``), and setuptools packs whatever stale modules
    sit in ``build/lib``; the copy builds what a fresh clone builds.
    """
    src = tmp_path_factory.mktemp("src") / "raysaga-src"
    shutil.copytree(REPO, src, ignore=_ignore_non_source)
    out = tmp_path_factory.mktemp("dist")
    try:
        importlib.metadata.version("build")
    except importlib.metadata.PackageNotFoundError:
        _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", out, src], cwd=src)
    else:
        _run([sys.executable, "-m", "build", "--wheel", "--outdir", out, src], cwd=src)
    wheels = list(out.glob("raysaga-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture(scope="module")
def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return {n for n in zf.namelist() if not n.endswith("/")}


def test_wheel_holds_every_source_module_and_data_file(wheel_names: set[str]) -> None:
    expected = _source_files(".py") | REQUIRED_DATA
    assert _source_files(".py"), "no source files found: is REPO right?"
    missing = sorted(expected - wheel_names)
    assert not missing, (
        f"missing from the wheel: {missing} (a subpackage absent from [tool.setuptools] packages, "
        "or a data file absent from [tool.setuptools.package-data])"
    )


#: The store schema each released version of raysaga migrates to. A new migration without a new
#: version left `pip install -U raysaga` (the fix every "newer schema" error gives) a no-op: 0.1.0
#: went through schemas 1 to 14. Add a row (and raise [project] version) with each schema change.
SCHEMA_OF_VERSION = {"0.2.0": 14, "0.3.0": 15}


def test_each_schema_change_raises_the_version() -> None:
    from raysaga.state.schema import SCHEMA_VERSION

    version = importlib.metadata.version("raysaga")
    assert SCHEMA_OF_VERSION.get(version) == SCHEMA_VERSION, (
        f"raysaga {version} migrates stores to schema {SCHEMA_VERSION}, but SCHEMA_OF_VERSION says "
        f"{SCHEMA_OF_VERSION.get(version)}: a schema change needs a new [project] version in pyproject.toml "
        "(and a row here), so `pip install -U raysaga` can bring it; reinstall (pip install -e .) after changing it")


def test_wheel_carries_the_license(wheel_names: set[str]) -> None:
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in wheel_names), sorted(
        n for n in wheel_names if ".dist-info/" in n)


def test_wheel_holds_only_the_raysaga_namespace(wheel: Path, wheel_names: set[str]) -> None:
    version = wheel.name.split("-")[1]
    dist_info = f"raysaga-{version}.dist-info/"
    foreign = sorted(n for n in wheel_names if not n.startswith(("raysaga/", dist_info)))
    assert not foreign, f"the wheel installs outside the raysaga namespace: {foreign}"
    # nothing under raysaga/ that is not in the source tree (stale build output, stray files)
    unknown = sorted(n for n in wheel_names if n.startswith("raysaga/") and n not in _source_files())
    assert not unknown, f"files in the wheel with no source in the checkout: {unknown}"


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str], Path]:
    """A fresh venv holding only the wheel; returns (venv bin dir, env, a cwd full of shadows)."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    # No pip in the new venv (ensurepip costs seconds): the dev venv's pip installs into it.
    _run([sys.executable, "-m", "venv", "--without-pip", venv], cwd=venv.parent)
    bindir = venv / "bin"
    vpython = bindir / "python"
    _run([sys.executable, "-m", "pip", "--python", vpython, "install", "--no-deps", "--no-index", wheel],
         cwd=venv.parent)

    # Dependencies (ray, sqlalchemy, alembic, typer, ...) are not installed into the new venv:
    # that would take minutes and need the network. Instead a .pth file appends the dev venv's
    # site-packages to sys.path, *after* the new venv's own. A bare path line in a .pth is only
    # appended; the .pth files inside the dev venv's site-packages are not processed, so its
    # editable-install hook for raysaga stays off, and `raysaga` can only come from the wheel
    # (the test asserts where it was imported from).
    site_packages = Path(_run([vpython, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              cwd=venv.parent).strip())
    dev_paths = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site_packages / "zz_raysaga_test_deps.pth").write_text("".join(f"{p}\n" for p in dev_paths))

    # A user's working directory with modules named like our folders: `python -c` and
    # `python -m` put the cwd first on sys.path, so any bare `import state` would hit these.
    cwd = tmp_path_factory.mktemp("usercwd")
    for name in SHADOWS:
        (cwd / f"{name}.py").write_text(
            f"raise ImportError('the user\\'s {name}.py was imported: raysaga imported a bare {name!r}')\n")

    env = {k: v for k, v in os.environ.items()
           if k not in {"PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "VIRTUAL_ENV", "PYTHONSAFEPATH"}}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", PYTHONNOUSERSITE="1",
               VIRTUAL_ENV=str(venv), RAYSAGA_DB=f"sqlite:///{cwd / 'default.db'}")
    return bindir, env, cwd


def test_installed_wheel_imports_past_shadowing_modules(installed: tuple[Path, dict[str, str], Path]) -> None:
    bindir, env, cwd = installed
    code = textwrap.dedent("""
        import importlib.metadata
        import raysaga, raysaga.state, raysaga.orchestrator, raysaga.agents, raysaga.sagas
        assert raysaga.__version__ == importlib.metadata.version("raysaga"), raysaga.__version__
        print(raysaga.__file__)
    """)
    out = _run([bindir / "python", "-c", code], cwd=cwd, env=env)
    imported_from = Path(out.strip().splitlines()[-1]).resolve()
    assert imported_from.is_relative_to(bindir.parent.resolve()), (
        f"raysaga was imported from {imported_from}, not from the fresh venv {bindir.parent}"
    )


def test_installed_wheel_migrates_a_fresh_database(installed: tuple[Path, dict[str, str], Path]) -> None:
    # the alembic env.py and versions/ must have shipped for the first open to create the schema
    bindir, env, cwd = installed
    db = cwd / "migrated.db"
    code = f"import raysaga; s = raysaga.open_store({f'sqlite:///{db}'!r}); print(s.dialect); s.close()"
    assert _run([bindir / "python", "-c", code], cwd=cwd, env=env).strip() == "sqlite"
    assert db.is_file()


@pytest.mark.parametrize("command", [["python", "-m", "raysaga"], ["raysaga"]], ids=["python-m", "console-script"])
def test_installed_cli_help(installed: tuple[Path, dict[str, str], Path], command: list[str]) -> None:
    bindir, env, cwd = installed
    out = _run([bindir / command[0], *command[1:], "--help"], cwd=cwd, env=env)
    assert "Usage" in out, out


def test_public_exports_are_pinned() -> None:
    assert len(set(raysaga.__all__)) == len(raysaga.__all__), "duplicate names in raysaga.__all__"
    assert sorted(raysaga.__all__) == EXPECTED_ALL


def test_every_public_export_is_importable() -> None:
    missing = [name for name in raysaga.__all__ if not hasattr(raysaga, name)]
    assert not missing, f"named in raysaga.__all__ but not defined: {missing}"
    namespace: dict[str, object] = {}
    exec("from raysaga import *", namespace)  # what a user's star-import sees
    assert set(raysaga.__all__) <= namespace.keys()

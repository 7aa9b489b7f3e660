"""Launch a run on a Ray cluster: record it, then hand its driving to a Ray Job.

``raysaga launch`` must return in seconds and let the laptop go away, so the driver cannot live
on the laptop. Ray's Job Submission API (``ray.job_submission.JobSubmissionClient``, served by
the head's dashboard) runs an entrypoint process on the cluster and keeps it there: the
entrypoint is ``python -m raysaga resume RUN``, which drives the run this module recorded. The
store is the truth; the job is only a driver, and a driver that dies is replaced the usual way
(its lease expires; a worker, a ``resume`` or another ``launch`` takes the run over).

- **At most one job per run at a time.** A job's ``submission_id`` is derived from the run id
  (``raysaga-<run>``, then ``-2``, ``-3``... for a later driver of the same run once the earlier
  job ended), and Ray refuses a second job with an id it has seen: a launch retried after a
  timeout finds the job it already started instead of starting another.
- **The cluster is asked first.** The Job API (and its token authentication, ``ray_auth``) is
  checked before any run row is written: a refusal leaves nothing ``pending`` behind.
- **The user's code travels with the job**: ``runtime_env["working_dir"]`` is the folder the
  workflow module is imported from (caches, virtualenvs and SQLite files left out).
- **The environment the run needs travels by name**: ``--env NAME`` copies that variable into
  ``runtime_env["env_vars"]``; nothing else of the laptop's environment goes, and no value is
  written to the store or printed.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import os
import re
import shlex
import sysconfig
import urllib.parse
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raysaga.errors import UserError
from raysaga.orchestrator.ray_address import speaks_http
from raysaga.orchestrator.ray_auth import authenticated
from raysaga.orchestrator.step_env import pick

if TYPE_CHECKING:
    from ray.job_submission import JobSubmissionClient

#: A Ray job that has not ended: its entrypoint may still be driving the run.
LIVE_JOB_STATES = frozenset({"PENDING", "RUNNING"})
#: Later drivers of one run a launch looks for (``raysaga-<run>-2`` ... ``-<this>``).
MAX_DRIVER_JOBS = 100
#: Left out of the shipped working_dir (gitignore syntax): never code the run imports, and never the
#: secrets a folder tends to hold (``.env`` files, keys, cloud and Ray credentials): a job's package
#: is kept by the cluster, readable by every job. What a run needs travels by name (``--env``).
EXCLUDES = (".git", ".venv", "venv", "__pycache__", "*.pyc", ".mypy_cache", ".pytest_cache", ".ruff_cache",
            "node_modules", "*.egg-info", "*.db", "*.db-wal", "*.db-shm", ".raysaga",
            ".env", ".env.*", ".ssh", ".aws", ".gnupg", ".netrc", ".ray", ".docker", ".kube")
_SAFE_ID = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def dashboard_url(address: str) -> str:
    """The Job API's URL: ``http(s)://HOST:PORT`` (a bare ``HOST:PORT`` is taken as http)."""
    text = address.strip().rstrip("/")
    hint = "--address (or RAY_API_SERVER_ADDRESS) is the Ray head's dashboard URL, e.g. http://HEAD:8265"
    if text.lower().startswith("ray://"):
        raise UserError(f"{address!r}: Ray Client (ray://) is not how a run is launched (it drops the work 30 s "
                        f"after a disconnect); {hint}")
    if "://" not in text:
        text = f"http://{text}"
    match = re.fullmatch(r"(https?)://(\[[0-9A-Fa-f:.]+\]|[^\s:/\[\]@]+):([0-9]{1,5})", text)
    if match is None or not 1 <= int(match.group(3)) <= 65535:
        raise UserError(f"{address!r} is not a dashboard URL with a port: {hint}")
    return text


def submission_id(run_id: str, driver: int = 1) -> str:
    """The Ray job id of the ``driver``-th job of ``run_id``: the same for every launch, so Ray
    itself refuses a duplicate. Readable when the run id is; otherwise a digest keeps it unique."""
    base = f"raysaga-{run_id}" if _SAFE_ID.fullmatch(run_id) else \
        f"raysaga-{re.sub(r'[^A-Za-z0-9_.-]', '-', run_id)[:80]}-{hashlib.sha256(run_id.encode()).hexdigest()[:12]}"
    return base if driver == 1 else f"{base}-{driver}"


def env_vars(names: Sequence[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The ``--env`` variables for the job: each named one as set here, nothing else. raysaga's own
    among them are checked here as the job's driver would check them: a bad one failed the job
    before it drove the run, after `launch` had said "launched" (the run left ``pending``)."""
    picked = pick(names, environ, "--env")
    if IO_CONCURRENCY_ENV in picked:
        from raysaga.orchestrator.io_pool import io_concurrency_limit

        try:
            io_concurrency_limit(environ=picked)
        except UserError as exc:
            raise UserError(f"--env {IO_CONCURRENCY_ENV}: {exc} (the launched driver would refuse it before "
                            "driving the run): fix it in this environment, or drop it") from None
    return picked


#: ``io_pool.IO_CONCURRENCY_ENV`` (the module is imported only to check it).
IO_CONCURRENCY_ENV = "RAYSAGA_IO_CONCURRENCY"


def source_root(module_ref: str) -> Path | None:
    """The folder the workflow's top-level module or package is imported from (shipped as the
    job's ``working_dir``); None when it is installed (site-packages): the cluster must have it."""
    top = module_ref.partition(":")[0].split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    folders = list(spec.submodule_search_locations or []) if spec is not None else []
    if spec is not None and not spec.origin and len(folders) == 1:  # a namespace package: a folder, no __init__
        root = Path(folders[0]).resolve().parent
    elif spec is None or not spec.origin or spec.origin in ("built-in", "frozen"):
        spread = f" (a namespace package spread over {len(folders)} folders)" if len(folders) > 1 else ""
        raise UserError(f"module {top!r} is not importable here{spread}: run `raysaga launch` from the folder that "
                        "holds it, naming it as MODULE:WORKFLOW (e.g. flows:wf; or put that folder on PYTHONPATH)")
    else:
        origin = Path(spec.origin).resolve()
        root = origin.parent.parent if spec.submodule_search_locations is not None else origin.parent
    installed = {Path(p).resolve() for key in ("purelib", "platlib", "stdlib") if (p := sysconfig.get_path(key))}
    if any(root == p or p in root.parents for p in installed):
        return None
    if root == Path(root.anchor) or root == Path.home().resolve():
        raise UserError(f"module {top!r} is imported from {root}: launching would ship that whole folder to the "
                        "cluster as the job's code (keys and credentials in it included): move the workflow into "
                        "a project folder and launch from there")
    return root


def runtime_env(root: Path | None, env: Mapping[str, str], db_url: str) -> dict[str, Any]:
    """The job's ``runtime_env``: the code, the store's URL (kept off the command line, which
    Ray shows in job lists and logs) and the ``--env`` variables."""
    shipped: dict[str, Any] = {"env_vars": {**env, "RAYSAGA_DB": db_url}}
    if root is not None:
        shipped["working_dir"] = str(root)
        shipped["excludes"] = list(EXCLUDES)
    return shipped


def entrypoint(run_id: str, lease_ttl: float, python: str = "python") -> str:
    """What the job runs: a resume of the recorded run (its workflow found by the module name
    the run records; the store from ``RAYSAGA_DB``; the cluster from the job's ``RAY_ADDRESS``).
    The run id comes last, after ``--``: an id that starts with ``-`` (``--help``) is the run's id,
    not an option (the job printed the help and exited 0, and the run was never driven)."""
    return f"{python} -m raysaga resume --quiet --lease-ttl {lease_ttl:g} -- {shlex.quote(run_id)}"


def connect(address: str) -> JobSubmissionClient:
    """A Job API client for the cluster at ``address`` (a dashboard URL), its token settled."""
    url = dashboard_url(address)
    from ray.job_submission import JobSubmissionClient

    quiet_sdk_logs()  # after Ray's import, which sets its loggers up

    def attempt() -> JobSubmissionClient:
        with _explicit_address():  # asks the server for its version: reachable, and let in
            return JobSubmissionClient(url)

    try:
        client = authenticated(url, attempt)
    except UserError:
        raise
    except (ConnectionError, OSError) as exc:
        if _answers_but_not_http(url):
            raise UserError(f"the server at {url} takes connections but does not answer HTTP "
                            f"({_first_line(exc)}): it looks like the cluster's GCS port (what `raysaga run / "
                            "resume / worker --address HOST:PORT` take); `launch --address` is the Ray head's "
                            "dashboard URL, e.g. http://HEAD:8265 (`ray start --head --dashboard-port`)") from None
        raise UserError(f"cannot reach the Ray Job API at {url} ({_first_line(exc)}): start the head with "
                        "`ray start --head --dashboard-port PORT` (the dashboard serves it; `pip install "
                        "'ray[default]'`), or fix --address") from None
    except RuntimeError as exc:  # the SDK's version check: something answers there, not a Job API
        raise not_a_job_api(url, exc) from None
    # a server that answers the version check may still not serve jobs (a proxy, an older or a
    # partial dashboard): ask for a job that cannot exist now, before any run is recorded
    job_info(client, f"raysaga-probe-{uuid.uuid4().hex[:12]}")
    return client


def _answers_but_not_http(url: str) -> bool:
    """Whether something listens at ``url``'s host and port that does not speak HTTP (a GCS port)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "http" or parts.hostname is None or parts.port is None:
        return False
    return speaks_http(parts.hostname, parts.port) is False


@contextlib.contextmanager
def _explicit_address() -> Iterator[None]:
    """Ray's SDK takes ``RAY_API_SERVER_ADDRESS``, else ``RAY_ADDRESS``, over the address it is
    given: with a ``RAY_ADDRESS`` in the shell (another cluster's), ``launch --address URL`` asked
    that cluster instead. The URL the command resolved (from ``--address`` or
    ``RAY_API_SERVER_ADDRESS``) is the one asked; both are back once the client is made."""
    saved = {name: os.environ.pop(name) for name in _ADDRESS_VARS if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


#: What Ray's job SDK reads an address from, over the one it is given.
_ADDRESS_VARS = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")


def not_a_job_api(url: str, exc: BaseException) -> UserError:
    """The one-line error for a server at ``url`` whose answer is not a Ray Job API's."""
    return UserError(f"the server at {url} does not answer as a Ray Job API ({_first_line(exc)[:200]}): "
                     "--address (or RAY_API_SERVER_ADDRESS) is the Ray head's dashboard URL, e.g. "
                     "http://HEAD:8265, served by `ray start --head` with `pip install 'ray[default]'`")


def quiet_sdk_logs() -> None:
    """Ray's SDK logs each package upload at INFO, and that ``.git`` and ``.venv`` are left out
    (as ``EXCLUDES`` asks) at WARNING, on stderr; the launch says what it did itself."""
    import logging

    for name in ("ray.dashboard.modules.dashboard_sdk", "ray._private.runtime_env.packaging"):
        logging.getLogger(name).setLevel(logging.WARNING)
    logging.getLogger("ray._private.runtime_env.working_dir").setLevel(logging.ERROR)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(frozen=True)
class Job:
    """One of a run's Ray jobs, as the cluster reports it."""

    submission_id: str
    status: str
    message: str | None = None
    driver_pid: int | None = None
    run_id: str | None = None
    """The run the job drives (its ``raysaga_run_id`` metadata): job ids of two runs can collide
    (run ``X``'s second driver and run ``X-2``'s first are both ``raysaga-X-2``)."""

    def drives(self, run_id: str) -> bool:
        return self.run_id in (None, run_id)

    @property
    def live(self) -> bool:
        return self.status in LIVE_JOB_STATES


def job_info(client: JobSubmissionClient, sid: str) -> Job | None:
    """The job ``sid`` as the cluster reports it, or None if the cluster never had it."""
    try:
        info = client.get_job_info(sid)
        driver = getattr(info, "driver_info", None)
        pid = getattr(driver, "pid", None)
        metadata = getattr(info, "metadata", None)
        owner = metadata.get("raysaga_run_id") if isinstance(metadata, dict) else None
        return Job(sid, str(getattr(info.status, "value", info.status)), info.message,
                   int(pid) if pid not in (None, "") else None, str(owner) if owner is not None else None)
    except RuntimeError as exc:  # the SDK's 404 ("does not exist")
        if "does not exist" in str(exc):
            return None
        if re.search(r"status code (?!40[45]\b)\d{3}", str(exc)):  # an HTTP error of a Job API (a 5xx...)
            raise UserError(f"the Ray Job API at {_address(client)} failed a request for job {sid} "
                            f"({_first_line(exc)[:200]}): try again once the head's dashboard answers") from None
        raise not_a_job_api(_address(client), exc) from None
    except Exception as exc:  # an answer that is not JSON, or not a job's: a proxy, another server
        raise not_a_job_api(_address(client), exc) from None


def _address(client: JobSubmissionClient) -> str:
    return str(getattr(client, "_address", "the Ray Job API's address"))


def jobs_of(client: JobSubmissionClient, run_id: str) -> list[Job]:
    """The jobs under the run's job ids in the order they were started (``raysaga-<run>``, ``-2``,
    ...): the next driver's id is the first one free. One may drive another run whose id collides
    (``Job.drives``)."""
    found: list[Job] = []
    for driver in range(1, MAX_DRIVER_JOBS + 1):
        job = job_info(client, submission_id(run_id, driver))
        if job is None:
            break
        found.append(job)
    return found


@dataclass(frozen=True)
class Submitted:
    """What a launch did: the job that drives the run, and whether this launch started it."""

    job: Job
    started: bool


def submit(client: JobSubmissionClient, run_id: str, driver: int, *, env: dict[str, Any], entry: str,
           metadata: dict[str, str]) -> Submitted:
    """Start the ``driver``-th job of ``run_id``; a job already there under that id (a launch
    that raced this one, or a retry of it) is reported, not duplicated."""
    sid = submission_id(run_id, driver)
    try:
        client.submit_job(entrypoint=entry, submission_id=sid, runtime_env=env, metadata=metadata,
                          entrypoint_num_cpus=0)
    except Exception as exc:  # a refusal (RuntimeError), a dropped connection, an answer that is not JSON
        try:
            existing = job_info(client, sid)
        except UserError:
            existing = None
        if existing is not None and not existing.drives(run_id):
            raise UserError(f"Ray job {sid} was started meanwhile for run {existing.run_id!r} (their job ids "
                            f"collide): run {run_id!r} is recorded, not started; launch it again with --run-id "
                            f"{run_id}") from None
        if existing is None:
            why = _first_line(exc) if isinstance(exc, RuntimeError) else \
                f"the server at {_address(client)} did not answer as a Ray Job API: {_first_line(exc)[:200]}"
            raise UserError(f"the Ray cluster refused job {sid} for run {run_id!r} ({why}): the run "
                            f"is recorded, not started; fix that and launch again with --run-id {run_id}") from None
        return Submitted(existing, started=False)
    try:  # submitted: a failed read of it now is no refusal (its caller would say "not started")
        job = job_info(client, sid)
    except Exception:
        job = None
    return Submitted(job or Job(sid, "PENDING"), started=True)


def job_log_tail(client: JobSubmissionClient, sid: str, lines: int = 3) -> list[str]:
    """The last lines of the job's log, redacted (a log can carry a key a step printed)."""
    from raysaga.state.redact import scrub_text

    try:
        text = client.get_job_logs(sid)
    except Exception:
        return []
    return [scrub_text(line) for line in text.strip().splitlines()[-lines:]]


def cluster_db_url(url: str) -> str:
    """The store's URL as the job must see it: a SQLite file by its absolute path (a relative
    one, or the default store, would name another file on the cluster)."""
    from raysaga.state.engine import normalize_url, sqlite_path, sqlite_url

    path = sqlite_path(url)
    return sqlite_url(path) if path is not None else normalize_url(url)  # (a ``?`` or ``%`` in it, escaped)


def is_local_file_store(url: str) -> bool:
    from raysaga.state.engine import sqlite_path

    return sqlite_path(url) is not None


__all__ = ["EXCLUDES", "Job", "Submitted", "cluster_db_url", "connect", "dashboard_url", "entrypoint", "env_vars",
           "job_info", "jobs_of", "runtime_env", "source_root", "submission_id", "submit"]


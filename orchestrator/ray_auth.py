"""Ray's token authentication, settled before ``ray.init`` or a job submission.

Ray 2.52+ can require a shared token on every RPC and HTTP call of a cluster
(``RAY_AUTH_MODE=token``). A ``ray start --head`` turns it on by itself whenever a token already
exists on the machine (``~/.ray/auth_token``, written by any earlier local ``ray.init()``), but
a process joining with an explicit address only sends a token when ``RAY_AUTH_MODE=token`` is
set in its own environment. Without it, ``ray.init`` retries for tens of seconds and ends in a
long traceback about a cluster it "cannot reach", and the Job Submission API answers 401.

So a cluster is asked once, up front, in the mode this process is in; if it refuses for want of
a token and the operator has not chosen a mode (``RAY_AUTH_MODE`` unset) but this machine has
a token, token mode is turned on for this process (what Ray itself does for ``--address auto``)
and the cluster asked again. Anything else is one ``UserError`` line naming the fix. The token
is never read, printed or stored here: Ray's own loader reads it (``RAY_AUTH_TOKEN``, the file
at ``RAY_AUTH_TOKEN_PATH``, or ``~/.ray/auth_token``, in that order).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from raysaga.errors import UserError

T = TypeVar("T")

MODE_VAR = "RAY_AUTH_MODE"
TOKEN_VAR = "RAY_AUTH_TOKEN"
TOKEN_PATH_VAR = "RAY_AUTH_TOKEN_PATH"
#: Milliseconds the GCS probe waits for the cluster's answer.
PROBE_TIMEOUT_MS = 5000

_WHERE = f"~/.ray/auth_token, {TOKEN_VAR} or {TOKEN_PATH_VAR}"
_GET = "`ray get-auth-token` on the head node prints it"


def token_source() -> str | None:
    """Where Ray would find a token for this process (named, never read), or None."""
    if os.environ.get(TOKEN_VAR, "").strip():
        return TOKEN_VAR
    path = os.environ.get(TOKEN_PATH_VAR, "").strip()
    candidate = Path(path).expanduser() if path else Path.home() / ".ray" / "auth_token"
    try:
        if not candidate.is_file():  # a FIFO (or a device) would block the read below for ever
            return None
        with candidate.open("rb") as f:  # Ray aborts the process on a token file it cannot read
            return str(candidate) if f.read(1) else None
    except OSError:
        return None


def chosen_mode() -> str:
    """``RAY_AUTH_MODE`` as the operator set it (lower case), or "" when unset."""
    return os.environ.get(MODE_VAR, "").strip().lower()


def enable_token_mode() -> None:
    """Token mode for this process and the processes it starts, as Ray's own ``ray start`` does."""
    os.environ[MODE_VAR] = "token"
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")  # the cached config is read at import: refresh it
    AuthenticationTokenLoader.instance().reset_cache()


def refused(address: str) -> UserError:
    """The one-line error for a cluster that refused this process's credentials as they stand."""
    where = f"the Ray cluster at {address}"
    mode, source = chosen_mode(), token_source()
    path = os.environ.get(TOKEN_PATH_VAR, "").strip()
    if source is None and path and not os.environ.get(TOKEN_VAR, "").strip():
        return UserError(f"{TOKEN_PATH_VAR} names {path}, which is missing, unreadable or empty: point it at the "
                         f"file holding the Ray cluster's token ({_GET}), or unset it")
    if mode == "token" and source is None:
        return UserError(f"RAY_AUTH_MODE=token is set here but no token for {where} was found: put the "
                         f"cluster's token in {_WHERE} ({_GET})")
    if mode == "token":
        return UserError(f"{where} refused the token from {source}: use that cluster's token ({_GET}) in {_WHERE}")
    if mode:
        return UserError(f"{where} requires token authentication, but RAY_AUTH_MODE is {mode!r} here: unset it "
                         f"or set RAY_AUTH_MODE=token, with the cluster's token in {_WHERE} ({_GET})")
    return UserError(f"{where} requires token authentication and no token was found here: put the cluster's "
                     f"token in {_WHERE} ({_GET})")


def is_auth_error(exc: BaseException) -> bool:
    from ray.exceptions import AuthenticationError

    return isinstance(exc, AuthenticationError)


def authenticated(address: str, attempt: Callable[[], T]) -> T:
    """``attempt()`` (a first call to the cluster at ``address``), in token mode if the cluster
    asks for it and this machine has a token the operator did not opt out of. Raises a one-line
    ``UserError`` when the cluster refuses."""
    if chosen_mode() == "token" and token_source() is None:
        raise refused(address)  # Ray's loader would abort the whole process (a failed native check)
    try:
        return attempt()
    except Exception as exc:
        if not is_auth_error(exc):
            raise
        if chosen_mode() or token_source() is None:
            raise refused(address) from None
    enable_token_mode()
    try:
        return attempt()
    except Exception as exc:
        if is_auth_error(exc):
            raise refused(address) from None
        raise


@contextlib.contextmanager
def _quiet_native_stderr() -> Iterator[None]:
    """Ray's C++ client logs each refused RPC to file descriptor 2 before raising; the error
    raised is what the operator needs, so the log lines of this one probe are dropped."""
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:  # no stderr to silence
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def check_gcs(address: str) -> None:
    """Ask the cluster's GCS at ``address`` (HOST:PORT, already found listening) for its id, in
    the mode ``authenticated`` settles on, so ``ray.init`` that follows is let in at once."""
    from ray._raylet import InnerGcsClient  # type: ignore[attr-defined]

    from raysaga.orchestrator.ray_address import host_port, not_a_gcs, speaks_grpc

    hp = host_port(address)
    if hp is not None and speaks_grpc(*hp) is False:  # (None: it stopped listening; Ray's probe says so)
        raise not_a_gcs(address, *hp)

    def probe() -> None:
        with _quiet_native_stderr():
            InnerGcsClient.standalone(address, None, PROBE_TIMEOUT_MS)

    try:
        authenticated(address, probe)
    except UserError:
        raise
    except Exception as exc:  # it listens, but does not answer as a Ray GCS
        from raysaga.orchestrator.ray_address import unreachable

        raise unreachable(address, str(exc).strip().splitlines()[0] if str(exc).strip() else "") from None


#: Seconds a dashboard has to say its authentication mode (``cluster_uses_token``).
MODE_ASK_TIMEOUT = 3.0


def cluster_uses_token(dashboard: str) -> bool:
    """Whether the cluster whose dashboard (Job API) is at ``dashboard`` requires Ray's token, as
    it says itself (``/api/authentication_mode``, asked without one), for a command printed for the
    user to run: a launch in a shell with ``RAY_AUTH_MODE=token`` against a cluster without token
    auth named ``RAY_AUTH_MODE=token ray job logs``. A Ray without that page (before token auth,
    2.52) has none; a dashboard that cannot be asked leaves this process's own mode to decide."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(dashboard.rstrip("/") + "/api/authentication_mode",
                                    timeout=MODE_ASK_TIMEOUT) as answer:
            mode = json.loads(answer.read(4096)).get("authentication_mode")
    except urllib.error.HTTPError as exc:
        mode = "disabled" if exc.code == 404 else None
    except (OSError, ValueError, AttributeError):
        mode = None
    if not isinstance(mode, str):
        return chosen_mode() == "token"
    return mode.strip().lower() == "token"

"""Ray token authentication as raysaga settles it (``ray_auth``), without a cluster: where a token
is found, when token mode is turned on, and the one line each refusal becomes. A real cluster
with token authentication: ``tests/cluster/test_launch.py``.

Token mode is never really turned on in this process (the session's Ray runs without it):
``enable_token_mode`` is replaced by a recorder."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from raysaga.errors import UserError
from raysaga.orchestrator import ray_auth

_VARS = (ray_auth.MODE_VAR, ray_auth.TOKEN_VAR, ray_auth.TOKEN_PATH_VAR)


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[str]:
    """No token anywhere (HOME is empty), RAY_AUTH_MODE unset; returns the enable_token_mode calls."""
    for name in _VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    calls: list[str] = []

    def enable() -> None:
        calls.append("token")
        monkeypatch.setenv(ray_auth.MODE_VAR, "token")

    monkeypatch.setattr(ray_auth, "enable_token_mode", enable)
    return calls


def _refusing(times: int) -> tuple[list[int], Callable[[], str]]:
    """An attempt refused by the cluster ``times`` times, then let in."""
    from ray.exceptions import AuthenticationError

    seen: list[int] = []

    def attempt() -> str:
        seen.append(1)
        if len(seen) <= times:
            raise AuthenticationError("Authentication token is missing or incorrect")
        return "in"

    return seen, attempt


def test_where_a_token_is_found_follows_rays_order(clean: list[str], monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    assert ray_auth.token_source() is None
    default = tmp_path / "home" / ".ray" / "auth_token"
    default.parent.mkdir(parents=True)
    default.write_text("")
    assert ray_auth.token_source() is None  # an empty file is no token (Ray would abort on it)
    default.write_text("t")
    assert ray_auth.token_source() == str(default)
    named = tmp_path / "token"
    named.write_text("t")
    monkeypatch.setenv(ray_auth.TOKEN_PATH_VAR, str(named))
    assert ray_auth.token_source() == str(named)
    monkeypatch.setenv(ray_auth.TOKEN_VAR, "t")
    assert ray_auth.token_source() == ray_auth.TOKEN_VAR


def test_a_cluster_that_lets_this_process_in_is_not_asked_twice(clean: list[str]) -> None:
    seen, attempt = _refusing(0)
    assert ray_auth.authenticated("h:1", attempt) == "in"
    assert len(seen) == 1 and clean == []


def test_token_mode_is_turned_on_only_when_asked_unset_and_a_token_is_here(
        clean: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ray_auth.TOKEN_VAR, "t")
    seen, attempt = _refusing(1)
    assert ray_auth.authenticated("h:1", attempt) == "in"
    assert len(seen) == 2 and clean == ["token"]


@pytest.mark.parametrize(("env", "message"), [
    ({}, "the Ray cluster at h:1 requires token authentication and no token was found here: put the "
         "cluster's token in ~/.ray/auth_token, RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH"),
    ({"RAY_AUTH_MODE": "disabled", "RAY_AUTH_TOKEN": "t"},
     "the Ray cluster at h:1 requires token authentication, but RAY_AUTH_MODE is 'disabled' here: unset it or "
     "set RAY_AUTH_MODE=token"),
    ({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "wrong"},
     "the Ray cluster at h:1 refused the token from RAY_AUTH_TOKEN: use that cluster's token"),
    ({"RAY_AUTH_TOKEN_PATH": "/nonexistent/token"},
     "RAY_AUTH_TOKEN_PATH names /nonexistent/token, which is missing, unreadable or empty"),
])
def test_each_refusal_is_one_line_naming_the_fix(clean: list[str], monkeypatch: pytest.MonkeyPatch,
                                                 env: dict[str, str], message: str) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    _, attempt = _refusing(5)
    with pytest.raises(UserError) as exc:
        ray_auth.authenticated("h:1", attempt)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert "wrong" not in str(exc.value)  # the token itself is never shown
    assert clean == []


def test_token_mode_without_a_token_is_refused_before_ray_is_asked(
        clean: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ray_auth.MODE_VAR, "token")  # Ray's loader would abort the whole process here
    seen, attempt = _refusing(0)
    with pytest.raises(UserError, match="RAY_AUTH_MODE=token is set here but no token for the Ray cluster"):
        ray_auth.authenticated("h:1", attempt)
    assert seen == []


def test_a_token_path_that_is_a_fifo_is_no_token_and_does_not_hang(clean: list[str], monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    """RAY_AUTH_TOKEN_PATH naming a FIFO: opening it to read blocked until a writer came, for ever."""
    fifo = tmp_path / "token-fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv(ray_auth.TOKEN_PATH_VAR, str(fifo))
    found: list[str | None] = []
    reader = threading.Thread(target=lambda: found.append(ray_auth.token_source()), daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # unblock the stuck open() so the thread ends with the test
        with open(fifo, "wb"):
            pass
        pytest.fail("token_source() blocked on a FIFO")
    assert found == [None]

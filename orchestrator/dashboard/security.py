"""Who may talk to the dashboard: the bind rule, the token, the Host check and the CSRF defence.

- **Bind.** 127.0.0.1 (or another loopback address) by default. Any other host needs a token
  (``--token`` or ``RAYSAGA_DASHBOARD_TOKEN``); without one ``raysaga dashboard`` refuses to start.
- **Token.** When one is set, every request needs it: ``Authorization: Bearer TOKEN``, or the
  ``raysaga_token`` cookie that opening ``/?token=TOKEN`` once sets (HttpOnly, SameSite=Strict),
  else 401. Compared in constant time.
- **Host.** A request whose ``Host`` header is not one of the names the server answers to
  (loopback names, the bind address, this machine's names, ``--allow-host``) gets 403: a page on
  another site that rebinds its DNS name to this address is refused (DNS rebinding).
- **CSRF.** A state-changing request (anything but GET/HEAD/OPTIONS) needs the header
  ``X-Raysaga-CSRF`` equal to the per-process value the page is served with (a page of another
  origin can neither read it nor send a custom header without a CORS preflight, which the
  dashboard never answers), and an ``Origin``, when sent, of this server; else 403. The value is
  random per process; a page left open across a restart reads the current one from
  ``GET /api/csrf``, which is guarded as the page itself is (Host, token): another origin can
  read neither (no CORS), so the header still proves the request came from a page of this server.
"""

from __future__ import annotations

import hmac
import ipaddress
import os
import secrets
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from raysaga.errors import UserError
from raysaga.state.redact import register_secret

TOKEN_ENV = "RAYSAGA_DASHBOARD_TOKEN"
COOKIE = "raysaga_token"
CSRF_HEADER = "x-raysaga-csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")


def is_loopback(host: str) -> bool:
    if host in ("localhost", "::1", "[::1]"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def resolve_token(token: str | None) -> str | None:
    """The token given, else the environment's; empty means none."""
    value = token if token is not None else os.environ.get(TOKEN_ENV)
    value = (value or "").strip()
    if value:  # never printed nor logged, whichever way it came (the environment's is by its name)
        register_secret(value)
    if value and len(value) < 16:
        raise UserError("the dashboard token is too short: use 16 characters or more "
                        "(e.g. python -c 'import secrets; print(secrets.token_urlsafe())')")
    return value or None


def check_bind(host: str, token: str | None) -> None:
    """Refuse a non-loopback bind without a token."""
    if not is_loopback(host) and token is None:
        raise UserError(f"--host {host} exposes the dashboard beyond this machine: it needs a token "
                        f"(--token TOKEN or {TOKEN_ENV}=TOKEN), which every request must then carry")


def _host_only(value: str) -> str:
    """``Host`` header to its host part, lower-cased (``[::1]:8000`` -> ``[::1]``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


@dataclass
class Guard:
    """The checks one dashboard process applies to each request."""

    host: str
    token: str | None = None
    allowed_hosts: set[str] = field(default_factory=set)
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    @classmethod
    def make(cls, host: str, token: str | None, extra_hosts: Iterable[str] = ()) -> Guard:
        allowed = {*_LOOPBACK_NAMES, host.lower(), *(h.lower() for h in extra_hosts)}
        if not is_loopback(host):
            for name in (socket.gethostname(), socket.getfqdn()):
                allowed.add(name.lower())
            if host in ("0.0.0.0", "::"):
                allowed |= _local_addresses()
        if ":" in host and not host.startswith("["):
            allowed.add(f"[{host.lower()}]")
        return cls(host=host, token=token, allowed_hosts=allowed)

    def host_ok(self, header: str | None) -> bool:
        return header is not None and _host_only(header) in self.allowed_hosts

    def token_ok(self, authorization: str | None, cookie: str | None, query: str | None = None) -> bool:
        if self.token is None:
            return True
        given = []
        if authorization and authorization.lower().startswith("bearer "):
            given.append(authorization[7:].strip())
        given += [v for v in (cookie, query) if v]
        return any(hmac.compare_digest(g.encode(), self.token.encode()) for g in given)

    def csrf_ok(self, header: str | None, origin: str | None, host_header: str | None) -> bool:
        return self.csrf_problem(header, origin, host_header) is None

    def csrf_problem(self, header: str | None, origin: str | None, host_header: str | None) -> str | None:
        """Why a state-changing request is refused, or None: ``"origin"`` (another site sent it),
        ``"csrf"`` (no header, or not this process's value: a page served by an earlier process
        asks ``/api/csrf`` for the current one and sends it again, once)."""
        if origin is not None:
            netloc = origin.split("://", 1)[-1].rstrip("/").lower()
            if host_header is None or netloc != host_header.strip().lower():
                return "origin"
        if header is None or not hmac.compare_digest(header.encode(), self.csrf.encode()):
            return "csrf"
        return None


def _local_addresses() -> set[str]:
    """This machine's addresses, for a server bound to every interface."""
    found: set[str] = set()
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None):
            addr = str(info[4][0])
            found.add(f"[{addr}]" if ":" in addr else addr)
    except OSError:
        pass
    return found


__all__ = ["COOKIE", "CSRF_HEADER", "SAFE_METHODS", "TOKEN_ENV", "Guard", "check_bind", "is_loopback",
           "resolve_token"]

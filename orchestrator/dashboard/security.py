"""Who may talk to the dashboard: the bind rule, the token, the Host check and the CSRF defence.

- **Bind.** 127.0.0.1 (or another loopback address) by default. Any other host needs a token
  (``--token`` or ``RAYSAGA_DASHBOARD_TOKEN``); without one ``raysaga dashboard`` refuses to start.
- **Token.** When one is set, every request needs it: ``Authorization: Bearer TOKEN``, or the
  ``raysaga_token`` cookie that opening ``/?token=TOKEN`` once sets (HttpOnly, SameSite=Strict),
  else 401. Compared in constant time. Every holder of the shared token is one principal: the
  name an action is done as (``by``) is then a label the page sends, not who acts.
- **Sign-in.** ``/?token=TOKEN`` is the only way a cookie is set, and it decides alone (a cookie
  sent with it does not count): a wrong token is a 401 that clears the cookie (a mistyped link
  left the previous person signed in, silently), and a link opened from another site
  (``Sec-Fetch-Site: cross-site`` or ``same-site``) is refused: a top-level navigation sets even a
  SameSite=Strict cookie, so any page could sign a browser in as someone else (login CSRF).
  Browsers send ``Sec-Fetch-Site`` to https and loopback addresses only; a client without it is
  let in. ``POST /api/logout`` clears the cookie.
- **Users.** ``--user NAME=TOKEN`` (repeatable) or ``--users-file PATH``
  (``RAYSAGA_DASHBOARD_USERS``: one ``NAME=TOKEN`` a line) give each person a token of their own,
  carried the same three ways; the token says who is signed in, and an action is done as that
  person (``app``: a ``by`` naming someone else is a 403). Exclusive with the shared token.
- **Host.** A request whose ``Host`` header is not one of the names the server answers to
  (loopback names, the bind address, this machine's names and interface addresses,
  ``--allow-host``) gets 403: a page on another site that rebinds its DNS name to this address is
  refused (DNS rebinding). With a token (or users), any IP-literal Host is accepted too: a
  rebinding page's Host is its own DNS name, and it holds neither the token nor the cookie, which
  the browser keeps for the host that set it.
- **CSRF.** A state-changing request (anything but GET/HEAD/OPTIONS) needs the header
  ``X-Raysaga-CSRF`` equal to the per-process value the page is served with (a page of another
  origin can neither read it nor send a custom header without a CORS preflight, which the
  dashboard never answers), and an ``Origin``, when sent, of this server; else 403. The value is
  random per process; a page left open across a restart reads the current one from
  ``GET /api/csrf``, which is guarded as the page itself is (Host, token): another origin can
  read neither (no CORS), so the header still proves the request came from a page of this server.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import os
import secrets
import socket
import struct
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from raysaga.errors import UserError
from raysaga.state.redact import register_secret

TOKEN_ENV = "RAYSAGA_DASHBOARD_TOKEN"
USERS_ENV = "RAYSAGA_DASHBOARD_USERS"
COOKIE = "raysaga_token"
CSRF_HEADER = "x-raysaga-csrf"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1", "[::1]")
_TOKEN_HINT = "e.g. python -c 'import secrets; print(secrets.token_urlsafe())'"
#: Longest user name (the longest name an action is done as).
MAX_NAME = 200


def is_loopback(host: str) -> bool:
    if host in ("localhost", "::1", "[::1]"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _ascii_problem(token: str) -> str | None:
    """Why ``token`` cannot be one, or None: a browser's cookie carries printable ASCII only (a
    character above U+00FF made ``/?token=`` a 500, its cookie header unencodable)."""
    bad = next((c for c in token if not " " <= c <= "~"), None)
    if bad is None:
        return None
    return (f"holds the character U+{ord(bad):04X}: a token is printable ASCII (letters, digits, punctuation), "
            f"which a browser's cookie carries ({_TOKEN_HINT})")


def resolve_token(token: str | None) -> str | None:
    """The token given, else the environment's; empty means none."""
    value = token if token is not None else os.environ.get(TOKEN_ENV)
    value = (value or "").strip()
    if value and len(value) < 16:  # (said before it is a secret: "too short" itself was masked for "short")
        raise UserError(f"the dashboard token is too short: use 16 characters or more ({_TOKEN_HINT})")
    problem = _ascii_problem(value)
    if problem is not None:
        raise UserError(f"the dashboard token (--token, {TOKEN_ENV}) {problem}")
    if value:  # never printed nor logged, whichever way it came (the environment's is by its name)
        register_secret(value)
    return value or None


def _users_file(path: str) -> str:
    """How a message names the users file: never by a value holding '=' (a ``NAME=TOKEN`` given
    where a file's name belongs: quoting it printed the token)."""
    return "the users file" if "=" in path else f"the users file {path!r}"


def _users_lines(path: str) -> list[tuple[str, str]]:
    """The entries of a users file, each with where it is (``FILE line N``); ``UserError`` when it
    cannot be read. A value holding '=' is never quoted: it is a ``NAME=TOKEN`` given where a
    file's name belongs (``RAYSAGA_DASHBOARD_USERS=alice=TOKEN``), and quoting it printed the token."""
    shown = _users_file(path)
    try:  # utf-8-sig: a file saved with a byte-order mark (Windows' editors) read its first name as '\ufeffalice'
        text = Path(path).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        if "=" in path:
            raise UserError(f"the value of {USERS_ENV} / --users-file is not a readable file: it should name a file "
                            "of NAME=TOKEN lines (one person: --user NAME=TOKEN)") from None
        raise UserError(f"cannot read the dashboard's users file {path!r} ({USERS_ENV}, --users-file): "
                        f"{getattr(exc, 'strerror', None) or exc}") from None
    return [(f"{shown} line {n}", line.strip()) for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.strip().startswith("#")]


def users_file_warning(path: str | None) -> str | None:
    """The warning ``raysaga dashboard`` prints at start when the users file (``path``, else
    ``RAYSAGA_DASHBOARD_USERS``'s) is readable by its group or others: it holds every token."""
    path = path if path is not None else os.environ.get(USERS_ENV) or None
    try:
        mode = os.stat(path).st_mode if path else 0
    except OSError:
        return None
    if not mode & 0o077:
        return None
    return (f"warning: {_users_file(str(path))} is readable by others than its owner (mode {mode & 0o777:o}) and "
            "holds every person's token: chmod 600 it")


def resolve_users(pairs: Iterable[str] = (), file: str | None = None) -> dict[str, str]:
    """Each person's token, name -> token, from ``--user NAME=TOKEN`` and a file of such lines
    (``--users-file``, else ``RAYSAGA_DASHBOARD_USERS``; blank lines and ``#`` comments skipped);
    ``UserError`` naming the entry that is not one (no '=', a name that is no name, a token under
    16 characters or not printable ASCII, a name or a token given twice: a shared token would sign
    two people in as one). A refused entry's text is never echoed, nor its name when its token is
    short: a line holding a token alone (``c2VjcmV0...=``) splits at its padding."""
    entries = [("--user" if n == 1 else f"--user #{n}", pair) for n, pair in enumerate(pairs, 1)]
    path = file if file is not None else os.environ.get(USERS_ENV) or None
    if path:
        entries += _users_lines(path)
    users: dict[str, str] = {}
    for where, entry in entries:
        name, sep, token = entry.partition("=")
        name, token = name.strip(), token.strip()
        if not sep or not name:  # the entry is not echoed: it may be a token alone
            raise UserError(f"{where}: an entry is not NAME=TOKEN ({'no name' if sep else 'no ='}): e.g. "
                            "--user alice=$(python -c 'import secrets; print(secrets.token_urlsafe())')")
        if len(token) < 16:  # the name unsaid: "NAME" may be a token, cut at its '=' padding
            raise UserError(f"{where}: the entry's token is missing or too short: each entry is NAME=TOKEN, "
                            f"the token 16 characters or more ({_TOKEN_HINT})")
        if len(name) > MAX_NAME or not name.isprintable():
            raise UserError(f"{where}: the user name {name[:40]!r} is not a name: 1-{MAX_NAME} printable characters")
        problem = _ascii_problem(token)
        if problem is not None:
            raise UserError(f"{where}: the token of {name!r} {problem}")
        if name in users:
            raise UserError(f"{where}: the user {name!r} is given twice: one token per person")
        if any(hmac.compare_digest(token.encode(), t.encode()) for t in users.values()):
            raise UserError(f"{where}: the token of {name!r} is another user's too: each person needs their own "
                            "(a token says who is signed in)")
        register_secret(token)  # once it is one: a short one, refused, would mask its text in the refusal
        users[name] = token
    return users


def check_bind(host: str, token: str | None, users: Mapping[str, str] | None = None) -> None:
    """Refuse a non-loopback bind without a token (or users), and a shared token beside users."""
    if token is not None and users:
        raise UserError(f"the dashboard has users (--user, --users-file or {USERS_ENV}) and a shared token "
                        f"(--token or {TOKEN_ENV}): with users each person signs in with their own token; "
                        "drop the shared one")
    if not is_loopback(host) and token is None and not users:
        raise UserError(f"--host {host} exposes the dashboard beyond this machine: it needs a token "
                        f"(--token TOKEN or {TOKEN_ENV}=TOKEN, or a token per person: --user NAME=TOKEN), "
                        "which every request must then carry")


#: ``Sec-Fetch-Site`` of a request another site made the browser send: no sign-in from it.
FOREIGN_SITES = frozenset({"cross-site", "same-site"})


def _host_only(value: str) -> str:
    """``Host`` header to its host part, lower-cased (``[::1]:8000`` -> ``[::1]``)."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[: value.find("]") + 1] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def allowed_name(value: str) -> str:
    """An ``--allow-host`` entry as a Host header's host part: its port dropped (the header's is),
    or ``UserError`` when it is no host name (a URL, a path, empty)."""
    name = _host_only(value)
    if not name or any(c in value for c in "/@ \t?#") or name.endswith(":"):
        raise UserError(f"--allow-host {value!r} is not a host name: give NAME or NAME:PORT "
                        "(e.g. --allow-host dash.example.com), not a URL")
    return name


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host[1:-1] if host.startswith("[") and host.endswith("]") else host)
    except ValueError:
        return False
    return True


@dataclass
class Guard:
    """The checks one dashboard process applies to each request."""

    host: str
    token: str | None = None
    allowed_hosts: set[str] = field(default_factory=set)
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    users: dict[str, str] = field(default_factory=dict)
    """Name -> token: with users, a token signs its holder in (``who``)."""

    @classmethod
    def make(cls, host: str, token: str | None, extra_hosts: Iterable[str] = (),
             users: Mapping[str, str] | None = None) -> Guard:
        allowed = {*_LOOPBACK_NAMES, host.lower()}
        for extra in extra_hosts:
            name = allowed_name(extra)
            allowed.add(name)
            if ":" in name and not name.startswith("["):
                allowed.add(f"[{name}]")
        if not is_loopback(host):
            for name in (socket.gethostname(), socket.getfqdn()):
                allowed.add(name.lower())
            if host in ("0.0.0.0", "::"):
                allowed |= _local_addresses()
        if ":" in host and not host.startswith("["):
            allowed.add(f"[{host.lower()}]")
        return cls(host=host, token=token, allowed_hosts=allowed, users=dict(users or {}))

    @property
    def signs_in(self) -> bool:
        """Whether a request needs a credential (a shared token or a user's)."""
        return self.token is not None or bool(self.users)

    def host_ok(self, header: str | None) -> bool:
        if header is None:
            return False
        host = _host_only(header)
        # with a credential required, an IP literal is safe: a rebinding page's Host is its DNS name
        return host in self.allowed_hosts or (self.signs_in and _is_ip(host))

    def who(self, authorization: str | None, cookie: str | None, query: str | None = None) -> str | None:
        """Who the request is from: a user's name; ``""`` when it is let in without one (no users:
        the shared token, or none needed); None when refused (401). The bearer header counts
        first, then ``query`` (the app passes none: a ``/?token=`` link is ``sign_in``'s alone),
        then the cookie; every token is compared, in constant time."""
        if not self.signs_in:
            return ""
        given = []
        if authorization and authorization.lower().startswith("bearer "):
            given.append(authorization[7:].strip())
        given += [v for v in (query, cookie) if v]
        for value in given:
            found = self._match(value.encode())
            if found is not None:
                return found
        return None

    def sign_in(self, token: str) -> str | None:
        """Whom a ``/?token=`` link signs in (``""``: the shared token), or None: not a token here."""
        return self._match(token.encode()) if token else None

    def _match(self, given: bytes) -> str | None:
        found = None
        if self.token is not None and hmac.compare_digest(given, self.token.encode()):
            found = ""
        for name, token in self.users.items():  # no early exit: the time says nothing of which matched
            if hmac.compare_digest(given, token.encode()):
                found = name
        return found

    def token_ok(self, authorization: str | None, cookie: str | None, query: str | None = None) -> bool:
        return self.who(authorization, cookie, query) is not None

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
    """This machine's addresses, for a server bound to every interface: its name's (on Debian only
    127.0.1.1) and its interfaces' (Linux: an ioctl per interface for IPv4, /proc for IPv6)."""
    found: set[str] = set()
    with contextlib.suppress(OSError):
        found |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
    found |= _interface_addresses()
    return {f"[{a.lower()}]" if ":" in a else a for a in found}


def _interface_addresses() -> set[str]:
    """The interfaces' addresses, without a dependency (psutil is none of raysaga's)."""
    found: set[str] = set()
    if not sys.platform.startswith("linux"):
        return found
    import fcntl

    siocgifaddr = 0x8915
    try:
        names = [name for _, name in socket.if_nameindex()]
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            for name in names:
                try:
                    raw = fcntl.ioctl(probe.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
                except OSError:  # no IPv4 address on it
                    continue
                found.add(socket.inet_ntoa(raw[20:24]))
    except OSError:
        pass
    try:
        with open("/proc/net/if_inet6", encoding="ascii") as lines:
            for line in lines:
                hexed = line.split()[0]
                found.add(str(ipaddress.IPv6Address(bytes.fromhex(hexed))))
    except (OSError, ValueError, IndexError):
        pass
    return found


__all__ = ["COOKIE", "CSRF_HEADER", "FOREIGN_SITES", "SAFE_METHODS", "TOKEN_ENV", "USERS_ENV", "Guard", "allowed_name",
           "check_bind", "is_loopback", "resolve_token", "resolve_users", "users_file_warning"]

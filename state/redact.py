"""Secrets never reach the store, the event log, the CLI or the logs (DESIGN invariant 7).

``scrub_text`` replaces, in a piece of text, every value that is or looks like a secret with
``MARKER``; ``scrub`` does the same for every string of a JSON value (and for the whole value
of a secret-named key such as ``authorization``). What counts as a secret:

- the value (8+ characters) of every environment variable whose *name* contains KEY, SECRET,
  TOKEN, PASSWORD, PASSWD or CREDENTIAL (``ANTHROPIC_API_KEY``) but a placeholder (``_plain``:
  ``POSTGRES_PASSWORD=postgres``, skipped with a warning naming the variable), and of every
  variable named with ``register_secret_env`` (the environment is re-read when it changes);
- values registered with ``register_secret`` (``raysaga.Secret`` input fields register theirs);
- each such value also as a URL's query writes it (percent-encoded) and as JSON escapes it;
- an ``Authorization:``/``x-api-key:`` header value, a ``Bearer <token>``, the password of a
  ``scheme://user:password@host`` URL (empty user, ``/`` or ``@`` in it) or in its query
  (``?password=``, ``&token=``...), a ``password=``/``PGPASSWORD=``/``'password': '...'`` or
  ``aws_secret_access_key`` in free text (a quoted value to its closing quote, escapes included),
  a quoted ``"token"``/``"private_key"`` key's value, a PEM private key's body, and token shapes:
  ``sk-ant-…``, ``sk-…`` (20+), GitHub ``ghp_…``/``github_pat_…``, Slack ``xox?-…``, AWS ``AKIA…``.

A piece of a known value that a cut left is masked too (``_Pieces``): at either end of a text, or
beside a cut's mark inside it (pydantic shows ``input_value='first25...last24'``). It is applied
where failures become records (step errors, tracebacks, agent and tool errors), at the store's
write boundary (node errors, event data, run reasons — never step outputs: a wrong result), and
to the ``raysaga`` loggers (``RedactingFilter``). Clean text costs one precompiled regex search.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import Any
from urllib.parse import quote, quote_plus

from raysaga.errors import UserError

MARKER = "[redacted]"
MIN_SECRET_LEN = 8  # shorter values are never secrets (they would redact common words)

_SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
#: Dict keys whose string value is a secret as a whole (compared lower-cased, '_' as '-').
SECRET_KEYS = frozenset({
    "authorization", "proxy-authorization", "x-api-key", "api-key", "apikey", "x-auth-token",
    "password", "passwd", "client-secret", "secret", "access-token", "refresh-token", "cookie", "set-cookie",
    "token", "id-token", "auth-token", "api-token", "session-token", "private-key", "api-secret",
    "secret-access-key", "aws-secret-access-key",
})

_SECRET_SUFFIXES = ("-password", "-passwd", "-secret", "-api-key", "-apikey", "-private-key")  # DB_PASSWORD


def _secret_key(key: str) -> bool:
    name = key.lower().replace("_", "-")
    return name in SECRET_KEYS or name.endswith(_SECRET_SUFFIXES)


#: A name whose value follows (``name=``, ``name: ``, ``'name': ``): lower-case ``password`` only
#: as a word (``nopassword`` is not one), upper case also at a variable's end (``PGPASSWORD``), or
#: camel case (``dbPassword``); AWS's ``aws_secret_access_key``.
_WORD = (r"(?:(?<![a-z])(?:password|passwd|client[-_]secret|(?:aws[-_])?secret[-_]access[-_]key)"
         r"|(?-i:(?<=[A-Za-z])(?:PASSWORD|PASSWD|Password|Passwd)))")
#: A name whose value is a secret only as a quoted key (``"token": "..."``): as a word it is prose.
_QWORD = r"(?:token|secret|private[-_]key|(?:access|refresh|id|auth|api|session)[-_]token|api[-_]secret)"

#: A character of a URL's password as the scan reads it: not a space, ``?``, ``#``, ``@``, ``://``.
_PW = r"(?:[^\s?#@:]|:(?!//))"

#: A secret's name in a pattern of ``_WORD`` or ``_QWORD`` holds one of these (a quoted ``token``
#: only, so the ``input_tokens`` of every usage record costs no scan).
_NAME_HINTS = ("passw", "secret", "private", "token\"", "token'", "token\\")

# (pattern, replacement, hints): each keeps what names the secret and replaces only the value, and
# is tried only when the (lower-cased) text holds one of its hints: one substring test, not a scan
_PATTERNS: list[tuple[str, str, tuple[str, ...]]] = [
    (r"(?P<k>(?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?(?!(?:(?:bearer|basic|token|digest)\s+)?\[redacted\])"
     r"(?:(?:bearer|basic|token|digest)\s+)?)[^\s\"',;}\]]+",
     r"\g<k>" + MARKER, ("authorization",)),
    (r"(?P<k>(?:x-api-key|x-auth-token|api[-_]?key)[\"']?\s*[:=]\s*[\"']?)(?!\[redacted\])[^\s\"',;}\]]{8,}",
     r"\g<k>" + MARKER, ("api-key", "api_key", "apikey", "auth-token")),
    (r"(?P<k>\bbearer\s+)(?!\[redacted\])[A-Za-z0-9._~+/=-]{8,}", r"\g<k>" + MARKER, ("bearer",)),
    # the password of ``scheme://user:password@host`` (user maybe empty: ``redis://:pw@cache``), ``@`` and
    # ``/`` in it: to the last ``@`` before a ``?``/``#`` (past what urllib and SQLAlchemy read), or the
    # first past one. Not a port (``https://host:8080/u/ada@x.com``); never across a ``://`` (linear)
    (rf"(?P<k>://[^/\s:@\[\]]{{0,256}}:)(?!\[redacted\]@)(?!\d{{1,5}}(?![^\s/?#]))(?!@){_PW}{{0,1024}}+"
     rf"(?:(?:@{_PW}{{0,1024}}+){{0,8}}(?=@)|[?#][^\s@]{{0,1024}}+(?=@))", r"\g<k>" + MARKER, ("://",)),
    # a URL's query (``?password=``: libpq and SQLAlchemy take the password there too) or a form body
    (r"(?P<k>[?&;](?:ssl)?(?:password|passwd|pwd)=|[?&;](?:client_secret|secret|token|access_token|"
     r"refresh_token|id_token|auth_token|api_token|key|api_?key|sig|signature)=)(?!\[redacted\])[^&\s#\"'<>]+",
     r"\g<k>" + MARKER, ("password=", "passwd=", "pwd=", "secret=", "token=", "key=", "sig=", "signature=")),
    # the password of a database URL whose ``://`` lost a character (``--db postgresql:/app:pw@db``)
    (r"(?P<k>\b(?:postgres(?:ql)?|mysql|mariadb|redis|rediss|mongodb|amqps?|mssql)(?:\+\w+)?(?::/?|/{1,2}|:///)"
     r"[^/\s:@\[\]]{0,256}:)(?!\[redacted\]@)[^\s/?#@:]{1,1024}(?=@)", r"\g<k>" + MARKER,
     ("postgres", "mysql", "mariadb", "redis", "mongodb", "amqp", "mssql")),
    # a quoted value in JSON text quoted again (``{\"password\": \"...\"}``, a body inside a message)
    (rf"(?P<k>(?:{_WORD}|(?<=\\[\"']){_QWORD})\\[\"']\s*:\s*)(?P<q>\\[\"'])(?!\[redacted\](?P=q))"
     r"(?:\\\\\\[\\\"']|\\\\[^\\]|(?!(?P=q))\\[^\\]|[^\\\n])+?(?P=q)", r"\g<k>\g<q>" + MARKER + r"\g<q>",
     _NAME_HINTS),
    # a quoted value, escaped quotes and spaces and all: ``{"password": "a\"b"}``, libpq's
    # ``password='a b'``, ``{'token': '...'}``
    (rf"(?P<k>(?:{_WORD}[\"']?|(?<=[\"']){_QWORD}[\"'])\s*[:=]\s*)(?P<q>[\"'])(?!\[redacted\](?P=q))"
     r"(?:\\.|[^\\\n])+?(?P=q)", r"\g<k>\g<q>" + MARKER + r"\g<q>",
     _NAME_HINTS),
    # ``password=...``, ``PGPASSWORD=...``, ``password: ...`` in free text (a log line, a command)
    (rf"(?P<k>{_WORD}[\"']?\s*[:=]\s*[\"']?)(?!\[redacted\])[^\s\"',;}}\]&]+", r"\g<k>" + MARKER, ("passw", "secret")),
    # a PEM private key's body, to its END line or to the end of a text cut inside it
    (r"(?P<k>-----BEGIN [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----)(?!\[redacted\])[\s\S]*?"
     r"(?P<e>-----END [A-Z0-9 ]*PRIVATE KEY[A-Z ]*-----|\Z)", r"\g<k>" + MARKER + r"\g<e>", ("private",)),
    # token shapes, and the tail a cut left after its mark (pydantic's ``'sk-ant-api03-Xy...-AbCdEfAA'``)
    (r"\bsk-ant-[A-Za-z0-9_-]{8,}(?:(?:\.{3}|…)[A-Za-z0-9_-]+)?", MARKER, ("sk-ant-",)),
    (r"\bsk-[A-Za-z0-9_-]{20,}(?:(?:\.{3}|…)[A-Za-z0-9_-]+)?", MARKER, ("sk-",)),
    (r"\b(?:ghp|gho|ghs|ghu|github_pat)_[A-Za-z0-9_]{20,}(?:(?:\.{3}|…)[A-Za-z0-9_]+)?", MARKER,
     ("ghp_", "gho_", "ghs_", "ghu_", "github_pat_")),
    (r"\bxox[abprs]-[A-Za-z0-9-]{10,}(?:(?:\.{3}|…)[A-Za-z0-9-]+)?", MARKER, ("xox",)),
    (r"\bAKIA[0-9A-Z]{16}\b", MARKER, ("akia",)),
]
_SUBS = [(re.compile(p, re.IGNORECASE), r, hints) for p, r, hints in _PATTERNS]
#: Every pattern above needs one of these in the text: a cheap test before the regexes.
_HINTS = tuple(sorted({hint for _, _, hints in _PATTERNS for hint in hints}))


#: Printable ASCII but what a JSON encoder escapes (``"``, ``\\``, ``/`` by some): verbatim in JSON text.
_VERBATIM = re.compile(r"[\x20\x21\x23-\x2e\x30-\x5b\x5d-\x7e]*")

#: Values no secret-named variable holds as a secret (docker compose's ``POSTGRES_PASSWORD=postgres``).
_PLACEHOLDERS = frozenset({"postgres", "password", "changeme", "localhost", "secret", "default", "undefined",
                           "not-set", "notset", "placeholder", "development", "xxxxxxxx", "********"})
_NOT_A_SECRET = re.compile(r"changeme|placeholder|not-a-real|dummy|example|replace-?me|your[-_]", re.IGNORECASE)
_LIMIT = re.compile(r"MAX|MIN|LIMIT|SIZE|COUNT|TIMEOUT|TTL|PORT|TOKENS\b")


def _plain(value: str, name: str = "") -> bool:
    """No secret, though its variable's name says so (narrow: a weak real password is masked): a placeholder, a
    word of the name itself, a number in a limit's variable (``MAX_TOKENS``), a path in a ``*_FILE`` one."""
    low, up, words = value.lower(), name.upper(), re.split(r"[^a-z0-9]+", name.lower()) if name else []
    if low in _PLACEHOLDERS or low in words or (name and _NOT_A_SECRET.search(value)):
        return True
    return bool(value.isdigit() and _LIMIT.search(up)) or (up.endswith(("_FILE", "_PATH", "_DIR")) and value[0] in "/~")


def _forms(value: str) -> set[str]:
    """``value`` as text quotes it: itself, percent-encoded (``%2F``, ``+``), JSON-escaped (``\\/`` too)."""
    escaped = json.dumps(value)[1:-1]
    return {value, quote(value, safe=""), quote(value), quote_plus(value), escaped, escaped.replace("/", "\\/")}


def _pattern(form: str) -> str:
    # a percent escape's hex digits in either case (``%2f`` as ``%2F``)
    return re.sub(r"%([0-9A-F])([0-9A-F])", lambda m: f"%[{m[1]}{m[1].lower()}][{m[2]}{m[2].lower()}]",
                  re.escape(form))


class _Registry:
    """The literal secret values, and one compiled regex of them, rebuilt only on change."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registered: set[str] = set()
        self.env_names: set[str] = set()
        self.env_seen: tuple[int, tuple[str | None, ...]] = (-1, ())
        self.watched: tuple[str, ...] = ()
        self.values: frozenset[str] = frozenset()
        self.regex: re.Pattern[str] | None = None
        self.verbatim = True  # every value is ``_VERBATIM``: written as itself by any JSON encoder
        self.declared: frozenset[str] = frozenset()
        #: a piece of a known value where a cut left it (``_Pieces``): declared, then named ones
        self.pieces: tuple[_Pieces, ...] = ()
        self.skipped: set[str] = set()  # secret-named variables whose plain value was skipped
        self.to_warn: list[str] = []  # ... and not yet warned of (once each, by name)

    def _env_changed(self) -> bool:
        environ = os.environ
        return self.env_seen != (len(environ), tuple(environ.get(n) for n in self.watched))

    def current(self) -> re.Pattern[str] | None:
        if self._env_changed():
            with self.lock:
                self._rebuild()
            self._warn()
        return self.regex

    def _rebuild(self) -> None:
        environ = dict(os.environ)
        watched = tuple(sorted(n for n in environ if _SECRET_NAME.search(n) or n in self.env_names)
                        + sorted(n for n in self.env_names if n not in environ))
        # declared (registered, or a variable named so): a secret whatever it looks like
        declared = self.registered | {v for n in self.env_names if (v := environ.get(n)) and len(v) >= MIN_SECRET_LEN}
        values = set(declared)
        for name in watched:
            value = environ.get(name)
            if not value or len(value) < MIN_SECRET_LEN or value in values or name in self.env_names:
                continue
            if not _plain(value, name):
                values.add(value)
            elif name not in self.skipped:  # (a path in a ``*_PATH`` variable needs no word)
                self.skipped.add(name)
                self.to_warn += [] if name.upper().endswith(("_FILE", "_PATH", "_DIR")) else [name]
        self.watched = watched
        self.env_seen = (len(os.environ), tuple(os.environ.get(n) for n in watched))
        if values != self.values or declared != self.declared:
            self.values, self.declared = frozenset(values), frozenset(declared)
            self.pieces = tuple(p for p in (_pieces(frozenset(declared)), _pieces(self.values - declared, named=True))
                                if p is not None)
            # longest first, so a secret containing another is replaced whole
            forms = sorted({f for v in values for f in _forms(v)}, key=len, reverse=True)
            self.regex = re.compile("|".join(map(_pattern, forms))) if forms else None
            self.verbatim = all(_VERBATIM.fullmatch(v) for v in values)

    def _warn(self) -> None:
        """Name each skipped variable once, never its value; outside the lock (the record's scrub reads it)."""
        names, self.to_warn = self.to_warn, []
        for name in names:
            logging.getLogger("raysaga.redact").warning(
                "environment variable %s is named like a secret, but its value is a placeholder (a word of "
                "its name, a default): it is not masked (register_secret_env(%r) makes it a secret)", name, name)

    def add(self, value: str) -> None:
        if len(value) < MIN_SECRET_LEN or value in self.registered:
            return
        with self.lock:
            self.registered.add(value)
            self._rebuild()
        self._warn()

    def add_env(self, name: str) -> None:
        if name in self.env_names:
            return
        with self.lock:
            self.env_names.add(name)
            self.env_seen = (-1, ())
            self._rebuild()
        self._warn()


#: Where a text was cut and the cut marked: ``...``, ``…``, ``***`` (a key shown as ``sk-abc12***``).
_CUT = re.compile(r"\.{3,}|…+|\*{3,}")
_CLOSERS = "'\")]}"


class _Pieces:
    """Where a text was cut across a known secret, the piece left: its first 8+ characters at the
    text's end (``text[:n]``, maybe quoted: ``f"{text[:n]!r}"``) or before a cut's mark, its last
    8+ at its start (``[-n:]``) or after a mark (pydantic's ``input_value='first25...last24'``).
    raysaga scrubs before it cuts, but only of what the cutting process knows (a Ray worker never
    knew a value declared in the driver), and a library cuts first. A placeholder piece (``_plain``:
    "...password") of a value known by its variable's name only is left."""

    def __init__(self, values: list[str], named: bool) -> None:
        self.named = named
        self.longest = max(map(len, values))
        self.heads, self.tails = _Starts(values), _Starts([v[::-1] for v in values])  # v[:k]; v[-k:] reversed

    def sub(self, text: str) -> str:
        n = len(text)
        marks = [m.span() for m in _CUT.finditer(text)] if "..." in text or "…" in text or "***" in text else []
        ends = {n, *(a for a, _ in marks)}
        closed = len(text.rstrip(_CLOSERS))  # a piece quoted, cut: f"{value[:n]!r}", f"({value[:n]})"
        if n - 3 <= closed < n:
            ends.add(closed)
        spans: list[tuple[int, int]] = []
        for end in ends:
            at = self.heads.at_end(text, end, self.longest)
            if at is not None and not (self.named and _plain(text[at:end])):
                spans.append((at, end))
        for start in {0, *(b for _, b in marks)}:
            window = text[start:start + self.longest][::-1]
            at = self.tails.at_end(window, len(window), self.longest)
            if at is not None and not (self.named and _plain(text[start:start + len(window) - at])):
                spans.append((start, start + len(window) - at))
        merged: list[tuple[int, int]] = []
        for at, end in sorted(spans):  # overlapping pieces are masked once
            if merged and at <= merged[-1][1]:
                first, last = merged.pop()
                at, end = first, max(end, last)
            merged.append((at, end))
        for at, end in reversed(merged):  # right to left, so the spans to come stay put
            text = text[:at] + MARKER + text[end:]
        return text


class _Starts:
    """Finds ``v[:k]`` (``MIN_SECRET_LEN <= k < len(v)``) of any of ``values`` ending at a point: a
    search for their first characters before it (again after each hit: hits may overlap), each hit
    checked against its values (a pattern of a 4 KB key's prefixes nests too deep for ``re``)."""

    def __init__(self, values: list[str]) -> None:
        self.by_start: dict[str, list[str]] = {}
        for v in values:
            self.by_start.setdefault(v[:MIN_SECRET_LEN], []).append(v)
        self.regex = re.compile("|".join(map(re.escape, self.by_start)))

    def at_end(self, text: str, end: int, longest: int) -> int | None:
        """Where the piece ending at ``text[end]`` starts (the longest one), or None."""
        hit = self.regex.search(text, max(0, end - longest + 1), end)
        while hit is not None:  # (clean text: one search that finds nothing)
            at = hit.start()
            piece = text[at:end]
            if any(len(piece) < len(v) and v.startswith(piece) for v in self.by_start[hit.group()]):
                return at
            hit = self.regex.search(text, at + 1, end)
        return None


def _pieces(values: frozenset[str], named: bool = False) -> _Pieces | None:
    cut = [v for v in values if len(v) > MIN_SECRET_LEN]  # a piece is shorter than its value
    return _Pieces(cut, named) if cut else None


_REGISTRY = _Registry()


def register_secret(value: str) -> None:
    """Treat ``value`` (8+ characters) as a secret in this process from now on."""
    _REGISTRY.add(value)


def register_secret_env(name: str) -> None:
    """Treat the value of environment variable ``name`` as a secret, whatever its name."""
    _REGISTRY.add_env(name)


def scrub_text(text: str) -> str:
    """``text`` with every known secret replaced by a marker."""
    if len(text) < MIN_SECRET_LEN:
        return text
    return _scrub_text(text, _REGISTRY.current())


def _scrub_text(text: str, literal: re.Pattern[str] | None) -> str:
    if literal is not None:
        if literal.search(text):
            text = literal.sub(MARKER, text)
        for pieces in _REGISTRY.pieces:
            text = pieces.sub(text)
    low = text.lower()
    if any(hint in low for hint in _HINTS):
        for regex, replacement, hints in _SUBS:
            if any(hint in low for hint in hints):
                text = regex.sub(replacement, text)
    return text


def scrub(value: Any) -> Any:
    """A JSON value with every string scrubbed (keys kept); returns the same object when clean."""
    if value is None or isinstance(value, bool | int | float):
        return value
    return _scrub(value, _REGISTRY.current())


def _scrub(value: Any, literal: re.Pattern[str] | None) -> Any:
    if isinstance(value, str):
        return value if len(value) < MIN_SECRET_LEN else _scrub_text(value, literal)
    if isinstance(value, dict):
        out: dict[Any, Any] | None = None
        for key, item in value.items():
            if isinstance(item, str):
                if not item:
                    continue
                if isinstance(key, str) and _secret_key(key):
                    new: Any = MARKER
                elif len(item) < MIN_SECRET_LEN:
                    continue
                else:
                    new = _scrub_text(item, literal)
            elif isinstance(item, dict | list | tuple):
                new = _scrub(item, literal)
            else:
                continue
            if new is not item and new != item:
                if out is None:
                    out = dict(value)
                out[key] = new
        return value if out is None else out
    if isinstance(value, list | tuple):
        # one pass, calling out only for long strings and containers: a fan-out's lists are mostly numbers
        changed: list[Any] | None = None
        for i, item in enumerate(value):
            kind = type(item)
            if kind is int or kind is float or kind is bool or item is None:
                continue
            if isinstance(item, str):
                if len(item) < MIN_SECRET_LEN:
                    continue
                new = _scrub_text(item, literal)
            elif isinstance(item, dict | list | tuple):
                new = _scrub(item, literal)
            else:
                continue
            if new is not item:
                if changed is None:
                    changed = list(value)
                changed[i] = new
        if changed is None:
            return value
        return changed if isinstance(value, list) else tuple(changed)
    return value


def secret_values_known() -> bool:
    """Whether this process knows a secret value (registered, or a secret-named variable's)."""
    return _REGISTRY.current() is not None


def scrub_secret_values(value: Any) -> Any:
    """A JSON value with every known secret *value* replaced by the marker in its strings, and
    nothing else changed (no pattern, no secret-named key): for what a model or a tool said, where
    a word that merely looks like a token stays, but an API key it echoed must not be stored."""
    literal = _REGISTRY.current()
    return value if literal is None else _replace_values(value, literal)


def json_may_hold_secret_value(text: str) -> bool:
    """Whether the JSON ``text`` may hold a known secret value in one of its strings: False when
    none is known, or every known value is ``_VERBATIM`` and none occurs in the text itself (so
    what a model or tool said is parsed and scrubbed only when it can hold one)."""
    literal = _REGISTRY.current()
    if literal is None:
        return False
    return not _REGISTRY.verbatim or literal.search(text) is not None


def refuse_secret_values(value: Any, what: str) -> None:
    """A ``UserError`` if a string (or key) of the JSON ``value`` holds a known secret value:
    for data kept and handed on as given (an approver's answer), which a scrub would change."""
    literal = _REGISTRY.current()
    if literal is not None and _replace_values(value, literal, keys=True) != value:
        raise UserError(f"{what} holds the value of a secret (an API key or a password this process knows): "
                        "it is stored and handed on as written; keep secrets out of it (pass a reference)")


def _replace_values(value: Any, literal: re.Pattern[str], *, keys: bool = False) -> Any:
    if isinstance(value, str):
        return literal.sub(MARKER, value) if len(value) >= MIN_SECRET_LEN and literal.search(value) else value
    if isinstance(value, dict):
        return {_replace_values(k, literal) if keys else k: _replace_values(v, literal, keys=keys)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_replace_values(item, literal, keys=keys) for item in value]
    return value


class RedactingFilter(logging.Filter):
    """Scrubs a log record's message, arguments and exception text before any handler sees it."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string: leave it to logging's own error report
            return True
        clean = scrub_text(message)
        if clean is not message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and (text := scrub_text(record.exc_text)) != record.exc_text:
            # the live exception goes when it held a secret: a handler formatting it itself
            # (OpenTelemetry's, a JSON formatter, Sentry's) read it unscrubbed; Formatter prints exc_text
            record.exc_text, record.exc_info = text, None
        if record.stack_info:
            record.stack_info = scrub_text(record.stack_info)
        return True


_FILTER = RedactingFilter()
#: The loggers raysaga writes to; a filter on a logger only sees that logger's own records.
LOGGERS = ("raysaga", "raysaga.driver", "raysaga.store", "raysaga.agents", "raysaga.cli")
#: Records of these logger trees are scrubbed when they are made, whichever logger or handler
#: emits them later (a filter on a logger misses its children's records): raysaga's own, and the
#: libraries whose messages can quote a request (the SDK, HTTP, SQL, Ray, the dashboard's server).
SCRUBBED_TREES = ("raysaga", "anthropic", "httpx", "httpcore", "urllib3", "sqlalchemy", "ray", "uvicorn")


def _in_scrubbed_tree(name: str) -> bool:
    return any(name == tree or name.startswith(tree + ".") for tree in SCRUBBED_TREES)


def install_log_filter(*names: str) -> None:
    """Put the redacting filter on raysaga's loggers (and on ``names``), and scrub every record of
    ``SCRUBBED_TREES`` as it is made; idempotent. Done when this module is imported."""
    known = [n for n in logging.Logger.manager.loggerDict if n == "raysaga" or n.startswith("raysaga.")]
    for name in {*LOGGERS, *known, *names}:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    current = logging.getLogRecordFactory()
    if getattr(current, "_raysaga_scrubs", False):
        return

    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = current(*args, **kwargs)
        if _in_scrubbed_tree(record.name):
            _FILTER.filter(record)
        return record

    factory._raysaga_scrubs = True  # type: ignore[attr-defined]
    logging.setLogRecordFactory(factory)


install_log_filter()

"""Secrets never reach the store, the event log, the CLI or the logs (DESIGN invariant 7).

``scrub_text`` replaces, in a piece of text, every value that is or looks like a secret with
``MARKER``; ``scrub`` does the same for every string of a JSON value (and for the whole value
of a secret-named key such as ``authorization``). What counts as a secret:

- the value (8+ characters) of every environment variable whose *name* contains KEY, SECRET,
  TOKEN, PASSWORD, PASSWD or CREDENTIAL (``ANTHROPIC_API_KEY``) but a placeholder (``_plain``:
  ``POSTGRES_PASSWORD=postgres``, skipped with a warning naming the variable), and of every
  variable named with ``register_secret_env`` (the environment is re-read when it changes);
- values registered with ``register_secret`` (``raysaga.Secret`` input fields register theirs):
  8+ characters anywhere, 3 to 7 only as a whole token, shorter ones not at all (a warning says
  so: ``secret_registry``);
- each such value also as a URL's query writes it (percent-encoded) and as JSON escapes it;
- an ``Authorization:``/``x-api-key:`` header value, a ``Bearer <token>``, the password of a
  ``scheme://user:password@host`` URL (empty user, ``/`` or ``@`` in it), a bare token as its user
  info (``https://TOKEN@host``: 12+ characters, or 8+ with a letter and a digit) or in its query
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

import itertools
import logging
import re
from typing import Any

from raysaga.errors import UserError
from raysaga.state import secret_registry
from raysaga.state.secret_registry import MARKER as MARKER  # re-exported: where every caller finds it
from raysaga.state.secret_registry import MIN_DECLARED_LEN, MIN_SECRET_LEN, Registry

_SECRET_NAME = secret_registry.SECRET_NAME
_Registry = Registry  # (a test makes a fresh one: ``monkeypatch.setattr(redact, "_REGISTRY", redact._Registry())``)
_pieces = secret_registry.pieces
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
    # a bare token as a URL's user info (``https://TOKEN@host``, a key given as the user): 12+
    # characters, or 8+ holding a letter and a digit; a user name (``postgres@``, ``git@``) is left
    (r"(?P<k>://)(?!\[redacted\]@)(?:(?=[^\s/?#@:\[\]]{0,256}[0-9])(?=[^\s/?#@:\[\]]{0,256}[A-Za-z])"
     r"[^\s/?#@:\[\]]{8,256}+|[^\s/?#@:\[\]]{12,256}+)(?=@)", r"\g<k>" + MARKER, ("://",)),
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




_REGISTRY = _Registry()


def register_secret(value: str, what: str = "a value given to register_secret", *, env: str = "") -> None:
    """Treat ``value`` as a secret in this process from now on (3 to 7 characters: as a whole token in
    text only; shorter: a warning naming ``what``, never the value, as it cannot be scrubbed without
    mangling text). ``env``: the variable it was read from; a short placeholder there ("test") is none."""
    _REGISTRY.add(value, what, env)


def register_secret_env(name: str, *, shortest: int = MIN_DECLARED_LEN) -> None:
    """Treat the value of environment variable ``name`` as a secret, whatever its name, if it has
    ``shortest`` characters or more (a shorter value of 3 or more is then no secret: a placeholder)."""
    _REGISTRY.add_env(name, max(shortest, MIN_DECLARED_LEN))


def scrub_text(text: str, *, short_values: bool = True) -> str:
    """``text`` with every known secret replaced by a marker. ``short_values=False`` for data (a run's
    label): a declared value under 8 characters is some run's of this process, masked in text only."""
    if len(text) < MIN_DECLARED_LEN:
        return text
    known = _REGISTRY.current()
    if not short_values:
        return text if len(text) < MIN_SECRET_LEN else _scrub_text(text, known.value_regex)
    return text if len(text) < known.shortest else _scrub_text(text, known.regex)


def _scrub_text(text: str, literal: re.Pattern[str] | None) -> str:
    if len(text) < MIN_SECRET_LEN:  # only a short declared value fits: no piece of one, no pattern
        return literal.sub(MARKER, text) if literal is not None and literal.search(text) else text
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
    """A JSON value with every string scrubbed, keys too (a model can write an API key as one:
    ``{"values": {KEY: "primary"}}``); returns the same object when clean."""
    if value is None or isinstance(value, bool | int | float):
        return value
    known = _REGISTRY.current()
    return _scrub(value, known.regex, known.shortest, {})


def scrub_data(value: Any) -> Any:
    """``scrub`` for a run's data shown (its input, output, labels, a payload): a declared value under
    8 characters is not masked there (it is some run's of this process: another run's ``2024`` was
    shown ``[redacted]``, telling its owner it is a secret), as it is not in the stored data."""
    if value is None or isinstance(value, bool | int | float):
        return value
    return _scrub(value, _REGISTRY.current().value_regex, MIN_SECRET_LEN, {})


def _scrub(value: Any, literal: re.Pattern[str] | None, shortest: int, names: dict[str, str]) -> Any:
    """``shortest``: a string shorter than every known value (and pattern) is clean. ``names``: the
    keys scrubbed so far in this value (a list of records repeats its keys: each is scanned once)."""
    if isinstance(value, str):
        return value if len(value) < shortest else _scrub_text(value, literal)
    if isinstance(value, dict):
        out: dict[Any, Any] | None = None
        for i, (key, item) in enumerate(value.items()):
            if isinstance(item, str):
                if isinstance(key, str) and _secret_key(key) and item:
                    new: Any = MARKER
                else:
                    new = item if len(item) < shortest else _scrub_text(item, literal)
            elif isinstance(item, dict | list | tuple):
                new = _scrub(item, literal, shortest, names)
            else:
                new = item
            name = key
            if isinstance(key, str) and len(key) >= shortest:
                name = names.get(key) or names.setdefault(key, _scrub_text(key, literal))
            if out is None:
                if name == key and (new is item or new == item):
                    continue
                out = dict(itertools.islice(value.items(), i))
            out[_free(name, out)] = new
        return value if out is None else out
    if isinstance(value, list | tuple):
        # one pass, calling out only for long strings and containers: a fan-out's lists are mostly numbers
        changed: list[Any] | None = None
        for i, item in enumerate(value):
            kind = type(item)
            if kind is int or kind is float or kind is bool or item is None:
                continue
            if isinstance(item, str):
                if len(item) < shortest:
                    continue
                new = _scrub_text(item, literal)
            elif isinstance(item, dict | list | tuple):
                new = _scrub(item, literal, shortest, names)
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
    """Whether this process knows a secret value of 8+ characters (registered, or a secret-named
    variable's): the only ones data is scrubbed of (``scrub_secret_values``)."""
    return _REGISTRY.current().value_regex is not None


def scrub_secret_values(value: Any) -> Any:
    """A JSON value with every known secret *value* replaced by the marker in its strings, keys
    included (a model's ``{"values": {KEY: "primary"}}`` is a tool call holding the key), and
    nothing else changed (no pattern, no secret-named key): for what a model or a tool said, where
    a word that merely looks like a token stays, but an API key it echoed must not be stored. A
    value under 8 characters (a PIN) is left: it is some run's of this process, and would rewrite
    every other run's data that holds it as a word ("In 2024 we sold...")."""
    literal = _REGISTRY.current().value_regex
    return value if literal is None else _replace_values(value, literal)


def json_may_hold_secret_value(text: str) -> bool:
    """Whether the JSON ``text`` may hold a known secret value in one of its strings: False when
    none is known, or every known value is ``_VERBATIM`` and none occurs in the text itself (so
    what a model or tool said is parsed and scrubbed only when it can hold one)."""
    known = _REGISTRY.current()
    if known.value_regex is None:
        return False
    return not known.verbatim or known.value_regex.search(text) is not None


def refuse_secret_values(value: Any, what: str) -> None:
    """A ``UserError`` if a string (or key) of the JSON ``value`` holds a known secret value:
    for data kept and handed on as given (an approver's answer), which a scrub would change. Values of 8+
    characters only: a short one ("2024") refused another run's answer, and told the caller it is a secret."""
    literal = _REGISTRY.current().value_regex
    if literal is not None and _replace_values(value, literal) != value:
        raise UserError(f"{what} holds the value of a secret (an API key or a password this process knows): "
                        "it is stored and handed on as written; keep secrets out of it (pass a reference)")


def _replace_values(value: Any, literal: re.Pattern[str]) -> Any:
    """``literal``: ``Snapshot.value_regex`` (values of 8+ characters); keys are replaced in too."""
    if isinstance(value, str):
        return literal.sub(MARKER, value) if len(value) >= MIN_SECRET_LEN and literal.search(value) else value
    if isinstance(value, dict):
        out: dict[Any, Any] = {}
        for k, v in value.items():
            out[_free(_replace_values(k, literal), out)] = _replace_values(v, literal)
        return out
    if isinstance(value, list):
        return [_replace_values(item, literal) for item in value]
    return value


def _free(key: Any, taken: dict[Any, Any]) -> Any:
    """``key``, or ``key#2``, ``key#3``... when a scrubbed key took it already: two keys that both held a
    secret stay two entries (``{"[redacted]": 1, "[redacted]#2": 2}``), none silently dropped."""
    if key not in taken:
        return key
    n = 2
    while f"{key}#{n}" in taken:
        n += 1
    return f"{key}#{n}"


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
#: ``anthropic`` 2.x sends through ``httpx2``/``httpcore2`` (forks of ``httpx``/``httpcore``, logging
#: ``HTTP Request: POST <url>`` at INFO): a tree is a prefix and a dot, so each is named.
SCRUBBED_TREES = ("raysaga", "anthropic", "httpx", "httpx2", "httpcore", "httpcore2", "urllib3", "sqlalchemy",
                  "ray", "uvicorn")


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

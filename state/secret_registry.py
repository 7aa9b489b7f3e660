"""The secret *values* ``redact`` knows, kept apart from its patterns (one job each).

A value is known when it is declared (``register_secret``, a ``raysaga.Secret`` input's value,
a variable named with ``register_secret_env``) or held by an environment variable whose name is
secret-like (``ANTHROPIC_API_KEY``) and that is no placeholder (``_plain``). All are matched by
one compiled regex (``Snapshot``), rebuilt once when next read after a change, so a clean text
costs one search:

- 8+ characters (``MIN_SECRET_LEN``): anywhere, inside any text or data;
- a declared value of 3 to 7 characters (a PIN): only in text (errors, events, status reasons,
  logs: ``Snapshot.regex``), never in data (outputs, tool calls, answers, labels:
  ``Snapshot.value_regex``), and only as a whole token, not inside a longer run of letters and
  digits of any script, so ``1234`` is masked in "pin 1234" but not in "order 912345" (as a
  substring it would rewrite every number and word that contains it);
- a declared value shorter than 3 (``MIN_DECLARED_LEN``) cannot be masked without mangling
  text: it is not, and one warning on the ``raysaga.redact`` logger says so (never the value);
- a secret-named variable's value shorter than 8 is no secret (``TINY_KEY=abc``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from typing import NamedTuple
from urllib.parse import quote, quote_plus

MARKER = "[redacted]"
MIN_SECRET_LEN = 8  # a secret-named variable's shorter value is no secret; a declared one is a token
MIN_DECLARED_LEN = 3  # a declared value shorter than this cannot be scrubbed safely (warned)

SECRET_NAME = re.compile(r"KEY|SECRET|TOKEN|PASSWORD|PASSWD|CREDENTIAL", re.IGNORECASE)
#: A short value's end that is a letter or digit (any script) needs no letter or digit beside it in the text.
_ALNUM = re.compile(r"[^\W_]")

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


#: Defaults a variable read by ``Secret.from_env`` holds in a dev environment (``APP_PIN=test``).
_SHORT_PLACEHOLDERS = frozenset({"test", "none", "null", "nil", "fake", "mock", "todo", "tbd", "xxx", "xxxx",
                                 "dev", "local", "empty", "unset", "n/a"})


def _env_placeholder(value: str, name: str) -> bool:
    """A declared variable's value of 3 to 7 characters that is a placeholder (``_plain``, or a default such
    as "test"): not masked, as the word it is would be masked in the text of every run of the process."""
    return MIN_DECLARED_LEN <= len(value) < MIN_SECRET_LEN and (_plain(value, name)
                                                                 or value.lower() in _SHORT_PLACEHOLDERS)


def _forms(value: str) -> set[str]:
    """``value`` as text quotes it: itself, percent-encoded (``%2F``, ``+``), JSON-escaped (``\\/`` too)."""
    escaped = json.dumps(value)[1:-1]
    return {value, quote(value, safe=""), quote(value), quote_plus(value), escaped, escaped.replace("/", "\\/")}


def _pattern(form: str) -> str:
    # a percent escape's hex digits in either case (``%2f`` as ``%2F``)
    return re.sub(r"%([0-9A-F])([0-9A-F])", lambda m: f"%[{m[1]}{m[1].lower()}][{m[2]}{m[2].lower()}]",
                  re.escape(form))


#: What may come before a short value's first character (the look back is past it: ``.``).
_AFTER = (r"(?:(?<![^\W_].)|(?<=\\[nrtbf].)|(?<=%[0-9A-Fa-f]{2}.)|(?<=\\u[0-9A-Fa-f]{4}.)"
          r"|(?<=\\x[0-9A-Fa-f]{2}.))")


class Snapshot(NamedTuple):
    """The known values' patterns, taken together (a reader pairing a new ``regex`` with an old
    ``shortest`` skipped a short string that held a new value)."""

    #: for text (errors, events, status reasons, logs): every value, a short one as a whole token
    regex: re.Pattern[str] | None
    #: for data (outputs, tool calls, answers, labels): values of 8+ characters only. A short one is
    #: masked in text but never changes or refuses data: the registry is process-wide, and one
    #: run's PIN "2024" would rewrite every other run's year (and a refusal tells its value)
    value_regex: re.Pattern[str] | None
    #: the shortest text that can hold a value ``regex`` knows (less than 8 with a short declared one)
    shortest: int
    #: every value ``value_regex`` knows is ``_VERBATIM``: written as itself by any JSON encoder
    verbatim: bool


_EMPTY = Snapshot(None, None, MIN_SECRET_LEN, True)


class Registry:
    """The literal secret values, and compiled regexes of them, rebuilt lazily (once, when read) after a change."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.registered: set[str] = set()
        #: variables declared secret -> the shortest value of theirs that is one (``add_env``)
        self.env_names: dict[str, int] = {}
        self.env_seen: tuple[int, tuple[str | None, ...]] = (-1, ())
        self.watched: tuple[str, ...] = ()
        self.values: frozenset[str] = frozenset()
        self.snapshot = _EMPTY
        self.dirty = False  # a value was added since the last rebuild (``add``: a batch of 1,000 PINs rebuilds once)
        self.rebuilds = 0  # (a test counts them)
        self.declared: frozenset[str] = frozenset()
        self.too_short: set[str] = set()  # declared values too short to scrub, already warned of
        #: a piece of a known value where a cut left it (``_Pieces``): declared, then named ones
        self.pieces: tuple[_Pieces, ...] = ()
        self.skipped: set[str] = set()  # secret-named variables whose plain value was skipped
        self.to_warn: list[str] = []  # warnings not yet logged (once each, never a value)

    def _env_changed(self) -> bool:
        environ = os.environ
        return self.env_seen != (len(environ), tuple(environ.get(n) for n in self.watched))

    def current(self) -> Snapshot:
        if self.dirty or self._env_changed():
            with self.lock:
                if self.dirty or self._env_changed():  # (not rebuilt meanwhile by another thread)
                    self._rebuild()
            self._warn()
        return self.snapshot

    def _rebuild(self) -> None:
        """Under the lock. ``dirty`` and the environment seen are set last, after the new snapshot:
        set first, a reader in another thread took the old snapshot as current while this one was
        compiling, and a secret registered just before went out unmasked."""
        self.rebuilds += 1
        environ = dict(os.environ)
        watched = tuple(sorted(n for n in environ if SECRET_NAME.search(n) or n in self.env_names)
                        + sorted(n for n in self.env_names if n not in environ))
        # declared (registered, or a variable named so): a secret whatever it looks like, if it can be one
        declared = set(self.registered)
        for name in sorted(self.env_names):
            value = environ.get(name)
            if value and MIN_DECLARED_LEN <= len(value) < self.env_names[name]:
                continue  # a model's key of a few characters is a local server's placeholder ("none", "test")
            if value and _env_placeholder(value, name):
                self._skip(name)
                continue
            if value and len(value) < MIN_DECLARED_LEN:
                if value not in self.too_short and self.env_names[name] <= MIN_DECLARED_LEN:
                    self.too_short.add(value)
                    self.to_warn.append(_too_short(f"environment variable {name}", len(value)))
            elif value:
                declared.add(value)
        values = set(declared)
        for name in watched:
            value = environ.get(name)
            if not value or len(value) < MIN_SECRET_LEN or value in values or name in self.env_names:
                continue
            if not _plain(value, name):
                values.add(value)
            elif not name.upper().endswith(("_FILE", "_PATH", "_DIR")):  # (a path needs no word)
                self._skip(name)
        seen = (len(environ), tuple(environ.get(n) for n in watched))
        if values != self.values or declared != self.declared:
            self.values, self.declared = frozenset(values), frozenset(declared)
            self.pieces = tuple(p for p in (pieces(frozenset(declared)), pieces(self.values - declared, named=True))
                                if p is not None)
            # one pattern for all (a scrub runs on every error and event): longest first, so a secret
            # containing another is replaced whole; a short declared value only as a whole token
            long = {v for v in values if len(v) >= MIN_SECRET_LEN}
            anywhere = {f for v in long for f in _forms(v)}
            whole = {f for v in values - long for f in _forms(v)} - anywhere
            self.snapshot = Snapshot(_compile(anywhere | whole, anywhere), _compile(anywhere, anywhere),
                                     min([MIN_SECRET_LEN, *map(len, values)]),
                                     all(_VERBATIM.fullmatch(v) for v in long))
        self.watched, self.env_seen, self.dirty = watched, seen, False

    def _skip(self, name: str) -> None:
        """Warn once that variable ``name``'s value is a placeholder, not masked (never the value)."""
        if name in self.skipped:
            return
        self.skipped.add(name)
        if name in self.env_names:
            self.to_warn.append(f"environment variable {name} holds a placeholder of a few characters (a word of "
                                "its name, a default): it is not masked; give it its real value (one of 8+ "
                                "characters is always masked)")
        else:
            self.to_warn.append(f"environment variable {name} is named like a secret, but its value is a placeholder "
                                f"(a word of its name, a default): it is not masked (register_secret_env({name!r}) "
                                "makes it a secret)")

    def _warn(self) -> None:
        """Log each warning once, naming a variable or field, never a value; outside the lock (the record's
        scrub reads it)."""
        messages, self.to_warn = self.to_warn, []
        for message in messages:
            logging.getLogger("raysaga.redact").warning("%s", message)

    def add(self, value: str, what: str, env: str = "") -> None:
        """``env``: the variable ``value`` was read from (a placeholder there is no secret: ``_env_placeholder``)."""
        if not value or value in self.registered or value in self.too_short or (env and _env_placeholder(value, env)):
            return
        with self.lock:
            if len(value) < MIN_DECLARED_LEN:
                self.too_short.add(value)
                self.to_warn.append(_too_short(what, len(value)))
            else:
                self.registered.add(value)
                self.dirty = True  # rebuilt when next read: a batch's values cost one rebuild, not one each
        self._warn()

    def add_env(self, name: str, shortest: int = MIN_DECLARED_LEN) -> None:
        if self.env_names.get(name, shortest + 1) <= shortest:
            return
        with self.lock:
            self.env_names[name] = shortest
            self.env_seen = (-1, ())
            self._rebuild()
        self._warn()


def _compile(forms: set[str], anywhere: set[str]) -> re.Pattern[str] | None:
    """One pattern of all ``forms``, longest first (a secret containing another is replaced whole); one
    not in ``anywhere`` (of a short value) only as a whole token: not inside a longer run of letters and
    digits of any script ("кот" is no token of "который"), but after an escape whose last character
    is one (``\\n``, ``%3A``, ``\\u00a0``, ``\\xbc``: a repr, a URL, JSON text). Short forms are grouped by
    their first character, the look back after it once per group: every branch starts with a literal,
    which ``re`` skips to (a look-behind first was tried at every position of every text), and a
    digit-heavy text pays the look back once per position, not once per PIN (500 PINs: 4 ms a scrub)."""
    branches = [_pattern(f) for f in sorted(forms & anywhere, key=len, reverse=True)]
    groups: dict[str, list[str]] = {}
    for form in sorted(forms - anywhere, key=len, reverse=True):
        body = _pattern(form) + ("(?![^\\W_])" if _ALNUM.match(form[-1]) else "")
        if _ALNUM.match(form[0]):
            groups.setdefault(form[0], []).append(body[len(re.escape(form[0])):])
        else:
            branches.append(body)
    branches += [re.escape(first) + _AFTER + "(?:" + "|".join(rests) + ")" for first, rests in groups.items()]
    return re.compile("|".join(branches)) if branches else None


#: Where a text was cut and the cut marked: ``...``, ``…``, ``***`` (a key shown as ``sk-abc12***``).
_CUT = re.compile(r"\.{3,}|…+|\*{3,}")
_CLOSERS = "'\")]}"


def _too_short(what: str, length: int) -> str:
    return (f"{what} holds a secret of {length} character{'s' if length > 1 else ''}: too short to be scrubbed "
            f"from errors, events and logs (a secret needs {MIN_DECLARED_LEN}+ characters; one of "
            f"{MIN_DECLARED_LEN} to {MIN_SECRET_LEN - 1} is masked only as a whole word): use a longer secret, "
            "and keep it out of error messages")


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


def pieces(values: frozenset[str], named: bool = False) -> _Pieces | None:
    cut = [v for v in values if len(v) > MIN_SECRET_LEN]  # a piece is shorter than its value
    return _Pieces(cut, named) if cut else None

"""A fake payment and email provider: a small local HTTP server that dedupes by idempotency key.

It behaves like a real provider with idempotency support (Stripe's ``Idempotency-Key``):
the first call with a key takes effect and its response is stored; a later call with the same
key returns the stored response without taking effect again; reusing a key with a different
body is refused (HTTP 422), because that is a client bug, not a retry.

It is also the crash tests' oracle. ``GET /log`` returns, per key, how many calls arrived
(``raw``) and how many took effect (``effective``), and per business subject (an order id)
how many effects happened (``by_subject``): a driver that re-issued a call under a *fresh* key
would show two effective calls for one subject.

    with FakeServices() as services:            # 127.0.0.1, a free port, a daemon thread
        reply = post(services.url, "charge", key, {"order_id": "o-1", "amount_cents": 1999})
        get_log(services.url)["raw"][key]       # 1

Endpoints: ``POST /<kind>`` (any kind: ``charge``, ``email``, ...; JSON body, header
``Idempotency-Key``), ``GET /log``, ``POST /reset``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import threading
import urllib.error
import urllib.request
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

#: The response id's prefix per kind of call.
_ID_PREFIX = {"charge": "ch", "email": "msg"}


def response_id(kind: str, key: str) -> str:
    """The provider-side id of the effect with this key: deterministic, so a replay returns the same."""
    return f"{_ID_PREFIX.get(kind, kind)}_{hashlib.sha256(key.encode()).hexdigest()[:16]}"


class _Ledger:
    """What the provider has done, guarded by one lock (the server handles requests in threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        self.raw: Counter[str] = Counter()
        self.effective: Counter[str] = Counter()
        self.by_subject: Counter[str] = Counter()
        self.requests: dict[str, tuple[str, str]] = {}  # key -> (kind, canonical body)
        self.responses: dict[str, dict[str, Any]] = {}
        self.calls: list[dict[str, Any]] = []

    def apply(self, kind: str, key: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        canonical = json.dumps(body, sort_keys=True)
        with self.lock:
            self.raw[key] += 1
            seen = self.requests.get(key)
            if seen is not None:
                duplicate = True
                if seen != (kind, canonical):
                    self.calls.append({"kind": kind, "key": key, "duplicate": True, "refused": True})
                    return 422, {"error": f"idempotency key {key!r} was used with another request"}
                response = self.responses[key]
            else:
                duplicate = False
                subject = f"{kind}:{body.get('order_id') or body.get('subject') or key}"
                self.requests[key] = (kind, canonical)
                self.effective[key] += 1
                self.by_subject[subject] += 1
                response = {"id": response_id(kind, key), "kind": kind, "subject": subject}
                self.responses[key] = response
            self.calls.append({"kind": kind, "key": key, "duplicate": duplicate})
            return 200, {**response, "duplicate": duplicate}

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            return {"raw": dict(self.raw), "effective": dict(self.effective), "by_subject": dict(self.by_subject),
                    "kinds": {k: kind for k, (kind, _) in self.requests.items()}, "calls": list(self.calls)}


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        if self.path.split("?")[0] == "/log":
            self._reply(200, self.server.ledger.snapshot())
        else:
            self._reply(404, {"error": f"no such endpoint {self.path!r}"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b"{}"
        if self.path == "/reset":
            self.server.ledger.reset()
            self._reply(200, {"reset": True})
            return
        kind = self.path.strip("/")
        key = self.headers.get("Idempotency-Key")
        if not kind or "/" in kind:
            self._reply(404, {"error": f"no such endpoint {self.path!r}"})
            return
        if not key:
            self._reply(400, {"error": "the Idempotency-Key header is required"})
            return
        try:
            body = json.loads(raw)
        except ValueError:
            self._reply(400, {"error": "the body is not JSON"})
            return
        if not isinstance(body, dict):
            self._reply(400, {"error": "the body must be a JSON object"})
            return
        self._reply(*self.server.ledger.apply(kind, key, body))

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the log is GET /log
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int]) -> None:
        super().__init__(address, _Handler)
        self.ledger = _Ledger()


class FakeServices:
    """The fake provider, served from a daemon thread of this process."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._address = (host, port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeServices:
        self._server = _Server(self._address)
        self._thread = threading.Thread(target=self._server.serve_forever, name="fake-services", daemon=True)
        self._thread.start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None, "start() the services first"
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def log(self) -> dict[str, Any]:
        """The log, read in-process (``GET /log`` returns the same)."""
        assert self._server is not None
        return self._server.ledger.snapshot()

    def reset(self) -> None:
        assert self._server is not None
        self._server.ledger.reset()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> FakeServices:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


# ---------------------------------------------------------------------- the client side


def post(url: str, kind: str, idempotency_key: str, body: dict[str, Any], *, timeout: float = 10.0) -> dict[str, Any]:
    """Call ``POST {url}/{kind}`` with an idempotency key; return the JSON reply.

    An HTTP error status is raised as ``urllib.error.HTTPError`` (raysaga classifies it by its
    code: 5xx/429 transient, other 4xx permanent); a refused or broken connection as
    ``ConnectionError``, which is transient: the provider may or may not have seen the call,
    and the same key makes the retry safe either way.
    """
    request = urllib.request.Request(
        f"{url.rstrip('/')}/{kind}", data=json.dumps(body).encode(), method="POST",
        headers={"Content-Type": "application/json", "Idempotency-Key": idempotency_key})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            reply: dict[str, Any] = json.loads(response.read())
            return reply
    except urllib.error.HTTPError:
        raise
    except (urllib.error.URLError, OSError) as exc:
        raise ConnectionError(f"{kind} service at {url} unreachable: {exc}") from exc


def get_log(url: str, *, timeout: float = 10.0) -> dict[str, Any]:
    """``GET {url}/log``: raw and effective calls per key, effects per subject."""
    with urllib.request.urlopen(f"{url.rstrip('/')}/log", timeout=timeout) as response:
        log: dict[str, Any] = json.loads(response.read())
        return log


def reset(url: str, *, timeout: float = 10.0) -> None:
    """``POST {url}/reset``: forget every call (between test scenarios)."""
    request = urllib.request.Request(f"{url.rstrip('/')}/reset", data=b"{}", method="POST")
    with urllib.request.urlopen(request, timeout=timeout):
        pass


def main(argv: list[str] | None = None) -> None:
    """Serve the fake provider in the foreground: ``python -m examples.order.fake_services --port 8765``."""
    parser = argparse.ArgumentParser(prog="python -m examples.order.fake_services", description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args(argv)
    server = _Server((args.host, args.port))
    print(f"fake provider on http://{args.host}:{server.server_address[1]} (GET /log for the call log)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()

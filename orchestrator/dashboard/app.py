"""The dashboard's HTTP application (FastAPI): the page, its JSON API, the live stream, /metrics.

Routes (all behind ``security.Guard``: Host check, token, CSRF on anything but GET/HEAD):

- ``GET /`` the page (the front-end built from ``dashboard-ui/``, served from ``static/``);
  ``/?token=T`` sets the token cookie and redirects to ``/`` (a wrong one is a 401 that clears
  it; a link another site opened is refused: ``security``'s *Sign-in*). ``POST /api/logout``
  clears it.
- ``GET /api/runs`` a page of runs (``status``, ``workflow``, ``since``, ``until``, ``q``,
  ``label=KEY=VALUE`` (repeatable: every one must hold), ``before``, ``limit``) with counts by
  state; ``GET /api/inbox`` nodes waiting for a human.
- ``GET /api/runs/RUN`` the run, its DAG and its nodes' states, and ``cursor``, the event seq
  they were read at; ``/items/STEP`` a fan-out's items; ``/nodes/NODE`` a node's panel (a 404 for
  a label that names no node of the run); ``/nodes/NODE/output`` its whole output; ``/events`` the
  event log. A run's summary (in a page of runs, the run, a live change) has ``no_driver``: why
  nobody drives a run still running or compensating (``undriven``), else null.
- ``GET /api/runs/RUN/stream?after=SEQ`` server-sent events from the event log: one ``change``
  per page of new events (the events, the rows of the nodes they name, the counts of the
  fan-outs they touch, the run's summary), with ``id: SEQ``; a browser reconnecting sends
  ``Last-Event-ID`` and catches up from there. One ``gone`` message ends it when the run is
  deleted or another run now has its id (its event seq behind the cursor, or another creation).
  A ``change`` with no events carries the run's summary alone when its ``no_driver`` changed with
  no event (a killed driver's lease expired; its process is found gone), checked with its identity.
- ``POST /api/runs/RUN/actions/VERB`` approve, reject, cancel, compensate, pause, unpause, retry.
- ``GET /api/csrf`` the CSRF value this process expects (a page open across a restart asks it again).
- ``GET /api/me`` who is signed in (``--user``: every action is done as them), else null; and whether
  this browser holds a sign-in cookie (``session``: the page then offers "Sign out").
- ``GET /api/stats`` the store's figures (``Store.stats``); ``GET /metrics`` the same and more as
  Prometheus text.
"""

from __future__ import annotations

import html
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, urlsplit

import anyio
from fastapi import Body, FastAPI, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from raysaga.errors import (
    BlobIntegrityError,
    ConcurrencyConflict,
    CorruptRecordError,
    IllegalTransitionError,
    RaySagaError,
    RunNotFoundError,
    StoreUnavailableError,
    UserError,
)
from raysaga.orchestrator.dashboard import actions, metrics, params, views
from raysaga.orchestrator.dashboard.security import COOKIE, CSRF_HEADER, FOREIGN_SITES, SAFE_METHODS, Guard
from raysaga.state import Store
from raysaga.state.dashboard_reads import RunFilter
from raysaga.state.redact import scrub_text

if TYPE_CHECKING:
    from raysaga.orchestrator.workflow import Workflow

# resolved: an editable install links each file, and StaticFiles follows no link out of its folder
STATIC = Path(__file__).resolve().parent / "static"
#: Seconds between two reads of the event log by one live stream.
POLL_SECONDS = 0.4
#: Seconds between two checks by an idle live stream that its run is still the one it follows.
IDENTITY_SECONDS = 1.0
#: The header of a 403 that says why a state-changing request was refused: ``csrf`` or ``origin``.
REFUSED_HEADER = "X-Raysaga-Refused"
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-store",
}


def create_app(store: Store, guard: Guard, *, poll: float = POLL_SECONDS,
               actor: str | None = None, workflows: Sequence[Workflow] = ()) -> FastAPI:
    """The application over ``store``; ``actor`` names who acts when a request does not say;
    ``workflows`` (``--workflow``) draw the DAGs of their runs whose recorded module is not
    importable here (``graph.graph_for``)."""
    given = tuple(workflows)
    app = FastAPI(title="raysaga dashboard", docs_url=None, redoc_url=None, openapi_url=None)
    state: dict[str, int] = {"streams": 0}

    @app.middleware("http")
    async def guarded(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        host = request.headers.get("host")
        if not guard.host_ok(host):
            return _headed(_refusal(_host_refused(host), 403))
        if request.url.path == "/" and "token" in request.query_params and guard.signs_in:
            return _headed(_sign_in(request, guard))  # the link alone decides: never the cookie sent with it
        if request.url.path == SIGN_IN_PATH and request.method == "POST" and guard.signs_in:
            return _headed(await _confirmed_sign_in(request, guard, host))
        user = guard.who(request.headers.get("authorization"), request.cookies.get(COOKIE))
        if user is None:
            answer = _page_or_json(request, NEEDS_TOKEN, 401)
            answer.headers["WWW-Authenticate"] = "Bearer"
            return _headed(answer)
        request.state.user = user  # "" when no one signs in (no users): names are then labels
        refused = None if request.method in SAFE_METHODS else guard.csrf_problem(
            request.headers.get(CSRF_HEADER), request.headers.get("origin"), host)
        if refused is not None:  # the page tells a stale value ("csrf") by this header, and asks anew
            answer = _refusal("refused: a state-changing request needs the page's CSRF header"
                              if refused == "csrf" else "refused: a request from another origin", 403)
            answer.headers[REFUSED_HEADER] = refused
            return _headed(answer)
        problem = params.query_problem(request.scope.get("query_string", b""))
        if problem is not None:
            return _headed(_refusal(problem, 400))
        return _headed(await call_next(request))

    @app.exception_handler(RunNotFoundError)
    async def not_found(request: Request, exc: RunNotFoundError) -> JSONResponse:
        return _refusal(str(exc), 404)

    @app.exception_handler(UserError)
    async def bad_request(request: Request, exc: UserError) -> JSONResponse:
        return _refusal(str(exc), 409 if isinstance(exc, actions.ActionConflict) else 400)

    @app.exception_handler(ConcurrencyConflict)
    @app.exception_handler(IllegalTransitionError)
    async def changed_meanwhile(request: Request, exc: Exception) -> JSONResponse:
        # two operators at once: the one that lost was a bare 500 (its action was not done)
        return _refusal(f"the run changed while this action was taken, which was not done: {exc}; look again", 409)

    @app.exception_handler(RequestValidationError)
    async def bad_parameter(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's own answer (422, a list under "detail") showed in the page as "[object Object]"
        return _refusal(params.validation_message(exc.errors()), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # every refusal in one shape, {"error": ...}: routing's 404 and 405 answered {"detail": ...}
        answer = _refusal(str(exc.detail), exc.status_code)
        answer.headers.update(exc.headers or {})
        return answer

    @app.exception_handler(views.NodeNotFoundError)
    async def node_not_found(request: Request, exc: views.NodeNotFoundError) -> JSONResponse:
        return _refusal(str(exc), 404)

    @app.exception_handler(CorruptRecordError)
    async def corrupt(request: Request, exc: CorruptRecordError) -> JSONResponse:
        return _refusal(str(exc), 500)

    @app.exception_handler(StoreUnavailableError)
    async def store_unavailable(request: Request, exc: StoreUnavailableError) -> JSONResponse:
        return _refusal(str(exc), 503)  # a store it cannot write (served read-only) or reach, said

    @app.exception_handler(BlobIntegrityError)
    async def blob_unreadable(request: Request, exc: BlobIntegrityError) -> JSONResponse:
        return _refusal(str(exc), 500)  # a missing or altered blob, said: not a bare "Internal Server Error"

    @app.get("/", response_class=HTMLResponse)
    def index() -> Response:  # a `/?token=` sign-in is answered before (`_sign_in`)
        page = (STATIC / "index.html").read_text(encoding="utf-8")
        return HTMLResponse(page.replace("__RAYSAGA_CSRF__", guard.csrf))

    @app.get("/api/csrf")
    def csrf() -> dict[str, str]:
        # the value the page's actions send: a page served by an earlier process (the dashboard
        # restarted) reads it again here. As readable as the page itself (same Host and token
        # checks, no CORS): a page of another origin cannot read either
        return {"csrf": guard.csrf}

    @app.get("/api/me")
    def me(request: Request) -> dict[str, str | bool | None]:
        # who is signed in (--user): whom every action is done as, which the page shows in place
        # of its "acting as"; None without users, when a name is a label the page gives. ``session``:
        # this browser holds the sign-in cookie (users or a shared token), which "Sign out" clears
        return {"user": request.state.user or None, "session": guard.signs_in and COOKIE in request.cookies}

    @app.post("/api/logout")
    def logout(request: Request) -> Response:
        # the cookie cleared (a CSRF-checked POST, as every action: another site cannot sign anyone out)
        answer = JSONResponse({"ok": True, "signed_out": request.state.user or None})
        _clear_cookie(answer, request)
        return answer

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/api/runs")
    def runs(status: str | None = None, workflow: str | None = None, since: str | None = None,
             until: str | None = None, q: str | None = None, before: str | None = None, limit: int = 50,
             label: list[str] | None = Query(None)) -> dict[str, Any]:
        f = RunFilter(status=params.parse_status(status), workflow=params.text_param(workflow, "workflow", 100),
                      since=params.parse_time(since, "since"),
                      until=params.parse_time(until, "until"), text=params.text_param((q or "").strip(), "q", 200),
                      before=params.parse_cursor(before), limit=min(max(1, limit), views.MAX_PAGE),
                      labels=params.label_filter(label))
        return views.run_list(store, f)

    @app.get("/api/stats")
    def stats() -> dict[str, Any]:
        return store.stats().model_dump(mode="json")

    @app.get("/api/inbox")
    def inbox(approver: str | None = None) -> dict[str, Any]:
        return {"waiting": views.inbox(store, params.text_param(approver, "approver", 200))}

    # Under /api/runs/ the path parameters are read from the raw path and unquoted here (`_id`):
    # a run id may hold a '/' (the page sends it as %2F), which routing on the decoded path split.
    @app.get("/api/runs/{run_id}")
    def run(run_id: str) -> dict[str, Any]:
        return views.run_page(store, _run_id(run_id), given)

    @app.get("/api/runs/{run_id}/items/{step}")
    def items(run_id: str, step: str, after: int = -1, limit: int = 200, status: str | None = None
              ) -> dict[str, Any]:
        return views.fan_items(store, _run_id(run_id), params.label_param(_id(step), "step"), after, limit,
                               params.parse_node_status(params.text_param(status, "status", 40)))

    @app.get("/api/runs/{run_id}/nodes/{label}")
    def node(run_id: str, label: str) -> dict[str, Any]:
        return views.node_page(store, _run_id(run_id), params.label_param(_id(label), "node"), given)

    @app.get("/api/runs/{run_id}/nodes/{label}/output")
    def node_output(run_id: str, label: str) -> JSONResponse:
        node = params.label_param(_id(label), "node")
        return JSONResponse({"value": views.node_output(store, _run_id(run_id), node)})

    @app.get("/api/runs/{run_id}/events")
    def events(run_id: str, after: int = 0, limit: int = 200) -> dict[str, Any]:
        run_id = _run_id(run_id)
        after = params.bounded(after, "after", 0, params.MAX_SEQ)
        if store.run_row(run_id) is None:
            raise RunNotFoundError(run_id)
        return {"events": views.events_page(store, run_id, after, limit)}

    @app.get("/api/runs/{run_id}/stream")
    async def stream(request: Request, run_id: str, after: int | None = None) -> EventSourceResponse:
        run_id = _run_id(run_id)
        last = params.last_event_id(request.headers.get("last-event-id"))
        # checked before the stream starts: a number the store cannot hold failed every poll after
        cursor = last if last is not None else params.bounded(after or 0, "after", 0, params.MAX_SEQ)
        row = await anyio.to_thread.run_sync(store.run_row, run_id)
        if row is None:
            raise RunNotFoundError(run_id)
        born = row["created_at"]
        # a cursor past the run's last event was read from another run under this id (since deleted)
        run = await anyio.to_thread.run_sync(lambda: store.get_run(run_id, lenient=True))
        first = None if run.event_seq >= cursor else {
            "run_id": run_id, "reason": "replaced",
            "message": f"run {run_id!r} is another run now (its events end at {run.event_seq}, before {cursor})"}

        async def changes() -> AsyncIterator[dict[str, str]]:
            nonlocal cursor
            state["streams"] += 1
            checked = time.monotonic()
            driven = (await anyio.to_thread.run_sync(views.summary, store, run_id)).get("no_driver")
            try:
                why = first
                while why is None and not await request.is_disconnected():
                    seq, change = await anyio.to_thread.run_sync(views.live_change, store, run_id, cursor)
                    if change is not None:
                        why = views.gone(run_id, change["run"], born)
                        if why is None:
                            cursor, driven = seq, change["run"].get("no_driver")
                            yield {"id": str(seq), "event": "change", "data": json.dumps(change, default=str)}
                        continue
                    if time.monotonic() - checked >= IDENTITY_SECONDS:
                        checked = time.monotonic()
                        now = await anyio.to_thread.run_sync(views.summary, store, run_id)
                        why = views.gone(run_id, now, born)
                        if why is not None:
                            continue
                        if now.get("no_driver") != driven:  # no event says a killed driver's lease expired
                            driven = now.get("no_driver")
                            alone = {"events": [], "nodes": [], "counts": {}, "run": now}
                            yield {"id": str(cursor), "event": "change", "data": json.dumps(alone, default=str)}
                    await anyio.sleep(poll)
                if why is not None:  # the page reloads (another run) or says the run was deleted
                    yield {"event": "gone", "data": json.dumps(why)}
            finally:
                state["streams"] -= 1

        return EventSourceResponse(changes(), ping=15, headers={"Cache-Control": "no-store"})

    @app.get("/metrics")
    def prometheus() -> Response:
        return Response(metrics.render(store, state["streams"]), media_type=metrics.CONTENT_TYPE)

    @app.post("/api/runs/{run_id}/actions/{verb}")
    def act(request: Request, run_id: str, verb: str, body: dict[str, Any] = Body(default_factory=dict)
            ) -> dict[str, Any]:
        run_id, verb = _run_id(run_id), _id(verb)
        if body.get("confirm") is not True:
            raise UserError(f"{verb}: confirm the action (send \"confirm\": true)")
        signed: str = request.state.user
        by = _signed_actor(signed, body.get("by"), verb) if signed else _actor(body.get("by") or actor or "dashboard")
        try:
            return actions.perform(store, run_id, verb, by=by, body=body)
        except Exception as exc:  # SQLite locked past its busy timeout, a lost connection: a 503 saying so
            from raysaga.state.engine import is_outage, outage_cause

            if not isinstance(exc, RaySagaError) and is_outage(exc):
                raise StoreUnavailableError(f"{verb} was not done: the store did not answer "
                                            f"({outage_cause(exc)}); what was committed is intact: try again") from None
            raise

    app.add_middleware(_RawRunPaths)
    return app


class _RawRunPaths:
    """Routes ``/api/runs/...`` on its raw (still percent-encoded) path, so that a run id, step or
    node label holding a '/' (``tenant/42``, sent as ``tenant%2F42``) is one path segment; the
    handlers unquote each parameter (``_id``). Other paths are routed as usual."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            root, path, raw = scope.get("root_path", ""), scope["path"], scope.get("raw_path")
            if path.startswith(root + RUNS):
                shown = raw.decode("latin-1") if isinstance(raw, bytes) else ""
                # without a raw path, the decoded one quoted again: every parameter is then
                # unquoted once (`_id`), whichever way it came
                scope = {**scope, "path": shown if shown.startswith(root + RUNS)
                         else root + quote(path[len(root):], safe="/")}
        await self.app(scope, receive, send)


RUNS = "/api/runs/"


def _id(segment: str) -> str:
    """A path parameter under ``/api/runs/`` as sent (routed raw by ``_RawRunPaths``)."""
    return params.path_segment(segment)


def _run_id(segment: str) -> str:
    """The run id of a path under ``/api/runs/`` (one no run can have: 404 at once)."""
    return params.run_id_param(params.path_segment(segment))


#: Longest name an action is done as (it is recorded in the event the action appends).
MAX_ACTOR = 200


def _actor(value: Any) -> str:
    """Who acts: a name of 1-200 printable characters (the page's *acting as*), else ``UserError``:
    any JSON value of any size was once recorded as its ``str()``."""
    if not params.fits(value, MAX_ACTOR):
        shown = value[:40] + "…" if isinstance(value, str) and len(value) > 40 else value
        raise UserError(f"by={shown!r} is not a name: 1-{MAX_ACTOR} printable characters")
    return value


#: What the page's *acting as* sends when left empty: no name given.
PAGE_DEFAULT_ACTOR = "dashboard"


def _signed_actor(signed: str, given: Any, verb: str) -> str:
    """Who acts when users sign in: the one signed in. A ``by`` naming someone else is a 403 (with
    users, a name is who holds the token, never what a request says); absent, empty or the page's
    default (``dashboard``: its *acting as* left empty) is filled in."""
    if given is None or given in ("", PAGE_DEFAULT_ACTOR, signed):
        return signed
    shown = _actor(given)  # a name that is no name is a 400, as without users
    raise StarletteHTTPException(403, f"{verb}: you are signed in as {signed!r}, and an action is done as the "
                                      f"person signed in: by={shown[:40]!r} names someone else (leave by out: "
                                      "it is done as you)")


def _host_refused(host: str | None) -> str:
    """The 403 of a Host the dashboard does not answer to, naming it and the way to add it."""
    if host is None:
        return "forbidden host: the request has no Host header (the dashboard answers only to its own names)"
    shown = host.strip()[:100]
    name = shown.rsplit(":", 1)[0] if shown.count(":") == 1 else shown
    return (f"forbidden host {shown!r}: the dashboard answers only to its own names (a page elsewhere may rebind "
            f"its name to this address); if {name!r} is how you reach it, start it with --allow-host {name}")


def _headed(response: Response) -> Response:
    """``response`` with the security headers every answer carries (a refusal's too)."""
    for k, v in _HEADERS.items():
        response.headers.setdefault(k, v)
    return response


def _refusal(message: str, code: int) -> JSONResponse:
    """An error's answer, scrubbed as every value the dashboard shows: a damaged row's message
    quotes the row's text (``CorruptRecordError``), which may be an output holding a key, and
    the CLI's errors, scrubbed, hid it while the page showed it."""
    return JSONResponse({"error": scrub_text(message)}, code)


#: The 401's advice: fixed text, never scrubbed (the scrubber masked its placeholders: "Bearer [redacted]").
NEEDS_TOKEN = ("a token is needed: open /?token=<your token> once in this browser, or send the header "
               "Authorization: Bearer <your token>")
FOREIGN_SIGN_IN = ("refused: this sign-in link (/?token=...) was opened by another site, which could sign this "
                   "browser in as someone else; who is signed in has not changed. To sign in, open the link "
                   "yourself: paste it into the address bar")
WRONG_TOKEN = ("the token of this sign-in link (/?token=...) is not one this dashboard knows (mistyped, or not "
               "given when it started): this browser is signed out; open /?token=<your token> with your own token")


#: Where the page that asks "sign in as NAME?" posts its answer (``_confirm_page``).
SIGN_IN_PATH = "/sign-in"


def _sign_in(request: Request, guard: Guard) -> Response:
    """The answer to ``/?token=T``: the cookie set and a redirect to ``/``; a 401 clearing the
    cookie when ``T`` is no token here; a 403 when another site opened the link (login CSRF), the
    cookie then left as it was. A person's token whose link came with no ``Sec-Fetch-Site`` (a
    browser sends none over plain http to a name or an address other than loopback, where it
    cannot tell who opened the link) is asked about first: a page naming the person, whose button
    posts the sign-in from this origin (``_confirmed_sign_in``)."""
    site = request.headers.get("sec-fetch-site", "").strip().lower()
    if site in FOREIGN_SITES:
        return _page_or_json(request, FOREIGN_SIGN_IN, 403)
    token = request.query_params.get("token", "")
    name = guard.sign_in(token)
    if name is None:
        return _wrong_token(request)
    if name and not site:
        return _confirm_page(name, token)
    return _signed_in(request, token)


def _wrong_token(request: Request) -> Response:
    answer = _page_or_json(request, WRONG_TOKEN, 401)
    answer.headers["WWW-Authenticate"] = "Bearer"
    _clear_cookie(answer, request)
    return answer


def _confirm_page(name: str, token: str) -> Response:
    """"Sign in as NAME?": no script (the CSP forbids inline ones), a form posting to this origin;
    another site cannot frame it (``frame-ancestors 'none'``), nor read the token in it."""
    who = html.escape(name)
    body = ("<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>raysaga dashboard</title></head>"
            f"<body><h1>raysaga dashboard</h1><p id=\"confirm\">This link signs this browser in as <b>{who}</b>. "
            "Sign in only if you opened your own link (a link another site sent you to would sign you in as "
            f"someone else).</p><form method=\"post\" action=\"{SIGN_IN_PATH}\"><input type=\"hidden\" "
            f"name=\"token\" value=\"{html.escape(token)}\"><button id=\"sign-in\" type=\"submit\">Sign in as "
            f"{who}</button></form></body></html>")
    return HTMLResponse(body, 200)


async def _confirmed_sign_in(request: Request, guard: Guard, host: str | None) -> Response:
    """The confirm page's post: signed in only when it came from this origin (its ``Origin``, which
    a browser sends with every form post, names this host; another site's auto-submitted form
    names its own, or ``null``)."""
    origin = request.headers.get("origin") or ""
    site = request.headers.get("sec-fetch-site", "").strip().lower()
    if not host or urlsplit(origin).netloc.lower() != host.lower() or site in FOREIGN_SITES:
        return _page_or_json(request, FOREIGN_SIGN_IN, 403)
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = (form.get("token") or [""])[0]
    if guard.sign_in(token) is None:
        return _wrong_token(request)
    return _signed_in(request, token)


def _signed_in(request: Request, token: str) -> Response:
    redirect = RedirectResponse("/", 303)
    redirect.set_cookie(COOKIE, token, httponly=True, samesite="strict", secure=request.url.scheme == "https")
    return redirect


def _clear_cookie(response: Response, request: Request) -> None:
    """Expire the token cookie (its attributes as set, so that every browser drops it)."""
    response.delete_cookie(COOKIE, httponly=True, samesite="strict", secure=request.url.scheme == "https")


def _page_or_json(request: Request, message: str, code: int) -> Response:
    """A refusal of fixed text: a page for a browser opening ``/`` (the JSON of a 401 was all a
    signed-out person saw), else ``{"error": ...}``."""
    if request.url.path == "/" and "text/html" in request.headers.get("accept", ""):
        body = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>raysaga dashboard</title>"
                f"</head><body><h1>raysaga dashboard</h1><p id=\"refusal\">{html.escape(message)}</p></body></html>")
        return HTMLResponse(body, code)
    return JSONResponse({"error": message}, code)


__all__ = ["POLL_SECONDS", "create_app"]

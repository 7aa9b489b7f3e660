"""``raysaga dashboard``: the web view of a store (registered on the app in ``cli.py``).

It imports FastAPI and uvicorn only when it runs (the ``dashboard`` extra)."""

from __future__ import annotations

import errno
import socket
from typing import Annotated

import typer

from raysaga.errors import UserError
from raysaga.orchestrator import cli_input
from raysaga.orchestrator.cli_errors import err, errors, say
from raysaga.orchestrator.cli_options import DbOpt


def dashboard(
    db: DbOpt = None,
    host: Annotated[str, typer.Option(help="Address to bind. Anything but loopback needs --token.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 8780,
    token: Annotated[str | None, typer.Option(
        envvar="RAYSAGA_DASHBOARD_TOKEN", show_envvar=True,
        help="Secret every request must carry (open /?token=TOKEN once in the browser).")] = None,
    allow_host: Annotated[list[str] | None, typer.Option(
        "--allow-host", help="Another name the dashboard is reached by (a Host header it accepts).")] = None,
    user: Annotated[list[str] | None, typer.Option(
        "--user", help="NAME=TOKEN: a person and their own token (repeatable); an action is then done as the "
        "person signed in. Exclusive with --token.")] = None,
    users_file: Annotated[str | None, typer.Option(
        "--users-file", envvar="RAYSAGA_DASHBOARD_USERS", show_envvar=True,
        help="A file of NAME=TOKEN lines, one person each (# comments): kept out of the process list.")] = None,
    workflow: Annotated[list[str] | None, typer.Option(
        "--workflow", "-w", help="MODULE:WORKFLOW (or a path like flows.py:wf) to draw the DAGs of its runs from, "
        "when the module a run records does not import here (repeatable; imports that code).")] = None,
) -> None:
    """Serve the web dashboard over the store: runs, their live DAG, nodes, events, /metrics."""
    with errors():
        cli_input.int_in_range("--port", port, 0, 65535)
        from raysaga.orchestrator.loader import load_workflow

        given = [load_workflow(ref) for ref in dict.fromkeys(workflow or [])]  # a bad one: exit 2, before serving
        import importlib.util

        if any(importlib.util.find_spec(m) is None for m in ("fastapi", "sse_starlette", "uvicorn")):
            raise UserError("the dashboard needs its extra: pip install 'raysaga[dashboard]'")
        from raysaga.orchestrator import cli_store
        from raysaga.orchestrator.dashboard.server import build

        store = cli_store.open_for_reads(db)
        app, guard = build(store, host=host, token=token, allow_hosts=allow_host or (), user_pairs=user or (),
                           users_file=users_file, workflows=given)
        from raysaga.orchestrator.dashboard.security import users_file_warning

        loose = users_file_warning(users_file)  # the file holds every token: say so when others may read it
        if loose is not None:
            say(err, loose)
        listener = _listen(host, port)  # a port in use is a one-line error, before any URL is announced
        port = int(listener.getsockname()[1])  # port 0: the one the system picked
        shown = f"[{host}]" if ":" in host else host
        say(err, f"raysaga dashboard on http://{shown}:{port}/ over {cli_store.describe(cli_store.store_url(db))}"
            + (" (token required: open /?token=TOKEN once)" if guard.token else "")
            + (f" ({len(guard.users)} users: each opens /?token=THEIR_TOKEN once)" if guard.users else "")
            + (f"; DAGs of {', '.join(sorted({f'{w.name} v{w.version}' for w in given}))} drawn from --workflow"
               if given else ""))
        import uvicorn

        config = uvicorn.Config(app, host=host, port=port, log_level="warning", proxy_headers=False,
                                server_header=False)
        with listener:
            uvicorn.Server(config).run(sockets=[listener])


def _listen(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (0: any free port), so the URL printed is one that answers.

    uvicorn binding the port itself would log its own error and exit 3, which here means "another
    driver owns the run"; a busy or forbidden address is a caller's mistake (exit 2)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        raise UserError(f"--host {host!r} is not an address of this machine ({exc.strerror})") from None
    listener = socket.socket(family, kind, proto)
    try:
        # as uvicorn does: a restart right after a stop may rebind; a port another server listens on stays refused
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(address)
        listener.listen(2048)
    except OSError as exc:
        listener.close()
        if exc.errno == errno.EADDRINUSE:
            raise UserError(f"port {port} is in use: pick another --port (0: any free port)") from None
        raise UserError(f"cannot listen on {host} port {port}: {exc.strerror or exc}") from None
    return listener

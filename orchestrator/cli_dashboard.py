"""``raysaga dashboard``: the web view of a store (registered on the app in ``cli.py``).

It imports FastAPI and uvicorn only when it runs (the ``dashboard`` extra)."""

from __future__ import annotations

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
) -> None:
    """Serve the web dashboard over the store: runs, their live DAG, nodes, events, /metrics."""
    with errors():
        cli_input.int_in_range("--port", port, 0, 65535)
        import importlib.util

        if any(importlib.util.find_spec(m) is None for m in ("fastapi", "sse_starlette", "uvicorn")):
            raise UserError("the dashboard needs its extra: pip install 'raysaga[dashboard]'")
        from raysaga.orchestrator import cli_store
        from raysaga.orchestrator.dashboard.server import build

        if port == 0:  # any free port, named in the line below (uvicorn would not say which)
            import socket

            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
                probe.bind((host, 0))
                port = int(probe.getsockname()[1])
        store = cli_store.open_for_reads(db)
        app, guard = build(store, host=host, token=token, allow_hosts=allow_host or ())
        shown = f"[{host}]" if ":" in host else host
        say(err, f"raysaga dashboard on http://{shown}:{port}/ over {cli_store.describe(cli_store.store_url(db))}"
            + (" (token required: open /?token=TOKEN once)" if guard.token else ""))
        import uvicorn

        uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=False,
                    server_header=False)

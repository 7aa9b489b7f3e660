"""Ray cluster addresses: parsed strictly and probed with a TCP connect before ``ray.init``, so
a typo or a cluster that is down is a one-line error in seconds, not a minute of retries. Imports
no Ray: the CLI checks ``--address`` before anything heavy is loaded."""

from __future__ import annotations

import re
import socket

from raysaga.errors import UserError

#: Seconds to wait for the TCP connect to a Ray cluster's address before giving up on it.
CLUSTER_CONNECT_TIMEOUT_S = 3.0


def speaks_http(host: str, port: int, timeout: float = 1.0) -> bool | None:
    """Whether the server at ``host:port`` answers an HTTP/1 request (a Ray dashboard does; a GCS,
    gRPC, does not); None when nothing takes the connection. For error messages only: the GCS
    port and the dashboard's are easy to swap, and "cannot reach" named neither."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError:  # refused, unreachable, or no answer to the connect (a host dropping packets)
        return None
    with conn:
        try:
            conn.settimeout(timeout)
            conn.sendall(b"GET /api/version HTTP/1.0\r\nHost: " + host.encode("ascii", "replace") + b"\r\n\r\n")
            return conn.recv(8).startswith(b"HTTP/1")
        except TimeoutError:
            return False  # took the connection, did not answer HTTP
        except OSError:
            return None


#: An HTTP/2 client's connection preface and an empty SETTINGS frame: a gRPC server (a Ray GCS)
#: answers with a SETTINGS frame of its own.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def speaks_grpc(host: str, port: int, timeout: float = 1.0) -> bool | None:
    """Whether the server at ``host:port`` answers as an HTTP/2 (gRPC) server does, with a
    SETTINGS frame; None when nothing takes the connection. Ray's own client waits 12-18 s on a
    port that listens but is not a GCS (PostgreSQL's, Redis's): this tells in a moment."""
    try:
        conn = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    with conn:
        try:
            conn.settimeout(timeout)
            conn.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                got = conn.recv(9 - len(head))
                if not got:
                    break
                head += got
        except OSError:  # (a timeout too) took the connection, never answered as HTTP/2
            return False
    return len(head) == 9 and head[3] == 0x04


def not_a_gcs(address: str, host: str, port: int) -> UserError:
    """The error for a port that listens but does not speak gRPC: no Ray cluster's GCS."""
    what = ("it answers HTTP/1, so it is a web server, perhaps a Ray dashboard (what `raysaga launch --address "
            "http://HOST:PORT` takes)") if speaks_http(host, port) else "it does not answer as a Ray cluster does"
    return UserError(f"something listens at {address}, but not a Ray cluster's GCS: {what}. --address (or "
                     "RAY_ADDRESS) is the port given to `ray start --head --port` (6379 by default; "
                     "`ray status` on the head prints the address), or drop it for a local Ray")


def unreachable(address: str, why: str, *, probe: bool = True) -> Exception:
    """The error for a cluster address Ray could not join; ``probe``: ask whether the port is a
    dashboard's (False when a connect to it has just failed: nothing listens there)."""
    try:
        hp = host_port(address)
    except UserError:
        hp = None
    port = str(hp[1]) if hp is not None else "6379"
    if probe and hp is not None and speaks_http(*hp):
        return UserError(f"cannot join the Ray cluster at {address}{f' ({why})' if why else ''}: that port answers "
                         "HTTP, so it is a Ray dashboard (what `raysaga launch --address http://HOST:PORT` takes), "
                         "not the cluster's GCS: --address here is the port given to `ray start --head --port` "
                         "(6379 by default), e.g. 127.0.0.1:6379")
    return UserError(f"cannot reach the Ray cluster at {address}{f' ({why})' if why else ''}: start it with "
                     f"`ray start --head --port {port}`, fix --address / RAY_ADDRESS, or drop them for a local Ray")


def host_port(address: str) -> tuple[str, int] | None:
    """``HOST:PORT`` (or ``[v6]:PORT``) of a Ray cluster address, the port 1 to 65535; None for
    "auto" (the cluster this machine runs) and "local" (start one), which Ray resolves itself.
    Anything else (``ray://`` Ray Client addresses, a missing or signed port, a bare word) is
    refused with a ``UserError`` saying what is accepted."""
    if address in ("auto", "local"):
        return None
    shown = repr(address)
    if address.lower().startswith(("http://", "https://")):
        raise UserError(f"Ray address {shown} is a URL: --address (or RAY_ADDRESS) here is the cluster's HOST:PORT, "
                        "without http:// (e.g. 127.0.0.1:6379, the port given to `ray start --head --port`); a "
                        "dashboard URL (http://HOST:8265) is what `raysaga launch --address` takes")
    if address.lower().startswith("ray://"):
        raise UserError(f"Ray address {shown}: Ray Client (ray://) is not supported: raysaga drives a run from a "
                        "node of the cluster; run it there with --address HOST:PORT of the cluster's GCS "
                        "(e.g. 10.0.0.5:6379), or auto")
    match = re.fullmatch(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^\s:/\[\]@]+)):(?P<port>[0-9]{1,5})",
                         address)
    port = int(match.group("port")) if match else 0
    if match is None or not 1 <= port <= 65535:
        raise UserError(f"Ray address {shown} (--address or RAY_ADDRESS) is not HOST:PORT with a port from 1 to "
                        "65535: use e.g. 127.0.0.1:6379, auto (the cluster this machine runs) or local")
    assert match is not None
    return match.group("v6") or match.group("host"), port


def same_cluster(asked: str, connected: str, this_node: str) -> bool:
    """Whether ``asked`` (an --address) names the cluster at ``connected`` (host:port of its GCS);
    ``this_node``: the IP Ray uses for this machine, one of its local addresses."""
    if asked in ("auto", "local"):
        return True
    wanted, have = host_port(asked), host_port(connected)
    if wanted is None or have is None:
        return asked == connected
    def ips(host: str) -> set[str]:
        try:
            return {str(info[4][0]) for info in socket.getaddrinfo(host, None)}
        except OSError:
            return {host}
    here = ips(socket.gethostname()) | ips("localhost") | {"127.0.0.1", "::1", this_node}
    a, b = ips(wanted[0]), ips(have[0])
    # a cluster on this machine is one cluster whichever of its addresses names it
    return wanted[1] == have[1] and (bool(a & b) or (bool(a & here) and bool(b & here)))


def check_cluster(address: str | None, timeout: float = CLUSTER_CONNECT_TIMEOUT_S) -> None:
    """Fail fast, with what to do, when ``address`` is malformed or names a Ray cluster nobody
    answers at.

    ``ray.init`` on an address where no GCS listens retries for over a minute (on a malformed
    one, forever), then raises a traceback: the address is parsed strictly (``host_port``) and
    a TCP connect to it (refused, or no answer in ``timeout`` seconds) tells within seconds,
    and leaves the cluster's own reconnect tolerance, which a long run needs when its GCS
    restarts, as it is. ``None``, "auto" and "local" are not probed (Ray finds or starts a
    cluster itself). Raises ``UserError``."""
    hp = host_port(address) if address else None
    if hp is None:
        return
    assert address is not None
    try:
        with socket.create_connection(hp, timeout=timeout):
            pass
    except TimeoutError:
        raise unreachable(address, f"no answer within {timeout:g} s", probe=False) from None
    except OSError as exc:
        raise unreachable(address, exc.strerror or str(exc), probe=False) from None

"""The control plane answers only the owner: one ASGI guard in front of
Dagster's webserver (kb.apps.guarded_webserver) and kb's search page
(kb web).

Why a guard: both servers listen on loopback and have no login. Any web
page that the owner opens in the same browser can send requests to them,
and Dagster's webserver executes GraphQL from a GET query string and from
a POST of any content type. A cross-origin form or `fetch(mode: "no-cors")`
then launched runs in kb's instance, and a page whose own domain name points
at 127.0.0.1 (DNS rebinding) read the run logs. docs/security.md tells more.

The rule, in the order of the checks (an allowlist: what is not named is
refused):

0. A loopback client is a process of the owner's user (kb/guards/connections.py):
   another user of the machine reaches loopback too.
1. Host is a name of the served address: 127.0.0.1, localhost, [::1] or
   the host that the owner bound, with the port that the request came in
   on. A wildcard bind (0.0.0.0, ::; the owner opened the server to the
   network on purpose, and kb warns about it) also accepts an IP address
   and the name of this machine (socket.gethostname()). It refuses other
   names: DNS rebinding always sends the attacker's own name, never an IP
   address.
2. An Origin header names the served origin (the scheme and the Host of the
   request), or the request is refused. WebSocket handshakes have no
   same-origin policy in the browser, so this check covers them too.
3. A browser request that says `Sec-Fetch-Site: cross-site` or `same-site`
   is refused. Another port of 127.0.0.1 is "same-site". Only a top-level
   GET navigation to a page of the UI passes: the owner can follow a link
   to a run from Telegram.
4. /graphql takes only a POST of `application/json` (and the WebSocket):
   a browser cannot send that type to another origin without a CORS
   preflight, which the servers do not answer. A GET of /graphql with no
   query string (the GraphiQL page) stays.

Every HTTP answer behind the guard also says that no page may frame it
(NoFraming): `X-Frame-Options: DENY` and `Content-Security-Policy:
frame-ancestors 'none'`. Why: a browser without Sec-Fetch headers passes
rule 3, and a hostile page could show the launchpad of the UI in a frame
and make the owner click.

Clients that send no Origin and no Sec-Fetch headers (the dagster CLI,
DagsterGraphQLClient, curl, kb's own commands) pass when their Host is
right. Each refusal is one warning line in the log and a plain-text answer
with the reason. A refused request never reaches the app, so it changes
nothing.
"""

from __future__ import annotations

import ipaddress
import logging
import socket

from kb.guards.connections import other_user, other_user_refusal

log = logging.getLogger(__name__)

LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_BINDS = ("0.0.0.0", "::", "[::]")
DEFAULT_PORTS = {"http": 80, "ws": 80, "https": 443, "wss": 443}
# The paths that give data or change state. A cross-site navigation may open
# a page of the UI, never one of these: a link on a hostile page must not
# run a query or download a log into the owner's browser.
DATA_PATHS = ("/graphql", "/logs/", "/download", "/report_", "/server_info", "/dagit_info", "/notebook",
              "/dagit/notebook", "/api/")
GRAPHQL_PATH = "/graphql"
JSON_TYPE = "application/json"
# A browser request that comes from this origin or from the owner's own hand
# (the address bar, a bookmark). A missing header is a client that is not a
# browser, or an old browser: the Origin rule still applies to it.
OWN_SITES = ("same-origin", "none")


def host_name(bound_host: str) -> str:
    """The name of a bound host as it stands in a Host header: an IPv6
    address in brackets."""
    if ":" in bound_host and not bound_host.startswith("["):
        return f"[{bound_host}]"
    return bound_host


def allowed_names(bound_host: str) -> frozenset[str] | None:
    """The Host names that a server bound to `bound_host` answers, or None
    for a wildcard bind (then is_own_address() decides)."""
    name = host_name(bound_host.strip())
    if name in WILDCARD_BINDS:
        return None
    return frozenset((*LOOPBACK_NAMES, name.lower()))


def machine_names() -> frozenset[str]:
    """The names of this machine, as a Host header may give them."""
    machine = socket.gethostname().lower()
    short = machine.split(".")[0]
    return frozenset((*LOOPBACK_NAMES, machine, short, f"{short}.local"))


def is_own_address(name: str, own_names: frozenset[str]) -> bool:
    """For a wildcard bind: an IP address or a name of this machine. Not any
    other name: that is how DNS rebinding comes in."""
    try:
        ipaddress.ip_address(name.strip("[]"))
        return True
    except ValueError:
        return name in own_names


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers") or ():
        if key == name:
            return value.decode("latin-1")
    return None


def _split_host(host: str) -> tuple[str, int | None] | None:
    """("name", port or None) of a Host header, or None when it is malformed."""
    if host.startswith("["):
        name, bracket, rest = host.partition("]")
        name += bracket
    else:
        name, colon, rest = host.partition(":")
        rest = colon + rest
    if not name or not _bracket_ok(name):
        return None
    if not rest:
        return name.lower(), None
    if not rest.startswith(":") or not rest[1:].isdigit() or len(rest) > 6:
        return None
    return name.lower(), int(rest[1:])


def _bracket_ok(name: str) -> bool:
    return name.endswith("]") if name.startswith("[") else "]" not in name


class OwnerOnly:
    """The guard: pure ASGI middleware around `app`.

    `bound_host`: the host that the server listens on (kb up's --host,
    kb web's --host). `port`: the served port; by default the port of the
    socket that took the request (the ASGI scope's "server")."""

    def __init__(self, app, *, bound_host: str = "127.0.0.1", port: int | None = None):
        self.app = app
        self.names = allowed_names(bound_host)
        # A wildcard bind: the machine's names, once (not a system call per request).
        self.own_names = machine_names() if self.names is None else frozenset()
        self.port = port

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # the lifespan messages
            return
        reason = self.refusal(scope)
        if reason is None:
            await self.app(scope, receive, send)
            return
        status, text = reason
        method = scope.get("method", "WEBSOCKET")
        log.warning("refused %s %s Host=%r Origin=%r: %s", method, scope.get("path"), _header(scope, b"host"),
                    _header(scope, b"origin"), text)
        if scope["type"] == "websocket":
            await _deny_websocket(scope, send, status, text)
        else:
            await _answer(send, status, text)

    def refusal(self, scope) -> tuple[int, str] | None:
        """(status, reason) when the request is refused, None when it may pass."""
        if (uid := other_user(scope.get("client"), scope.get("server"))) is not None:
            return 403, other_user_refusal(uid, "kb")
        host = _header(scope, b"host")
        reason = self._host_refusal(scope, host)
        if reason is not None:
            return 400, reason
        scheme = "https" if scope.get("scheme") in ("https", "wss") else "http"
        origin = _header(scope, b"origin")
        if origin is not None and origin.lower() != f"{scheme}://{host}".lower():
            return 403, (f"Origin {origin!r} is not the origin of this server ({scheme}://{host}). "
                         "kb answers only its own pages and clients that send no Origin.")
        path = scope.get("path") or "/"
        method = scope.get("method", "GET")
        site = _header(scope, b"sec-fetch-site")
        if site is not None and site.lower() not in OWN_SITES and not _is_page_navigation(scope, path, method):
            return 403, (f"Sec-Fetch-Site {site!r}: a request from another site may only open a page of the UI "
                         f"in the browser, not {method} {path}.")
        if scope["type"] == "http" and path == GRAPHQL_PATH:
            return _graphql_refusal(scope, method)
        return None

    def _host_refusal(self, scope, host: str | None) -> str | None:
        if not host:
            return "the request has no Host header. kb answers only requests to its own address."
        parts = _split_host(host)
        server = scope.get("server")
        port = self.port or (server[1] if server else None)
        default = DEFAULT_PORTS.get(scope.get("scheme", "http"))
        if parts is not None:
            name, given = parts
            known = is_own_address(name, self.own_names) if self.names is None else name in self.names
            if known and (given == port or (given is None and port == default)):
                return None
        allowed = (", ".join(f"{name}:{port}" for name in sorted(self.names)) if self.names is not None
                   else f"an IP address or the name of this machine, port {port}")
        return (f"Host {host!r} is not an address of this server (allowed: {allowed}). "
                "A web page that points its own name at this machine (DNS rebinding) gets nothing.")


def _is_page_navigation(scope, path: str, method: str) -> bool:
    """A top-level GET navigation to a page of the UI, not to data."""
    return (scope["type"] == "http" and method in ("GET", "HEAD")
            and (_header(scope, b"sec-fetch-mode") or "").lower() == "navigate"
            and (_header(scope, b"sec-fetch-dest") or "").lower() == "document"
            and not any(path == p.rstrip("/") or path.startswith(p) for p in DATA_PATHS))


def _graphql_refusal(scope, method: str) -> tuple[int, str] | None:
    if method == "POST":
        content_type = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
        if content_type == JSON_TYPE:
            return None
        return 415, (f"POST /graphql with Content-Type {content_type or 'none'!r}: kb takes only "
                     f"{JSON_TYPE} (a web page cannot send it to another origin without asking first).")
    if method in ("GET", "HEAD") and not scope.get("query_string"):
        return None  # the GraphiQL page: it sends its queries as JSON POSTs
    if method in ("GET", "HEAD"):
        return 405, (f"{method} /graphql with a query string: Dagster would execute it, also a mutation. "
                     f"Send the query as a POST of {JSON_TYPE}.")
    return 405, f"{method} /graphql: kb lets through only a POST of {JSON_TYPE}."


class ResponseHeaders:
    """Pure ASGI middleware: each HTTP answer of `app` gets the headers
    `headers_for(path)`. A header of the app with the same name is replaced,
    except Content-Security-Policy: a second policy adds its rule to the
    app's own (the browser applies every policy it gets). One middleware for
    the headers of both servers: the guarded Dagster UI (NoFraming) and the
    search page (kb/apps/web/app.py)."""

    def __init__(self, app, headers_for):
        self.app = app
        self.headers_for = headers_for

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        added = self.headers_for(scope["path"])
        replaced = {name for name, _ in added if name != b"content-security-policy"}

        async def with_headers(message):
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in replaced]
                message = dict(message, headers=[*kept, *added])
            await send(message)

        await self.app(scope, receive, with_headers)


FRAME_HEADERS = ((b"x-frame-options", b"DENY"), (b"content-security-policy", b"frame-ancestors 'none'"))


class NoFraming(ResponseHeaders):
    """No page of another origin may frame the app: FRAME_HEADERS on each answer."""

    def __init__(self, app):
        super().__init__(app, lambda path: FRAME_HEADERS)


async def _answer(send, status: int, text: str) -> None:
    body = (text + "\n").encode("utf-8")
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                            (b"content-length", str(len(body)).encode()), (b"cache-control", b"no-store")]})
    await send({"type": "http.response.body", "body": body})


async def _deny_websocket(scope, send, status: int, text: str) -> None:
    """Refuse the handshake: with the reason where the server can send an
    HTTP answer (the ASGI extension websocket.http.response), else a close
    before accept, which the server turns into 403."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        body = (text + "\n").encode("utf-8")
        await send({"type": "websocket.http.response.start", "status": status,
                    "headers": [(b"content-type", b"text/plain; charset=utf-8"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "websocket.http.response.body", "body": body})
    else:
        await send({"type": "websocket.close", "code": 1008})

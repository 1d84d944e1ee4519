"""The fetch guard: kb fetches links from the public internet only.

Every link that kb fetches comes from hostile text: a bookmark, a page, a
source that anyone can send to the bot. The owner's machine has services
that trust loopback and the local network (the Dagster UI on
127.0.0.1:3000 has no login and starts runs) and, in a cloud, a metadata
service at 169.254.169.254 that hands out keys. So the rule is an
allowlist: kb connects to an address only when it is a global unicast
address. Every other address is refused: loopback, private networks,
link-local, carrier-grade NAT (100.64.0.0/10), multicast, unspecified,
reserved, the IPv4-mapped, 6to4 and NAT64 forms of those, and the cloud
metadata addresses and names.

How the rule holds:
- The check comes after DNS, and the connection goes to the address that
  was checked (the guard opens the socket itself). So a name that resolves
  to a public address for the check and to 127.0.0.1 for the connect (DNS
  rebinding) does not get through.
- Each connection is checked, so each redirect is checked too.
- Numeric forms of an address (http://2130706433/, http://0177.0.0.1/) are
  read as the C library reads them, and then checked as addresses.
- httpx: `FetchGuard.httpx_client()` gives a client whose transport
  connects through the guard. It ignores the proxy variables of the
  environment: a proxy would make the connection, and the guard could not
  check it.
- The browser, yt-dlp and requests: `GuardProxy` is an HTTP proxy on
  loopback that connects only through the guard (CONNECT for https and
  WebSockets, plain requests for http). kb's browser contexts send every
  request through their own GuardProxy: navigations, redirects, frames,
  scripts, fetch() calls. For a browser in its room, which has no network,
  the proxy listens on a Unix socket instead (kb/x/browser_room.py).

- Behind kb's egress proxy (KB_EGRESS_PROXY, kb/guards/egress_proxy.py):
  the containers `code` and `bot` have no route out but that proxy, and
  the proxy runs this same guard. Then the guard connects through the
  proxy: a CONNECT tunnel to the host's name, and the proxy resolves the
  name, checks each address and connects to the checked one. Here the
  guard still refuses an address literal and a local name at once, before
  the proxy sees them. A proxy that the owner's shell sets (HTTPS_PROXY)
  is never used: it does not check the addresses.

Settings (kb/settings.py):
- KB_FETCH_ALLOW_HOSTS: hosts that may be fetched although their address
  is not public, as `host` or `host:port` (for example 127.0.0.1:8123 for
  a test site, or a wiki on the home network). The host is compared as it
  is written in the link, before DNS: a name that resolves to an allowed
  address is not allowed by that. A loopback host (localhost, 127.0.0.1,
  ::1, 0.0.0.0) needs its port: an entry without one is refused with
  AllowListError when the guard is made, and `kb status` shows it. An
  entry without a port never reaches a loopback address, also when its
  name resolves to one.
- KB_FETCH_RESOLVE: `name=address` pairs that the guard uses instead of
  DNS (as curl --resolve). The guard still checks the address. Tests use
  it to give a public-looking name a loopback address.
- KB_EGRESS_PROXY: kb's egress proxy, http://host:port. Empty: the guard
  connects directly.

A refused fetch raises `PrivateAddress` (reason "private address"; the
message names the host, the address and why) or `NotAWebAddress` (a
scheme that is not http or https). Callers store the reason; they never
skip the link in silence.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import selectors
import socket
import socketserver
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

import h11
import httpcore
import httpx

from kb.guards.connections import HEAD_TIMEOUT_S, other_user, other_user_refusal
from kb.guards.rare_warning import RareWarning
from kb.guards.response_body import ACCEPT_ENCODING
from kb.guards.tls import tls_context

if TYPE_CHECKING:
    from kb.settings import Settings

log = logging.getLogger("kb.guards.proxy")
refused_warning = RareWarning(log)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], list[str]]

WEB_SCHEMES = ("http", "https")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}

# Cloud metadata services. Some are global addresses (Azure's wire server,
# 168.63.129.16), so the global-unicast rule alone would let them through.
METADATA_ADDRESSES = frozenset(ipaddress.ip_address(a) for a in (
    "169.254.169.254",  # AWS, GCP, Azure, OpenStack, DigitalOcean ...
    "169.254.170.2",  # AWS ECS task metadata
    "169.254.169.253",  # AWS DNS
    "fd00:ec2::254",  # AWS over IPv6
    "fd00:ec2::253",
    "100.100.100.200",  # Alibaba Cloud
    "168.63.129.16",  # Azure wire server
    "192.0.0.192",  # Oracle Cloud
))
METADATA_NAMES = frozenset((
    "metadata", "metadata.google.internal", "metadata.goog", "instance-data", "instance-data.ec2.internal",
))
# Names that never leave the machine, whatever a resolver answers.
LOCAL_NAME_SUFFIXES = (".localhost", ".local", ".internal")

CGNAT = ipaddress.ip_network("100.64.0.0/10")
NAT64 = ipaddress.ip_network("64:ff9b::/96")


class FetchRefused(ValueError):
    """The guard refused a fetch. `reason` is short and stable: it goes into
    the documents table and the source's failure."""

    reason = "refused"


class PrivateAddress(FetchRefused):
    """The link's host is, or resolves to, an address that is not public."""

    reason = "private address"

    def __init__(self, host: str, address: str, why: str, *, port: int | None = None, literal: bool = False):
        self.host, self.address, self.why, self.port = host, address, why, port
        shown = f"[{host}]" if ":" in host else host
        shown += f":{port}" if port else ""
        if host == address:
            where = shown
        else:
            where = f"{shown} is {address}" if literal else f"{shown} resolves to {address}"
        super().__init__(f"private address: {where} ({why}); kb fetches only public addresses. "
                         "To allow this host, add it to KB_FETCH_ALLOW_HOSTS.")


class NotAWebAddress(FetchRefused):
    """A link whose scheme is not http or https (file:, ftp:, data: ...)."""

    reason = "not a web address"


def why_refused(ip: IPAddress) -> str | None:
    """Why the address is refused, or None for a global unicast address."""
    if ip in METADATA_ADDRESSES:
        return "cloud metadata"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return f"IPv4-mapped form of {ip.ipv4_mapped}"
        if ip in NAT64:
            # An IPv6-only network reaches IPv4 sites through NAT64: allowed
            # when the IPv4 address inside is.
            inner = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
            why = why_refused(inner)
            return f"NAT64 form of {inner}: {why}" if why else None
        if ip.sixtofour is not None and why_refused(ip.sixtofour):
            return f"6to4 form of {ip.sixtofour}: {why_refused(ip.sixtofour)}"
        if ip.teredo is not None:
            return "Teredo tunnel"
        if ip.is_site_local:
            return "site-local"
    if ip.is_loopback:
        return "loopback"
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_link_local:
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip in CGNAT:
        return "carrier-grade NAT"
    if ip.is_private:
        return "private network"
    if ip.is_reserved:
        return "reserved"
    if not ip.is_global:
        return "not a global address"
    return None


def ip_literal(host: str) -> IPAddress | None:
    """The address that `host` names as a number, or None for a name.

    Also the old numeric IPv4 forms that the C library accepts (decimal
    2130706433, octal 0177.0.0.1, hex 0x7f.1): getaddrinfo() reads them as
    addresses, so the guard must too."""
    host = host.strip("[]")
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host.split("%", 1)[0])
    if host and all(c in "0123456789abcdefxABCDEFX." for c in host) and host[0].isdigit():
        with contextlib.suppress(OSError):
            return ipaddress.IPv4Address(socket.inet_aton(host))
    return None


def canonical_host(host: str) -> str:
    """The form in which hosts are compared: lower case, no trailing dot,
    no brackets, and an address in its standard form."""
    host = host.strip().strip("[]").rstrip(".").lower()
    ip = ip_literal(host)
    return str(ip) if ip is not None else host


def _system_resolver(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(info[4][0] for info in infos))


class AllowListError(ValueError):
    """An entry of KB_FETCH_ALLOW_HOSTS that kb does not take. The message
    names the entry and says how to write it."""


def is_loopback_host(host: str) -> bool:
    """True for a name or an address of this machine itself: localhost,
    *.localhost, 127.0.0.0/8, ::1, the unspecified address (a connection
    to 0.0.0.0 reaches loopback) and their IPv4-mapped forms."""
    name = canonical_host(host)
    if name == "localhost" or name.endswith(".localhost"):
        return True
    ip = ip_literal(name)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip is not None and (ip.is_loopback or ip.is_unspecified)


def parse_allowed_hosts(value: str) -> frozenset[str]:
    """`host` or `host:port` entries, comma-separated, in canonical form.
    An IPv6 address with a port is written [::1]:8080.

    A loopback host needs a port: without one, the entry would allow every
    service of this machine, the Dagster UI too (it has no login and starts
    runs). Raises AllowListError for such an entry and for a port that is
    not a number from 1 to 65535."""
    entries = set()
    for raw in value.split(","):
        raw = raw.strip()
        if not raw:
            continue
        host, port = _allowed_entry(raw)
        if port is None and is_loopback_host(host):
            shown = f"[{canonical_host(host)}]" if ":" in canonical_host(host) else canonical_host(host)
            raise AllowListError(f"KB_FETCH_ALLOW_HOSTS entry {raw!r} is a loopback host without a port: it would "
                                 "allow every service on this machine, the Dagster UI too. Write the port of "
                                 f"the one service to allow, for example {shown}:8080.")
        entries.add(f"{canonical_host(host)}:{port}" if port else canonical_host(host))
    return frozenset(entries)


def allowlist_readiness(settings: Settings) -> tuple[bool, str]:
    """For `kb status`: whether KB_FETCH_ALLOW_HOSTS is valid, and what it allows."""
    try:
        entries = parse_allowed_hosts(settings.kb_fetch_allow_hosts)
    except AllowListError as exc:
        return False, f"{exc} Until then, every link fetch fails."
    return True, what_passes(entries)


def what_passes(entries) -> str:
    """What a guard lets through, for `kb status` and the egress proxy's log."""
    return "public addresses" + (f" and {', '.join(sorted(entries))}" if entries else " only")


def _allowed_entry(raw: str) -> tuple[str, int | None]:
    """The host and the port of one KB_FETCH_ALLOW_HOSTS entry: `host`,
    `host:port`, an IPv6 address, or `[IPv6]:port`."""
    if raw.startswith("["):
        host, close, rest = raw[1:].partition("]")
        port_text = rest[1:] if close and rest.startswith(":") else None
        if not close or (rest and port_text is None):
            port_text = ""  # refused below: text after the address that is not :port
    elif raw.count(":") == 1:
        host, _, port_text = raw.partition(":")
    else:
        host, port_text = raw, None  # a name, an IPv4 address or an IPv6 address without a port
    if port_text is not None and not (port_text.isdigit() and 0 < int(port_text) < 65536):
        raise AllowListError(f"KB_FETCH_ALLOW_HOSTS entry {raw!r} has a port that is not a number from 1 to 65535. "
                             "Write host or host:port, for example 192.168.1.20:8080 or [::1]:8080.")
    return host, int(port_text) if port_text else None


def host_port(host: str, port: int) -> str:
    """host:port as a URL and a CONNECT line write it: an IPv6 address in
    brackets ([fd00::5]:8080)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_host_port(text: str) -> tuple[str, int | None]:
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, int(port) if port.isdigit() else None
    return text, None


def parse_pins(value: str) -> dict[str, tuple[str, ...]]:
    """KB_FETCH_RESOLVE: `name=address` pairs, comma-separated. One name may
    come more than once for more addresses."""
    pins: dict[str, list[str]] = {}
    for raw in value.split(","):
        name, sep, address = raw.strip().partition("=")
        if not sep or not name.strip() or not address.strip():
            continue
        ipaddress.ip_address(address.strip().strip("[]"))  # a bad address is an error here, not a later surprise
        pins.setdefault(canonical_host(name), []).append(address.strip().strip("[]"))
    return {name: tuple(addresses) for name, addresses in pins.items()}


def parse_proxy(value: str) -> tuple[str, int] | None:
    """KB_EGRESS_PROXY as (host, port), or None when it is empty. kb's
    egress proxy speaks plain HTTP (CONNECT): http://host:port, no user, no
    path. Raises ValueError that names the setting for another form."""
    value = value.strip()
    if not value:
        return None
    parts = urlsplit(value)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "http" or not parts.hostname or not port or parts.username or parts.path not in ("", "/"):
        raise ValueError(f"KB_EGRESS_PROXY {value!r} is not http://host:port (for example http://egress:3128): "
                         "kb's egress proxy speaks plain HTTP and takes no user and no path")
    return parts.hostname, port


def tunnel_handshake(write: Callable[[bytes], object], read: Callable[[], bytes], proxy: tuple[str, int],
                     host: str, port: int) -> None:
    """Ask kb's egress proxy for a tunnel to host:port over a connection to
    it (`write` and `read` are the connection's). Returns when the tunnel is
    open. Raises PrivateAddress when the proxy refuses the address (its
    reason is in the X-Kb-Refused header), OSError for any other answer."""
    name = host if host.isascii() else host.encode("idna").decode("ascii")
    target = host_port(name, port)
    shown = f"kb's egress proxy {proxy[0]}:{proxy[1]}"
    write(f"CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n".encode("ascii"))
    data = b""
    while b"\r\n\r\n" not in data:
        block = read()
        if not block:
            raise OSError(f"{shown} closed the connection to {target} without an answer")
        data += block
        if len(data) > MAX_HEAD_BYTES:
            raise OSError(f"{shown} sent an answer head of more than {MAX_HEAD_BYTES} bytes")
    head, _, body = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    fields = status_line.split(" ", 2)
    status = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else 0
    if status == 200:
        return
    headers = {key.strip().lower(): value.strip() for key, _, value in (line.partition(":") for line in lines)}
    if status == 403 and headers.get("x-kb-refused"):
        raise PrivateAddress(host, headers.get("x-kb-address") or host, f"{headers['x-kb-refused']}; said {shown}",
                             port=port)
    text = body[:500].decode("utf-8", "replace").strip()
    raise OSError(f"{shown} did not open a tunnel to {target}: {status_line.strip()[:100]}: {text}")


def open_tunnel(proxy: tuple[str, int], host: str, port: int, timeout: float | None = None) -> socket.socket:
    """A TCP connection to host:port through kb's egress proxy."""
    sock = socket.create_connection(proxy, timeout)
    try:
        tunnel_handshake(sock.sendall, lambda: sock.recv(65536), proxy, host, port)
    except BaseException:
        sock.close()
        raise
    return sock


def connect_out(host: str, port: int, timeout: float | None, proxy: tuple[str, int] | None) -> socket.socket:
    """A TCP connection to a named endpoint (not a link: no address check
    here), through kb's egress proxy, which checks it, or directly. A
    loopback host is always direct: it is this machine or this container,
    not a way out (NO_PROXY of docker-compose.yml says the same)."""
    if proxy is None or is_loopback_host(host):
        return socket.create_connection((host, port), timeout)
    return open_tunnel(proxy, host, port, timeout)


@dataclass(frozen=True)
class FetchGuard:
    """The rule for every connection that a link fetch makes."""

    allowed_hosts: frozenset[str] = frozenset()  # canonical `host` or `host:port`
    pins: dict[str, tuple[str, ...]] = field(default_factory=dict)  # name -> addresses, instead of DNS
    resolver: Resolver = _system_resolver
    # kb's egress proxy (host, port): every connection is a CONNECT tunnel through it. None: direct.
    proxy: tuple[str, int] | None = None

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> FetchGuard:
        """The guard of the settings (KB_FETCH_ALLOW_HOSTS, KB_FETCH_RESOLVE)."""
        from kb.settings import get_settings

        settings = settings or get_settings()
        return cls(allowed_hosts=parse_allowed_hosts(settings.kb_fetch_allow_hosts),
                   pins=parse_pins(settings.kb_fetch_resolve), proxy=parse_proxy(settings.kb_egress_proxy))

    def allowing(self, *entries: str) -> FetchGuard:
        """The same guard with more allowed `host` or `host:port` entries
        (the X origin for the X context)."""
        return FetchGuard(self.allowed_hosts | parse_allowed_hosts(",".join(entries)), self.pins, self.resolver,
                          self.proxy)

    # --- the rule -----------------------------------------------------------------

    def is_allowed_host(self, host: str, port: int) -> bool:
        """True when the owner allowed this host (as written, before DNS)."""
        name = canonical_host(host)
        return name in self.allowed_hosts or f"{name}:{port}" in self.allowed_hosts

    def addresses(self, host: str, port: int, *, resolve: bool = True) -> list[IPAddress]:
        """The addresses to connect to for host:port, all checked. Raises
        PrivateAddress when any of them is refused: a name with a public and
        a private address is refused as a whole. OSError when the name does
        not resolve. With resolve=False, a name is checked without DNS (the
        egress proxy resolves it): the answer is [] for a name that passes."""
        written = host.strip().strip("[]").lower()
        name = canonical_host(host)
        allowed = self.is_allowed_host(name, port)
        literal = ip_literal(name)
        if literal is not None:
            found = [literal]
        else:
            if not allowed and (name in METADATA_NAMES or name == "localhost" or name.endswith(LOCAL_NAME_SUFFIXES)):
                raise PrivateAddress(written, written, "a name of the local machine, network or cloud metadata",
                                     port=port)
            if not resolve:
                return []
            pinned = self.pins.get(name)
            found = [ipaddress.ip_address(a.split("%", 1)[0]) for a in (pinned or self.resolver(name, port))]
            if not found:
                raise OSError(f"{name}: the name has no address")
        if not allowed:
            for ip in found:
                why = why_refused(ip)
                if why:
                    raise PrivateAddress(written, str(ip), why, port=port, literal=literal is not None)
        elif f"{name}:{port}" not in self.allowed_hosts:
            # Allowed by an entry without a port: never a loopback address,
            # also when a name resolves to one (/etc/hosts, a pin).
            for ip in found:
                if is_loopback_host(str(ip)):
                    raise PrivateAddress(written, str(ip), "loopback needs an entry with its port in "
                                         "KB_FETCH_ALLOW_HOSTS", port=port, literal=literal is not None)
        return found

    def connect(self, host: str, port: int, timeout: float | None = None,
                source_address: tuple[str, int] | None = None) -> socket.socket:
        """A TCP connection to a checked address of host:port. The socket
        goes to the very address that was checked: no second DNS lookup.
        Behind the egress proxy: a tunnel through it to host:port."""
        if self.proxy is not None:
            self.addresses(host, port, resolve=False)
            return open_tunnel(self.proxy, host, port, timeout)
        last_error: OSError | None = None
        for ip in self.addresses(host, port):
            try:
                return socket.create_connection((str(ip), port), timeout, source_address)
            except OSError as exc:
                last_error = exc
        raise last_error or OSError(f"{host}:{port}: no address to connect to")

    def check_url(self, url: str) -> None:
        """Raise NotAWebAddress or PrivateAddress for a link that the guard
        refuses. A name that does not resolve passes: the fetch itself then
        fails with the network error, as before."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in WEB_SCHEMES:
            raise NotAWebAddress(f"not a web address: {url[:200]} (kb fetches http and https links only)")
        try:
            port = parts.port or DEFAULT_PORTS[scheme]
        except ValueError:
            raise NotAWebAddress(f"not a web address: {url[:200]} (the port is not a number)") from None
        if not parts.hostname:
            raise NotAWebAddress(f"not a web address: {url[:200]} (no host)")
        with contextlib.suppress(OSError):
            self.addresses(parts.hostname, port, resolve=self.proxy is None)

    # --- clients ------------------------------------------------------------------

    def httpx_client(self, **options) -> httpx.Client:
        """An httpx.Client that connects only through the guard, redirects
        included. `options` go to httpx.Client (timeout, headers,
        follow_redirects ...)."""
        # gzip and deflate only: kb reads the body with a limit on each
        # step of the decoder (kb/guards/response_body.py).
        headers = {"Accept-Encoding": ACCEPT_ENCODING, **dict(options.pop("headers", None) or {})}
        return httpx.Client(transport=GuardedTransport(self), trust_env=False, headers=headers, **options)


class _GuardedBackend(httpcore.SyncBackend):
    """httpcore's network backend, with every TCP connection made by the guard."""

    def __init__(self, guard: FetchGuard):
        self.guard = guard

    def connect_tcp(self, host, port, timeout=None, local_address=None, socket_options=None):
        # The checked address goes to httpcore's own connect; TLS still
        # checks the certificate of the name (httpcore passes the URL's host
        # as server_hostname).
        if self.guard.proxy is not None:
            self.guard.addresses(host, port, resolve=False)
            stream = super().connect_tcp(*self.guard.proxy, timeout, local_address, socket_options)
            try:
                tunnel_handshake(stream.write, lambda: stream.read(65536, timeout), self.guard.proxy, host, port)
            except OSError as exc:
                stream.close()
                raise httpcore.ConnectError(str(exc)) from exc
            except BaseException:
                stream.close()
                raise
            return stream
        try:
            addresses = self.guard.addresses(host, port)
        except OSError as exc:  # the name does not resolve
            raise httpcore.ConnectError(f"{host}:{port}: {exc}") from exc
        for n, ip in enumerate(addresses):
            try:
                return super().connect_tcp(str(ip), port, timeout, local_address, socket_options)
            except httpcore.ConnectError:
                if n == len(addresses) - 1:
                    raise
        raise httpcore.ConnectError(f"{host}:{port}: no address")


class GuardedTransport(httpx.HTTPTransport):
    """httpx's own transport, with a connection pool whose network backend
    connects through the guard. httpx has no parameter for the backend, so
    the pool is built here (httpcore's public API) with httpx's defaults."""

    def __init__(self, guard: FetchGuard):
        # One TLS context of the process for the transport and its pool (kb/guards/tls.py):
        # httpx made one for each, 26 ms of CPU each.
        context = tls_context(trust_env=False)
        super().__init__(verify=context, trust_env=False)
        limits = httpx.Limits(max_connections=100, max_keepalive_connections=20, keepalive_expiry=5.0)
        self._pool = httpcore.ConnectionPool(
            ssl_context=context,
            max_connections=limits.max_connections, max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry, network_backend=_GuardedBackend(guard))


# --- the proxy for the browser, yt-dlp and requests ----------------------------------

MAX_HEAD_BYTES = 64 * 1024
IDLE_TIMEOUT_S = 600.0
# Connections at a time to one proxy. Chromium opens at most 32 to a proxy;
# the egress proxy of the containers serves a few clients. A client that
# opens thousands (an agent that a source talked into it) gets no more threads.
MAX_PROXY_CONNECTIONS = 256
HOP_HEADERS = {"connection", "keep-alive", "proxy-connection", "proxy-authorization", "proxy-authenticate", "te",
               "trailer", "upgrade"}


class GuardProxy:
    """An HTTP proxy on 127.0.0.1 that connects only through the guard.
    With `unix_socket`, it listens on that Unix socket instead, and not on
    loopback: the browser's room (kb/x/browser_room.py) has no network, and
    reaches the proxy through that socket only. `listen` (host, port) gives
    another TCP address: kb's egress proxy listens on its container's
    networks (kb/guards/egress_proxy.py). `guard` is a FetchGuard or another
    object with its connect() (the egress proxy's NamedOnly).

    Use it as a context manager; `url` is the proxy's address. Refused
    connections are kept in `refused` (host, port, error), so the caller can
    name the reason of a page that did not load. Each plain http request
    gets its own upstream connection ("Connection: close"), so one client
    connection cannot carry a second request to another host.

    Each refusal goes to the log "kb.guards.proxy" (warning) with the host,
    the port and the reason; each connection that passes too (info). Never
    the path of a request: a Bot API path holds the bot's token."""

    def __init__(self, guard: FetchGuard, timeout_s: float = 60.0, idle_timeout_s: float = IDLE_TIMEOUT_S,
                 unix_socket: str | None = None, listen: tuple[str, int] = ("127.0.0.1", 0),
                 only_own_user: bool = True):
        self.guard = guard
        # Every user of the machine reaches loopback: another user's process
        # could hold the proxy's threads, or use the owner's proxy.
        self.only_own_user = only_own_user
        self.unix_socket = unix_socket
        self.listen = listen
        self.timeout_s = timeout_s  # to connect
        # To wait for bytes. Longer than any timeout of the client: the
        # client decides when a slow server has failed (the X capture names
        # the page that did not answer), not the proxy.
        self.idle_timeout_s = max(idle_timeout_s, timeout_s)
        # The newest refusals (a long-running proxy keeps no more).
        self.refused: deque[tuple[str, int, PrivateAddress]] = deque(maxlen=1000)
        self._lock = threading.Lock()
        self._server: socketserver.BaseServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "the proxy is not running"
        assert self.unix_socket is None, "the proxy listens on a Unix socket: its URL is the room's"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def refusal_for(self, url: str) -> PrivateAddress | None:
        """The refusal of a connection to this URL's host and port, if any."""
        parts = urlsplit(url)
        if not parts.hostname:
            return None
        host = canonical_host(parts.hostname)
        try:
            port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 80)
        except ValueError:
            return None
        with self._lock:
            return next((exc for h, p, exc in reversed(self.refused) if h == host and p == port), None)

    def __enter__(self) -> GuardProxy:
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):
                proxy._handle(self.request, self.client_address)

        class Bounded:
            """At most MAX_PROXY_CONNECTIONS at a time: each one holds a
            thread, and a client can hold a tunnel for the idle timeout."""

            def process_request(self, request, client_address):
                if not proxy._slots.acquire(blocking=False):
                    refused_warning("kb's proxy refused a connection: %d connections are open",
                                    MAX_PROXY_CONNECTIONS)
                    self.shutdown_request(request)
                    return
                try:
                    super().process_request(request, client_address)
                except BaseException:
                    proxy._slots.release()  # no thread started
                    raise

            def process_request_thread(self, request, client_address):
                try:
                    super().process_request_thread(request, client_address)
                finally:
                    proxy._slots.release()

        class Server(Bounded, socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        class UnixServer(Bounded, socketserver.ThreadingUnixStreamServer):
            daemon_threads = True

        self._slots = threading.BoundedSemaphore(MAX_PROXY_CONNECTIONS)

        if self.unix_socket is None:
            self._server = Server(self.listen, Handler)
        else:
            self._server = UnixServer(self.unix_socket, Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="kb-guard-proxy", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
            if self.unix_socket is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.unix_socket)

    # --- one client connection ----------------------------------------------------------

    def _handle(self, client: socket.socket, peer=None) -> None:
        client.settimeout(self.idle_timeout_s)
        with contextlib.suppress(OSError), contextlib.closing(client):
            # Only the owner's processes use this proxy (the browser, yt-dlp,
            # kb's clients); the egress proxy serves the other containers.
            if self.only_own_user and (uid := other_user(peer, client.getsockname())) is not None:
                refusal = other_user_refusal(uid, "kb's proxy")
                refused_warning("kb's proxy refused a connection: %s", refusal)
                return _answer(client, 403, refusal)
            # h11 parses the request: a bad Content-Length, a bad chunk size or
            # a head past MAX_HEAD_BYTES is a 400 with h11's reason, never an
            # exception in the proxy's thread.
            incoming = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD_BYTES)
            try:
                # The whole head within HEAD_TIMEOUT_S: a client that sent a
                # byte a minute held its thread for weeks (the idle timeout
                # holds for each read). A timeout closes the connection.
                request = _next_event(client, incoming, deadline=time.monotonic() + HEAD_TIMEOUT_S)
                client.settimeout(self.idle_timeout_s)
                if not isinstance(request, h11.Request):
                    return  # the client closed before a whole request
                if request.method.upper() == b"CONNECT":
                    self._tunnel(client, request.target.decode("latin-1"), incoming.trailing_data[0], peer)
                else:
                    self._forward(client, incoming, request, peer)
            except h11.RemoteProtocolError as exc:
                # Before any answer of the upstream: the body is read whole first.
                _answer(client, 400, f"kb's proxy refused a request that is not valid HTTP/1.1: {exc}")

    def _open(self, client: socket.socket, host: str, port: int, how: str, peer) -> socket.socket | None:
        who = f"{peer[0]}" if isinstance(peer, tuple) else "a local client"
        try:
            upstream = self.guard.connect(host, port, self.timeout_s)
        except PrivateAddress as exc:
            with self._lock:
                self.refused.append((canonical_host(host), port, exc))
            log.warning("refused %s %s:%d for %s: %s", how, host, port, who, exc.why)
            # The reason in headers too: kb's clients behind this proxy raise
            # PrivateAddress with it (tunnel_handshake).
            _answer(client, 403, f"kb refused the connection: {exc}",
                    [("X-Kb-Refused", exc.why), ("X-Kb-Address", exc.address)])
            return None
        except OSError as exc:
            log.warning("could not connect %s %s:%d for %s: %s", how, host, port, who, exc)
            _answer(client, 502, f"kb could not connect to {host}:{port}: {exc}")
            return None
        log.info("allowed %s %s:%d for %s", how, host, port, who)
        upstream.settimeout(self.idle_timeout_s)
        return upstream

    def _tunnel(self, client: socket.socket, target: str, rest: bytes, peer=None) -> None:
        host, port = split_host_port(target)
        if not host or port is None:
            return _answer(client, 400, f"CONNECT needs host:port, not {target[:100]}")
        upstream = self._open(client, host, port, "CONNECT", peer)
        if upstream is None:
            return
        with contextlib.closing(upstream):
            client.sendall(b"HTTP/1.1 200 Connection Established\r\n\r\n")
            if rest:
                upstream.sendall(rest)
            _pump(client, upstream, self.idle_timeout_s)

    def _forward(self, client: socket.socket, incoming: h11.Connection, request: h11.Request, peer=None) -> None:
        target = request.target.decode("latin-1")
        parts = urlsplit(target)
        if parts.scheme.lower() != "http" or not parts.hostname:
            return _answer(client, 400, f"kb's proxy takes absolute http URLs and CONNECT, not {target[:100]}")
        try:
            port = parts.port or 80
        except ValueError:
            return _answer(client, 400, f"not a valid port in {target[:100]}")
        headers = [(name, value) for name, value in request.headers if name.decode("latin-1") not in HOP_HEADERS]
        if any(name == b"transfer-encoding" for name, _ in headers):
            # One framing for the upstream: a Content-Length beside a
            # Transfer-Encoding is how one request hides a second one.
            headers = [(name, value) for name, value in headers if name != b"content-length"]
        upstream = self._open(client, parts.hostname, port, request.method.decode("latin-1")[:10], peer)
        if upstream is None:
            return
        with contextlib.closing(upstream):
            outgoing = h11.Connection(h11.CLIENT)
            path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            upstream.sendall(outgoing.send(h11.Request(method=request.method, target=path.encode("latin-1"),
                                                       headers=[*headers, (b"connection", b"close")])))
            # The body, as h11 framed it, to its end and no byte more.
            while not isinstance(event := _next_event(client, incoming), h11.EndOfMessage):
                if not isinstance(event, h11.Data):
                    return  # the client closed inside the body
                upstream.sendall(outgoing.send(event))
            upstream.sendall(outgoing.send(h11.EndOfMessage()))
            _answer_back(client, upstream, self.idle_timeout_s)


def _next_event(sock: socket.socket, connection: h11.Connection, deadline: float | None = None):
    """The next h11 event of `connection`, reading `sock` as h11 needs bytes.
    With a `deadline` (time.monotonic()), TimeoutError when the event is not
    whole by then."""
    while (event := connection.next_event()) is h11.NEED_DATA:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request head did not come in time")
            sock.settimeout(min(left, sock.gettimeout() or left))
        # Small reads: h11 refuses a head past MAX_HEAD_BYTES at the first
        # read after it, so a head can pass the limit by one read at most.
        connection.receive_data(sock.recv(16384))
    return event


def _answer(client: socket.socket, status: int, text: str, headers: list[tuple[str, str]] = ()) -> None:
    body = text.encode("utf-8", "replace")
    phrase = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[status]
    extra = "".join(f"{name}: {' '.join(value.split())}\r\n" for name, value in headers)
    with contextlib.suppress(OSError):
        client.sendall(f"HTTP/1.1 {status} {phrase}\r\nContent-Type: text/plain; charset=utf-8\r\n{extra}"
                       f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1", "replace")
                       + body)


def _pump(a: socket.socket, b: socket.socket, timeout_s: float) -> None:
    """Copy bytes both ways until one side closes or nothing moves for the timeout."""
    with selectors.DefaultSelector() as selector:
        selector.register(a, selectors.EVENT_READ, b)
        selector.register(b, selectors.EVENT_READ, a)
        while True:
            events = selector.select(timeout_s)
            if not events:
                return
            for key, _ in events:
                block = key.fileobj.recv(65536)
                if not block:
                    return
                key.data.sendall(block)


def _answer_back(client: socket.socket, upstream: socket.socket, timeout_s: float) -> None:
    """Copy the upstream answer to the client until either side closes.
    What the client sends now is dropped: it cannot become a second request
    on this upstream connection (to another host)."""
    with selectors.DefaultSelector() as selector:
        selector.register(upstream, selectors.EVENT_READ)
        selector.register(client, selectors.EVENT_READ)
        while events := selector.select(timeout_s):
            for key, _ in events:
                block = key.fileobj.recv(65536)
                if not block:
                    return
                if key.fileobj is upstream:
                    client.sendall(block)

"""kb's egress proxy: the one way out of the containers `code` and `bot`.

In docker-compose.yml, `code` and `bot` are on networks with no route out
(`internal: true`). The only other member of each network is a proxy
container, which also has a network with a route out. So every connection
to the internet goes through a proxy, and the proxy decides.

The proxy is kb's fetch guard (GuardProxy, kb/guards/fetch_guard.py): an
HTTP proxy (CONNECT for TLS, absolute URLs for plain http). It allows:
- the endpoints that kb's settings name (ENDPOINT_SETTINGS): the Telegram
  Bot API, the wiki agent's endpoint, the quality gate, Groq, the caption
  endpoint, S3, Ollama. Each one as `host:port`, also when its address is
  not public (a model server on the home network);
- with `public=True` (the proxy of `code`): every public address, for link
  fetches, with the guard's rule: the proxy resolves the name and refuses
  loopback, private, link-local, cloud metadata and the other addresses
  that are not public. KB_FETCH_ALLOW_HOSTS adds hosts, as for kb itself;
- with `public=False` (the proxy of `bot`): the named endpoints only.

Everything else gets "403 Forbidden" with the reason, and the proxy's log
has a line that names the host, the port, the client and the reason. The
log never has the path of a request (a Bot API path holds the bot's token).

An endpoint on a loopback host is left out: in a container, loopback is the
proxy's own container. The proxy itself never uses KB_EGRESS_PROXY.

Usage: python -m kb.guards.egress_proxy [--listen 0.0.0.0:3128]
       [--only TELEGRAM_API_BASE ...]
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import threading
from dataclasses import dataclass
from urllib.parse import urlsplit

from kb.guards.fetch_guard import (
    DEFAULT_PORTS,
    FetchGuard,
    GuardProxy,
    PrivateAddress,
    canonical_host,
    host_port,
    is_loopback_host,
    parse_allowed_hosts,
    parse_pins,
    parse_proxy,
    split_host_port,
    what_passes,
)
from kb.settings import Settings, get_settings

log = logging.getLogger("kb.guards.egress")

# The settings that name an endpoint of kb (a URL). Their hosts pass the proxy.
ENDPOINT_SETTINGS = ("telegram_api_base", "anthropic_base_url", "kb_gate_base_url", "groq_base_url",
                     "kb_caption_base_url", "kb_s3_endpoint", "ollama_url")
DEFAULT_LISTEN = ("0.0.0.0", 3128)


def named_endpoints(settings: Settings, only: tuple[str, ...] = ()) -> dict[str, str]:
    """{SETTING: "host:port"} for each endpoint setting that is set (all of
    ENDPOINT_SETTINGS, or the ones in `only`, by name in any case). A loopback
    host is left out. Raises ValueError for a name that is not an endpoint
    setting."""
    wanted = tuple(name.lower() for name in only) or ENDPOINT_SETTINGS
    unknown = [name for name in wanted if name not in ENDPOINT_SETTINGS]
    if unknown:
        raise ValueError(f"not an endpoint setting: {', '.join(n.upper() for n in unknown)} "
                         f"(the endpoint settings: {', '.join(n.upper() for n in ENDPOINT_SETTINGS)})")
    found = {}
    for name in wanted:
        value = str(getattr(settings, name) or "").strip()
        parts = urlsplit(value)
        if not parts.hostname:
            continue
        try:
            port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower(), 443)
        except ValueError:
            log.warning("%s=%s: the port is not a number; the proxy does not allow it", name.upper(), value)
            continue
        if is_loopback_host(parts.hostname):
            log.info("%s=%s is a loopback address: in a container that is the proxy's own; left out",
                        name.upper(), value)
            continue
        host = canonical_host(parts.hostname)
        found[name.upper()] = host_port(host, port)
    return found


@dataclass(frozen=True)
class NamedOnly:
    """The rule of a proxy without public addresses: only the named
    endpoints pass (the bot's proxy: the Bot API only)."""

    guard: FetchGuard  # its allowed_hosts are the named endpoints
    names: str  # for the reason: "TELEGRAM_API_BASE=api.telegram.org:443"

    def connect(self, host: str, port: int, timeout: float | None = None) -> socket.socket:
        if not self.guard.is_allowed_host(host, port):
            written = host.strip().strip("[]").lower()
            raise PrivateAddress(written, written, f"not an endpoint of this proxy's allowlist ({self.names})",
                                 port=port)
        return self.guard.connect(host, port, timeout)


def egress_guard(settings: Settings, *, public: bool, only: tuple[str, ...] = ()) -> FetchGuard | NamedOnly:
    """The rule of one egress proxy (see the module's text)."""
    endpoints = named_endpoints(settings, only)
    # The guard's own form of each entry (an IPv6 address without its
    # brackets): parse_allowed_hosts() makes it, as for KB_FETCH_ALLOW_HOSTS.
    allowed = parse_allowed_hosts(",".join(endpoints.values()))
    if public:
        allowed |= parse_allowed_hosts(settings.kb_fetch_allow_hosts)
    # proxy=None: the proxy connects directly, whatever KB_EGRESS_PROXY says.
    guard = FetchGuard(allowed_hosts=allowed, pins=parse_pins(settings.kb_fetch_resolve), proxy=None)
    if public:
        return guard
    return NamedOnly(guard, ", ".join(f"{k}={v}" for k, v in endpoints.items()) or "no endpoint is set")


def describe(rule: FetchGuard | NamedOnly) -> str:
    if isinstance(rule, NamedOnly):
        return f"only {rule.names}"
    return what_passes(rule.allowed_hosts)


def egress_readiness(settings: Settings, timeout_s: float = 2.0) -> tuple[bool, str]:
    """For `kb status`: KB_EGRESS_PROXY, and whether the proxy answers."""
    try:
        proxy = parse_proxy(settings.kb_egress_proxy)
    except ValueError as exc:
        return False, f"{exc}. Until then, every link fetch, agent run and Bot API call fails."
    if proxy is None:
        return True, "not set: kb's clients connect directly"
    try:
        socket.create_connection(proxy, timeout_s).close()
    except OSError as exc:
        return False, (f"KB_EGRESS_PROXY {settings.kb_egress_proxy} does not answer ({exc}): link fetches, agent "
                       "runs and Bot API calls fail until it does")
    return True, f"{settings.kb_egress_proxy} answers: link fetches, the agent's relay and the bot go through it"


def _listen_address(text: str) -> tuple[str, int]:
    host, port = split_host_port(text.strip())
    if port is None:
        raise argparse.ArgumentTypeError(f"--listen {text!r}: write host:port, for example 0.0.0.0:3128")
    return host or "0.0.0.0", port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kb.guards.egress_proxy", description=__doc__.split("\n\n")[0])
    parser.add_argument("--listen", type=_listen_address, default=DEFAULT_LISTEN, help="host:port (0.0.0.0:3128)")
    parser.add_argument("--only", nargs="+", default=[], metavar="SETTING",
                        help="allow only these endpoint settings, and no public address (for the bot)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        rule = egress_guard(get_settings(), public=not args.only, only=tuple(args.only))
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    # Its clients are the other containers: other users of the machine when
    # the containers share the host's network.
    with GuardProxy(rule, listen=args.listen, only_own_user=False):  # type: ignore[arg-type]  # NamedOnly has connect()
        log.info("kb's egress proxy on %s:%d allows %s", *args.listen, describe(rule))
        stop.wait()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

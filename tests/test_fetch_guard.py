"""The fetch guard plays against an attacker (kb/guards/fetch_guard.py).

The attacker controls the links and the pages. Its target is a "secret"
server on loopback (it stands in for the Dagster UI on 127.0.0.1:3000)
and the cloud metadata address. The guard allows one loopback port only:
the attacker's own site, as KB_FETCH_ALLOW_HOSTS names it. Each attack
must leave the secret server with no request, and the link must fail with
the reason "private address" and name the address.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import re
import socket
import subprocess
import time
from collections import deque
from datetime import datetime, timezone

import dagster as dg
import httpx
import pytest
from playwright.sync_api import Error as PlaywrightError

from kb.x.browser import Browser, navigation_refusal, watch_navigation
from kb.store.duckdb_store import DuckDBStore, insert_rows
from kb.guards.fetch_guard import (
    FetchGuard,
    GuardProxy,
    NotAWebAddress,
    PrivateAddress,
    canonical_host,
    ip_literal,
    why_refused,
)
from kb.telegram.source_parsers import ParseError, PermanentParseError, fetch_page, parse_web, parse_youtube
from kb.urls import normalize_url
from tests.loopback import LoopbackServer, QuietHandler, allow_fetches

SECRET_TEXT = "the owner's secret page: dagster ui, launch runs here"
ARTICLE = " ".join(["A public article about river deltas and the sediment that keeps them fertile."] * 12)


class Secret(LoopbackServer):
    """The target: a loopback service that must see no request."""

    def __init__(self):
        self.hits: list[str] = []
        secret = self

        class Handler(QuietHandler):
            def do_GET(self):
                secret.hits.append(self.path)
                self.send_body(200, f"<html><body><p>{SECRET_TEXT}</p></body></html>".encode(), "text/html")

            do_POST = do_GET

        self.bind(Handler)

    @property
    def port(self) -> int:
        return self.server.server_port


class Attacker(LoopbackServer):
    """The attacker's site: pages, and redirects to wherever it likes."""

    def __init__(self, routes: dict[str, tuple]):
        self.routes = routes
        self.hits: list[str] = []
        site = self

        class Handler(QuietHandler):
            def do_GET(self):
                path = self.path.split("?")[0]
                site.hits.append(path)
                kind, value = site.routes.get(path, ("page", "<h1>Not found</h1>"))
                if kind == "redirect":
                    self.send_body(302, b"", "text/html", {"Location": value})
                else:
                    self.send_body(200, value.encode(), "text/html; charset=utf-8")

            do_HEAD = do_GET

        self.bind(Handler)

    def url(self, path: str) -> str:
        return self.base_url + path


def article(extra: str = "") -> str:
    return (f"<!doctype html><html><head><title>Deltas</title></head><body><article><h1>Deltas</h1>"
            f"<p>{ARTICLE}</p></article>{extra}</body></html>")


def redirects(secret: Secret) -> dict[str, str]:
    """Redirect targets, each a way to write a private address."""
    port = secret.port
    return {
        "/to-127.0.0.2": f"http://127.0.0.2:{port}/",
        "/to-metadata": "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
        "/to-ipv6-loopback": f"http://[::1]:{port}/",
        "/to-decimal": f"http://2130706433:{port}/",
        "/to-octal": f"http://0177.0.0.1:{port}/",
        "/to-mapped": f"http://[::ffff:127.0.0.1]:{port}/",
        "/to-secret-port": f"http://127.0.0.1:{port}/",
        "/to-rebound-name": f"http://news.example.com:{port}/",  # KB_FETCH_RESOLVE points it at 127.0.0.1
    }


@pytest.fixture(scope="module")
def servers():
    with Secret() as secret:
        routes = {path: ("redirect", target) for path, target in redirects(secret).items()}
        routes["/article"] = ("page", article())
        with Attacker(routes) as attacker:
            yield attacker, secret


@pytest.fixture
def guarded(servers, monkeypatch):
    """The settings of an owner whose only allowed loopback host is the
    attacker's site; news.example.com resolves to 127.0.0.1."""
    attacker, secret = servers
    allow_fetches(monkeypatch, attacker.base_url)
    monkeypatch.setenv("KB_FETCH_RESOLVE", "news.example.com=127.0.0.1,metadata.example.net=169.254.169.254")
    secret.hits.clear()
    return attacker, secret


# --- the address rule ------------------------------------------------------------------


@pytest.mark.parametrize("address, why", [
    ("127.0.0.1", "loopback"), ("127.8.9.10", "loopback"), ("::1", "loopback"),
    ("10.0.0.5", "private network"), ("172.16.3.4", "private network"), ("192.168.1.1", "private network"),
    ("fd12:3456::1", "private network"), ("169.254.10.10", "link-local"), ("fe80::1", "link-local"),
    ("100.64.0.1", "carrier-grade NAT"), ("100.127.255.254", "carrier-grade NAT"),
    ("224.0.0.251", "multicast"), ("ff02::1", "multicast"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("240.0.0.1", "private network"), ("255.255.255.255", "private network"),
    ("169.254.169.254", "cloud metadata"), ("fd00:ec2::254", "cloud metadata"),
    ("168.63.129.16", "cloud metadata"), ("100.100.100.200", "cloud metadata"), ("192.0.0.192", "cloud metadata"),
    ("::ffff:127.0.0.1", "IPv4-mapped form of 127.0.0.1"), ("::ffff:8.8.8.8", "IPv4-mapped form of 8.8.8.8"),
    ("2002:7f00:1::", "6to4 form of 127.0.0.1: loopback"),
    ("64:ff9b::a9fe:a9fe", "NAT64 form of 169.254.169.254: cloud metadata"),
    ("2001:db8::1", "private network"), ("192.0.2.1", "private network"), ("198.18.0.1", "private network"),
])
def test_every_address_that_is_not_global_unicast_is_refused(address, why):
    assert why_refused(ipaddress.ip_address(address)) == why


@pytest.mark.parametrize("address", ["8.8.8.8", "93.184.215.14", "2606:4700::1111", "64:ff9b::808:808"])
def test_global_unicast_addresses_are_allowed(address):
    assert why_refused(ipaddress.ip_address(address)) is None


@pytest.mark.parametrize("written", ["2130706433", "0177.0.0.1", "0x7f.0.0.1", "127.1", "0x7f000001", "[::1]",
                                     "127.0.0.1.", "LOCALHOST", "[::ffff:7f00:1]"])
def test_other_spellings_of_loopback_are_loopback(written):
    with pytest.raises(PrivateAddress, match="private address"):
        FetchGuard().addresses(written, 80)


def test_numeric_forms_are_read_as_the_c_library_reads_them():
    for written in ("2130706433", "0177.0.0.1", "0x7f.0.0.1", "127.1"):
        assert ip_literal(written) == ipaddress.ip_address(socket.gethostbyname(written))
    assert ip_literal("example.com") is None and ip_literal("1password.com") is None
    assert canonical_host("[::FFFF:127.0.0.1]") == "::ffff:7f00:1"


@pytest.mark.parametrize("name", ["localhost", "db.localhost", "printer.local", "metadata.google.internal",
                                  "metadata.goog", "metadata", "instance-data"])
def test_names_of_the_machine_and_of_metadata_are_refused_before_dns(name):
    asked = []
    guard = FetchGuard(resolver=lambda host, port: asked.append(host) or ["93.184.215.14"])
    with pytest.raises(PrivateAddress, match=f"private address: {name}:80 "):
        guard.addresses(name, 80)
    assert asked == []


def test_a_name_with_one_private_address_among_public_ones_is_refused():
    guard = FetchGuard(resolver=lambda host, port: ["93.184.215.14", "127.0.0.1"])
    with pytest.raises(PrivateAddress, match=r"evil.example:443 resolves to 127.0.0.1 \(loopback\)"):
        guard.addresses("evil.example", 443)


def test_the_allow_list_is_by_host_and_port_as_written():
    guard = FetchGuard.from_settings().allowing("127.0.0.1:8123", "wiki.home")
    assert guard.addresses("127.0.0.1", 8123) == [ipaddress.ip_address("127.0.0.1")]
    assert guard.addresses("2130706433", 8123)  # the same address, written as a number
    with pytest.raises(PrivateAddress):
        guard.addresses("127.0.0.1", 3000)  # another port of the same host
    pinned = FetchGuard(pins={"wiki.home": ("192.168.1.20",), "evil.example": ("127.0.0.1",)},
                        allowed_hosts=guard.allowed_hosts)
    assert pinned.addresses("wiki.home", 80) == [ipaddress.ip_address("192.168.1.20")]
    with pytest.raises(PrivateAddress):
        # A name that resolves to an allowed address is not allowed by that.
        pinned.addresses("evil.example", 8123)


@pytest.mark.parametrize("entry", ["127.0.0.1", "localhost", "LocalHost.", "dagster.localhost", "::1", "[::1]",
                                   "127.0.0.2", "2130706433", "0.0.0.0", "::ffff:127.0.0.1", "127.0.0.1:"])
def test_a_loopback_entry_without_a_port_is_refused_by_name(monkeypatch, entry):
    """Without a port, a loopback entry would allow every service of the
    machine: the Dagster UI (no login, starts runs), the search page, a
    database. The error names the entry; nothing is allowed."""
    from kb.guards.fetch_guard import AllowListError, parse_allowed_hosts

    problem = "has a port that is not a number" if entry.endswith(":") else "is a loopback host without a port"
    with pytest.raises(AllowListError, match=f"KB_FETCH_ALLOW_HOSTS entry {re.escape(repr(entry))} {problem}"):
        parse_allowed_hosts(f"wiki.home, {entry}")
    monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS", f"wiki.home,{entry}")
    with pytest.raises(AllowListError, match=re.escape(repr(entry))):
        FetchGuard.from_settings()
    with pytest.raises(AllowListError):
        FetchGuard().allowing(entry)


@pytest.mark.parametrize("entry", ["127.0.0.1:0", "127.0.0.1:65536", "wiki.home:http", "[::1]x", "[::1", "[::1]:"])
def test_an_entry_with_a_port_that_is_not_a_port_is_refused(entry):
    from kb.guards.fetch_guard import AllowListError, parse_allowed_hosts

    with pytest.raises(AllowListError, match=f"{re.escape(repr(entry))} has a port that is not a number from 1 to"):
        parse_allowed_hosts(entry)


def test_a_loopback_entry_with_a_port_allows_that_port_only():
    guard = FetchGuard().allowing("127.0.0.1:8123", "localhost:8124", "[::1]:8125")
    assert guard.addresses("127.0.0.1", 8123) == [ipaddress.ip_address("127.0.0.1")]
    assert guard.is_allowed_host("localhost", 8124) and guard.addresses("[::1]", 8125)
    for host, port in (("127.0.0.1", 3000), ("127.0.0.1", 8124), ("localhost", 8123), ("[::1]", 8123)):
        with pytest.raises(PrivateAddress):
            guard.addresses(host, port)


def test_a_name_allowed_without_a_port_reaches_no_loopback_address():
    """A public name may be allowed without a port (the rule for the home
    network stays). If it resolves to loopback (/etc/hosts, a pin, a DNS
    answer), that entry does not open loopback."""
    guard = FetchGuard(allowed_hosts=frozenset({"wiki.home"}),
                       pins={"wiki.home": ("127.0.0.1",)})
    with pytest.raises(PrivateAddress, match=r"wiki.home:3000 resolves to 127.0.0.1 \(loopback needs an entry"):
        guard.addresses("wiki.home", 3000)
    lan = FetchGuard(allowed_hosts=frozenset({"wiki.home"}), pins={"wiki.home": ("192.168.1.20",)})
    assert lan.addresses("wiki.home", 8080) == [ipaddress.ip_address("192.168.1.20")]


def test_the_loopback_fixture_allows_the_servers_of_the_test_and_no_other_port(loopback_fetches):
    """tests/conftest.py's loopback_fetches: the ports on which this test
    listens, not every port of loopback."""
    site = LoopbackServer()
    site.bind(QuietHandler)
    with site, socket.socket() as other:
        other.bind(("127.0.0.1", 0))  # bound, not listening: not a server of the test
        guard = FetchGuard.from_settings()
        assert guard.addresses("127.0.0.1", site.server.server_port)
        assert guard.addresses("localhost", site.server.server_port)
        with pytest.raises(PrivateAddress):
            guard.addresses("127.0.0.1", other.getsockname()[1])
        with pytest.raises(PrivateAddress):
            guard.addresses("127.0.0.1", 3000)


def test_kb_status_shows_a_refused_entry(monkeypatch):
    from kb.apps.status import _services
    from kb.settings import get_settings

    monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS", "localhost")
    line = _services(get_settings())["fetch_allowlist"]
    assert not line["ready"] and "KB_FETCH_ALLOW_HOSTS entry 'localhost' is a loopback host without a port" in \
        line["detail"] and "localhost:8080" in line["detail"]
    monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS", "localhost:8080")
    assert _services(get_settings())["fetch_allowlist"] == {"ready": True,
                                                            "detail": "public addresses and localhost:8080"}


def test_links_that_are_not_web_addresses_are_refused():
    for url in ("file:///root/.config/kb/.env", "ftp://example.com/x", "data:text/html,hi", "javascript:alert(1)"):
        with pytest.raises(NotAWebAddress, match="not a web address"):
            FetchGuard().check_url(url)


def test_the_settings_give_the_guard(monkeypatch):
    monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS", "127.0.0.1:8123, [::1]:9000 ,Wiki.Home")
    monkeypatch.setenv("KB_FETCH_RESOLVE", "news.example.com=127.0.0.1")
    guard = FetchGuard.from_settings()
    assert guard.allowed_hosts == {"127.0.0.1:8123", "::1:9000", "wiki.home"}
    assert guard.pins == {"news.example.com": ("127.0.0.1",)}
    assert guard.is_allowed_host("[::1]", 9000) and not guard.is_allowed_host("::1", 9001)


# --- httpx: the Telegram web parser and the documents downloads ----------------------------


def test_the_allowed_site_is_fetched(guarded):
    attacker, _ = guarded
    page = fetch_page(attacker.url("/article"), timeout_s=5)
    assert "river deltas" in page.body.decode()


@pytest.mark.parametrize("path", ["/to-127.0.0.2", "/to-metadata", "/to-ipv6-loopback", "/to-decimal", "/to-mapped",
                                  "/to-secret-port", "/to-rebound-name"])
def test_a_redirect_to_a_private_address_fails_the_telegram_link(guarded, path):
    attacker, secret = guarded
    with pytest.raises(PermanentParseError, match=r"private address: .*\(.*\).*KB_FETCH_ALLOW_HOSTS"):
        parse_web(attacker.url(path), timeout_s=5)
    assert secret.hits == []
    assert path in attacker.hits  # the first hop was fetched: it is the redirect that was refused


def test_a_redirect_to_an_octal_address_is_not_followed(guarded):
    """httpx refuses 0177.0.0.1 as an address before any connection (the
    browser reads it as 127.0.0.1, and the guard refuses it there: see the
    documents test)."""
    attacker, secret = guarded
    with pytest.raises(ParseError, match="Invalid IPv4 address: '0177.0.0.1'"):
        parse_web(attacker.url("/to-octal"), timeout_s=5)
    assert secret.hits == []


def test_a_public_looking_name_that_resolves_to_loopback_is_refused(guarded):
    _, secret = guarded
    with pytest.raises(PermanentParseError, match=r"news.example.com:\d+ resolves to 127.0.0.1 \(loopback\)"):
        parse_web(f"http://news.example.com:{secret.port}/", timeout_s=5)
    with pytest.raises(PermanentParseError, match=r"metadata.example.net:80 resolves to 169.254.169.254"):
        parse_web("http://metadata.example.net/latest/meta-data/", timeout_s=5)
    assert secret.hits == []


def test_dns_rebinding_between_the_check_and_the_connect_does_not_work(guarded):
    """The name is public at the first lookup and loopback at every later
    one. A guard that checks and then lets httpx resolve again would connect
    to the secret server; this one checks every lookup it connects by."""
    _, secret = guarded
    answers = iter(["93.184.215.14"])
    lookups = []

    def rebinding(host: str, port: int) -> list[str]:
        lookups.append(host)
        return [next(answers, "127.0.0.1")]

    guard = FetchGuard(resolver=rebinding)
    with pytest.raises(PermanentParseError, match="rebind.example.org:.* resolves to 127.0.0.1"):
        fetch_page(f"http://rebind.example.org:{secret.port}/", timeout_s=5, guard=guard)
    assert lookups == ["rebind.example.org", "rebind.example.org"]
    assert secret.hits == []


def test_the_guarded_client_ignores_proxy_variables(guarded, monkeypatch):
    """A proxy would make the connection where the guard cannot check it."""
    attacker, secret = guarded
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{secret.port}")
    monkeypatch.setenv("ALL_PROXY", f"http://127.0.0.1:{secret.port}")
    with FetchGuard.from_settings().httpx_client(timeout=5) as client:
        assert client.get(attacker.url("/article")).status_code == 200
    assert secret.hits == []


def test_without_the_setting_the_loopback_site_itself_is_refused(servers, monkeypatch):
    attacker, secret = servers
    monkeypatch.delenv("KB_FETCH_ALLOW_HOSTS", raising=False)
    with pytest.raises(PermanentParseError, match=r"private address: 127.0.0.1:\d+ \(loopback\)"):
        parse_web(attacker.url("/article"), timeout_s=5)
    with FetchGuard.from_settings().httpx_client(timeout=5) as client, pytest.raises(PrivateAddress):
        client.get(attacker.url("/article"))


# --- the proxy of the browser, yt-dlp and requests ----------------------------------------


def test_the_proxy_refuses_a_tunnel_and_a_request_to_a_private_address(guarded):
    attacker, secret = guarded
    with GuardProxy(FetchGuard.from_settings(), timeout_s=5) as proxy:
        with httpx.Client(proxy=proxy.url, timeout=5) as client:
            assert client.get(attacker.url("/article")).status_code == 200
            refused = client.get(f"http://127.0.0.1:{secret.port}/")
            assert refused.status_code == 403 and "private address: 127.0.0.1" in refused.text
            with pytest.raises(httpx.ProxyError):
                client.get(f"https://news.example.com:{secret.port}/")  # CONNECT, as for https
        assert proxy.refusal_for(f"http://127.0.0.1:{secret.port}/x") is not None
        assert "news.example.com" in str(proxy.refusal_for(f"https://news.example.com:{secret.port}/"))
    assert secret.hits == []


def test_a_second_request_on_one_proxy_connection_does_not_reach_another_host(guarded):
    """Request smuggling: the first request goes to the allowed site, the
    second one, on the same connection, to the secret port."""
    attacker, secret = guarded
    with GuardProxy(FetchGuard.from_settings(), timeout_s=3) as proxy:
        host, port = proxy.url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(f"GET {attacker.url('/article')} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n"
                         f"GET http://127.0.0.1:{secret.port}/ HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            answer = b""
            while block := sock.recv(65536):
                answer += block
    assert b"river deltas" in answer and SECRET_TEXT.encode() not in answer
    assert secret.hits == []


class RawUpstream:
    """A loopback site that keeps the bytes of each connection as they came
    and answers 200: what the proxy sent, with no HTTP parser between."""

    def __init__(self):
        self.received: list[bytes] = []
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self._stop = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._sock.getsockname()[1]}"

    def _serve(self):
        while not self._stop:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            with conn:
                # All that comes until a pause: the proxy sends a request at once.
                conn.settimeout(0.5)
                data = b""
                with contextlib.suppress(OSError):
                    while block := conn.recv(65536):
                        data += block
                self.received.append(data)
                with contextlib.suppress(OSError):
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")

    def __enter__(self):
        import threading

        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop = True
        self._thread.join(5)
        self._sock.close()


def _through_proxy(proxy: GuardProxy, raw: bytes) -> bytes:
    host, port = proxy.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(raw)
        answer = b""
        with contextlib.suppress(OSError):
            while block := sock.recv(65536):
                answer += block
    return answer


@pytest.mark.parametrize("head, why", [
    (b"Content-Length: abc", "Content-Length"),
    (b"Content-Length: -5", "Content-Length"),
    (b"Content-Length: 5\r\nContent-Length: 7", "Content-Length"),
    (b"X-Long: " + b"a" * (100 * 1024), "too long"),
    (b"Bad Header Name: 1", "header"),
])
def test_the_proxy_answers_400_to_a_request_that_it_cannot_frame(monkeypatch, head, why):
    """A request whose body length is not one number (or whose head is too
    long) gets a 400 with the reason, and no byte reaches the site. Before
    h11, a bad Content-Length raised ValueError in the proxy's thread."""
    with RawUpstream() as site:
        allow_fetches(monkeypatch, site.base_url)
        with GuardProxy(FetchGuard.from_settings(), timeout_s=3) as proxy:
            answer = _through_proxy(proxy, f"POST {site.base_url}/in HTTP/1.1\r\nHost: x\r\n".encode()
                                    + head + b"\r\n\r\nhello")
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert why.lower().encode() in answer.lower(), answer[:300]
    assert site.received == []


def test_a_bad_chunk_size_is_a_400_and_the_site_gets_no_body(monkeypatch):
    with RawUpstream() as site:
        allow_fetches(monkeypatch, site.base_url)
        with GuardProxy(FetchGuard.from_settings(), timeout_s=3) as proxy:
            answer = _through_proxy(proxy, f"POST {site.base_url}/in HTTP/1.1\r\nHost: x\r\n"
                                           "Transfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert all(b"hello" not in data for data in site.received)


def test_the_site_gets_one_framing_of_a_body(monkeypatch):
    """Content-Length beside Transfer-Encoding (request smuggling): the site
    gets the chunked body only, and the request ends at its last chunk."""
    with RawUpstream() as site:
        allow_fetches(monkeypatch, site.base_url)
        with GuardProxy(FetchGuard.from_settings(), timeout_s=3) as proxy:
            answer = _through_proxy(proxy, f"POST {site.base_url}/in HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n"
                                           "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
                                           "GET /second HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    assert answer.startswith(b"HTTP/1.1 200") or answer.startswith(b"HTTP/1.1 400"), answer[:200]
    for data in site.received:
        head = data.split(b"\r\n\r\n", 1)[0].lower()
        assert b"content-length" not in head or b"transfer-encoding" not in head
        assert b"/second" not in data


def test_the_proxy_forwards_an_honest_post_with_its_body(monkeypatch):
    with RawUpstream() as site:
        allow_fetches(monkeypatch, site.base_url)
        with GuardProxy(FetchGuard.from_settings(), timeout_s=3) as proxy, \
                httpx.Client(proxy=proxy.url, timeout=5) as client:
            answer = client.post(f"{site.base_url}/in", content=b"hello")
    assert answer.status_code == 200 and answer.text == "ok"
    [data] = site.received
    assert data.startswith(b"POST /in HTTP/1.1\r\n") and data.endswith(b"\r\n\r\nhello")
    assert b"content-length: 5" in data.lower()


def test_a_head_sent_a_byte_at_a_time_closes_its_connection(monkeypatch):
    """The idle timeout (10 minutes) holds for each read: a client that sent
    a byte a minute held a thread of the proxy for weeks. The whole head must
    come in within HEAD_TIMEOUT_S. An honest request on the same proxy passes."""
    import kb.guards.fetch_guard as fetch_guard

    monkeypatch.setattr(fetch_guard, "HEAD_TIMEOUT_S", 1.0)
    with RawUpstream() as site:
        allow_fetches(monkeypatch, site.base_url)
        with GuardProxy(FetchGuard.from_settings(), timeout_s=3) as proxy:
            host, port = proxy.url.removeprefix("http://").split(":")
            with socket.create_connection((host, int(port)), timeout=5) as slow:
                slow.sendall(b"GET " + site.base_url.encode() + b"/in HTTP/1.1\r\n")
                started = time.monotonic()
                closed = False
                for _ in range(15):  # a byte each 0.2 s: no read waits long
                    time.sleep(0.2)
                    try:
                        slow.sendall(b"X")
                    except OSError:
                        closed = True
                        break
                if not closed:
                    slow.settimeout(2)
                    with contextlib.suppress(ConnectionResetError):
                        closed = slow.recv(100) == b""
                assert closed and time.monotonic() - started < 3.5
            with httpx.Client(proxy=proxy.url, timeout=5) as client:
                assert client.get(f"{site.base_url}/in").status_code == 200
    assert len(site.received) == 1


def test_a_client_that_opens_many_connections_gets_no_more_threads(monkeypatch):
    """Each connection holds a thread of the proxy. Past MAX_PROXY_CONNECTIONS
    at a time, the proxy closes a new connection at once; when the others
    end, an honest request passes again."""
    import kb.guards.fetch_guard as fetch_guard

    monkeypatch.setattr(fetch_guard, "MAX_PROXY_CONNECTIONS", 3)
    with RawUpstream() as site:
        allow_fetches(monkeypatch, site.base_url)
        with GuardProxy(FetchGuard.from_settings(), timeout_s=3) as proxy:
            host, port = proxy.url.removeprefix("http://").split(":")
            held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(3)]
            try:
                time.sleep(0.2)
                with socket.create_connection((host, int(port)), timeout=2) as extra:
                    assert extra.recv(100) == b""  # closed at once, not after the head timeout
            finally:
                for client in held:
                    client.close()
            deadline = time.monotonic() + 5
            while True:
                try:
                    with httpx.Client(proxy=proxy.url, timeout=5) as client:
                        assert client.get(f"{site.base_url}/in").status_code == 200
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline, "the slots of the closed connections were not freed"
                    time.sleep(0.1)


PROXY_CLIENT = """
import socket, sys
client = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=10)
client.sendall(b"CONNECT example.com:443 HTTP/1.1\\r\\nHost: example.com:443\\r\\n\\r\\n")
print(client.recv(1000).decode(errors="replace"))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="setpriv needs root to act as another user")
def test_another_user_of_the_machine_gets_no_use_of_the_proxy():
    """Every user reaches loopback: as `nobody`, a process could hold the
    proxy's threads or send its traffic as the owner's. It gets a 403 that
    names both users, before the proxy reads a byte."""
    with GuardProxy(FetchGuard.from_settings(), timeout_s=3) as proxy:
        port = proxy.url.rsplit(":", 1)[1]
        done = subprocess.run(["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
                               "/usr/bin/python3", "-c", PROXY_CLIENT, port], cwd="/", capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith("HTTP/1.1 403"), done.stdout
        assert "another user of this machine (uid 65534)" in done.stdout and "only its owner (uid 0)" in done.stdout
        assert proxy.refused == deque()  # nothing was asked of the guard


def test_youtube_requests_go_through_the_guard(guarded, monkeypatch):
    """Without an owner's proxy, youtube-transcript-api and yt-dlp ask
    YouTube through the guard's proxy. Here www.youtube.com resolves to
    loopback, as a poisoned resolver could make it."""
    _, secret = guarded
    monkeypatch.setenv("KB_FETCH_RESOLVE", "www.youtube.com=127.0.0.1")
    with pytest.raises(PermanentParseError, match=r"YouTube video dQw4w9WgXcQ: private address: "
                                                  r"www.youtube.com:443 resolves to 127.0.0.1"):
        parse_youtube("https://www.youtube.com/watch?v=dQw4w9WgXcQ", timeout_s=5)


# --- the browser -------------------------------------------------------------------------


def hostile_page(secret: Secret, frames: bool = True) -> str:
    """A page whose image, frames, script calls and WebSocket aim at the secret port."""
    target = f"http://127.0.0.1:{secret.port}"
    iframes = (f'<iframe src="{target}/frame"></iframe><iframe src="http://169.254.169.254/latest/meta-data/">'
               "</iframe>") if frames else ""
    return article(f"""
<img src="{target}/img.png">{iframes}
<script>
fetch("{target}/fetch", {{method: "POST", body: "stolen"}}).catch(() => {{}});
fetch("http://news.example.com:{secret.port}/rebound").catch(() => {{}});
try {{ new WebSocket("ws://127.0.0.1:{secret.port}/ws"); }} catch (e) {{}}
</script>""")


@pytest.fixture(scope="module")
def browser_servers(servers):
    attacker, secret = servers
    attacker.routes["/hostile"] = ("page", hostile_page(secret))
    # The X context stops at a frame that is not on X (its navigation guard),
    # so its page has the subresources only.
    attacker.routes["/x-hostile"] = ("page", hostile_page(secret, frames=False))
    attacker.routes["/navigates"] = ("page", article(
        f"<script>location.href = 'http://127.0.0.1:{secret.port}/by-script';</script>"))
    return attacker, secret


@pytest.mark.slow
@pytest.mark.browser
def test_the_clean_context_loads_no_subresource_from_a_private_address(browser_servers, guarded):
    attacker, secret = browser_servers
    with Browser.from_settings(timeout_s=10).clean_context() as context:
        page = context.new_page()
        watch_navigation(page)
        response = page.goto(attacker.url("/hostile"), wait_until="networkidle")
        assert response.status == 200 and "river deltas" in page.content()
        assert navigation_refusal(page, attacker.url("/hostile")) is None  # the page itself is good

        for path in ("/to-metadata", "/to-decimal", "/to-rebound-name", "/navigates"):
            page = context.new_page()
            watch_navigation(page)
            with contextlib.suppress(PlaywrightError):  # a refused CONNECT is a load error
                page.goto(attacker.url(path), wait_until="load")
            if path == "/navigates":
                page.wait_for_url("**/by-script", timeout=5000)
            refusal = navigation_refusal(page, attacker.url(path))
            assert refusal is not None and "private address" in str(refusal), path
    assert secret.hits == []


@pytest.mark.slow
@pytest.mark.browser
def test_the_x_context_reaches_x_and_public_addresses_only(browser_servers, guarded, monkeypatch, tmp_path):
    """The X origin (KB_X_BASE_URL) is allowed; a post's page that loads
    from the secret port is not."""
    attacker, secret = browser_servers
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"cookies": [], "origins": []}))
    monkeypatch.setenv("KB_X_STATE", str(state))
    monkeypatch.setenv("KB_X_BASE_URL", attacker.base_url)
    monkeypatch.delenv("KB_FETCH_ALLOW_HOSTS")
    with Browser.from_settings(timeout_s=10).x_context() as x:
        page = x.open("/x-hostile", wait_until="networkidle")
        assert "river deltas" in page.content()
    assert secret.hits == []


# --- the documents stage ------------------------------------------------------------------

BATCH = "20260101T000000000Z"


def _run_documents(store: DuckDBStore, urls: list[str]) -> dict[str, dict]:
    from kb_assets.documents.documents import DocumentsConfig, documents
    from kb_assets.partitions import sync_batches
    from kb_resources.services import BrowserResource
    from kb_resources.stores import DuckDBResource

    now = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with store.transaction() as conn:
        insert_rows(conn, "bookmarks", [{
            "tweet_id": "1", "batch": BATCH, "sort_index": "1", "url": "https://x.com/u/status/1", "text": "post",
            "is_long": False, "raw_file": "page-0001.json", "captured_at": now, "article_title": None,
            "article_text": None}])
        insert_rows(conn, "links", [{
            "tweet_id": "1", "url_norm": normalize_url(url), "position": n, "expanded_url": url,
            "host": normalize_url(url).split("/")[2], "kind": "link", "from_quote": False,
            "batch": BATCH} for n, url in enumerate(urls)])
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions(sync_batches.name, [BATCH])
    result = dg.materialize([documents], partition_key=BATCH, instance=instance,
                            resources={"duckdb": DuckDBResource.from_settings(path=store.path),
                                       "browser": BrowserResource.from_settings()},
                            run_config=dg.RunConfig({"documents": DocumentsConfig(workers=2)}))
    assert result.success
    with store.connect() as conn:
        rows = conn.execute("SELECT url, status, reason, detail, text FROM documents").fetchall()
    return {url: {"status": s, "reason": r, "detail": d, "text": t} for url, s, r, d, t in rows}


@pytest.mark.browser
@pytest.mark.slow
def test_the_documents_stage_fails_private_links_by_name(browser_servers, guarded, monkeypatch, kb_home):
    attacker, secret = browser_servers
    monkeypatch.setenv("KB_BROWSER_TIMEOUT_S", "10")
    hostile = {
        attacker.url("/to-metadata"): "169.254.169.254",
        attacker.url("/to-octal"): "127.0.0.1",  # Chromium reads 0177.0.0.1 as 127.0.0.1
        attacker.url("/navigates"): "127.0.0.1",
        f"http://news.example.com:{secret.port}/": "news.example.com",
        f"http://127.0.0.1:{secret.port}/": "127.0.0.1",
    }
    urls = [attacker.url("/hostile"), *hostile]
    docs = _run_documents(DuckDBStore.from_settings(path=str(kb_home / "kb.duckdb")), urls)

    assert docs[attacker.url("/hostile")]["status"] == "ok"
    assert "river deltas" in docs[attacker.url("/hostile")]["text"]
    for url, named in hostile.items():
        row = docs[url]
        assert (row["status"], row["reason"]) == ("failed", "private address"), (url, row)
        assert named in row["detail"] and SECRET_TEXT not in (row["text"] or ""), (url, row)
    assert secret.hits == []


# --- one TLS context per process (kb/guards/tls.py) -----------------------------------


def test_http_clients_share_one_tls_context_that_still_checks_certificates(tmp_path, monkeypatch):
    """A guarded client, an Ollama client and the clients of the model APIs
    (the gate's, the translator's, the captioner's) take the process's TLS
    context: no client loads the CA file again. The shared context still
    refuses a server whose certificate no trusted authority signed."""
    import ssl
    import threading

    from kb.enrich.translator import Translator
    from kb.enrich.vision import Captioner
    from kb.guards.tls import tls_context
    from kb.index.embed_ollama import ollama_client
    from kb.telegram.gate import QualityGate
    from tests.fake_youtube import _self_signed_certificate

    import importlib

    for library in ("ollama", "openai", "groq"):
        importlib.import_module(library)  # an import can make a default context of its own, once
    from pydantic import SecretStr

    key = SecretStr("TEST-SECRET-key")
    model_api_clients = (QualityGate.from_settings(api_key=key)._client, Translator.from_settings(api_key=key).client,
                         Captioner.from_settings(api_key=key).openai_client)

    made = []
    real = ssl.create_default_context
    monkeypatch.setattr(ssl, "create_default_context", lambda *a, **k: made.append(k) or real(*a, **k))
    tls_context.cache_clear()
    guard = FetchGuard()
    for _ in range(3):
        guard.httpx_client().close()
        ollama_client("http://127.0.0.1:11434", 3.0).close()
        for make in model_api_clients:
            make().close()
    assert len(made) == 2  # one context for trust_env False (the guard), one for True (the others)
    shared = tls_context(trust_env=False)
    assert shared.verify_mode == ssl.CERT_REQUIRED and shared.check_hostname

    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(*_self_signed_certificate(tmp_path, "127.0.0.1"))
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]

    def serve() -> None:
        connection, _ = listener.accept()
        with contextlib.suppress(OSError), server_context.wrap_socket(connection, server_side=True) as tls:
            tls.recv(1024)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    with guard.allowing(f"127.0.0.1:{port}").httpx_client(timeout=10) as client:
        with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
            client.get(f"https://127.0.0.1:{port}/")
    thread.join(10)
    listener.close()
    assert len(made) == 2

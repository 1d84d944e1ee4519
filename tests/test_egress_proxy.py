"""kb's egress proxy (kb/guards/egress_proxy.py) and kb's clients behind it
(KB_EGRESS_PROXY), on loopback, with the real clients: httpx through the
fetch guard, the fetch guard's own proxy (the browser's and yt-dlp's way
out), the wiki agent's relay, and aiogram against the Bot API stand-in.

In the containers, the proxy resolves names; here KB_FETCH_RESOLVE gives
the names of the test their addresses: site.example is the loopback site
(allowed by host:port, it stands in for a public site), intranet.example
is 10.0.0.1, metadata.example is 169.254.169.254, ui.example is a loopback
service that must see no request (it stands in for the Dagster UI).
tests/test_containers.py attacks the proxies in the deployment."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

import httpx
import pytest

from kb.guards.egress_proxy import ENDPOINT_SETTINGS, describe, egress_guard, main, named_endpoints
from kb.guards.fetch_guard import FetchGuard, GuardProxy, PrivateAddress, parse_proxy
from kb.settings import get_settings
from kb.telegram.notifier import TelegramNotifier
from kb.wiki.agent import WikiAgent
from kb.wiki.sandbox import EndpointRelay
from tests.fake_telegram import BOT_USERNAME, FakeTelegram
from tests.loopback import LoopbackServer, QuietHandler

TOKEN = "123456:EGRESS-TEST-TOKEN-0003"
PAGE = b"<html><body><p>a page of the public site</p></body></html>"


class Site(LoopbackServer):
    """A loopback HTTP server that counts its requests."""

    def __init__(self):
        self.hits: list[str] = []
        site = self

        class Handler(QuietHandler):
            def do_GET(self):
                site.hits.append(self.path)
                self.send_body(200, PAGE, "text/html")

        self.bind(Handler)

    @property
    def port(self) -> int:
        return self.server.server_port


@pytest.fixture
def sites(monkeypatch):
    with Site() as site, Site() as ui:
        monkeypatch.setenv("KB_FETCH_RESOLVE", "site.example=127.0.0.1,ui.example=127.0.0.1,"
                                               "intranet.example=10.0.0.1,metadata.example=169.254.169.254")
        monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS", f"site.example:{site.port}")
        yield site, ui


@contextlib.contextmanager
def egress(public: bool = True, only: tuple[str, ...] = ()):
    """The egress proxy of the settings, on a free loopback port."""
    with GuardProxy(egress_guard(get_settings(), public=public, only=only)) as proxy:
        yield proxy


def address(proxy: GuardProxy) -> tuple[str, int]:
    return parse_proxy(proxy.url)


def test_a_link_fetch_goes_through_the_proxy_and_the_proxy_refuses_private_addresses(sites, caplog):
    site, ui = sites
    caplog.set_level(logging.INFO, "kb.guards.proxy")
    with egress() as proxy:
        # The client of a container: no allow list and no DNS of its own; the proxy decides.
        client = FetchGuard(proxy=address(proxy))
        with client.httpx_client(timeout=5) as http:
            assert http.get(f"http://site.example:{site.port}/page").content == PAGE
            for name, port, why in (("intranet.example", 80, "private network"),
                                    ("metadata.example", 80, "cloud metadata"),
                                    ("ui.example", ui.port, "loopback"),
                                    ("site.example", ui.port, "loopback")):  # the allowed name, another port
                with pytest.raises(PrivateAddress) as refused:
                    http.get(f"http://{name}:{port}/")
                assert refused.value.why.startswith(why) and "said kb's egress proxy" in refused.value.why
                assert f"{name}:{port}" in str(refused.value)
    assert site.hits == ["/page"] and ui.hits == []
    log = caplog.text
    assert f"allowed CONNECT site.example:{site.port} for 127.0.0.1" in log
    assert "refused CONNECT intranet.example:80 for 127.0.0.1: private network" in log
    assert "refused CONNECT metadata.example:80 for 127.0.0.1: cloud metadata" in log


def test_an_address_literal_is_refused_before_the_proxy_sees_it(sites, caplog):
    caplog.set_level(logging.INFO, "kb.guards.proxy")
    with egress() as proxy:
        client = FetchGuard(proxy=address(proxy))
        for host in ("10.0.0.1", "169.254.169.254", "127.0.0.1", "metadata.google.internal"):
            with pytest.raises(PrivateAddress):
                client.connect(host, 80, 3)
    assert "CONNECT" not in caplog.text


def test_the_browser_and_yt_dlp_proxy_goes_through_the_egress_proxy(sites):
    """kb's local GuardProxy (Chromium and yt-dlp use it) behind the egress proxy:
    a plain http request and a tunnel pass; a refusal of the egress proxy is
    the local proxy's refusal, with its reason."""
    site, ui = sites
    with egress() as outer, GuardProxy(FetchGuard(proxy=address(outer))) as local:
        with httpx.Client(proxy=local.url, timeout=5) as http:
            assert http.get(f"http://site.example:{site.port}/a").content == PAGE
            answer = http.get(f"http://intranet.example:{ui.port}/")
        assert answer.status_code == 403 and "private network; said kb's egress proxy" in answer.text
        assert local.refusal_for(f"http://intranet.example:{ui.port}/") is not None
        with socket.create_connection(parse_proxy(local.url), 5) as tunnel:
            tunnel.sendall(f"CONNECT site.example:{site.port} HTTP/1.1\r\nHost: site.example\r\n\r\n".encode())
            assert tunnel.recv(100).startswith(b"HTTP/1.1 200")
    assert site.hits == ["/a"] and ui.hits == []


def test_tls_goes_through_the_tunnel_and_checks_the_certificate_of_the_name(sites, monkeypatch, tmp_path):
    """The proxy passes TLS bytes unchanged: the client checks the site's own
    certificate for the name that it asked for."""
    from tests.fake_youtube import _self_signed_certificate

    cert, key = _self_signed_certificate(tmp_path, "site.example")
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))
    with Site() as site:
        site.server.socket = server_context.wrap_socket(site.server.socket, server_side=True)
        monkeypatch.setenv("KB_FETCH_RESOLVE", "site.example=127.0.0.1,other.example=127.0.0.1")
        monkeypatch.setenv("KB_FETCH_ALLOW_HOSTS", f"site.example:{site.port},other.example:{site.port}")
        with egress() as proxy:
            client = FetchGuard(proxy=address(proxy))
            with client_context.wrap_socket(client.connect("site.example", site.port, 5),
                                            server_hostname="site.example") as tls:
                tls.sendall(b"GET /tls HTTP/1.1\r\nHost: site.example\r\nConnection: close\r\n\r\n")
                answer = b""
                while block := tls.recv(65536):
                    answer += block
            assert answer.startswith(b"HTTP/1.0 200") and answer.endswith(PAGE)
            # Another name of the same site: its certificate does not match that name.
            with pytest.raises(ssl.SSLCertVerificationError):
                client_context.wrap_socket(client.connect("other.example", site.port, 5),
                                           server_hostname="other.example")
    assert site.hits == ["/tls"]


def test_the_agent_relay_reaches_its_endpoint_through_the_proxy_and_nothing_else(sites, tmp_path):
    site, ui = sites

    def ask(host: str, port: int) -> bytes:
        path = tmp_path / f"{host}.sock"
        relay = EndpointRelay(path, host, port, address(proxy))
        try:
            with socket.socket(socket.AF_UNIX) as room:
                room.settimeout(5)
                room.connect(str(path))
                room.sendall(f"GET /agent HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
                data = b""
                with contextlib.suppress(ConnectionResetError):  # closed before it read the request
                    while block := room.recv(65536):
                        data += block
                return data
        finally:
            relay.close()

    with egress() as proxy:
        assert ask("site.example", site.port).endswith(PAGE)
        assert ask("ui.example", ui.port) == b""  # the proxy refused: the room's connection just ends
        # An endpoint on loopback is this machine (or container) itself: no way out, no proxy.
        assert ask("127.0.0.1", ui.port).endswith(PAGE)
    assert site.hits == ["/agent"] and ui.hits == ["/agent"]


def test_the_bot_reaches_its_bot_api_through_its_proxy_and_nothing_else(sites, monkeypatch, caplog):
    site, _ = sites
    caplog.set_level(logging.INFO, "kb.guards.proxy")
    fake = FakeTelegram(TOKEN).start()
    port = int(fake.base_url.rsplit(":", 1)[1])
    # The Bot API by a name: the proxy leaves out an endpoint on loopback (in a container, that is the proxy).
    monkeypatch.setenv("KB_FETCH_RESOLVE", "bot.example=127.0.0.1,site.example=127.0.0.1")
    monkeypatch.setenv("TELEGRAM_API_BASE", f"http://bot.example:{port}")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", TOKEN)
    try:
        with egress(public=False, only=("TELEGRAM_API_BASE",)) as proxy:
            monkeypatch.setenv("KB_EGRESS_PROXY", proxy.url)

            async def me() -> str:
                from kb.telegram.api import build_bot

                bot = build_bot(get_settings())
                try:
                    return (await bot.me()).username
                finally:
                    await bot.session.close()

            assert asyncio.run(me()) == BOT_USERNAME
            assert [method for method, _ in fake.calls] == ["getme"]
            # Not the site that the proxy of `code` allows, not a link.
            with pytest.raises(PrivateAddress, match=r"not an endpoint of this proxy's allowlist "
                                                     rf"\(TELEGRAM_API_BASE=bot.example:{port}\)"):
                FetchGuard(proxy=address(proxy)).connect("site.example", site.port, 3)
            # The notices of `code` take the setting of their process.
            assert TelegramNotifier.from_settings().egress_proxy == proxy.url
    finally:
        fake.stop()
    assert site.hits == []
    assert f"allowed POST bot.example:{port} for 127.0.0.1" in caplog.text
    assert TOKEN not in caplog.text and "/bot" not in caplog.text  # the path holds the token


def test_without_the_setting_every_client_connects_directly(monkeypatch):
    """Outside the containers nothing changes: a proxy of the owner's shell
    (HTTPS_PROXY) is not the egress proxy; it does not check addresses."""
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert FetchGuard.from_settings().proxy is None
    assert TelegramNotifier.from_settings().egress_proxy == ""
    from kb.telegram.api import bot_at  # aiogram: 3.8 s of CPU at import, in the tests that use it only

    assert bot_at("https://api.telegram.org", TOKEN).session.egress_proxy is None


@pytest.mark.parametrize("value", ["https://egress:3128", "http://egress", "http://user:pw@egress:3128",
                                   "http://egress:3128/path", "egress:3128", "http://egress:port"])
def test_a_proxy_setting_that_is_not_http_host_port_is_an_error_that_names_it(value):
    with pytest.raises(ValueError, match=r"KB_EGRESS_PROXY .* is not http://host:port"):
        parse_proxy(value)
    assert parse_proxy(" ") is None and parse_proxy("http://egress:3128/") == ("egress", 3128)


def test_the_allowlist_names_the_endpoints_of_the_settings(monkeypatch, caplog):
    caplog.set_level(logging.INFO, "kb.guards.egress")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://192.168.1.20:8080/v1")
    monkeypatch.setenv("KB_CAPTION_BASE_URL", "http://localhost:8000/v1")  # loopback: the proxy's own container
    found = named_endpoints(get_settings())
    assert found == {"TELEGRAM_API_BASE": "api.telegram.org:443", "ANTHROPIC_BASE_URL": "192.168.1.20:8080",
                     "KB_GATE_BASE_URL": "api.deepseek.com:443", "GROQ_BASE_URL": "api.groq.com:443"}
    assert "KB_CAPTION_BASE_URL=http://localhost:8000/v1 is a loopback address" in caplog.text
    assert named_endpoints(get_settings(), ("telegram_api_base",)) == {"TELEGRAM_API_BASE": "api.telegram.org:443"}
    # An endpoint at an IPv6 address passes: the guard's entry has no brackets.
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://[fd00::5]:8080/v1")
    assert named_endpoints(get_settings(), ("anthropic_base_url",)) == {"ANTHROPIC_BASE_URL": "[fd00::5]:8080"}
    for public in (True, False):
        rule = egress_guard(get_settings(), public=public, only=() if public else ("anthropic_base_url",))
        guard = rule if public else rule.guard
        assert guard.is_allowed_host("fd00::5", 8080) and guard.is_allowed_host("[FD00::5]", 8080)
        assert not guard.is_allowed_host("fd00::5", 8081)
        assert describe(rule).startswith("public addresses and ") and "fd00::5:8080" in describe(rule) if public \
            else describe(rule) == "only ANTHROPIC_BASE_URL=[fd00::5]:8080"
    with pytest.raises(ValueError, match="not an endpoint setting: KB_HOME"):
        named_endpoints(get_settings(), ("KB_HOME",))
    assert main(["--only", "KB_HOME"]) == 2
    assert set(ENDPOINT_SETTINGS) <= set(type(get_settings()).model_fields)


def test_the_listen_address_takes_ipv4_ipv6_and_a_port_alone():
    import argparse

    from kb.guards.egress_proxy import _listen_address

    assert _listen_address("0.0.0.0:3128") == ("0.0.0.0", 3128)
    assert _listen_address("[::]:3129") == ("::", 3129)
    assert _listen_address(":3130") == ("0.0.0.0", 3130)
    for bad in ("3128", "[::]", "host:port"):
        with pytest.raises(argparse.ArgumentTypeError, match="write host:port"):
            _listen_address(bad)


def test_the_resources_give_the_setting_to_the_notifier_and_the_agent(monkeypatch):
    """In `code`, Dagster's runs build these clients from their resources."""
    from kb_resources.services import TelegramNotifierResource, WikiAgentResource

    monkeypatch.setenv("KB_EGRESS_PROXY", "http://egress:3128")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://api.anthropic.com")
    assert TelegramNotifierResource.from_settings().get_client().egress_proxy == "http://egress:3128"
    assert WikiAgentResource.from_settings().get_client().egress_proxy == "http://egress:3128"


@pytest.mark.slow  # the agent's real CLI, twice
@pytest.mark.parametrize("sandbox", ["bwrap", "none"])
def test_the_wiki_agent_reaches_its_endpoint_only_through_the_proxy(sandbox, tmp_path, monkeypatch):
    """The real CLI against the Messages API stand-in, at a name that only
    the proxy resolves: in its room through the relay, without a room
    through HTTPS_PROXY and HTTP_PROXY that kb gives it."""
    from kb.wiki.change import apply_agent_change
    from kb.wiki.prompts import GateDecision, ingest_prompt
    from kb.wiki.repo import Wiki
    from kb.wiki.sandbox import bubblewrap_works
    from tests.fake_anthropic import FakeAnthropic
    from tests.test_wiki_agent import PARSED, SOURCE_TEXT, good_turns

    if sandbox == "bwrap" and not bubblewrap_works()[0]:
        pytest.skip(f"no bubblewrap room here: {bubblewrap_works()[1]}")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("ANTHROPIC_AUTH_TOKEN", "sk-TEST-egress-agent-0004")
    monkeypatch.setenv("KB_AGENT_SANDBOX", sandbox)
    wiki = Wiki.from_settings()
    (wiki.ensure() / PARSED).parent.mkdir(parents=True, exist_ok=True)
    (wiki.root() / PARSED).write_text(SOURCE_TEXT)
    with FakeAnthropic(turns=good_turns()) as fake:
        port = fake.server.server_port
        monkeypatch.setenv("KB_FETCH_RESOLVE", "anthropic.example=127.0.0.1")
        monkeypatch.setenv("ANTHROPIC_BASE_URL", f"http://anthropic.example:{port}")
        with egress() as proxy:
            monkeypatch.setenv("KB_EGRESS_PROXY", proxy.url)
            decision = GateDecision(source_id="src1", approved=True, parsed_path=PARSED, topics=("computing",))
            prompt = ingest_prompt(decision, {"title": "Notes on the Engine"}, "2026-11-29")
            outcome = apply_agent_change(wiki, WikiAgent.from_settings(), prompt, prefix="ingest:", max_turns=20)
    assert outcome.ok, outcome.problems
    assert fake.requests and fake.unknown == []


def test_kb_status_tells_whether_the_proxy_answers(monkeypatch):
    from kb.apps.status import _services

    assert _services(get_settings())["egress_proxy"] == {
        "ready": True, "detail": "not set: kb's clients connect directly"}
    with egress() as proxy:
        url = proxy.url
        monkeypatch.setenv("KB_EGRESS_PROXY", url)
        line = _services(get_settings())["egress_proxy"]
        assert line["ready"] and line["detail"].startswith(f"{url} answers"), line
    line = _services(get_settings())["egress_proxy"]  # the proxy is gone
    assert not line["ready"] and f"KB_EGRESS_PROXY {url} does not answer" in line["detail"], line
    monkeypatch.setenv("KB_EGRESS_PROXY", "https://egress:3128")
    line = _services(get_settings())["egress_proxy"]
    assert not line["ready"] and "'https://egress:3128' is not http://host:port" in line["detail"], line

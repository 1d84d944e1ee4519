"""The browser that reads strangers' pages has its sandbox and no keys
(kb/x/browser_room.py). Real Playwright on Debian's Chromium, launched
through kb's own Browser; the tests read /proc of every process of the
browser tree, as an attacker in a renderer would want to."""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import psutil
import pytest
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import sync_playwright

from kb.guards.fetch_guard import FetchGuard
from kb.guards.room_relay import relay_python
from kb.settings import get_settings
from kb.x import browser_room, playwright_internals
from kb.x.browser import Browser, chromium_launch_options
from tests.loopback import LoopbackServer, QuietHandler, allow_fetches

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parent.parent
PRODUCT = ("kb", "kb_assets", "kb_resources", "sensors", "mcp_server", "telegram_bridge")

# Keys as kb's resources export them (kb_resources/client_resource.py), and
# names that no browser process may get, whatever their value.
KEYS = {
    "DEEPSEEK_API_KEY": "test-secret-xyz-deepseek",
    "TELEGRAM_BOT_TOKEN": "test-secret-xyz-telegram",
    "KB_S3_SECRET_ACCESS_KEY": "test-secret-xyz-s3",
    "ANTHROPIC_AUTH_TOKEN": "test-secret-xyz-anthropic",
    "AWS_SECRET_ACCESS_KEY": "test-secret-xyz-aws",
    "GOOGLE_API_KEY": "test-secret-xyz-google",
    "KB_SOME_SETTING": "test-secret-xyz-kb-setting",
}
# Names that Chromium or Debian's launcher (/usr/bin/chromium and
# /etc/chromium.d) set for themselves. Their values come from the launcher,
# not from kb's environment (the test checks that no value of KEYS is there).
CHROMIUM_OWN_NAMES = {"CHROME_DESKTOP", "CHROME_VERSION_EXTRA", "CHROME_WRAPPER", "CHROMIUM_FLAGS",
                      "GOOGLE_API_KEY", "GOOGLE_DEFAULT_CLIENT_ID", "GOOGLE_DEFAULT_CLIENT_SECRET",
                      "DBUS_SESSION_BUS_ADDRESS", "PWD"}
BROWSER_NAMES = set(browser_room.BROWSER_ENV_NAMES) | {"PATH", "HOME", "TMPDIR"} | CHROMIUM_OWN_NAMES
# Chromium writes the titles of its child processes (--type=renderer, zygote,
# utility, gpu) over the memory of their environment, so their environ holds
# pieces of a command line. They get their environment from the browser
# process. So the test checks the names in the driver, bwrap, the browser
# process and crashpad, and the key values in every process.
VARIABLE = re.compile(rb"^([A-Za-z_][A-Za-z0-9_]*)=")
PAGE = b"<html><body><p>a stranger's page</p></body></html>"


class PageHandler(QuietHandler):
    def do_GET(self) -> None:
        self.send_body(200, PAGE, "text/html")


class Site(LoopbackServer):
    def __init__(self) -> None:
        self.bind(PageHandler)


@pytest.fixture(scope="module")
def site():
    with Site() as server:
        yield server


@pytest.fixture
def plan_cache():
    """The plan depends on PATH (bwrap) and the user: each test asks afresh."""
    browser_room.room_works.cache_clear()
    browser_room.user_namespaces_work.cache_clear()
    yield
    browser_room.room_works.cache_clear()
    browser_room.user_namespaces_work.cache_clear()


@pytest.fixture(params=["room", "no room"])
def mode(request, monkeypatch, tmp_path, plan_cache):
    """"room": as kb runs here. "no room": bubblewrap is not on PATH."""
    if request.param == "no room":
        bare = tmp_path / "bin-without-bwrap"
        bare.mkdir()
        monkeypatch.setenv("PATH", str(bare))
    elif not shutil.which("bwrap"):
        pytest.skip("bubblewrap is not installed on this machine")
    return request.param


def browser_tree() -> list[psutil.Process]:
    """The Playwright driver that this test process started, and all its
    children: bwrap, Chromium and Chromium's children. Not other children of
    the test process: in a full run, an xdist worker may still hold a server
    process of an earlier test."""
    drivers = [p for p in psutil.Process().children(recursive=True) if is_driver(p)]
    return drivers + [child for driver in drivers for child in driver.children(recursive=True)]


def environ_of(process: psutil.Process) -> tuple[bytes, set[str]]:
    raw = Path(f"/proc/{process.pid}/environ").read_bytes()
    names = {m.group(1).decode() for entry in raw.split(b"\0") if (m := VARIABLE.match(entry))}
    return raw, names


def is_driver(process: psutil.Process) -> bool:
    try:
        return any("playwright" in part and part.endswith("cli.js") for part in process.cmdline())
    except psutil.Error:  # a zombie or a process gone: a left-over of an earlier test, not a driver
        return False


def test_no_key_reaches_the_driver_or_any_browser_process(mode, site, monkeypatch, tmp_path):
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DISPLAY", ":99")  # only a login window gets the display
    # NODE_OPTIONS loads code into every Node.js process: the driver must not get it.
    marker = tmp_path / "node-options-ran"
    script = tmp_path / "evil.js"
    script.write_text(f"require('fs').writeFileSync({str(marker)!r}, 'ran');\n")
    monkeypatch.setenv("NODE_OPTIONS", f"--require={script}")
    allow_fetches(monkeypatch, site.base_url)

    with Browser.from_settings(timeout_s=20).clean_context() as context:
        page = context.new_page()
        page.goto(site.base_url + "/")
        assert "a stranger's page" in page.content()
        seen = []
        for process in browser_tree():
            raw, names = environ_of(process)
            driver = is_driver(process)
            for name, value in KEYS.items():
                assert value.encode() not in raw, f"{name} reached {process.name()} {process.pid}"
            seen.append("driver" if driver else process.name())
            if any(part.startswith("--type=") for part in process.cmdline()):
                continue  # a child of Chromium: its environ shows its title (see VARIABLE)
            allowed = set(browser_room.DRIVER_ENV_NAMES) if driver else BROWSER_NAMES
            outside = {n for n in names - allowed if not (driver and n.startswith(("PW_", "PLAYWRIGHT_")))}
            assert not outside, f"{process.name()} {process.pid} got {sorted(outside)}"
            if not driver:
                assert "DISPLAY" not in names
    assert "driver" in seen, seen
    assert seen.count("chromium") >= 3, seen
    assert not marker.exists(), "NODE_OPTIONS reached the Playwright driver"


def test_the_driver_hook_is_in_place(monkeypatch):
    """kb wraps Playwright's get_driver_env (no option for it exists): the
    wrapper is in place and filters. Whether a new Playwright still calls
    that function, only the test above can tell (it reads the driver's
    /proc/<pid>/environ)."""
    assert playwright_internals.driver_env_filtered()
    monkeypatch.setenv("KB_HOOK_CHECK_TOKEN", "test-secret-xyz-hook")
    env = playwright_internals.next_driver_env()
    assert "KB_HOOK_CHECK_TOKEN" not in env and env.get("PW_LANG_NAME") == "python"


def test_only_the_adapter_uses_playwrights_private_modules():
    """kb/x/playwright_internals.py is the one door to `playwright._`: a new
    private use elsewhere fails here, with its file and line."""
    adapter = REPO / "kb" / "x" / "playwright_internals.py"
    offenders = []
    for package in PRODUCT:
        for path in sorted((REPO / package).rglob("*.py")):
            text = path.read_text()
            if "playwright" not in text:
                continue  # parse only the files that can hold such an import
            for node in ast.walk(ast.parse(text, str(path))):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                         else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                if path != adapter and any(name.startswith("playwright._") for name in names):
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, f"use Playwright's public API, or add the use to {adapter.name}: {offenders}"
    pin = next(line for line in (REPO / "pyproject.toml").read_text().splitlines() if '"playwright' in line)
    assert "<" in pin, f"pyproject.toml must allow one minor release of Playwright, not {pin.strip()}"


def own_namespace(kind: str) -> str:
    return os.readlink(f"/proc/self/ns/{kind}")


def test_renderers_run_in_the_sandbox(site, monkeypatch, plan_cache):
    """In CI's conditions (root, bubblewrap installed) and on a laptop
    (not root): each renderer runs with seccomp-bpf (Seccomp: 2) in user and
    PID namespaces that are not kb's."""
    if os.geteuid() == 0 and not shutil.which("bwrap"):
        pytest.skip("root without bubblewrap: Chromium's sandbox cannot run (kb status says so)")
    allow_fetches(monkeypatch, site.base_url)
    assert Browser.from_settings().sandbox_readiness()[0]
    with Browser.from_settings(timeout_s=20).clean_context() as context:
        page = context.new_page()
        page.goto(site.base_url + "/")
        renderers = [p for p in browser_tree() if "--type=renderer" in p.cmdline()]
        assert renderers
        for renderer in renderers:
            status = Path(f"/proc/{renderer.pid}/status").read_text()
            assert re.search(r"^Seccomp:\s+2$", status, re.M), f"renderer {renderer.pid} has no seccomp-bpf"
            for kind in ("user", "pid"):
                assert os.readlink(f"/proc/{renderer.pid}/ns/{kind}") != own_namespace(kind)


def test_the_room_holds_no_file_of_kb_home_or_the_login(site, kb_home, monkeypatch, plan_cache):
    """What the room changes: even a browser process that a page took over,
    or a file:// URL that reached kb's browser, finds no KB_HOME, no X login
    and no home folder. The files exist outside the room."""
    if not browser_room.sandbox_plan(get_settings().chromium_executable()).mode == "room":
        pytest.skip("bubblewrap cannot make a room on this machine")
    secret = kb_home / "wiki" / "private.md"
    secret.parent.mkdir()
    secret.write_text("test-secret-xyz-wiki-page")
    login = get_settings().x_state_path
    login.write_text('{"cookies": [], "secret": "test-secret-xyz-login"}')
    allow_fetches(monkeypatch, site.base_url)
    with Browser.from_settings(timeout_s=20).clean_context() as context:
        for path in (secret, login):
            assert path.exists()
            page = context.new_page()
            try:
                page.goto(path.as_uri())
                text = page.content()
            except PlaywrightError as exc:
                text = str(exc)
            assert "test-secret-xyz" not in text, f"the browser read {path}"
        context.new_page().goto(site.base_url + "/")
        checked = 0
        for process in browser_tree():
            if process.name() != "chromium":
                continue
            # The process's own view of the file system, as root reads it from outside.
            root = Path(f"/proc/{process.pid}/root")
            try:
                found = [p for p in (secret, login, kb_home, Path.home() / ".config")
                         if (root / p.relative_to("/")).exists()]
                # The browser process sees the room; a sandboxed renderer sees not even that.
                browser_process = not any(a.startswith("--type=") for a in process.cmdline())
                sees_the_room = (root / "usr/lib").is_dir()
            except (ProcessLookupError, psutil.NoSuchProcess):
                continue  # a short-lived helper of Chromium ended meanwhile
            assert not found, f"{found} are in the room of {process.pid}"
            checked += browser_process and sees_the_room
        assert checked, "no browser process was checked"


def test_the_login_window_gets_the_display_and_no_key(monkeypatch, plan_cache):
    """`kb login` opens a window: its Chromium gets the display variables,
    still no key, and no room (the room has no display)."""
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DISPLAY", ":99")
    options = chromium_launch_options("/usr/bin/chromium", headless=False)
    assert options["env"]["DISPLAY"] == ":99"
    assert not set(options["env"]) & set(KEYS)
    assert options["executable_path"] == "/usr/bin/chromium"
    headless = chromium_launch_options("/usr/bin/chromium", headless=True)
    assert "DISPLAY" not in headless["env"]


def test_status_says_when_the_sandbox_is_off_and_how_to_fix_it(monkeypatch, tmp_path, plan_cache):
    from kb.apps.status import collect_status, format_status

    if shutil.which("bwrap"):
        ready, detail = Browser.from_settings().sandbox_readiness()
        assert ready and "bubblewrap room" in detail
    # Root and no bubblewrap (a container without the package):
    bare = tmp_path / "bin-without-bwrap"
    bare.mkdir()
    monkeypatch.setenv("PATH", str(bare))
    monkeypatch.setattr(browser_room, "_is_root", lambda: True)
    browser_room.room_works.cache_clear()
    report = collect_status()
    sandbox = report["services"]["browser_sandbox"]
    assert not sandbox["ready"]
    assert "apt-get install bubblewrap" in sandbox["detail"] and "root" in sandbox["detail"]
    line = next(line for line in format_status(report).splitlines() if "browser_sandbox" in line)
    assert "not ready" in line and "OFF" in line


def test_status_names_the_fix_when_bubblewrap_cannot_make_a_room(monkeypatch, tmp_path, plan_cache):
    """A container can have bubblewrap but refuse user namespaces: then the
    fix is not "install bubblewrap". A bwrap that fails as it fails there
    stands in for that machine."""
    folder = tmp_path / "bin"
    folder.mkdir()
    bwrap = folder / "bwrap"
    bwrap.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    bwrap.chmod(0o755)
    monkeypatch.setenv("PATH", str(folder))
    monkeypatch.setattr(browser_room, "_is_root", lambda: True)
    ready, detail = Browser.from_settings().sandbox_readiness()
    assert not ready
    assert "No permissions to create new namespace" in detail and "user namespaces" in detail
    assert "install bubblewrap" not in detail
    assert chromium_launch_options("/usr/bin/chromium", headless=True)["chromium_sandbox"] is False


# --- the room has no network: the fetch guard is the one way out ---------------------


class UiStandIn(ThreadingHTTPServer):
    """Plays the Dagster UI: no login, and a JSON POST with no Origin to
    /graphql launches a run (issue 56: from the room, such a POST did). It
    listens on every address of the host (0.0.0.0) and counts each
    connection that it accepts."""

    def __init__(self) -> None:
        self.accepted = 0
        self.launched: list[str] = []
        server = self

        class Handler(QuietHandler):
            def do_POST(self) -> None:
                server.launched.append(self.path)
                self.send_json(200, {"data": {"launchRun": {"__typename": "LaunchRunSuccess"}}})

            def do_GET(self) -> None:
                self.send_body(200, b"<p>the Dagster UI</p>", "text/html")

        super().__init__(("0.0.0.0", 0), Handler)

    def get_request(self):
        request = super().get_request()
        self.accepted += 1
        return request

    def __enter__(self) -> UiStandIn:
        threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        # Open from outside the room: the test below could fail.
        socket.create_connection(("127.0.0.1", self.server_port), timeout=3).close()
        assert wait_for(lambda: self.accepted == 1)
        self.accepted = 0
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()


def wait_for(condition, seconds: float = 3.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def host_addresses() -> list[str]:
    """The IPv4 addresses of this machine that are not loopback: a service
    bound to 0.0.0.0 listens on them too."""
    return [a.address for name, addresses in psutil.net_if_addrs().items() for a in addresses
            if a.family == socket.AF_INET and not a.address.startswith("127.")]


@pytest.fixture
def room_chromium(plan_cache) -> str:
    chromium = get_settings().chromium_executable()
    works, why = browser_room.room_works(chromium) if chromium else (False, "no Chromium")
    if not works:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the browser's room does not start here: {why} (CI=true: .ci/run installs bubblewrap)")
        pytest.skip(f"the browser's room does not start here: {why}")
    return chromium


# Runs in the room, as kb starts it (the relay first), in place of Chromium:
# what a page that took over a browser process would try.
NETWORK_PROBE = r"""
import json, socket, sys
ui_port, proxy_host, proxy_port, page_url, ui_url = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
hosts = sys.argv[6:]
POST = (f"POST /graphql HTTP/1.1\r\nHost: 127.0.0.1:{ui_port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: 2\r\nConnection: close\r\n\r\n{{}}").encode()

def attack(host, port):
    try:
        with socket.create_connection((host, port), timeout=3) as s:
            s.sendall(POST)
            return "open: " + s.recv(200).decode("latin-1")
    except OSError as exc:
        return type(exc).__name__

def through_proxy(url):
    with socket.create_connection((proxy_host, proxy_port), timeout=10) as s:
        s.sendall(f"GET {url} HTTP/1.1\r\nHost: {url.split('/')[2]}\r\n\r\n".encode())
        data = b""
        while block := s.recv(65536):
            data += block
    return data.decode("latin-1")

found = {f"{host}:{ui_port}": attack(host, ui_port) for host in ["127.0.0.1", "localhost", *hosts]}
found["metadata"] = attack("169.254.169.254", 80)
found["public"] = attack("1.1.1.1", 443)
try:
    socket.getaddrinfo("example.com", 443)
    found["dns"] = "resolved"
except OSError as exc:
    found["dns"] = type(exc).__name__
print(json.dumps({"attacks": found, "page": through_proxy(page_url), "ui": through_proxy(ui_url)}))
"""


def test_a_process_in_the_room_reaches_no_host_port_and_pages_through_the_guard(room_chromium, site):
    """kb's own command line of the room, with a probe in place of Chromium
    (the relay still runs first): a JSON POST to the UI on 127.0.0.1 and on
    the host's other addresses finds nothing to connect to, nor do the
    metadata address, a public address or DNS. The honest path works: the
    context's proxy, at its own loopback address of the room, fetches the
    page that the guard allows, and refuses the UI."""
    with UiStandIn() as ui, browser_room.room_proxy(
            FetchGuard().allowing(urlsplit(site.base_url).netloc), timeout_s=10) as (proxy, server):
        room = browser_room.room_args(shutil.which("bwrap"), room_chromium)[:-1]
        proxy_host, proxy_port = urlsplit(server).hostname, urlsplit(server).port
        # Not on the host's 127.0.0.1: the room's own loopback address (127.0.0.10 is one too).
        assert proxy.unix_socket and proxy_host != "127.0.0.1"
        ui_url = f"http://127.0.0.1:{ui.server_port}/graphql"
        probe = subprocess.run([*room, relay_python(), "-IS", "-c", NETWORK_PROBE, str(ui.server_port), proxy_host,
                                str(proxy_port), site.base_url + "/", ui_url, *host_addresses()],
                               capture_output=True, text=True, timeout=60, env={"PATH": browser_room.BROWSER_PATH})
        assert probe.returncode == 0, probe.stderr[-2000:]
        found = json.loads(probe.stdout.strip().splitlines()[-1])
        attacks = found["attacks"]
        assert all(not result.startswith("open") and result != "resolved" for result in attacks.values()), attacks
        assert ui.accepted == 0 and ui.launched == []
        assert found["page"].startswith("HTTP/1.") and "a stranger's page" in found["page"], found["page"][:300]
        assert " 403 " in found["ui"].split("\r\n", 1)[0] and "kb refused" in found["ui"], found["ui"][:300]
        assert proxy.refusal_for(ui_url) is not None and ui.accepted == 0


def test_chromium_in_the_room_that_skips_its_proxy_reaches_no_loopback_port(room_chromium, site):
    """Real Chromium in the room, as kb launches it. A context without a
    proxy stands in for a browser process that a page took over: it goes to
    the UI directly, by navigation and by a JSON POST, and reaches nothing.
    A context with its room proxy loads the page that the guard allows."""
    options = chromium_launch_options(room_chromium, headless=True)
    assert browser_room.runs_in_room(options)
    guard = FetchGuard().allowing(urlsplit(site.base_url).netloc)
    with UiStandIn() as ui, sync_playwright() as playwright, \
            browser_room.room_proxy(guard, timeout_s=10) as (proxy, server):
        browser = playwright.chromium.launch(**options)
        try:
            page = browser.new_context().new_page()
            posted = page.evaluate("""url => fetch(url, {method: "POST", mode: "no-cors", body: "{}"})
                                     .then(r => "answered", e => String(e))""",
                                   f"http://127.0.0.1:{ui.server_port}/graphql")
            assert posted != "answered"
            for host in ["127.0.0.1", *host_addresses()]:
                with pytest.raises(PlaywrightError, match="ERR_"):
                    page.goto(f"http://{host}:{ui.server_port}/", timeout=10_000)
            honest = browser.new_context(proxy={"server": server}).new_page()
            honest.goto(site.base_url + "/", timeout=10_000)
            assert "a stranger's page" in honest.content()
        finally:
            browser.close()
    assert ui.accepted == 0 and ui.launched == []

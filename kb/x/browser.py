"""The browser: Playwright on Chromium, with two kinds of context.

- `x_context()` carries the owner's saved X login (from `kb login`). It opens
  X pages only.
- `clean_context()` has no storage state. Use it for every other site.

The rule for the X context: it never shows a page that is not on X. Three
walls keep that rule:
1. `XContext.open()` refuses a URL whose host is not the X host (or one of
   its subdomains), before any request goes out.
2. A route on the context aborts every navigation request (main frame or
   frame) to a host that is not X. This also stops links and scripts.
3. Playwright does not call routes for redirects. So a main frame that
   lands on a non-X page is recorded; `open()` and the capture loop check
   for it (`raise_if_left_x()`) and stop.
Subresources (scripts, images, video) may come from any public host: X
loads its assets from twimg.com, and the browser sends x.com cookies only
to x.com. To block them would break the X web app and protect nothing.

The rule for both contexts: the browser reaches the public internet only.
Each context sends every request through its own fetch-guard proxy
(kb/guards/fetch_guard.py, GuardProxy): navigations, redirects, frames, scripts,
images, fetch() and WebSocket calls. In the room (kb/x/browser_room.py),
Chromium has no network, and the proxy is its only way out. The proxy
resolves each host, refuses loopback, private, link-local and cloud
metadata addresses, and connects to the address that it checked. A route
alone cannot hold this rule: Playwright does not call routes for
redirects, and Chromium would resolve the name again after the check. The X context also allows the X origin
(KB_X_BASE_URL); KB_FETCH_ALLOW_HOSTS allows more hosts for both.
`navigation_refusal(page)` tells why a page did not load when the proxy
refused it, so the caller can store the reason "private address".

We use the sync Playwright API. It is bound to the thread that starts it,
so every `with` block here starts and stops its own Playwright and Chromium
(a Dagster op may run in any thread or process; nothing crosses threads).
Inside `Browser.kept_open()`, contexts that the same thread opens share one
Chromium. Each context is still separate: no cookie or storage crosses.

Usage:
    with browser.x_context() as x:      # X pages only
        page = x.open("/i/bookmarks")
    with browser.clean_context() as context:   # every other site
        page = context.new_page(); page.goto(url)
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from pydantic import BaseModel
from playwright.sync_api import Browser as PlaywrightBrowser
from playwright.sync_api import BrowserContext, Frame, Page, Route, sync_playwright
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from kb.guards.fetch_guard import DEFAULT_PORTS, FetchGuard, GuardProxy, PrivateAddress
from kb.settings import Settings, playwright_browser_installed, get_settings
from kb.x.browser_room import room_proxy, runs_in_room, sandbox_options, sandbox_plan

# No --no-sandbox: kb/x/browser_room.py decides on the sandbox (and where
# it cannot run, Playwright adds --no-sandbox). --disable-background-networking:
# no update checks or field trials; a capture run talks to X only.
# --force-webrtc-ip-handling-policy: WebRTC sends UDP past the proxy of the
# context; with this policy it uses the proxy or nothing.
CHROMIUM_ARGS = ["--disable-gpu", "--disable-background-networking",
                 "--force-webrtc-ip-handling-policy=disable_non_proxied_udp"]

# Playwright turns Chromium's pop-up blocker off. kb wants no pop-up that a
# page opens without a click: a hostile page opened pop-ups that went on
# sending requests (the red team, 7 December 2026). A click of the owner in
# `kb login` still opens one.
CHROMIUM_DEFAULT_ARGS_LEFT_OUT = ["--disable-popup-blocking"]

# The sync Playwright API is bound to its thread, so a browser kept open is
# kept per thread.
_kept_open = threading.local()
# The fetch-guard proxy of each open context.
_context_proxies: weakref.WeakKeyDictionary[BrowserContext, GuardProxy] = weakref.WeakKeyDictionary()
# The browsers that run in the room (no network: their contexts reach their
# proxies through the room's gate).
_in_room: weakref.WeakSet[PlaywrightBrowser] = weakref.WeakSet()


class BrowserNotFound(RuntimeError):
    """No Chromium to launch."""


class XLoginMissing(RuntimeError):
    """The saved X login state is absent or not readable."""


class NotAnXPage(ValueError):
    """The X context was asked to show a page that is not on X."""


def host_of(url: str) -> str:
    return (urlsplit(url).hostname or "").lower()


def is_x_host(host: str, x_host: str) -> bool:
    """True for the X host and its subdomains (api.x.com), nothing else."""
    host, x_host = host.lower(), x_host.lower()
    return host == x_host or host.endswith("." + x_host)


def check_chromium(executable: str | None) -> None:
    """BrowserNotFound when there is no Chromium to launch."""
    if executable is None and not playwright_browser_installed():
        raise BrowserNotFound(
            "No Chromium found: set KB_CHROMIUM_PATH, install Debian's chromium, "
            "or run `playwright install chromium`."
        )
    if executable is not None and not os.access(executable, os.X_OK):
        raise BrowserNotFound(f"KB_CHROMIUM_PATH={executable}: the file is absent or not executable.")


def chromium_launch_options(executable: str | None, *, headless: bool) -> dict:
    """Playwright's launch options. `executable` None: Playwright's own
    Chromium (Settings.chromium_executable() finds the one to use). The
    options hold the sandbox, the room and the whole environment of Chromium
    (kb/x/browser_room.py): launch with them as they are."""
    check_chromium(executable)
    return {"headless": headless, "args": list(CHROMIUM_ARGS), "ignore_default_args": list(CHROMIUM_DEFAULT_ARGS_LEFT_OUT),
            **sandbox_options(executable, headless=headless)}


def load_login_state(path: Path) -> dict:
    """The storage state that `kb login` saved. The error names the file and
    the reason, never its content."""
    if not path.exists():
        raise XLoginMissing(f"No X login state at {path}. Run `kb login` to sign in to X and save it.")
    try:
        state = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise XLoginMissing(
            f"The X login state at {path} is not readable JSON ({type(exc).__name__}). Run `kb login` again."
        ) from None
    if not isinstance(state, dict) or not isinstance(state.get("cookies"), list):
        raise XLoginMissing(f"The X login state at {path} has no cookie list. Run `kb login` again.")
    return state


class XContext:
    """A browser context with the owner's X login, limited to X pages."""

    def __init__(self, context: BrowserContext, x_base_url: str, timeout_s: float):
        self.context = context
        self.base_url = x_base_url.rstrip("/")
        self.x_host = urlsplit(self.base_url).hostname or "x.com"
        self.timeout_ms = timeout_s * 1000
        self.violations: list[str] = []
        context.route("**/*", self._guard_navigation)

    def url(self, path_or_url: str) -> str:
        """An absolute X URL for a path ("/i/bookmarks") or a full URL.
        Raises NotAnXPage when the host is not X."""
        url = urljoin(self.base_url + "/", path_or_url)
        if not is_x_host(host_of(url), self.x_host):
            raise NotAnXPage(
                f"The X context opens X pages only ({self.x_host}); {url} is on {host_of(url) or 'no host'}. "
                "Use the clean context for other sites."
            )
        return url

    def open(self, path_or_url: str, *, wait_until: str = "domcontentloaded") -> Page:
        """A new page on an X URL. Attach response listeners to `self.context`
        before the call, so that no response of the first load is missed."""
        url = self.url(path_or_url)
        earlier = len(self.violations)  # one page that left X does not spoil the next open()
        page = self.context.new_page()
        page.on("framenavigated", self._check_main_frame)
        try:
            page.goto(url, wait_until=wait_until, timeout=self.timeout_ms)
        except PlaywrightError:
            self._close_if_left_x(page, earlier)
            raise
        self._close_if_left_x(page, earlier)
        return page

    def raise_if_left_x(self, since: int = 0) -> None:
        """NotAnXPage when a page of this context went to a non-X page."""
        if len(self.violations) > since:
            raise NotAnXPage(f"The X context left X and was stopped: {self.violations[since]}")

    def _close_if_left_x(self, page: Page, since: int) -> None:
        if len(self.violations) > since:
            page.close()
            self.raise_if_left_x(since)

    def _guard_navigation(self, route: Route) -> None:
        request = route.request
        if request.is_navigation_request() and not is_x_host(host_of(request.url), self.x_host):
            self.violations.append(f"navigation to {host_of(request.url)} blocked")
            route.abort("blockedbyclient")
        else:
            route.continue_()

    def _check_main_frame(self, frame: Frame) -> None:
        # Routes do not see redirects, so check where the main frame landed.
        # An event handler must not call back into Playwright (that can
        # deadlock), so it only records; callers check raise_if_left_x().
        if frame.parent_frame is None and frame.url.startswith("http") and not is_x_host(host_of(frame.url), self.x_host):
            self.violations.append(f"page landed on {host_of(frame.url)}")


class Browser(BaseModel):
    """Playwright on Chromium. from_settings() finds Chromium (KB_CHROMIUM_PATH,
    Debian's /usr/bin/chromium, or Playwright's own browser)."""

    chromium_path: str  # empty: Playwright's own Chromium
    x_state_path: str  # the saved X login; used on X pages only
    x_base_url: str
    timeout_s: float
    headless: bool = True

    @classmethod
    def from_settings(cls, settings: Settings | None = None, **overrides) -> Browser:
        settings = settings or get_settings()
        return cls(**{"chromium_path": settings.chromium_executable() or "", "x_state_path": str(settings.x_state_path),
                      "x_base_url": settings.kb_x_base_url, "timeout_s": settings.kb_browser_timeout_s, **overrides})

    @property
    def x_host(self) -> str:
        return urlsplit(self.x_base_url).hostname or "x.com"

    def _launch_options(self, *, headless: bool) -> dict:
        return chromium_launch_options(self.chromium_path or None, headless=headless)

    @contextlib.contextmanager
    def _browser(self) -> Iterator[PlaywrightBrowser]:
        options = self._launch_options(headless=self.headless)
        kept = getattr(_kept_open, "browser", None)
        if kept is not None and _kept_open.options == options and kept.is_connected():
            yield kept
            return
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(**options)
            if runs_in_room(options):
                _in_room.add(browser)
            try:
                yield browser
            finally:
                browser.close()

    @contextlib.contextmanager
    def kept_open(self) -> Iterator[None]:
        """Keep one Chromium open for every context that this thread opens
        inside the block. To start Playwright and Chromium costs one to three
        seconds; a run that opens many contexts (or a test session) pays it
        once. Each context stays separate: no cookie or storage is shared."""
        with self._browser() as browser:
            _kept_open.browser = browser
            _kept_open.options = self._launch_options(headless=self.headless)
            try:
                yield
            finally:
                _kept_open.browser = None

    @contextlib.contextmanager
    def x_context(self, guard: FetchGuard | None = None) -> Iterator[XContext]:
        """A context with the saved X login. Opens X pages only, and reaches
        public addresses and the X origin only."""
        state = load_login_state(Path(self.x_state_path))
        x_origin = urlsplit(self.x_base_url)
        x_port = x_origin.port or DEFAULT_PORTS.get(x_origin.scheme, 443)
        guard = (guard or FetchGuard.from_settings()).allowing(f"[{self.x_host}]:{x_port}")
        # X registers a service worker. Requests that it handles bypass
        # Playwright routes (the navigation guard) and their bodies can be
        # unreadable, so the X context blocks service workers.
        with self._guarded_context(guard, storage_state=state, service_workers="block") as context:
            yield XContext(context, self.x_base_url, self.timeout_s)

    @contextlib.contextmanager
    def clean_context(self, guard: FetchGuard | None = None) -> Iterator[BrowserContext]:
        """A context with no storage state, for every site that is not X.
        It reaches public addresses only (and KB_FETCH_ALLOW_HOSTS). No
        bypass_csp: kb runs no script in the page (it reads page.content()),
        and a page's own Content Security Policy is one more wall against
        what the page loads."""
        with self._guarded_context(guard or FetchGuard.from_settings()) as context:
            yield context

    @contextlib.contextmanager
    def _guarded_context(self, guard: FetchGuard, **options) -> Iterator[BrowserContext]:
        with self._browser() as browser, self._proxy(browser, guard) as (proxy, server):
            # Playwright adds <-loopback> to Chromium's bypass list, so
            # loopback addresses go through the proxy too (Chromium's own
            # default sends them direct).
            context = browser.new_context(proxy={"server": server}, **options)
            _context_proxies[context] = proxy
            context.set_default_timeout(self.timeout_s * 1000)
            try:
                yield context
            finally:
                context.close()

    @contextlib.contextmanager
    def _proxy(self, browser: PlaywrightBrowser, guard: FetchGuard) -> Iterator[tuple[GuardProxy, str]]:
        """The context's own fetch-guard proxy, and its address as Chromium
        reaches it: through the room's gate in the room, else on loopback."""
        if browser in _in_room:
            with room_proxy(guard, timeout_s=self.timeout_s) as (proxy, server):
                yield proxy, server
        else:
            with GuardProxy(guard, timeout_s=self.timeout_s) as proxy:
                yield proxy, proxy.url

    def readiness(self) -> tuple[bool, str]:
        """(ready, detail) for `kb status`. Never shows the login state itself."""
        try:
            # Only whether Chromium is there: the launch options would make
            # the room's folder and launcher, and probe bwrap.
            check_chromium(self.chromium_path or None)
        except BrowserNotFound as exc:
            return False, str(exc)
        chromium = self.chromium_path or "Playwright's own Chromium"
        try:
            state = load_login_state(Path(self.x_state_path))
        except XLoginMissing as exc:
            return False, f"chromium: {chromium}; {exc}"
        x_cookies = sum(1 for c in state["cookies"] if is_x_host(str(c.get("domain", "")).lstrip("."), self.x_host))
        if not x_cookies:
            return False, f"chromium: {chromium}; the login state at {self.x_state_path} has no {self.x_host} cookie. Run `kb login`."
        return True, f"chromium: {chromium}; X login saved at {self.x_state_path}"

    def sandbox_readiness(self) -> tuple[bool, str]:
        """(sandbox on, detail) for `kb status`: how Chromium runs on this
        machine, and how to fix it when its sandbox cannot run."""
        plan = sandbox_plan(self.chromium_path or None, headless=self.headless)
        return plan.sandbox_on, plan.detail


def watch_navigation(page: Page) -> None:
    """Record the URLs of the page's main-frame navigations (the link, each
    redirect, a script that navigates), for navigation_refusal(). Call it
    before page.goto()."""
    urls: list[str] = []

    def on_request(request) -> None:
        # An event handler only records: a call back into Playwright can deadlock.
        if request.is_navigation_request() and request.frame.parent_frame is None:
            urls.append(request.url)

    page.on("request", on_request)
    _navigations[page] = urls


_navigations: weakref.WeakKeyDictionary[Page, list[str]] = weakref.WeakKeyDictionary()


class PageHeld(PlaywrightTimeout):
    """The page gave no answer in time: a script of the page holds it."""


# What page.content() gives (the doctype, then the root element), read
# through a locator. Hard-won fact (the red team, 7 December 2026):
# page.content() and page.title() have no timeout, and they wait for the
# page's main thread. A page that starts `while (true) {}` after it loaded
# held its worker for 2 hours, until Dagster's longest run time; a CDP
# Runtime.terminateExecution got no answer either. A locator's deadline is
# kept by Playwright's driver, so it ends also when the renderer does not
# answer. The caller then closes the page, and Chromium ends its renderer.
# At most `limit` + 1 characters come back: a page can build more text
# than the reader takes, and the caller refuses a longer one.
_HTML_OF_PAGE = """(root, limit) => {
    const html = (document.doctype ? new XMLSerializer().serializeToString(document.doctype) : '') + root.outerHTML;
    return html.length > limit ? html.slice(0, limit + 1) : html;
}"""


def page_html(page: Page, timeout_s: float, max_chars: int) -> str:
    """The page's HTML, as page.content() gives it, within timeout_s, and
    cut after max_chars + 1 characters. A page that navigates again (a
    script redirect) is read when the new page has loaded. PageHeld when
    the page does not answer in time."""
    try:
        return _evaluate_root(page, _HTML_OF_PAGE, timeout_s, max_chars)
    except PageHeld:
        raise
    except PlaywrightError:
        with contextlib.suppress(PlaywrightError):
            page.wait_for_load_state("domcontentloaded", timeout=timeout_s * 1000)
        return _evaluate_root(page, _HTML_OF_PAGE, timeout_s, max_chars)


def page_title(page: Page, timeout_s: float) -> str:
    """document.title within timeout_s (PageHeld when the page does not answer)."""
    return _evaluate_root(page, "() => document.title", timeout_s)


def _evaluate_root(page: Page, expression: str, timeout_s: float, arg=None):
    try:
        return page.locator(":root").evaluate(expression, arg, timeout=timeout_s * 1000)
    except PlaywrightTimeout:
        raise PageHeld(f"the page gave no answer within {timeout_s:g} s: a script of the page holds it") from None


def navigation_refusal(page: Page, url: str | None = None) -> PrivateAddress | None:
    """Why the fetch-guard proxy refused the page's main document (the link
    `url` or a redirect of it), or None. Subresources that the proxy
    refused do not count: the page itself may still be good."""
    proxy = _context_proxies.get(page.context)
    if proxy is None:
        return None
    urls = ([url] if url else []) + _navigations.get(page, []) + [page.url]
    return next((refusal for u in urls if (refusal := proxy.refusal_for(u))), None)

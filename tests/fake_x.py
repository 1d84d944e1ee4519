"""Loopback servers for the capture tests.

`FakeX` plays the X web client's bookmarks page. GET /i/bookmarks returns a
page whose script does what the X client does: at load it asks
/i/api/graphql/<query id>/Bookmarks?variables={..."cursor"...} for the first
page, renders a tall block per tweet, and asks for the next page (with the
bottom cursor of the last one) each time the user scrolls near the bottom.
The answers are Bookmarks pages from tests/x_fixtures.py, paged by cursor.
The page also calls another GraphQL operation (UserByScreenName), which the
capture must not keep.

With folders set, the bookmarks page also asks BookmarkFoldersSlice, and
GET /i/bookmarks/<folder id> plays a folder page: the same script, with the
operation BookmarkFolderTimeline and the variable bookmark_collection_id, as
the X web client asks (twillot-app/twillot docs/req-res/folders.md).
GET /<handle>/status/<id> plays a post page: it asks TweetDetail with the
variable focalTweetId, and the answer comes from `tweet_details`.

`OtherSite` is a second site. Both record the Cookie header of every request.
"""

from __future__ import annotations

import json
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

from tests.x_fixtures import bookmarks_page, paged_bookmarks

PAGE_SCRIPT = """<!doctype html>
<html><head><title>Bookmarks / X</title></head>
<body style="margin:0">
<div id="timeline"></div>
<script>
const QUERY_ID = %(query_id)s;
const STOP_AFTER = %(stop_after)s;     // the client stops asking after N pages (a stall)
const REFRESH_TOP = %(refresh_top)s;   // ask again for the top, as X does now and then
const OPERATION = %(operation)s;       // Bookmarks, or BookmarkFolderTimeline on a folder page
const FOLDER_ID = %(folder_id)s;
const ASK_FOLDERS = %(ask_folders)s;
let bottomCursor = null, topCursor = null, loading = false, done = false, asked = 0;

function graphqlUrl(operation, queryId, variables) {
  return `/i/api/graphql/${queryId}/${operation}?variables=` + encodeURIComponent(JSON.stringify(variables));
}

function render(data) {
  const timeline = FOLDER_ID ? data.data.bookmark_collection_timeline : data.data.bookmark_timeline_v2;
  const instructions = timeline.timeline.instructions;
  let tweets = 0;
  for (const instruction of instructions) {
    for (const entry of instruction.entries || []) {
      if (entry.entryId.startsWith("tweet-")) {
        const div = document.createElement("article");
        div.style.height = "500px";
        div.textContent = entry.entryId;
        document.getElementById("timeline").appendChild(div);
        tweets++;
      } else if (entry.entryId.startsWith("cursor-bottom-")) {
        bottomCursor = entry.content.value;
      } else if (entry.entryId.startsWith("cursor-top-")) {
        topCursor = entry.content.value;
      }
    }
  }
  return tweets;
}

async function loadMore() {
  if (loading || done) return;
  if (STOP_AFTER && asked >= STOP_AFTER) return;
  loading = true;
  asked++;
  const variables = {count: 20, includePromotedContent: true};
  if (FOLDER_ID) variables.bookmark_collection_id = FOLDER_ID;
  if (bottomCursor) variables.cursor = bottomCursor;
  try {
    const response = await fetch(graphqlUrl(OPERATION, QUERY_ID, variables), {credentials: "include"});
    if (!response.ok) { done = true; return; }   // X shows "Something went wrong"
    const tweets = render(await response.json());
    if (tweets === 0) done = true;
    if (REFRESH_TOP && asked === 1) {
      fetch(graphqlUrl("Bookmarks", QUERY_ID, {count: 20, cursor: topCursor}), {credentials: "include"})
        .then(r => r.json());
    }
  } catch (error) {
    done = true;
  } finally {
    loading = false;
  }
}

window.addEventListener("scroll", () => {
  if (window.innerHeight + window.scrollY >= document.body.scrollHeight - 1000) loadMore();
});
fetch(graphqlUrl("UserByScreenName", "xyzUser1", {screen_name: "owner"}), {credentials: "include"}).then(r => r.json());
if (ASK_FOLDERS) fetch(graphqlUrl("BookmarkFoldersSlice", "i78YDd0Tza", {}), {credentials: "include"}).then(r => r.json());
loadMore();
</script>
</body></html>
"""

POST_SCRIPT = """<!doctype html>
<html><head><title>Post / X</title></head>
<body><div id="conversation"></div>
<script>
const variables = {focalTweetId: %(tweet_id)s, with_rux_injections: false, includePromotedContent: true};
fetch("/i/api/graphql/xyzDetail/TweetDetail?variables=" + encodeURIComponent(JSON.stringify(variables)),
      {credentials: "include"})
  .then(r => r.json())
  .then(data => { document.getElementById("conversation").textContent = "loaded"; })
  .catch(() => {});
</script>
</body></html>
"""


@dataclass
class SeenRequest:
    path: str
    cookie: str


def _start(server: ThreadingHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return thread


class _QuietHandler(BaseHTTPRequestHandler):
    def log_message(self, format, *args):  # keep test output clean
        pass

    def send_body(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)


@dataclass
class FakeXState:
    """What one test sets up and what the server saw."""

    query_id: str = field(default_factory=lambda: secrets.token_urlsafe(16))
    pages: list[bytes] = field(default_factory=list)
    fail_after: int | None = None  # serve this many pages, then fail with fail_mode
    fail_mode: str = "500"  # 500, close (drop the connection), hang (no answer for hang_s)
    hang_s: float = 5.0
    limit_after: int | None = None  # from this page on, answer HTTP 429 ...
    limit_count: int = 0  # ... this many times, then serve again
    limit_headers: dict[str, str] = field(default_factory=dict)  # retry-after, x-rate-limit-reset
    limited: list[int] = field(default_factory=list)  # the page index of each 429 answer
    stop_after: int = 0  # the page script stops asking after this many pages
    refresh_top: bool = False
    seen: list[SeenRequest] = field(default_factory=list)
    served_pages: list[int] = field(default_factory=list)
    # Folders: None is an account without folders (the page asks for none).
    folders: list[dict] | None = None  # the items of BookmarkFoldersSlice: {"id", "name"}
    folder_pages: dict[str, list[bytes]] = field(default_factory=dict)  # folder id -> pages by cursor
    folder_limit_count: int = 0  # answer this many folder page requests with HTTP 429 first
    served_folder_pages: list[tuple[str, int]] = field(default_factory=list)
    # TweetDetail answers by focal post id; another id gets HTTP 404.
    tweet_details: dict[str, bytes] = field(default_factory=dict)
    detail_limit_count: int = 0  # answer this many TweetDetail requests with HTTP 429 first
    asked_details: list[str] = field(default_factory=list)


class FakeX:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.state = FakeXState()
        self._stopping = threading.Event()
        fake = self

        class Handler(_QuietHandler):
            def do_GET(self):
                fake.handle(self)

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        _start(self.server)

    def reset(self) -> FakeXState:
        self.state = FakeXState()
        return self.state

    def serve_entries(self, entries: list[dict], page_size: int = 20) -> list[bytes]:
        """Serve these tweet entries as Bookmarks pages; returns the page bytes."""
        self.state.pages = [json.dumps(page).encode() for page in paged_bookmarks(entries, page_size)]
        return self.state.pages

    def serve_folders(self, folders: dict[str, tuple[str, list[dict]]], page_size: int = 20) -> None:
        """Serve these folders: {folder id: (name, tweet entries)}."""
        self.state.folders = [{"id": folder_id, "name": name} for folder_id, (name, _) in folders.items()]
        self.state.folder_pages = {folder_id: [json.dumps(page).encode() for page in
                                               paged_bookmarks(entries, page_size, folder=True)]
                                   for folder_id, (_, entries) in folders.items()}

    def stop(self) -> None:
        self._stopping.set()
        self.server.shutdown()
        self.server.server_close()

    # --- request handling --------------------------------------------------------

    def handle(self, request: _QuietHandler) -> None:
        state = self.state
        url = urlsplit(request.path)
        state.seen.append(SeenRequest(url.path, request.headers.get("Cookie", "")))
        parts = url.path.strip("/").split("/")
        if url.path == "/i/bookmarks" or (len(parts) == 3 and parts[:2] == ["i", "bookmarks"]):
            folder_id = parts[2] if len(parts) == 3 else None
            html = PAGE_SCRIPT % {
                "query_id": json.dumps(state.query_id),
                "stop_after": state.stop_after,
                "refresh_top": json.dumps(state.refresh_top),
                "operation": json.dumps("BookmarkFolderTimeline" if folder_id else "Bookmarks"),
                "folder_id": json.dumps(folder_id),
                "ask_folders": json.dumps(folder_id is None and state.folders is not None),
            }
            request.send_body(200, html.encode(), "text/html; charset=utf-8")
        elif len(parts) == 3 and parts[1] == "status":
            request.send_body(200, (POST_SCRIPT % {"tweet_id": json.dumps(parts[2])}).encode(),
                              "text/html; charset=utf-8")
        elif url.path == "/leave":
            request.send_response(302)
            request.send_header("Location", url.query)  # /leave?http://other/...
            request.end_headers()
        elif len(parts) == 5 and parts[:3] == ["i", "api", "graphql"] and parts[4] == "Bookmarks":
            self._bookmarks(request, url.query)
        elif len(parts) == 5 and parts[:3] == ["i", "api", "graphql"] and parts[4] == "BookmarkFoldersSlice":
            body = {"data": {"viewer": {"user_results": {"result": {
                "__typename": "User", "bookmark_collections_slice": {"items": state.folders or [], "slice_info": {}}}}}}}
            request.send_body(200, json.dumps(body).encode(), "application/json")
        elif len(parts) == 5 and parts[:3] == ["i", "api", "graphql"] and parts[4] == "BookmarkFolderTimeline":
            self._folder_page(request, url.query)
        elif len(parts) == 5 and parts[:3] == ["i", "api", "graphql"] and parts[4] == "TweetDetail":
            self._tweet_detail(request, url.query)
        elif len(parts) == 5 and parts[:3] == ["i", "api", "graphql"]:
            body = json.dumps({"data": {"user": {"result": {"rest_id": "1", "legacy": {"screen_name": "owner"}}}}})
            request.send_body(200, body.encode(), "application/json")
        else:
            request.send_body(404, b"not found", "text/plain")

    def _bookmarks(self, request: _QuietHandler, query: str) -> None:
        state = self.state
        variables = json.loads(parse_qs(query).get("variables", ["{}"])[0])
        cursor = variables.get("cursor")
        if cursor and cursor.startswith("top-"):
            # X asks the top again for new bookmarks; there are none.
            body = json.dumps(bookmarks_page([], bottom_cursor=None, page_no=0)).encode()
            request.send_body(200, body, "application/json")
            return
        index = 0 if cursor is None else int(cursor.removeprefix("page-"))
        if state.limit_after is not None and index >= state.limit_after and state.limit_count > 0:
            # X's answer to too many requests: 429 with its rate-limit headers.
            state.limit_count -= 1
            state.limited.append(index)
            self._rate_limited(request)
            return
        if state.fail_after is not None and index >= state.fail_after:
            if state.fail_mode == "500":
                request.send_body(500, b'{"errors":[{"message":"Internal error"}]}', "application/json")
            elif state.fail_mode == "hang":
                self._stopping.wait(state.hang_s)
                request.close_connection = True
            else:  # close: drop the connection with no answer
                request.close_connection = True
            return
        if not state.pages:
            request.send_body(404, b'{"errors":[{"message":"no pages set up"}]}', "application/json")
            return
        index = min(index, len(state.pages) - 1)  # past the end: the empty last page again
        state.served_pages.append(index)
        request.send_body(200, state.pages[index], "application/json")

    def _rate_limited(self, request: _QuietHandler) -> None:
        """X's answer to too many requests: 429 with its rate-limit headers."""
        body = b'{"errors":[{"message":"Rate limit exceeded","code":88}]}'
        request.send_response(429)
        for name, value in {"Content-Type": "application/json", "Content-Length": str(len(body)),
                            **self.state.limit_headers}.items():
            request.send_header(name, value)
        request.end_headers()
        request.wfile.write(body)

    def _folder_page(self, request: _QuietHandler, query: str) -> None:
        state = self.state
        variables = json.loads(parse_qs(query).get("variables", ["{}"])[0])
        pages = state.folder_pages.get(str(variables.get("bookmark_collection_id")))
        if not pages:
            request.send_body(404, b'{"errors":[{"message":"no such folder"}]}', "application/json")
            return
        if state.folder_limit_count > 0:
            state.folder_limit_count -= 1
            self._rate_limited(request)
            return
        cursor = variables.get("cursor")
        index = 0 if cursor is None else min(int(cursor.removeprefix("page-")), len(pages) - 1)
        state.served_folder_pages.append((str(variables["bookmark_collection_id"]), index))
        request.send_body(200, pages[index], "application/json")

    def _tweet_detail(self, request: _QuietHandler, query: str) -> None:
        state = self.state
        focal = str(json.loads(parse_qs(query).get("variables", ["{}"])[0]).get("focalTweetId"))
        state.asked_details.append(focal)
        if state.detail_limit_count > 0:
            state.detail_limit_count -= 1
            self._rate_limited(request)
            return
        body = state.tweet_details.get(focal)
        if body is None:
            request.send_body(404, b'{"errors":[{"message":"no such post"}]}', "application/json")
            return
        request.send_body(200, body, "application/json")

    # --- what the server saw ------------------------------------------------------

    def cookies_on(self, path_prefix: str) -> list[str]:
        return [seen.cookie for seen in self.state.seen if seen.path.startswith(path_prefix)]


class OtherSite:
    """A site that is not X. It records the Cookie header of each request."""

    def __init__(self, host: str = "localhost") -> None:
        self.seen: list[SeenRequest] = []
        site = self

        class Handler(_QuietHandler):
            def do_GET(self):
                site.seen.append(SeenRequest(self.path, self.headers.get("Cookie", "")))
                self.send_body(200, b"<!doctype html><p>another site</p>", "text/html")

        # Bind loopback; the browser reaches it by another host name, so
        # cookies (which are per host, not per port) cannot be shared.
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.url = f"http://{host}:{self.port}"
        _start(self.server)

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


"""The MCP server, through a real MCP client over stdio.

The server runs as a subprocess (`python -m mcp_server.server`) with its own
KB_HOME. The corpus is written into a real LanceDB index with the same calls
that the index assets make (ChunkIndex.replace_chunks, upsert_bookmark_cards,
the wiki_index asset), embedded with the deterministic `hash` backend, so no
model loads. A server start costs seconds, so one server serves every test:
it starts on an empty KB_HOME, and the corpus is written under it."""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from kb.index.chunking import chunk_text
from kb.index.reading import PAGE_CHARS
from kb.index.search import search
from kb.wiki_files import wiki_page_files
from kb_assets.index.wiki_index import wiki_index
from kb.store.duckdb_store import DuckDBStore
from kb.index.embedder import Embedder
from kb.index.client import ChunkIndex
from kb.wiki.repo import Wiki
from kb_resources.services import EmbedderResource
from kb_resources.stores import ChunkIndexResource, WikiResource

pytestmark = pytest.mark.slow  # slow: kb or a server in another process

T0 = datetime(2024, 3, 1, tzinfo=timezone.utc)
SYNCED = datetime(2024, 4, 2, 6, 30, tzinfo=timezone.utc)
BLOG = "https://blog.example.org/rust-borrow-checker"
CHANGELOG = "https://example.com/changelog"
PHOTO = "https://pbs.twimg.com/media/borrow.jpg"
VIDEO_REF = "https://www.youtube.com/watch?v=k8s"
RARE = "zanzibarquux"
# The issue: one answer never exceeds a bounded page of about 2,000 words.
PAGE_WORDS = 2000
CHANGELOG_WORDS = 10_000


# --- the corpus -------------------------------------------------------------------
def post_url(author: str, tweet_id: str) -> str:
    return f"https://x.com/{author}/status/{tweet_id}"


def rows_of(tweet_id: str, author: str, created_at: datetime, source: str, ref: str, texts: list[str],
            **extra) -> list[dict]:
    return [{"chunk_id": f"{tweet_id}-{source}-{ref}-{position}", "tweet_id": tweet_id,
             "url": post_url(author, tweet_id), "author": author, "created_at": created_at, "source": source,
             "ref": ref, "position": position, "text": text, **extra} for position, text in enumerate(texts)]


def post(tweet_id: str, author: str, created_at: datetime, text: str, **extra) -> list[dict]:
    return rows_of(tweet_id, author, created_at, "post", post_url(author, tweet_id), [text], **extra)


def changelog_text() -> str:
    """10,000 distinct words in paragraphs of 20 to 90 words, with sentence
    ends; each paragraph starts with `release`, one word deep inside is rare."""
    rng = random.Random(7)
    words = [f"change{i}" for i in range(CHANGELOG_WORDS)]
    words[7001] = RARE
    paragraphs, start = [], 0
    while start < len(words):
        size = rng.randint(20, 90)
        part = words[start:start + size]
        part[0] = "release" if start else part[0]
        sentences = [" ".join(part[i:i + 12]) + "." for i in range(0, len(part), 12)]
        paragraphs.append(" ".join(sentences))
        start += size
    return "\n\n".join(paragraphs)


def build_corpus(home: Path) -> dict:
    index = ChunkIndex.from_settings(path=str(home / "lancedb"))
    embedder = Embedder.from_settings(backend="hash", cache_dir=str(home / "lancedb"))
    changelog = changelog_text()
    changelog_passages = chunk_text(changelog)
    post_104 = "Release notes of the big project, worth a read: " + CHANGELOG
    rows = (
        post("101", "alice", T0, "Rust ownership and the borrow checker, explained with small examples")
        + rows_of("101", "alice", T0, "link", BLOG,
                  ["The borrow checker rejects two mutable references to one value.",
                   "Lifetimes tell the compiler how long a reference lives."])
        + rows_of("101", "alice", T0, "image", PHOTO,
                  ["A diagram of the borrow checker. Text in the image: fn main() { let r = &mut x; }"])
        + post("102", "bob", T0 + timedelta(days=3), "Sourdough bread: feeding the starter and shaping the loaf")
        + post("103", "carol", T0 - timedelta(days=3), "A talk on cluster operators")
        + rows_of("103", "carol", T0 - timedelta(days=3), "video", VIDEO_REF,
                  ["Kubernetes operators reconcile the cluster state in a control loop, and rust is not involved"])
        + post("104", "dave", T0 + timedelta(days=10), post_104)
        + rows_of("104", "dave", T0 + timedelta(days=10), "link", CHANGELOG, changelog_passages)
        # A second bookmark links to the same page: the page is stored once per bookmark.
        + post("106", "erin", T0 + timedelta(days=12), "The changelog again " + CHANGELOG)
        + rows_of("106", "erin", T0 + timedelta(days=12), "link", CHANGELOG, changelog_passages)
        + post("105", "frank", T0 + timedelta(days=20), "The borrow checker checks references at compile time",
               lang="de", source_text="Der Borrow-Checker prüft Referenzen beim Kompilieren")
    )
    # Several commits, as several sync batches make: the later rows are not
    # in the full-text index yet, and search must still find them.
    for tweet_ids in (["101", "102", "103"], ["104", "106"], ["105"]):
        index.replace_chunks(tweet_ids, [r for r in rows if r["tweet_id"] in tweet_ids], embedder)
    index.upsert_bookmark_cards([
        {"tweet_id": "101", "url": post_url("alice", "101"), "author": "alice", "author_name": "Alice A.",
         "created_at": T0, "text": "Rust ownership and the borrow checker, explained with small examples",
         "lang": "en", "last_sync": SYNCED - timedelta(days=1),
         "quoted": {"tweet_id": "99", "author": "rustlang", "author_name": "Rust", "text": "Rust 1.80 is out"},
         "article": None,
         "links": [{"url": BLOG, "kind": "link", "from_quote": False, "title": "The borrow checker"}],
         "media": [{"kind": "photo", "url": PHOTO, "alt_text": "", "video_url": None, "from_quote": False},
                   {"kind": "video", "url": "https://pbs.twimg.com/v.jpg", "alt_text": "",
                    "video_url": "https://video.twimg.com/v.mp4", "from_quote": False}]},
        {"tweet_id": "104", "url": post_url("dave", "104"), "author": "dave", "author_name": "Dave",
         "created_at": T0 + timedelta(days=10), "text": post_104, "lang": "en", "last_sync": SYNCED,
         "links": [{"url": CHANGELOG, "kind": "link", "from_quote": False, "title": "Changelog"}], "media": []},
    ])
    index.maintain()
    return {"changelog": changelog, "post_104": post_104, "changelog_passages": changelog_passages}


def write_wiki(home: Path) -> Path:
    root = home / "wiki"
    pages = {
        "wiki/concepts/vector-search.md": "---\ntype: concept\ncreated: 2026-11-01\nlast_updated: 2026-11-20\n"
                                          "---\n# vector search\n\n"
                                          "Vector search finds near neighbours with hnsw graphs. [[sources/a#para1]]\n",
        "wiki/entities/Ada Lovelace.md": "---\ntype: entity\nname: \"Ada Lovelace\"\nkind: person\n---\n"
                                         "# Ada Lovelace\n\nShe wrote the first program for the Analytical Engine.\n",
        "wiki/sources/long-page.md": "---\ntype: source\ntitle: \"A long page\"\ningested_at: 2026-11-21T08:30:00+01:00\n---\n"
                                     + "\n\n".join(" ".join(f"page{p}word{i}" for i in range(50)) for p in range(60)),
    }
    for rel, text in pages.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "index.md").write_text("# Index\n\n- [[concepts/vector-search]]\n")
    (root / "raw" / "parsed").mkdir(parents=True)
    (root / "raw" / "parsed" / "notes.txt").write_text("not a page")
    # A file outside the wiki, and a link to it from inside.
    (home / "secret.md").write_text("TOPSECRET outside the wiki")
    (root / "wiki" / "concepts" / "escape.md").symlink_to(home / "secret.md")
    return root


def materialize_wiki_index(home: Path) -> dg.ExecuteInProcessResult:
    return dg.materialize([wiki_index], resources={
        "wiki": WikiResource.from_settings(path=str(home / "wiki")),
        "embedder": EmbedderResource.from_settings(backend="hash", cache_dir=str(home / "lancedb")),
        "lance": ChunkIndexResource.from_settings(path=str(home / "lancedb")),
    })


# --- a real MCP client over stdio, in a background thread ---------------------------
class McpClient:
    """A ClientSession to `python -m mcp_server.server` over stdio. The
    session lives in its own event loop thread, so the sync tests can share
    one server."""

    def __init__(self, home: Path, errlog: Path, extra_env: dict[str, str] | None = None):
        self.home, self.errlog_path = home, errlog
        self.extra_env = extra_env or {}
        self.stream_errors: list[Exception] = []
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_until_complete, args=(self._main(),), daemon=True)

    def start(self) -> McpClient:
        self._thread.start()
        return self

    def wait_ready(self) -> McpClient:
        if not self._ready.wait(60) or self._failure:
            raise RuntimeError(f"the MCP server did not start: {self._failure!r}\n{self.stderr()}")
        return self

    def close(self) -> None:
        if self._ready.is_set():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def __enter__(self) -> McpClient:
        return self.start().wait_ready()

    def __exit__(self, *exc) -> None:
        self.close()

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        # An empty settings file: the server never reads the owner's ~/.config/kb/.env.
        env_file = self.home.parent / "empty.env"
        env_file.touch()
        env = {"KB_HOME": str(self.home), "KB_EMBED_BACKEND": "hash", "KB_CONFIG_FILE": str(self.home / "none.toml"),
               "KB_ENV_FILE": str(env_file), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               # A worktree's copy of the code, when PYTHONPATH names it: else the server is the installed one.
               **({"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}),
               **self.extra_env}
        params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server.server"], env=env,
                                       cwd=str(self.home.parent))
        try:
            with open(self.errlog_path, "w") as errlog:
                async with stdio_client(params, errlog=errlog) as (read, write):
                    async with ClientSession(read, write, message_handler=self._on_message) as session:
                        await session.initialize()
                        self.session = session
                        self._ready.set()
                        await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - reported by __enter__ or the test
            self._failure = exc
            self._ready.set()

    async def _on_message(self, message) -> None:
        # A line on stdout that is not an MCP message arrives here.
        if isinstance(message, Exception):
            self.stream_errors.append(message)

    def call(self, tool: str, **arguments):
        future = asyncio.run_coroutine_threadsafe(self.session.call_tool(tool, arguments), self._loop)
        return future.result(timeout=60)

    def ok(self, tool: str, **arguments) -> dict:
        result = self.call(tool, **arguments)
        assert not result.is_error, f"{tool}{arguments}: {result.content}"
        # The text content is the same JSON that structured_content holds.
        assert json.loads(result.content[0].text) == result.structured_content
        return result.structured_content

    def error(self, tool: str, **arguments) -> str:
        result = self.call(tool, **arguments)
        assert result.is_error, f"{tool}{arguments} did not fail: {result.structured_content}"
        return result.content[0].text

    def list_tools(self):
        return asyncio.run_coroutine_threadsafe(self.session.list_tools(), self._loop).result(timeout=60)

    def stderr(self) -> str:
        return self.errlog_path.read_text() if self.errlog_path.exists() else ""

    def server_pid(self) -> int:
        """The server process: a child of this process with our KB_HOME."""
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                stat = (proc / "stat").read_text()
                environ = (proc / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and f"KB_HOME={self.home}".encode() in environ:
                return int(proc.name)
        raise AssertionError("the server process is not running")


def open_files(pid: int) -> set[str]:
    out = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            out.add(os.readlink(fd))
        except OSError:
            pass
    return out


def tree(home: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(home)): (p.lstat().st_size, p.lstat().st_mtime_ns) for p in home.rglob("*")}


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    home = tmp_path_factory.mktemp("mcp") / "kb_home"
    home.mkdir()
    return home


@pytest.fixture(scope="module")
def server(home):
    """The server starts before the first sync, as it may on the owner's
    machine. Its answers on the empty home are kept for
    test_server_started_before_the_first_sync; then the corpus is written
    under the running server."""
    with McpClient(home, home.parent / "server.stderr") as mcp:
        mcp.empty_home_answers = {
            "search_bookmarks": mcp.call("search_bookmarks", query="rust"),
            "search_wiki": mcp.call("search_wiki", query="rust"),
            "bad_date": mcp.call("search_bookmarks", query="rust", after="soon"),
            "get_bookmark": mcp.call("get_bookmark", tweet_id="101"),
            "read_document": mcp.call("read_document", tweet_id_or_url="101"),
            "read_wiki_page": mcp.call("read_wiki_page", path="concepts/vector-search"),
        }
        mcp.empty_home_files = sorted(p.name for p in home.iterdir())
        yield mcp


@pytest.fixture(scope="module")
def corpus(home, server) -> dict:
    facts = build_corpus(home)
    write_wiki(home)
    # The asset function itself: a whole Dagster run costs seconds, and
    # test_wiki_index_removes_deleted_pages runs the asset through Dagster.
    wiki_index(dg.build_asset_context(), wiki=WikiResource.from_settings(path=str(home / "wiki")),
               embedder=EmbedderResource.from_settings(backend="hash", cache_dir=str(home / "lancedb")),
               lance=ChunkIndexResource.from_settings(path=str(home / "lancedb")))
    return {"home": home, **facts}


@pytest.fixture(scope="module")
def client(server, corpus) -> McpClient:
    return server


# --- the tools ---------------------------------------------------------------------
def test_tools_are_listed_as_read_only(client):
    tools = {tool.name: tool for tool in client.list_tools().tools}
    assert set(tools) == {"search_bookmarks", "get_bookmark", "read_document", "search_wiki", "read_wiki_page"}
    assert all(tool.annotations.read_only_hint for tool in tools.values())
    params = tools["search_bookmarks"].input_schema["properties"]
    assert set(params) == {"query", "limit", "author", "source", "after", "before", "folder", "rerank"}
    assert set(tools["read_document"].input_schema["properties"]) == {"tweet_id_or_url", "query", "offset"}


def test_search_bookmarks_hits_and_last_sync(client):
    response = client.ok("search_bookmarks", query="borrow checker mutable references", rerank=False)
    assert response["last_sync"] == SYNCED.isoformat() and response["search_mode"] == "fast"
    # The model of the index, beside last_sync (issue 48).
    assert response["index_model"].startswith("hash:")  # the server embeds with KB_EMBED_BACKEND=hash
    hits = {h["tweet_id"]: h for h in response["hits"]}
    assert response["hits"][0]["tweet_id"] == "101"
    hit = hits["101"]
    assert set(hit) == {"tweet_id", "url", "author", "created_at", "score", "best_source", "best_chunk", "best_ref",
                        "chunk_count", "word_count", "media", "lang", "best_source_text"}
    assert hit["best_source"] == "link" and hit["best_ref"] == BLOG
    assert hit["best_chunk"] == "The borrow checker rejects two mutable references to one value."
    assert hit["url"] == post_url("alice", "101") and hit["author"] == "alice"
    assert hit["created_at"] == T0.isoformat()
    assert hit["chunk_count"] == 4 and hit["media"][0]["url"] == PHOTO
    # One best passage per bookmark, never a wiki page.
    assert len(hits) == len(response["hits"])
    assert not any(h["tweet_id"].startswith("wiki:") for h in response["hits"])


def test_search_bookmarks_deep_search_is_the_default(client):
    """The default is the deep search (issue 49): the cross-encoder scores the
    first hits; the same bookmarks as the fast search, each with its
    rerank_score, the best first. rerank=false gives the fast search. The
    answer says which one ran."""
    query = "borrow checker mutable references"
    plain = client.ok("search_bookmarks", query=query, rerank=False)
    default = client.ok("search_bookmarks", query=query)
    assert client.ok("search_bookmarks", query=query, rerank=True) == default
    assert plain["search_mode"] == "fast" and default["search_mode"] == "deep"
    assert "note" not in default
    deep = default["hits"]
    assert "rerank_score" not in plain["hits"][0]
    assert {h["tweet_id"] for h in deep} == {h["tweet_id"] for h in plain["hits"]}
    assert all(isinstance(h["rerank_score"], float) for h in deep)
    assert deep[0]["tweet_id"] == "101" and deep[0]["rerank_score"] == max(h["rerank_score"] for h in deep)


def test_search_bookmarks_without_the_cross_encoder_gives_the_fast_search(corpus, monkeypatch, tmp_path):
    """A cross-encoder that does not load (here: a model folder without its
    files) makes no failed call: the answer comes from the fast search, and
    says so and why."""
    from mcp_server import server as mcp

    home = corpus["home"]
    for name, value in {"KB_HOME": str(home), "KB_EMBED_BACKEND": "hash", "KB_CONFIG_FILE": str(home / "none.toml"),
                        "KB_ENV_FILE": str(home.parent / "empty.env"), "KB_RERANK_MODEL": str(tmp_path)}.items():
        monkeypatch.setenv(name, value)
    answer = mcp.search_bookmarks("borrow checker mutable references")
    assert answer["search_mode"] == "fast" and answer["hits"][0]["tweet_id"] == "101"
    assert "rerank_score" not in answer["hits"][0]
    assert "deep search is not available" in answer["note"] and "has no model.onnx" in answer["note"]


def test_search_bookmarks_gives_the_original_of_a_translated_passage(client):
    hit = client.ok("search_bookmarks", query="checks references at compile time", limit=1)["hits"][0]
    assert hit["tweet_id"] == "105" and hit["lang"] == "de"
    assert hit["best_source_text"] == "Der Borrow-Checker prüft Referenzen beim Kompilieren"


def test_search_bookmarks_filters(client):
    def ids(**filters) -> list[str]:
        hits = client.ok("search_bookmarks", query="rust borrow checker sourdough kubernetes release", **filters)["hits"]
        return sorted(h["tweet_id"] for h in hits)

    assert ids(author="bob") == ["102"]
    assert ids(author="@Alice") == ["101"]
    # Filters apply before ranking: the video passage is a weak match, and it is found.
    assert ids(source="video") == ["103"]
    assert ids(source="video,image") == ["101", "103"]
    # after is inclusive and before exclusive, on the post date. 101 is at 2024-03-01T00:00Z.
    assert ids(after="2024-03-01", before="2024-03-04") == ["101"]
    assert ids(before="2024-03-01") == ["103"]
    assert ids(after="2024-03-04", before="2024-03-11T00:00:01Z") == ["102", "104"]
    assert ids(after="2024-03-21") == ["105"]
    response = client.ok("search_bookmarks", query="rust", limit=500)
    assert response["limit"] == 100
    assert client.ok("search_bookmarks", query="rust", author="nobody")["hits"] == []


def test_get_bookmark(client):
    card = client.ok("get_bookmark", tweet_id="101")
    assert card["text"] == "Rust ownership and the borrow checker, explained with small examples"
    assert card["author"] == "alice" and card["author_name"] == "Alice A." and card["created_at"] == T0.isoformat()
    assert card["quoted"] == {"tweet_id": "99", "author": "rustlang", "author_name": "Rust", "text": "Rust 1.80 is out"}
    assert card["links"] == [{"url": BLOG, "kind": "link", "from_quote": False, "title": "The borrow checker"}]
    photo, video = card["media"]
    assert photo["caption"].startswith("A diagram of the borrow checker.")
    assert "caption" not in video and video["video_url"] == "https://video.twimg.com/v.mp4"
    assert card["last_sync"] == SYNCED.isoformat()
    # The post URL works too.
    assert client.ok("get_bookmark", tweet_id=post_url("alice", "101") + "?s=20")["tweet_id"] == "101"


def test_get_bookmark_holds_no_document_body(client, corpus):
    result = client.call("get_bookmark", tweet_id="104")
    card = result.structured_content
    assert card["documents"] == [
        {"source": "post", "ref": post_url("dave", "104"), "passages": 1, "words": len(corpus["post_104"].split())},
        {"source": "link", "ref": CHANGELOG, "passages": len(corpus["changelog_passages"]),
         "words": CHANGELOG_WORDS},
    ]
    assert RARE not in result.content[0].text and "change5000" not in result.content[0].text
    assert len(result.content[0].text) < 3000


def _read_all(client, target: str) -> list[dict]:
    pages, offset = [], 0
    while True:
        page = client.ok("read_document", tweet_id_or_url=target, offset=offset)
        pages.append(page)
        assert page["offset"] == offset
        if not page["has_more"]:
            assert page["next_offset"] is None
            return pages
        assert page["next_offset"] == offset + page["page_words"]
        offset = page["next_offset"]
        assert len(pages) < 50


def _words(pages: list[dict]) -> list[str]:
    return [w for page in pages for part in page["parts"] for w in part["text"].split()]


def test_read_document_pages_to_the_end_of_a_long_document(client, corpus):
    pages = _read_all(client, "104")
    expected = corpus["post_104"].split() + corpus["changelog"].split()
    assert len(pages) >= len(expected) // PAGE_WORDS
    for page in pages:
        assert page["page_words"] <= PAGE_WORDS
        assert sum(len(part["text"]) for part in page["parts"]) <= PAGE_CHARS
        assert len(_words([page])) == page["page_words"]
        assert page["total_words"] == len(expected) and page["last_sync"] == SYNCED.isoformat()
    # The post comes first; joined, the pages are the whole text: no word lost, none twice.
    assert pages[0]["parts"][0]["source"] == "post"
    assert _words(pages) == expected
    # Pages end at passage ends where they can: few passages are cut.
    cut = [part for page in pages for part in page["parts"] if not part["whole_passage"]]
    assert len(cut) <= 2


def test_read_document_by_page_url(client, corpus):
    # Two bookmarks link to the changelog; its URL reads the page once.
    pages = _read_all(client, CHANGELOG)
    assert _words(pages) == corpus["changelog"].split()
    assert pages[0]["ref"] == CHANGELOG and pages[0]["total_words"] == CHANGELOG_WORDS
    # The post URL reads the bookmark with all its texts.
    page = client.ok("read_document", tweet_id_or_url=post_url("alice", "101"))
    assert [p["source"] for p in page["parts"]] == ["post", "link", "link", "image"]
    assert not page["has_more"]


def test_read_document_with_a_query(client):
    response = client.ok("read_document", tweet_id_or_url="104", query=RARE)
    best = response["passages"][0]
    assert RARE in best["text"] and best["ref"] == CHANGELOG
    # The offset of a passage reads on from there.
    page = client.ok("read_document", tweet_id_or_url="104", offset=best["offset"])
    assert page["parts"][0]["text"] == best["text"]
    # A query that every passage matches stays within one page bound.
    response = client.ok("read_document", tweet_id_or_url="104", query="release")
    assert response["has_more"] and 0 < response["page_words"] <= PAGE_WORDS
    assert sum(len(p["text"].split()) for p in response["passages"]) == response["page_words"]
    # Restricted to the document: another bookmark's passages never appear.
    response = client.ok("read_document", tweet_id_or_url="101", query="release changelog kubernetes")
    assert {p["ref"] for p in response["passages"]} <= {post_url("alice", "101"), BLOG, PHOTO}


def test_search_wiki_and_read_wiki_page(client):
    response = client.ok("search_wiki", query="hnsw near neighbours")
    assert response["pages"][0]["path"] == "wiki/concepts/vector-search.md"
    assert response["pages"][0]["date"] == "2026-11-20T00:00:00+00:00"
    paths = {p["path"] for p in client.ok("search_wiki", query="TOPSECRET outside the wiki")["pages"]}
    assert "wiki/concepts/escape.md" not in paths  # the link out of the wiki is not indexed
    page = client.ok("read_wiki_page", path=response["pages"][0]["path"])
    assert page["type"] == "concept" and "hnsw graphs" in page["text"] and not page["has_more"]
    # The page's date is its `last_updated`, as the index dates its passages.
    assert page["date"] == response["pages"][0]["date"] and page["links"] == ["sources/a"]
    # A link target names the same page.
    assert client.ok("read_wiki_page", path="concepts/vector-search#para1")["text"] == page["text"]
    ada = client.ok("read_wiki_page", path="entities/Ada Lovelace")
    assert ada["title"] == "Ada Lovelace" and "Analytical Engine" in ada["text"]
    # The wiki pages are not bookmarks.
    hits = client.ok("search_bookmarks", query="Analytical Engine Lovelace", limit=100)["hits"]
    assert hits and not any(h["best_source"] == "wiki" or h["tweet_id"].startswith("wiki:") for h in hits)


def test_read_wiki_page_pages_a_long_page(client, corpus):
    texts, offset = [], 0
    while True:
        page = client.ok("read_wiki_page", path="wiki/sources/long-page.md", offset=offset)
        assert page["page_words"] <= PAGE_WORDS and len(page["text"]) <= PAGE_CHARS
        texts.append(page["text"])
        if not page["has_more"]:
            break
        offset = page["next_offset"]
    assert len(texts) >= 2
    whole = (corpus["home"] / "wiki" / "wiki" / "sources" / "long-page.md").read_text()
    assert " ".join(texts).split() == whole.split()


@pytest.mark.parametrize("path, reason", [
    ("../secret.md", "leaves the wiki folder"),
    ("wiki/../../secret.md", "leaves the wiki folder"),
    ("/etc/passwd", "is absolute"),
    (r"C:\Windows\win.ini", "is absolute"),
    ("~/secret.md", "is absolute"),
    (".git/config", "hidden file"),
    ("wiki/concepts/escape.md", "leaves the wiki folder"),
    ("raw/parsed/notes.txt", "not a Markdown page"),
    ("concepts/no-such-page", "is not a wiki page"),
    ("  ", "path is empty"),
])
def test_read_wiki_page_refuses_paths_outside_the_wiki(client, path, reason):
    message = client.error("read_wiki_page", path=path)
    assert reason in message
    assert "TOPSECRET" not in message


def test_bad_input_gets_a_clear_error(client):
    assert "tweet_id='42' is not in the index" in client.error("get_bookmark", tweet_id="42")
    assert "is not in the index" in client.error("read_document", tweet_id_or_url="42")
    assert "no bookmark and no page has this URL" in client.error(
        "read_document", tweet_id_or_url="https://example.com/unknown")
    assert "query is empty" in client.error("search_bookmarks", query="   ")
    assert "query is empty" in client.error("search_wiki", query="")
    assert "query is empty" in client.error("read_document", tweet_id_or_url="104", query=" ")
    assert "after='yesterday' is not a date" in client.error("search_bookmarks", query="rust", after="yesterday")
    assert "before='2024-13-45'" in client.error("search_bookmarks", query="rust", before="2024-13-45")
    assert "limit=0" in client.error("search_bookmarks", query="rust", limit=0)
    assert "offset=-1" in client.error("read_document", tweet_id_or_url="104", offset=-1)
    assert "past the end" in client.error("read_document", tweet_id_or_url="104", offset=10**6)
    assert "use search_wiki" in client.error("search_bookmarks", query="vector", source="wiki")
    assert "is a wiki page" in client.error("get_bookmark", tweet_id="wiki:wiki/concepts/vector-search.md")


def test_no_tool_writes_and_logs_stay_off_stdout(client, corpus):
    home = corpus["home"]
    before = tree(home)
    client.ok("search_bookmarks", query="borrow checker")
    client.ok("get_bookmark", tweet_id="101")
    client.ok("read_document", tweet_id_or_url="104", offset=2000)
    client.ok("read_document", tweet_id_or_url="104", query="release")
    client.ok("search_wiki", query="vector search")
    client.ok("read_wiki_page", path="concepts/vector-search")
    assert tree(home) == before
    # Every line on stdout was an MCP message; the logs went to stderr.
    assert client.stream_errors == []
    assert "kb-mcp serves the index at" in client.stderr()
    assert "search_bookmarks:" in client.stderr()


# --- before the first sync, and while a sync runs ------------------------------------------
def test_server_started_before_the_first_sync(server):
    answers = server.empty_home_answers
    # Nothing is indexed yet: empty answers, clear errors, and the server created no file.
    assert answers["search_bookmarks"].structured_content["hits"] == []
    assert answers["search_wiki"].structured_content["pages"] == []
    assert answers["bad_date"].is_error and "after='soon' is not a date" in answers["bad_date"].content[0].text
    assert answers["get_bookmark"].is_error and "is not in the index" in answers["get_bookmark"].content[0].text
    assert answers["read_document"].is_error and "the index is empty" in answers["read_document"].content[0].text
    assert "the wiki does not exist yet" in answers["read_wiki_page"].content[0].text
    assert server.empty_home_files == []


def test_calls_while_the_index_is_written(client, home):
    index = ChunkIndex.from_settings(path=str(home / "lancedb"))
    embedder = Embedder.from_settings(backend="hash", cache_dir=str(home / "lancedb"))

    def version(n: int) -> list[dict]:
        # Each version of bookmark 200 has its own number of passages and one word throughout.
        word = f"alpha{n}"
        return rows_of("200", "gina", T0, "link", "https://example.com/v",
                       [f"{word} passage {i} " + f"{word} " * 30 for i in range(20 + n % 7)])

    index.replace_chunks(["200"], version(0), embedder)
    writes = [0]
    stop = threading.Event()
    failures: list[BaseException] = []

    def writer() -> None:
        try:
            n = 1
            while not stop.is_set():
                index.replace_chunks(["200"], version(n), embedder)
                writes[0] = n
                n += 1
        except BaseException as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    try:
        # A sync holds the DuckDB file: a server that opened it would fail.
        with DuckDBStore.from_settings(path=str(home / "kb.duckdb")).transaction() as conn:
            conn.execute("INSERT INTO schema_info VALUES (0)")
            pid = client.server_pid()
            thread = threading.Thread(target=writer)
            thread.start()
            overlapping, deadline = 0, time.monotonic() + 15
            try:
                while (overlapping < 2 or writes[0] < 2) and time.monotonic() < deadline:
                    seen = writes[0]
                    page = client.ok("read_document", tweet_id_or_url="200")
                    hits = client.ok("search_bookmarks", query="alpha passage", author="gina")["hits"]
                    overlapping += writes[0] > seen
                    # One committed version: every passage of the page has the same word.
                    words = {part["text"].split()[0] for part in page["parts"]}
                    assert len(words) == 1, words
                    n = int(words.pop().removeprefix("alpha"))
                    assert len(page["parts"]) == 20 + n % 7
                    assert [h["tweet_id"] for h in hits] == ["200"]
                    assert str(home / "kb.duckdb") not in open_files(pid)
            finally:
                stop.set()
                thread.join(30)
        assert not failures, failures
        assert overlapping >= 2, f"only {overlapping} calls overlapped a write"
        last = client.ok("read_document", tweet_id_or_url="200")
        assert last["parts"][0]["text"].startswith(f"alpha{writes[0]} ")
        assert client.stream_errors == []
    finally:
        index.remove_bookmarks(["200"])


# --- the wiki_index asset and the pages, in process ---------------------------------------
def test_wiki_index_removes_deleted_pages(kb_home):
    root = kb_home / "wiki"
    for name, text in (("concepts/a.md", "# a\n\nquokka facts"), ("concepts/b.md", "# b\n\nnumbat facts")):
        (root / "wiki" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "wiki" / name).write_text(text)
    (root / "wiki" / "concepts" / ".hidden.md").write_text("hidden quokka")
    assert [f.name for f in wiki_page_files(root)] == ["a.md", "b.md"]
    assert materialize_wiki_index(kb_home).success
    index = ChunkIndex.from_settings(path=str(kb_home / "lancedb"))
    assert index.tweet_ids(source="wiki") == {"wiki:wiki/concepts/a.md", "wiki:wiki/concepts/b.md"}
    hasher = Embedder.from_settings(backend="hash")
    hit = search("quokka", source="wiki", index=index, embedder=hasher).hits[0]
    assert (hit.best_ref, hit.author, hit.best_source) == ("wiki/concepts/a.md", "wiki", "wiki")

    (root / "wiki" / "concepts" / "a.md").unlink()
    (root / "wiki" / "concepts" / "b.md").write_text("# b\n\nnumbat and quokka facts")
    result = materialize_wiki_index(kb_home)
    assert result.success
    assert result.asset_materializations_for_node("wiki_index")[0].metadata["removed_pages"].value == [
        "wiki:wiki/concepts/a.md"]
    assert index.tweet_ids(source="wiki") == {"wiki:wiki/concepts/b.md"}
    hits = search("quokka", source="wiki", index=index, embedder=hasher).hits
    assert [h.best_ref for h in hits] == ["wiki/concepts/b.md"]
    assert hits[0].best_chunk == "# b\n\nnumbat and quokka facts"

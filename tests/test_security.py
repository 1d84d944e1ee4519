"""Security: no one but the owner gets in, and no secret gets out.

- Allowlist: a stranger's messages, commands and files write nothing and
  get no reply (what tests/test_telegram_bot.py does not cover already:
  voice, Markdown, every command, a group chat, a message with no sender).
- The X login: saved with mode 0600 (also tests/test_login.py); the
  documents stage renders other sites in the clean context, so a loopback
  "other site" on the same host as the fake X never receives the login
  cookie, while the X Article on the fake X does (the control). The cookie
  is in no log and no file of KB_HOME. (tests/test_capture.py covers the
  capture and the two contexts.)
- Secrets: a sync, the quality gate, the translator, the captioner, the
  wiki agent, the bot and the MCP server run with marked fake keys, against
  loopback services that quote the key back in their 401 answers (a careless
  server). Then every file under KB_HOME (Dagster's event and compute logs
  too), the agent CLI's home, the captured stdout/stderr and the log records
  are scanned: no key is there.
- The MCP server has no tool that writes: every tool is annotated read-only,
  and calling every tool, with good and bad arguments, leaves KB_HOME byte
  for byte as it was (tests/test_mcp_server.py checks sizes and times).
- The wiki agent cannot run other commands, push, or change files outside
  its area: tests/test_wiki_agent.py (test_guard_denies_everything_else,
  test_rm_curl_and_push_are_denied, test_edits_of_purpose_and_raw_are_stopped,
  test_a_commit_that_touches_purpose_or_raw_is_rolled_back,
  test_source_that_says_delete_the_wiki).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import stat
import sys
import threading
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import dagster as dg
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from kb_assets.documents.documents import DocumentsConfig, documents
from kb.apps.login import save_login_state
from kb_assets.partitions import sync_batches
from kb.apps.sync import run_sync
from kb.urls import normalize_url
from kb.wiki.change import apply_agent_change
from kb.wiki.prompts import GateDecision, ingest_prompt
from kb_assets.index.wiki_index import wiki_index
from kb_assets.instance_config import ensure_dagster_home
from kb.store.duckdb_store import DuckDBStore, insert_rows
from kb.settings import get_settings
from kb.wiki.repo import Wiki
from kb.wiki.agent import WikiAgent
from kb.telegram.inbox import Inbox, telegram_item_id
from tests import fake_telegram as tg
from tests import source_helpers as h
from tests.fake_anthropic import FakeAnthropic
from tests.fake_media import png
from tests.fake_telegram import FakeTelegram, converse
from tests.loopback_site import pdf_bytes
from tests.test_bad_input import entry, tweet
from tests.test_mcp_server import build_corpus, write_wiki
from tests.test_wiki_agent import PARSED, SOURCE_TEXT, good_turns
from kb_resources.services import BrowserResource, EmbedderResource
from kb_resources.stores import ChunkIndexResource, DuckDBResource, WikiResource

OWNER, STRANGER = h.OWNER_ID, 999
LONG_TEXT = "Idea: keep a log of every schema change, with the reason, so that a rebuild can replay it."
X_COOKIE = "TEST-SECRET-x-login-cookie-7d21"
KEYS = {
    "GROQ_API_KEY": "sk-TEST-SECRET-4f9a-groq",
    "DEEPSEEK_API_KEY": "sk-TEST-SECRET-4f9a-gate",
    "KB_CAPTION_API_KEY": "sk-TEST-SECRET-4f9a-vision",
    "ANTHROPIC_AUTH_TOKEN": "sk-TEST-SECRET-4f9a-agent",
    "TELEGRAM_BOT_TOKEN": "123456:TEST-SECRET-4f9a-telegram-bot",
}
SECRETS = [*KEYS.values(), KEYS["TELEGRAM_BOT_TOKEN"].split(":")[1], X_COOKIE]


# --- scanning for secrets --------------------------------------------------------------------

def files_under(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


def leaks(texts: list[str], roots: list[Path], secrets: list[str]) -> list[str]:
    """Where each secret occurs: in a text, or in a file (read as bytes, so
    SQLite databases and binary logs count too)."""
    found = []
    for secret in secrets:
        found += [f"{secret} in captured text #{n}" for n, text in enumerate(texts) if secret in text]
        found += [f"{secret} in {p}" for p in files_under(*roots) if secret.encode() in p.read_bytes()]
    return found


# --- the Telegram bot ---------------------------------------------------------------------------



@pytest.fixture
def telegram(monkeypatch):
    fake = FakeTelegram(KEYS["TELEGRAM_BOT_TOKEN"]).start()
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", KEYS["TELEGRAM_BOT_TOKEN"])
    monkeypatch.setenv("ALLOWED_USER_IDS", str(OWNER))
    monkeypatch.setenv("TELEGRAM_API_BASE", fake.base_url)
    yield fake
    fake.stop()


STRANGER_WORDS = "STRANGER-WORDS-never-logged"


@pytest.mark.slow
def test_a_stranger_gets_no_reply_and_writes_nothing(telegram, caplog, kb_home):
    caplog.set_level("DEBUG")
    fake = telegram
    fake.add_file("owner-voice", "voice/owner.oga", b"OggS owner voice")
    for file_id in ("s-voice", "s-md", "s-pdf"):
        fake.add_file(file_id, f"documents/{file_id}", b"%PDF-1.7 a stranger's file")

    def msg(message_id: int, user: int = STRANGER, **fields) -> dict:
        return tg.message_update(fake.next_update_id(), message_id, user, **fields)

    owner_item = telegram_item_id(OWNER, 1)
    no_sender = msg(40, text=f"{STRANGER_WORDS} from a channel")
    del no_sender["message"]["from"]
    no_sender["message"]["sender_chat"] = {"id": -1001, "type": "channel", "title": "a channel"}
    strangers = [
        msg(20, text=f"{STRANGER_WORDS} https://evil.example/x"),
        msg(21, text=f"{STRANGER_WORDS} " + LONG_TEXT),
        msg(22, **tg.voice_fields("s-voice", 100)),
        msg(23, **tg.document_fields("s-md", "notes.md", "text/markdown", 100)),
        msg(24, **tg.document_fields("s-pdf", "paper.pdf", "application/pdf", 100, caption=STRANGER_WORDS)),
        *(msg(30 + n, **tg.command_fields(command)) for n, command in enumerate([
            "/start", "/help", "/status", f"/status {owner_item}", f"/override {owner_item}", "/lint",
            f"/synthesize {STRANGER_WORDS}", "/frobnicate"])),
        # The stranger writes in a group chat that the owner is in.
        msg(50, chat_id=-100777, text=f"{STRANGER_WORDS} " + LONG_TEXT),
        # The stranger forwards one of the owner's messages.
        msg(51, text=f"{STRANGER_WORDS} " + LONG_TEXT,
            forward_origin={"type": "user", "date": 0, "sender_user": {"id": OWNER, "is_bot": False, "first_name": "O"}}),
        no_sender,
    ]
    converse(fake, msg(1, user=OWNER, text=LONG_TEXT), *strangers, msg(2, user=OWNER, **tg.command_fields("/status")))

    # Only the owner's two messages got replies.
    assert sorted(m["reply_to_message_id"] for m in fake.sent) == [1, 2]
    assert all(m["chat_id"] == OWNER for m in fake.sent)
    assert [p["file_id"] for method, p in fake.calls if method == "getfile"] == []
    assert fake.downloads == []
    inbox = Inbox(get_settings().inbox_dir)
    assert [inbox.read(inbox.items_dir / n).id for n in inbox.manifest_names_after(None)] == [owner_item]
    assert inbox.request_names_after(None) == []
    assert not (inbox.root / "files").exists()
    assert not [p for p in kb_home.rglob("*") if p.is_file() and STRANGER_WORDS in p.read_text(errors="replace")]
    # The log names the stranger's user id, never the words.
    assert f"ignored a message from user {STRANGER}" in caplog.text
    assert STRANGER_WORDS not in caplog.text


# --- the X login and the documents stage ---------------------------------------------------------

class RecordingSite:
    """A loopback site: fixed answers by path; it records the path and the
    Cookie header of every request (HEAD and GET)."""

    def __init__(self, routes: dict[str, tuple[str, bytes]]):
        self.routes = routes
        self.seen: list[tuple[str, str, str]] = []  # (method, path, cookie)
        site = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self.answer(send_body=False)

            def do_GET(self):
                self.answer(send_body=True)

            def answer(self, send_body: bool):
                path = self.path.split("?")[0]
                site.seen.append((self.command, path, self.headers.get("Cookie", "")))
                content_type, body = site.routes.get(path, ("text/html", b"<h1>Not found</h1>"))
                self.send_response(200 if path in site.routes else 404)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if send_body:
                    self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def paths_seen(self) -> set[str]:
        return {path for _, path, _ in self.seen}

    def close(self):
        self.server.shutdown()
        self.server.server_close()


ARTICLE_WORDS = ("The river delta grows each spring when the snow melts in the high valleys, and farmers "
                 "plant rice on the new land before the summer floods arrive. ") * 6


def html_page(title: str, words: str) -> bytes:
    return (f"<!doctype html><html><head><title>{title}</title></head><body><article><h1>{title}</h1>"
            f"<p>{words}</p><p>{words}</p></article></body></html>").encode()


@pytest.mark.slow
@pytest.mark.browser
def test_documents_send_the_x_login_to_x_only(kb_home, monkeypatch, capfd, caplog, loopback_fetches):
    caplog.set_level("DEBUG")
    x = RecordingSite({"/i/article/777": ("text/html", html_page("An X Article", ARTICLE_WORDS))})
    # The other site is on the same host as the fake X: a cookie is per host,
    # not per port, so only the choice of the context keeps the login away.
    other = RecordingSite({"/article": ("text/html", html_page("A blog post", ARTICLE_WORDS)),
                           "/report.pdf": ("application/pdf", pdf_bytes(ARTICLE_WORDS))})
    try:
        monkeypatch.setenv("KB_X_BASE_URL", x.base)
        monkeypatch.setenv("KB_CHROMIUM_PATH", "/usr/bin/chromium")
        monkeypatch.setenv("KB_BROWSER_TIMEOUT_S", "10")
        settings = get_settings()
        state = {"cookies": [{"name": "auth_token", "value": X_COOKIE, "domain": "127.0.0.1", "path": "/",
                              "expires": -1, "httpOnly": True, "secure": False, "sameSite": "Lax"}], "origins": []}
        path = save_login_state(state, settings)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert kb_home not in path.parents

        batch = "20261101T000000000Z"
        urls = [other.base + "/article", other.base + "/report.pdf", "https://x.com/i/article/777"]
        with DuckDBStore.from_settings().transaction() as conn:
            insert_rows(conn, "bookmarks", [{"tweet_id": "1", "batch": batch, "sort_index": "1",
                                             "url": "https://x.com/a/status/1", "text": "links", "is_long": False,
                                             "raw_file": "p", "captured_at": datetime.now(timezone.utc)}])
            insert_rows(conn, "links", [{"tweet_id": "1", "url_norm": normalize_url(u), "position": n,
                                         "expanded_url": u, "host": "h", "kind": "article" if "x.com" in u else "link",
                                         "from_quote": False, "batch": batch} for n, u in enumerate(urls)])
        instance = dg.DagsterInstance.from_config(str(ensure_dagster_home()))  # logs on disk, to scan
        instance.add_dynamic_partitions(sync_batches.name, [batch])
        result = dg.materialize([documents], partition_key=batch, instance=instance,
                                resources={"duckdb": DuckDBResource.from_settings(), "browser": BrowserResource.from_settings()},
                                run_config=dg.RunConfig({"documents": DocumentsConfig(workers=2)}))
        instance.dispose()
        assert result.success
        with DuckDBStore.from_settings().connect() as conn:
            statuses = dict(conn.execute("SELECT url, status FROM documents").fetchall())
    finally:
        x.close()
        other.close()

    assert statuses == {other.base + "/article": "ok", other.base + "/report.pdf": "ok",
                        "https://x.com/i/article/777": "ok"}
    # The control: the X context did send the login to X.
    assert [cookie for _, p, cookie in x.seen if p == "/i/article/777" and X_COOKIE in cookie]
    # The other site was fetched (by the browser and by httpx), never with the login.
    assert {"/article", "/report.pdf"} <= other.paths_seen()
    assert not [seen for seen in other.seen if X_COOKIE in seen[2]]
    captured = capfd.readouterr()
    assert leaks([captured.out, captured.err, caplog.text], [kb_home], [X_COOKIE]) == []


# --- secrets in logs ------------------------------------------------------------------------------

class CarelessOpenAI:
    """An OpenAI-compatible chat endpoint (any path that ends in
    /chat/completions) that quotes the key back in a 401 answer to the
    first request with each key, and answers the next ones. It also serves
    one photo at /photo.png, for the captioner."""

    def __init__(self, answer):
        self.answer = answer  # (request body) -> answer text
        self.keys_seen: list[str] = []
        self.photo = png(64, 48)
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                body = fake.photo if self.path == "/photo.png" else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "image/png")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                key = self.headers.get("Authorization", "").removeprefix("Bearer ")
                first = key not in fake.keys_seen
                fake.keys_seen.append(key)
                if first:
                    code, payload = 401, {"error": {"message": f"Incorrect API key provided: {key}.",
                                                    "type": "invalid_request_error", "code": "invalid_api_key"}}
                else:
                    code, payload = 200, {"id": "c1", "object": "chat.completion", "created": 0,
                                          "model": body.get("model", ""),
                                          "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                              "role": "assistant", "content": fake.answer(body)}}],
                                          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def careless_answer(body: dict) -> str:
    system = " ".join(str(m.get("content")) for m in body["messages"] if m["role"] == "system")
    if "score" in system:
        return '{"score": 80, "topics": ["rivers"], "reason": "clear"}'
    if any(isinstance(m.get("content"), list) for m in body["messages"]):
        return '{"caption": "A red rectangle.", "ocr_text": ""}'
    return "The rivers change their course."


def sync_page(photo_url: str) -> dict:
    photo = {"media_key": "3_1", "type": "photo", "media_url_https": photo_url}
    entries = [
        entry("201", tweet("201", "anna", "Die Flüsse ändern ihren Lauf jedes Jahr im Frühling.", legacy={"lang": "de"}),
              "1900"),
        entry("202", tweet("202", "ben", "A photo of the delta", legacy={"extended_entities": {"media": [photo]}}),
              "1899"),
        {"entryId": "cursor-bottom-1", "sortIndex": "0", "content": {"value": "end", "cursorType": "Bottom"}},
    ]
    return {"data": {"bookmark_timeline_v2": {"timeline": {
        "instructions": [{"type": "TimelineAddEntries", "entries": entries}]}}}}


def ingest_with_the_agent(fake: FakeAnthropic, monkeypatch) -> bool:
    """One wiki ingest by the real agent CLI against the loopback Messages API."""
    wiki = Wiki.from_settings()
    root = wiki.ensure()
    (root / PARSED).parent.mkdir(parents=True, exist_ok=True)
    (root / PARSED).write_text(SOURCE_TEXT)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", fake.base_url)
    decision = GateDecision(source_id="src1", approved=True, parsed_path=PARSED, topics=("computing",))
    prompt = ingest_prompt(decision, {"title": "Notes on the Engine"}, "2026-11-29")
    return apply_agent_change(wiki, WikiAgent.from_settings(), prompt, prefix="ingest:", max_turns=20).ok


@pytest.mark.slow
def test_no_key_or_token_reaches_a_log_or_a_file(kb_home, tmp_path, monkeypatch, telegram, capfd, caplog,
                                               loopback_fetches):
    caplog.set_level("DEBUG")
    agent_home = tmp_path / "agent-home"
    agent_home.mkdir()
    monkeypatch.setenv("HOME", str(agent_home))  # the agent CLI keeps its files here
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    service = CarelessOpenAI(careless_answer)
    try:
        monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
        monkeypatch.setenv("GROQ_BASE_URL", service.base + "/openai/v1")
        monkeypatch.setenv("KB_GATE_BASE_URL", service.base)
        monkeypatch.setenv("KB_CAPTION_BACKEND", "openai")
        monkeypatch.setenv("KB_CAPTION_BASE_URL", service.base + "/v1")
        monkeypatch.setenv("KB_CAPTION_MODEL", "vision-test")
        monkeypatch.setenv("KB_CAPTION_MIN_PHOTOS", "1")
        monkeypatch.setenv("KB_AGENT_TIMEOUT_S", "60")
        # The sync: capture (files), normalize, documents, captions, chunks,
        # translations and the index, each a Dagster run in KB_HOME/dagster.
        page = tmp_path / "page.json"
        page.write_text(json.dumps(sync_page(service.base + "/photo.png")))
        report = run_sync(files=[str(page)])
        # The gate, through the real intake job.
        dagster = h.instance()
        item = h.add_item("text", 1, text=LONG_TEXT)
        gated = h.run_item(dagster, item.id)
        dagster.dispose()
        # The wiki agent.
        with FakeAnthropic(good_turns()) as anthropic:
            ingested = ingest_with_the_agent(anthropic, monkeypatch)
        agent_auth = {r["_authorization"] for r in anthropic.requests}
        # The bot: a message, a download that works and one that fails.
        telegram.add_file("v1", "voice/file_1.oga", b"OggS voice")
        telegram.add_file("gone", "documents/gone.pdf", b"x", download_status=404)

        def msg(n: int, **fields):
            return tg.message_update(telegram.next_update_id(), n, OWNER, **fields)

        converse(telegram, msg(10, text=LONG_TEXT), msg(11, **tg.voice_fields("v1", 10)),
                 msg(12, **tg.document_fields("gone", "gone.pdf", "application/pdf", 1)))
    finally:
        service.close()

    # Each service ran, and met the 401 that quotes its key.
    assert set(service.keys_seen) >= {KEYS["GROQ_API_KEY"], KEYS["DEEPSEEK_API_KEY"], KEYS["KB_CAPTION_API_KEY"]}
    # The captions and translations stages met the 401; their errors quote it, redacted.
    errors = {stage.stage: stage.error for stage in report.stages}
    assert report.failed == ["captions", "translations"], errors
    assert "Incorrect API key provided: <redacted>" in errors["captions"] + errors["translations"]
    assert gated.success and ingested
    assert agent_auth == {f"Bearer {KEYS['ANTHROPIC_AUTH_TOKEN']}"}  # the agent CLI did use its token
    assert telegram.unauthorized == 0 and telegram.replies_to(10)  # the bot did use its token
    assert telegram.replies_to(12) == ["Could not download attachment: the file server answered HTTP 404 Not Found"]

    captured = capfd.readouterr()
    found = leaks([captured.out, captured.err, caplog.text], [kb_home, agent_home], SECRETS)
    assert found == [], "\n".join(found)


# --- the MCP server writes nothing -----------------------------------------------------------------

def content_hashes(home: Path) -> dict[str, str]:
    """Every path under the folder, with the SHA-256 of each file."""
    return {str(p.relative_to(home)): (hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir")
            for p in sorted(home.rglob("*"))}


MCP_CALLS = [
    ("search_bookmarks", {"query": "borrow checker"}),
    ("search_bookmarks", {"query": "rust", "author": "alice", "source": "link", "after": "2024-01-01", "limit": 3}),
    ("get_bookmark", {"tweet_id": "101"}),
    ("read_document", {"tweet_id_or_url": "104"}),
    ("read_document", {"tweet_id_or_url": "104", "query": "release", "offset": 0}),
    ("read_document", {"tweet_id_or_url": "https://blog.example.org/rust-borrow-checker"}),
    ("search_wiki", {"query": "vector search"}),
    ("read_wiki_page", {"path": "concepts/vector-search"}),
    # Bad input: each is an error answer, and changes nothing either.
    ("search_bookmarks", {"query": "x' OR '1'='1", "author": "a' OR '1'='1"}),
    ("search_bookmarks", {"query": "rust", "after": "soon"}),
    ("search_bookmarks", {"query": "rust", "limit": -1}),
    ("get_bookmark", {"tweet_id": "'; DROP TABLE chunks; --"}),
    ("read_document", {"tweet_id_or_url": "../../kb.duckdb"}),
    ("read_document", {"tweet_id_or_url": "104", "offset": 10**9}),
    ("read_wiki_page", {"path": "../secret.md"}),
    ("read_wiki_page", {"path": "/etc/passwd"}),
    ("read_wiki_page", {"path": "concepts/escape"}),
    ("no_such_tool", {}),
]


async def mcp_session(home: Path, env: dict) -> tuple[list, list]:
    params = StdioServerParameters(command=sys.executable, args=["-m", "mcp_server.server"], env=env,
                                   cwd=str(home.parent))
    with open(home.parent / "mcp.stderr", "w") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = (await session.list_tools()).tools
                results = []
                for name, arguments in MCP_CALLS:
                    try:
                        results.append((name, await session.call_tool(name, arguments)))
                    except Exception as exc:  # an unknown tool may be a protocol error
                        results.append((name, exc))
                return tools, results


@pytest.mark.slow  # starts the MCP server process
def test_mcp_tools_are_read_only_and_calls_change_no_byte(tmp_path, capfd):
    home = tmp_path / "mcp" / "kb_home"
    home.mkdir(parents=True)
    build_corpus(home)
    write_wiki(home)
    wiki_index(dg.build_asset_context(), wiki=WikiResource.from_settings(path=str(home / "wiki")),
               embedder=EmbedderResource.from_settings(backend="hash", cache_dir=str(home / "lancedb")),
               lance=ChunkIndexResource.from_settings(path=str(home / "lancedb")))
    before = content_hashes(home)
    env = {"KB_HOME": str(home), "KB_EMBED_BACKEND": "hash", "KB_CONFIG_FILE": str(home / "none.toml"),
           "KB_ENV_FILE": os.environ["KB_ENV_FILE"], "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "PATH": os.environ.get("PATH", ""), **KEYS}

    tools, results = asyncio.run(mcp_session(home, env))

    assert {t.name for t in tools} == {"search_bookmarks", "get_bookmark", "read_document", "search_wiki",
                                       "read_wiki_page"}
    for tool in tools:
        assert tool.annotations.read_only_hint is True and tool.annotations.destructive_hint is False, tool.name
    outcomes = [(name, not isinstance(r, Exception) and not r.is_error) for name, r in results]
    assert [ok for _, ok in outcomes] == [True] * 8 + [True] + [False] * 9, outcomes
    assert results[8][1].structured_content["hits"] == []  # the quotes stayed inside the filter value
    assert content_hashes(home) == before
    stderr = (home.parent / "mcp.stderr").read_text()
    assert "kb-mcp serves the index at" in stderr
    captured = capfd.readouterr()
    assert leaks([stderr, captured.out, captured.err], [home], SECRETS) == []

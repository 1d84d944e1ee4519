"""The stage commands (`kb extract`, `kb transcribe`, `kb translate`,
`kb normalize`, `kb index`) and the end report of `kb sync` / `kb import`.

Each command runs in this process against a temp KB_HOME, as the owner
types it. Every outside service is a loopback server that speaks its real
protocol: a web site for the documents, Groq's API for translations,
Ollama's API for embeddings.
"""

from __future__ import annotations

import shutil

import dagster as dg
import pytest

from kb.store.duckdb_store import DuckDBStore, insert_rows
from kb.index.client import ChunkIndex
from kb.sample_data import sample_pages
from kb.urls import normalize_url
from kb.index.chunk_sources import SourceText
from tests.enrich_rows import add_batches, bookmark, media, rows, write
from tests.fake_groq import FakeGroq
from tests.fake_ollama import DIM, FakeOllama
from tests.loopback_site import LoopbackSite, page, pdf_bytes
from tests.test_sync import instance, kb

# The loopback sites stand in for the web: let the fetch guard reach them.
pytestmark = [pytest.mark.usefixtures('loopback_fetches'), pytest.mark.slow]  # slow: whole Dagster runs of the graph, 1 to 3 s of CPU each

OLD, NEW = "20261101T000000000Z", "20261102T000000000Z"

REPORT_WORDS = ("Glaciers in the northern valleys lost a third of their ice in two decades, and the meltwater "
                "changed the course of three rivers that farmers used for irrigation. ") * 4


@pytest.fixture(autouse=True)
def hash_embedder(monkeypatch):
    # The deterministic embedder: no model load. A test of `auto` sets its own.
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")


def runs_of(job: str) -> list[dg.DagsterRun]:
    return [run for run in instance().get_runs() if run.job_name == job]


def op_config(run: dg.DagsterRun, op: str) -> dict:
    return run.run_config["ops"][op]["config"]


# --- the end report of kb import ---------------------------------------------------------


def test_import_of_a_file_that_is_no_page_fails_and_names_the_file(tmp_path, capsys):
    junk = tmp_path / "bookmarks-export.json"
    junk.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00 not a page at all \xff\xfe")
    assert kb("import", "--no-link", str(junk)) == 1
    err = capsys.readouterr().err
    assert f"Could not read {junk}: not JSON" in err
    assert "no page was read, so no bookmark came in" in err
    assert "all stages finished" not in err
    assert rows("SELECT count(*) FROM bookmarks") == [(0,)]
    assert junk.read_bytes().startswith(b"\x89PNG")  # nothing is lost: the raw copy is kept too


def test_import_ends_with_counts_of_each_stage_and_kb_index_takes_a_source_out(capsys):
    pages = [str(p) for p in sample_pages()[:2]]
    assert kb("import", "--no-link", *pages) == 0
    out = capsys.readouterr().out
    total = rows("SELECT count(*) FROM bookmarks")[0][0]
    passages = ChunkIndex.from_settings().counts()["chunks"]
    assert f"Pages read: {len(pages)}\n" in out
    assert f"Bookmarks: {total} new, 0 updated" in out
    assert f"Passages indexed: {passages}" in out
    assert "all stages finished" in out

    # The first page again: its bookmarks are known, so they are updated, not new.
    assert kb("import", "--no-link", pages[0]) == 0
    out = capsys.readouterr().out
    [(batch,)] = rows("SELECT max(batch) FROM bookmarks")
    again = rows("SELECT count(*) FROM bookmarks WHERE batch = ?", [batch])[0][0]
    assert again > 0 and f"Bookmarks: 0 new, {again} updated" in out
    assert "Pages read: 1\n" in out

    table = ChunkIndex.from_settings().table("chunks")
    assert table.count_rows("source = 'post'") > 0
    assert kb("index", "--no-post") == 0
    assert table.count_rows("source = 'post'") == 0 and table.count_rows() > 0
    assert {r.tags.get("kb/exclude") for r in runs_of("index_rebuild")} == {"post"}
    assert "Passages indexed:" in capsys.readouterr().out


# --- kb extract ----------------------------------------------------------------------------


@pytest.fixture
def links_site():
    site = LoopbackSite({"/report.pdf": page(pdf_bytes(REPORT_WORDS), content_type="application/pdf"),
                         "/archive.zip": page(b"PK\x03\x04 zip bytes", content_type="application/zip")})
    with site:
        pdf, zip_url = f"{site.base_url}/report.pdf", f"{site.base_url}/archive.zip"
        write([bookmark("1", OLD, text="a report on glaciers"), bookmark("2", NEW, text="the data files")])
        link_rows = [
            {"tweet_id": "1", "url_norm": normalize_url(pdf), "position": 0, "expanded_url": pdf,
             "host": "127.0.0.1", "kind": "link", "from_quote": False, "batch": OLD},
            {"tweet_id": "2", "url_norm": normalize_url(zip_url), "position": 0, "expanded_url": zip_url,
             "host": "127.0.0.1", "kind": "link", "from_quote": False, "batch": NEW},
        ]
        with DuckDBStore.from_settings().transaction() as conn:
            insert_rows(conn, "links", link_rows)
        add_batches(instance(), OLD, NEW)
        yield site, pdf, zip_url


def test_kb_extract_fetches_what_waits_indexes_it_and_names_failures(links_site, capsys):
    site, pdf, zip_url = links_site
    # --limit 1: one address in all, from the oldest batch.
    assert kb("extract", "--limit", "1") == 0
    [first] = runs_of("extract_job")
    assert first.tags["dagster/partition"] == OLD and op_config(first, "documents") == {"limit": 1, "retry": False}
    assert rows("SELECT url, status FROM documents") == [(pdf, "ok")]
    assert "Documents fetched: 1\n" in capsys.readouterr().out
    # The document went on to the index of its batch.
    hits = ChunkIndex.from_settings().table("chunks").search().where("source = 'link'").to_list()
    assert [h["ref"] for h in hits] == [pdf] and "Glaciers" in hits[0]["text"]

    # The rest: the file is no document. The command names it and fails.
    assert kb("extract") == 1
    captured = capsys.readouterr()
    assert f"Problem: {zip_url}: binary (application/zip)" in captured.err
    assert "Documents fetched: 0 (1 failed)" in captured.out
    assert rows("SELECT status, reason, attempts FROM documents WHERE url = ?", [zip_url]) == [("failed", "binary", 1)]

    # A failure waits for --retry; without it, nothing waits.
    assert kb("extract") == 0
    assert "No link or X Article waits." in capsys.readouterr().err
    assert kb("extract", "--retry") == 1
    assert rows("SELECT attempts FROM documents WHERE url = ?", [zip_url]) == [(2,)]
    assert site.hits["/report.pdf"] == 2  # probe and download, once: a document is never fetched again
    assert len(runs_of("extract_job")) == 3


# --- kb transcribe ---------------------------------------------------------------------------


def _videos() -> None:
    write([bookmark("10", OLD, handle="carol"), bookmark("11", NEW, handle="dave")],
          [media("10", "7_10", 0, "video", "https://pbs.twimg.com/10.jpg", OLD),
           media("11", "7_11", 0, "video", "https://pbs.twimg.com/11.jpg", NEW)])
    add_batches(instance(), OLD, NEW)


def test_kb_transcribe_says_why_it_did_nothing_names_failures_and_retries_only_on_request(monkeypatch, capsys):
    _videos()  # X offers no MP4 for these videos: each one fails as no_mp4
    # Transcripts are off (the default): the command says so and fails.
    assert kb("transcribe", "--limit", "1") == 1
    err = capsys.readouterr().err
    assert "transcripts: nothing was done:" in err and "KB_TRANSCRIBE_BACKEND" in err
    assert rows("SELECT count(*) FROM transcripts") == [(0,)]  # the videos still wait

    monkeypatch.setenv("KB_TRANSCRIBE_BACKEND", "local")
    assert kb("transcribe", "--limit", "1") == 1
    run = runs_of("transcribe_job")[0]  # the newest
    assert run.tags["dagster/max_retries"] == "0"  # a GPU stage never retries by itself
    assert op_config(run, "transcripts") == {"limit": 1, "retry": False}
    assert "Problem: https://x.com/carol/status/10/video/1: no_mp4" in capsys.readouterr().err
    # --retry: the failed video again, and the video that still waits.
    assert kb("transcribe", "--retry") == 1
    assert "https://x.com/dave/status/11/video/1: no_mp4" in capsys.readouterr().err
    assert rows("SELECT url, attempts FROM transcripts ORDER BY url") == [
        ("https://x.com/carol/status/10/video/1", 2), ("https://x.com/dave/status/11/video/1", 1)]
    assert kb("transcribe") == 0 and "No video waits." in capsys.readouterr().err


# --- kb translate ----------------------------------------------------------------------------


SPANISH = ["La biblioteca abre a las nueve de la mañana.", "El tren sale del andén tres cada hora."]
ENGLISH = ["The library opens at nine in the morning.", "The train leaves from platform three every hour."]


def test_kb_translate_translates_what_waits_and_indexes_the_english(monkeypatch, capsys):
    monkeypatch.setenv("GROQ_API_KEY", "gsk-TEST-SECRET-translate-0002")
    for n, (batch, text) in enumerate(zip((OLD, NEW), SPANISH)):
        write([bookmark(str(20 + n), batch, text=text, lang="es")],
              texts=[SourceText(str(20 + n), "post", f"https://x.com/alice/status/{20 + n}", text, "es")], batch=batch)
    add_batches(instance(), OLD, NEW)
    with FakeGroq(dict(zip(SPANISH, ENGLISH))) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        assert kb("translate", "--limit", "1") == 0
        assert "Texts translated: 1\n" in capsys.readouterr().out
        assert rows("SELECT english FROM translations") == [(ENGLISH[0],)]
        assert kb("translate") == 0
    assert sorted(r[0] for r in rows("SELECT english FROM translations")) == sorted(ENGLISH)
    texts = {h["text"] for h in ChunkIndex.from_settings().table("chunks").search().to_list()}
    assert texts == set(ENGLISH)
    assert "gsk-TEST-SECRET" not in "".join(capsys.readouterr())


class StrangeGroq(FakeGroq):
    """Groq that answers one text with a completion without a message: a
    shape that the translator does not expect, so the stage raises."""

    def __init__(self, strange_text: str, **kwargs):
        super().__init__(**kwargs)
        self.strange_text = strange_text

    def completion(self, body: dict) -> dict:
        answer = super().completion(body)
        if any(self.strange_text in m["content"] for m in body["messages"] if m["role"] == "user"):
            answer["choices"][0]["message"] = None
        return answer


def test_a_translation_stage_that_raises_leaves_the_batch_to_go_on_to_the_index(monkeypatch, capsys):
    """One failure stops one thing: the stage is named, its batch is still
    indexed, and `kb translate` tries the text again."""
    monkeypatch.setenv("GROQ_API_KEY", "gsk-TEST-SECRET-translate-0003")
    english = "The harbour keeps a record of every ship that enters."
    write([bookmark("30", OLD, text=SPANISH[0], lang="es"), bookmark("31", OLD, text=english, lang="en")],
          texts=[SourceText("30", "post", "https://x.com/alice/status/30", SPANISH[0], "es"),
                 SourceText("31", "post", "https://x.com/alice/status/31", english, "en")], batch=OLD)
    add_batches(instance(), OLD)
    with StrangeGroq(SPANISH[0], translations=dict(zip(SPANISH, ENGLISH))) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        assert kb("translate") == 1
    # The index of the batch was still built: both posts are searchable, the Spanish one as it came.
    texts = {h["text"] for h in ChunkIndex.from_settings().table("chunks").search().to_list()}
    assert texts == {SPANISH[0], english}
    captured = capsys.readouterr()
    [line] = [line for line in captured.out.splitlines() if "translations" in line and "FAILED" in line]
    assert "AttributeError" in line and "kb translate" in line
    assert rows("SELECT count(*) FROM translations WHERE english IS NOT NULL") == [(0,)]

    with FakeGroq(dict(zip(SPANISH, ENGLISH))) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        assert kb("translate") == 0
    texts = {h["text"] for h in ChunkIndex.from_settings().table("chunks").search().to_list()}
    assert texts == {ENGLISH[0], english}


def test_a_bookmark_that_cannot_be_embedded_is_named_and_the_rest_is_indexed(monkeypatch, capsys):
    monkeypatch.setenv("KB_EMBED_BACKEND", "ollama")
    posts = {str(40 + n): f"Post {n} about rivers, valleys and the water that farmers use." for n in range(4)}
    posts["42"] = "A post that the embedding server cannot read: UNREADABLE-INPUT."
    write([bookmark(t, OLD, text=text) for t, text in posts.items()],
          texts=[SourceText(t, "post", f"https://x.com/alice/status/{t}", text, "en") for t, text in posts.items()],
          batch=OLD)
    add_batches(instance(), OLD)
    with FakeOllama(refuse_text="UNREADABLE-INPUT") as ollama:
        monkeypatch.setenv("OLLAMA_URL", ollama.url)
        assert kb("index") == 1
        captured = capsys.readouterr()
        assert "Could not index 42: error (" in captured.err
        indexed = set(ChunkIndex.from_settings().table("chunks").to_arrow().column("tweet_id").to_pylist())
        assert indexed == set(posts) - {"42"}
        ollama.refuse_text = None  # the server reads it now: `kb index` tries the bookmark again
        assert kb("index") == 0
    indexed = set(ChunkIndex.from_settings().table("chunks").to_arrow().column("tweet_id").to_pylist())
    assert indexed == set(posts)


# --- kb normalize --------------------------------------------------------------------------------


def test_kb_normalize_rebuilds_the_tables_from_every_raw_page(capsys):
    from kb.x.raw_store import RawStore

    assert kb("import", "--no-link", "--no-image", "--no-video", *map(str, sample_pages()[:2])) == 0
    before = rows("SELECT tweet_id, batch, text FROM bookmarks ORDER BY tweet_id")
    # A batch on disk that the instance does not know (a restore of raw files only).
    raw = RawStore.from_settings()
    restored = "20200101T000000000Z"
    shutil.copytree(raw.batch_dir(rows("SELECT max(batch) FROM bookmarks")[0][0]), raw.batch_dir(restored))
    raw.batch_dir(restored).joinpath("page-0099.json").write_text("{\"data\": {}}")
    with DuckDBStore.from_settings().transaction() as conn:
        conn.execute("DELETE FROM media")
        conn.execute("DELETE FROM bookmarks")
    capsys.readouterr()

    assert kb("normalize") == 1  # the page that is not a Bookmarks page is named
    err = capsys.readouterr().err
    assert f"Could not read {restored}/page-0099.json:" in err
    assert restored in instance().get_dynamic_partitions("sync_batches")
    # Oldest batch first: the later batch wins, so every bookmark keeps its batch.
    assert rows("SELECT tweet_id, batch, text FROM bookmarks ORDER BY tweet_id") == before
    assert rows("SELECT count(*) FROM media")[0][0] > 0
    assert {r.tags["dagster/partition"] for r in runs_of("normalize_job")} == set(raw.batches())


# --- kb index --rebuild after a change of embedding model -----------------------------------


def test_a_change_of_model_names_the_rebuild_and_kb_index_rebuild_does_it(monkeypatch, capsys):
    pages = [str(p) for p in sample_pages()]
    monkeypatch.setenv("KB_EMBED_BACKEND", "auto")
    with FakeOllama(models=["embeddinggemma:latest", "nomic-embed-text:latest"]) as ollama:
        monkeypatch.setenv("OLLAMA_URL", ollama.url)
        assert kb("import", "--no-link", pages[0]) == 0
        index = ChunkIndex.from_settings()
        assert index.model_info() == ("ollama:embeddinggemma", DIM)

        # The owner changes the model: the next sync refuses to mix two models.
        monkeypatch.setenv("KB_OLLAMA_MODEL", "nomic-embed-text")
        capsys.readouterr()
        assert kb("import", "--no-link", pages[1]) == 1
        out = capsys.readouterr().out
        [line] = [line for line in out.splitlines() if "chunk_index" in line and "FAILED" in line]
        assert "ollama:embeddinggemma" in line and "ollama:nomic-embed-text" in line and "kb index --rebuild" in line

        assert kb("index", "--rebuild") == 0
    assert index.model_info() == ("ollama:nomic-embed-text", DIM)
    assert index.counts()["bookmarks"] == rows("SELECT count(*) FROM bookmarks")[0][0]
    sent = {r["body"]["model"] for r in ollama.requests if r["path"] == "/api/embed"}
    assert sent == {"embeddinggemma", "nomic-embed-text"}

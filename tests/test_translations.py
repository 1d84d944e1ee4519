"""Translation: the real `groq` client against a loopback server that
speaks Groq's HTTP API, the `translations` asset on a real DuckDB file, and
the index that shows the English with the original beside it."""

from __future__ import annotations

import time

import dagster as dg
import duckdb
import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from kb.index.chunk_sources import SourceText
from kb_assets.index.chunk_index import chunk_index
from kb.enrich.foreign_text import FOREIGN_CHUNK_SQL
from kb_assets.enrich.translations import translations
from kb.store.duckdb_store import DuckDBStore
from kb.index.client import ChunkIndex
from kb.enrich.translator import PIECE_CHARS, TranslateError, Translator, split_pieces
from tests.enrich_rows import add_batches, bookmark, rows, write
from tests.fake_groq import PATH, FakeGroq
from tests.stage_checks import coverage, stage_failure
from kb_resources.services import EmbedderResource, TranslatorResource
from kb_resources.stores import ChunkIndexResource, DuckDBResource

KEY = "sk-TEST-SECRET-groq-0000"
BATCH = "20261101T000000000Z"

SPANISH = "La biblioteca abre a las nueve de la mañana."
SPANISH_EN = "The library opens at nine in the morning."
RUSSIAN = "Модель читает статью и пишет краткое содержание."
RUSSIAN_EN = "The model reads the article and writes a summary."
TAGGED_ES_BUT_ENGLISH = "Great thread about vector databases and search."


@pytest.fixture
def groq_env(monkeypatch):
    monkeypatch.setenv("GROQ_API_KEY", KEY)


@pytest.fixture
def instance():
    with dg.DagsterInstance.ephemeral() as inst:
        add_batches(inst, BATCH)
        yield inst


# --- pieces ---------------------------------------------------------------------------


def test_pieces_keep_paragraphs_whole_and_fit_the_limit():
    paragraphs = [f"Paragraph {n}. " + "palabra " * 60 for n in range(8)]  # ~500 characters each
    text = "\n\n".join(p.strip() for p in paragraphs)
    pieces = split_pieces(text)
    assert "".join(sep + piece for sep, piece in pieces) == text
    assert all(len(piece) <= PIECE_CHARS for _, piece in pieces)
    assert len(pieces) == 3  # 2 + 2 + ... paragraphs per piece, never half a paragraph
    for separator, piece in pieces[1:]:
        assert separator == "\n\n" and piece.startswith("Paragraph")


def test_a_long_paragraph_is_cut_at_sentence_ends_and_cjk_marks():
    sentence = "Esta es una frase bastante larga que habla de bases de datos vectoriales. "
    long_paragraph = (sentence * 50).strip()  # ~3,700 characters, one paragraph; 20 sentences fit a piece
    pieces = split_pieces(long_paragraph)
    assert len(pieces) == 3
    assert all(piece.endswith("vectoriales.") for _, piece in pieces)
    cjk = "向量数据库存储文本的嵌入。" * 300  # no spaces at all
    cjk_pieces = split_pieces(cjk)
    assert "".join(s + p for s, p in cjk_pieces) == cjk
    assert all(len(p) <= PIECE_CHARS and p.endswith("。") for _, p in cjk_pieces)


@hypothesis_settings(max_examples=60, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab cd.\n\t。x")), max_size=5000), st.integers(20, 400))
def test_pieces_are_lossless_and_bounded(text, limit):
    pieces = split_pieces(text, limit)
    assert "".join(sep + piece for sep, piece in pieces) == text
    assert all(len(piece) <= limit for _, piece in pieces)


# --- the resource through the loopback Groq ---------------------------------------------------


def test_a_429_waits_for_retry_after_then_translates(groq_env, monkeypatch):
    with FakeGroq({SPANISH: SPANISH_EN}, rate_limits=1, retry_after="1") as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        assert Translator.from_settings().translate(SPANISH) == SPANISH_EN
    assert groq.paths == [PATH, PATH]
    assert groq.times[1] - groq.times[0] >= 0.95  # it waited the second that retry-after asked for
    request = groq.requests[1]
    assert request["model"] == "openai/gpt-oss-120b"
    assert request["reasoning_effort"] == "low"
    assert request["messages"][0]["role"] == "system" and "ENGLISH" in request["messages"][0]["content"]
    assert groq.headers[1]["authorization"] == f"Bearer {KEY}"


def test_a_rate_limit_that_outlasts_the_retries_fails_the_piece(groq_env, monkeypatch):
    with FakeGroq({SPANISH: SPANISH_EN}, rate_limits=5, retry_after="0") as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        with pytest.raises(TranslateError, match="429 \\(rate limit\\) 3 times in a row") as info:
            Translator.from_settings(max_retries=2).translate(SPANISH)
    assert len(groq.requests) == 3  # the first try and the groq client's two retries
    assert not info.value.fatal  # the text waits for the next run; the key is fine


def test_english_answer_means_no_translation(groq_env, monkeypatch):
    with FakeGroq(english_texts={TAGGED_ES_BUT_ENGLISH}) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        assert Translator.from_settings().translate(TAGGED_ES_BUT_ENGLISH) is None


def test_a_long_text_goes_out_in_pieces_and_comes_back_in_order(groq_env, monkeypatch):
    parts = [f"Parte {n}: " + "texto en español " * 55 for n in range(3)]  # ~950 characters each
    text = "\n\n".join(p.strip() for p in parts)
    english = {p.strip(): f"Part {n} in English." for n, p in enumerate(parts)}
    with FakeGroq(english) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        result = Translator.from_settings().translate(text)
    assert groq.user_texts() == [p.strip() for p in parts]
    assert all(len(t) <= PIECE_CHARS for t in groq.user_texts())
    assert result == "Part 0 in English.\n\nPart 1 in English.\n\nPart 2 in English."


def test_a_bad_key_is_fatal(groq_env, monkeypatch):
    with FakeGroq(status_code=401) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        with pytest.raises(TranslateError, match="HTTP 401") as info:
            Translator.from_settings().translate(SPANISH)
    assert info.value.fatal
    assert KEY not in str(info.value)


# --- the asset, the cache and the index ------------------------------------------------------


def _write_chunks() -> None:
    write(
        [bookmark("1", BATCH, text=SPANISH, lang="es"),
         bookmark("2", BATCH, text="Plain English words here.", lang="en"),
         bookmark("3", BATCH, text="https://example.com", lang="qme"),
         bookmark("4", BATCH, text=TAGGED_ES_BUT_ENGLISH, lang="es"),
         bookmark("5", BATCH, text="An English post that quotes Russian.", lang="en", quoted_tweet_id="50",
                  quoted_author_handle="boris")],
        texts=[SourceText("1", "post", "https://x.com/alice/status/1", SPANISH, "es"),
               SourceText("2", "post", "https://x.com/alice/status/2", "Plain English words here.", "en"),
               SourceText("3", "post", "https://x.com/alice/status/3", "Hola amigos", "qme"),
               SourceText("4", "post", "https://x.com/alice/status/4", TAGGED_ES_BUT_ENGLISH, "es"),
               SourceText("5", "post", "https://x.com/alice/status/5", "An English post that quotes Russian.", "en"),
               SourceText("5", "quote", "https://x.com/boris/status/50", RUSSIAN, None)],
        batch=BATCH)


def _materialize(instance, *assets, **resources):
    base = {"duckdb": DuckDBResource.from_settings(), "translator": TranslatorResource.from_settings()}
    return dg.materialize(list(assets), partition_key=BATCH, instance=instance, resources={**base, **resources},
                          raise_on_error=False)


@pytest.mark.slow
def test_translations_asset_caches_foreign_chunks_and_the_index_shows_english(groq_env, monkeypatch, instance):
    _write_chunks()
    with FakeGroq({SPANISH: SPANISH_EN, RUSSIAN: RUSSIAN_EN}, english_texts={TAGGED_ES_BUT_ENGLISH}) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        result = _materialize(instance, translations)
        assert result.success
        # Only the foreign ones went out: es tag, Cyrillic letters under no tag. Not en, not qme.
        assert sorted(groq.user_texts()) == sorted([SPANISH, RUSSIAN, TAGGED_ES_BUT_ENGLISH])
        metadata = result.asset_materializations_for_node("translations")[0].metadata
        assert metadata["translated"].value == 2 and metadata["already_english"].value == 1
        check = coverage(result, "translations")
        assert check.passed and check.metadata["foreign_texts"].value == 3

        again = _materialize(instance, translations)
        assert again.success and len(groq.requests) == 3  # the cache answered: no new request

    cached = dict(rows("SELECT c.text, t.english FROM translations t JOIN chunks c USING (text_hash)"))
    assert cached == {SPANISH: SPANISH_EN, RUSSIAN: RUSSIAN_EN, TAGGED_ES_BUT_ENGLISH: None}

    index = _materialize(instance, chunk_index, embedder=EmbedderResource.from_settings(backend="hash"),
                         lance=ChunkIndexResource.from_settings())
    assert index.success
    passages = {p["ref"] + " " + p["source"]: p for t in ("1", "4", "5") for p in ChunkIndex.from_settings().passages(tweet_id=t)}
    spanish = passages["https://x.com/alice/status/1 post"]
    assert spanish["text"] == SPANISH_EN and spanish["source_text"] == SPANISH
    russian = passages["https://x.com/boris/status/50 quote"]
    assert russian["text"] == RUSSIAN_EN and russian["source_text"] == RUSSIAN
    english = passages["https://x.com/alice/status/4 post"]
    assert english["text"] == TAGGED_ES_BUT_ENGLISH and english["source_text"] == ""


def test_translation_is_off_without_a_key_or_when_the_owner_says_so(monkeypatch, instance, kb_home):
    _write_chunks()
    result = _materialize(instance, translations)
    assert result.success
    metadata = result.asset_materializations_for_node("translations")[0].metadata
    assert metadata["skipped"].value == "no GROQ_API_KEY" and metadata["waiting"].value == 3
    check = coverage(result, "translations")
    assert not check.passed and check.severity == dg.AssetCheckSeverity.WARN
    assert check.metadata["waiting"].value == 3

    monkeypatch.setenv("GROQ_API_KEY", KEY)
    config_file = kb_home.parent / "config" / "config.toml"
    config_file.write_text("translate = false\n")
    with FakeGroq({SPANISH: SPANISH_EN}) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        result = _materialize(instance, translations)
    assert result.success and groq.requests == []
    assert "translate = false" in result.asset_materializations_for_node("translations")[0].metadata["skipped"].value
    assert coverage(result, "translations").passed  # the owner's choice, not a gap


def test_a_fatal_endpoint_error_stops_the_stage_and_caches_nothing(groq_env, monkeypatch, instance):
    _write_chunks()
    with FakeGroq(status_code=401) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        result = _materialize(instance, translations)
    assert result.success  # the stages after it in x_sync still run
    assert len(groq.requests) == 1  # stopped at the first: the key is wrong for every chunk
    assert "HTTP 401" in stage_failure(result, "translations")
    assert rows("SELECT count(*) FROM translations") == [(0,)]


@pytest.mark.parametrize(("text", "lang", "foreign"), [
    ("Plain English words here.", "en", False),
    ("Plain English words here.", None, False),
    ("Café crème in Zürich, naïve façade.", "en", False),  # not ASCII, but Latin letters only
    ("Привет, мир! Как дела?", None, True),  # Cyrillic under no tag
    ("日本語のテキストです。", None, True),
    ("An English post that names Москва once.", "en", False),  # most letters Latin
    ("Ελληνικά γράμματα and a few English", "en", True),  # most letters Greek
    ("Hola amigos, buenos días.", "es", True),  # the tag says Spanish
    ("12345 !!! 678", "es", False),  # no letter at all
    ("https://example.com", "qme", False),  # X's tag for "links only"
])
def test_the_foreign_text_rule(text, lang, foreign):
    conn = duckdb.connect()
    found = conn.execute(f"SELECT {FOREIGN_CHUNK_SQL} FROM (SELECT ? AS text, ? AS lang) c, (SELECT NULL AS lang) b",
                         [text, lang]).fetchone()[0]
    assert found is foreign


def test_japanese_passages_are_translated_and_found_by_their_own_words(groq_env, monkeypatch, instance):
    """Issue 29: a long Japanese post is cut into passages by characters; each
    passage goes out to be translated, the index shows the English, and a
    query of two Japanese characters finds the passage by its original."""
    from kb.index.chunking import chunk_text, word_count
    from kb.index.search import search
    from tests.scripts_text import JA

    text = "\n".join(f"第{i}部。{JA}" for i in range(1, 5))
    passages = chunk_text(text)
    assert len(passages) > 1 and all(word_count(p) <= 200 for p in passages)
    english = {p: f"Human rights, part {i}: all people are born free and equal." for i, p in enumerate(passages)}
    write([bookmark("7", BATCH, text=text, lang="ja")],
          texts=[SourceText("7", "post", "https://x.com/alice/status/7", text, "ja")], batch=BATCH)
    with FakeGroq(english) as groq:
        monkeypatch.setenv("GROQ_BASE_URL", groq.base_url)
        assert _materialize(instance, translations).success
        assert sorted(groq.user_texts()) == sorted(passages)  # each passage whole, in one piece
    embedder = EmbedderResource.from_settings(backend="hash")
    assert _materialize(instance, chunk_index, embedder=embedder, lance=ChunkIndexResource.from_settings()).success
    stored = ChunkIndex.from_settings().passages(tweet_id="7")
    assert [p["source_text"] for p in stored] == passages
    assert [p["text"] for p in stored] == [english[p] for p in passages]
    hits = search("尊厳", index=ChunkIndex.from_settings(), embedder=embedder.get_client(), mode="bm25").hits
    assert [h.tweet_id for h in hits] == ["7"] and "尊厳" in hits[0].best_source_text

"""chunk_text(): paragraph-aligned passages within a word limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kb.index.chunking import chunk_text, word_count


def test_short_paragraphs_merge_up_to_the_limit():
    text = "one two three\n\nfour five\n\n\nsix seven eight nine"
    assert chunk_text(text, max_words=5) == ["one two three\n\nfour five", "six seven eight nine"]
    assert chunk_text(text, max_words=100) == ["one two three\n\nfour five\n\nsix seven eight nine"]


def test_a_long_paragraph_splits_at_sentence_ends_into_equal_parts():
    sentences = [f"Sentence {i} has exactly six words." for i in range(10)]  # 60 words
    chunks = chunk_text(" ".join(sentences), max_words=50)
    assert len(chunks) == 2
    assert [word_count(c) for c in chunks] == [30, 30]  # equal, not 50 + 10
    assert all(c.endswith("words.") for c in chunks)


def test_a_sentence_over_the_limit_splits_between_words():
    chunks = chunk_text(" ".join(f"w{i}" for i in range(25)), max_words=10)
    assert [word_count(c) for c in chunks] == [9, 9, 7]


def test_single_line_breaks_stay_inside_a_paragraph():
    assert chunk_text("- item one\n- item two\n\nNext") == ["- item one\n- item two\n\nNext"]


def test_blank_text_gives_no_passages():
    assert chunk_text("") == [] and chunk_text(" \n\n \t") == []


def test_bad_limit():
    with pytest.raises(ValueError, match="max_words"):
        chunk_text("text", max_words=0)


paragraph = st.lists(st.text(alphabet="abc .!?", min_size=1, max_size=12), min_size=1, max_size=40).map(" ".join)


@settings(max_examples=60, deadline=None)
@given(st.lists(paragraph, min_size=1, max_size=8), st.integers(min_value=3, max_value=60))
def test_no_word_is_lost_and_no_chunk_is_over_the_limit(paragraphs, max_words):
    text = "\n\n".join(paragraphs)
    chunks = chunk_text(text, max_words=max_words)
    assert all(word_count(c) <= max_words for c in chunks)
    assert " ".join(chunks).split() == text.split()


# --- scripts without spaces between words (issue 29) ---------------------------
from tests.scripts_text import TEXTS  # noqa: E402


def _no_space(text: str) -> str:
    return "".join(text.split())


@pytest.mark.parametrize("lang", sorted(TEXTS))
def test_each_script_is_cut_within_the_limit(lang):
    # Real text, several times over: the default limit and a small one.
    text = "\n".join([TEXTS[lang]] * 12)
    for max_words in (200, 40):
        chunks = chunk_text(text, max_words=max_words)
        assert len(chunks) >= word_count(text) // max_words > 1
        assert all(word_count(c) <= max_words for c in chunks)
        assert _no_space("".join(chunks)) == _no_space(text)


def test_a_character_of_an_unspaced_script_is_a_word():
    assert word_count("人人生而自由") == 6
    assert word_count("すべての人間") == 6
    assert word_count("모든 인간은") == 5  # each Hangul syllable
    assert word_count("สิทธิ") == 3  # ส, ทธิ: a mark stays with its letter
    assert word_count("Rust 的 borrow checker") == 4
    # 4,480 characters of Chinese: passages of at most 200 characters.
    chunks = chunk_text((TEXTS["zh"] * 60)[:4480])
    assert len(chunks) > 20 and all(word_count(c) <= 200 for c in chunks)


def test_chinese_sentences_end_at_their_own_marks():
    sentences = TEXTS["zh"].split("。")
    chunks = chunk_text(TEXTS["zh"], max_words=50)
    assert all(c.endswith(("。", "；")) or c == chunks[-1] for c in chunks)
    assert chunks[0].startswith(sentences[0])


def test_a_thai_cut_falls_at_a_space_and_keeps_marks_with_their_letter():
    chunks = chunk_text(TEXTS["th"], max_words=60)
    assert len(chunks) > 1 and all(word_count(c) <= 60 for c in chunks)
    words = set(TEXTS["th"].split())
    assert all(c.split()[-1] in words for c in chunks)  # whole runs between spaces


def test_a_closing_quote_stays_with_its_sentence():
    text = " ".join(['He said "stop." Then he left.'] * 10)
    chunks = chunk_text(text, max_words=20)
    assert " ".join(chunks).split() == text.split()


unspaced = st.text(alphabet="人生而自由。あいう ขอกิ่ abc.", min_size=1, max_size=300)


@settings(max_examples=60, deadline=None)
@given(st.lists(unspaced, min_size=1, max_size=6), st.integers(min_value=1, max_value=40))
def test_no_character_is_lost_in_any_script(paragraphs, max_words):
    text = "\n\n".join(paragraphs)
    chunks = chunk_text(text, max_words=max_words)
    assert all(word_count(c) <= max_words for c in chunks)
    assert _no_space("".join(chunks)) == _no_space(text)


def test_a_run_without_spaces_is_cut_into_passages_of_bounded_length():
    """A run with no space was one word of any length: an inline image of
    20 MB in Base64 was one passage, given whole to each search that found
    it. Each LONG_WORD_CHARS of a run count one word now, so a passage has
    at most DEFAULT_MAX_WORDS * LONG_WORD_CHARS characters, and no character
    is lost. A long address stays whole inside its sentence."""
    from kb.index.chunking import DEFAULT_MAX_WORDS, LONG_WORD_CHARS, word_count

    image = "![photo](data:image/png;base64," + "iVBORw0KGgoAAAANSUhEUgAA" * 40_000 + ")"
    passages = chunk_text(f"A note with a photo.\n\n{image}\n\nThe end.")
    assert max(len(p) for p in passages) <= DEFAULT_MAX_WORDS * LONG_WORD_CHARS
    assert "".join(passages).replace("\n", "") == f"A note with a photo.{image}The end."
    address = "https://example.com/" + "a" * 90
    assert word_count(address) == 2
    assert chunk_text(f"See {address} for more.") == [f"See {address} for more."]

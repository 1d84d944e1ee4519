"""chunk_text(): paragraph-aligned passages within a word limit."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kb.chunking import chunk_text, word_count


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

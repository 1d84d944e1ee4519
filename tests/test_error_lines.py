"""The one reader of an error's first line (kb/error_lines.py): the stage
errors of `kb sync` and `kb status`, the wiki agent's run error, the
fetcher's failure detail and Ollama's errors use it."""

from kb.error_lines import error_line, first_line


def test_the_first_line_with_text_is_read_and_cut_at_the_limit():
    assert first_line("\n  \nValueError: bad page\n  Traceback ...") == "ValueError: bad page"
    assert first_line("x" * 400) == "x" * 300
    assert first_line("abcdef", limit=3) == "abc"


def test_a_message_without_text_gives_the_empty_word():
    assert first_line(" \n ", "the step failed") == "the step failed"
    assert first_line("") == ""


def test_an_error_without_a_message_is_named_by_its_type():
    assert error_line(TimeoutError()) == "TimeoutError"
    assert error_line(OSError("\nno route to host\nmore"), 200) == "no route to host"

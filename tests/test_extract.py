"""Extraction functions on real HTML and a real PDF made here: no browser."""

from __future__ import annotations

import pymupdf
import pytest

from kb.documents.web_links import kind_of_content
from kb.enrich.extract import (
    MAX_PAGE_CHARS,
    MAX_PAGE_ELEMENTS,
    THIN_WORDS,
    PageTooLarge,
    article_text,
    clean_fragment,
    extract_file,
    extracted_from_text,
    extract_html,
    extract_pdf,
    html_to_text,
    looks_blocked,
    page_size_refusal,
    recall_when_thin,
    rewrite_arxiv,
    trafilatura_fragment,
)
from tests.shared_data import shared_path

BODY = [
    "The river town kept its old stone bridge for four hundred years, and the people who crossed it every "
    "morning knew each worn step by heart. Engineers who came to study it found that the arches carried "
    "far more weight than the builders could have planned for.",
    "In the spring floods the water rose to the second arch, and the town closed the bridge to carts. "
    "Children stood on the bank and counted the tree trunks that the current pushed against the piers.",
    "A survey in the last century showed that the mortar had turned almost to stone itself. The council "
    "decided to leave the bridge as it was, and to build a new road bridge two miles down the valley.",
]


def article_page(body: list[str] = BODY) -> str:
    paragraphs = "\n".join(f"<p>{p}</p>" for p in body)
    return f"""<!doctype html><html><head><title>The Old Bridge | River Town News</title></head><body>
<header><nav><a href="/">Home</a> <a href="/news">News</a> <a href="/sport">Sport</a> <a href="/about">About us</a></nav></header>
<div class="cookie">We use cookies to improve your experience. Accept all cookies or manage your settings.</div>
<main><article>
<h1>The old bridge</h1>
{paragraphs}
<p>Read the <a href="/history/bridge">full history</a> of the bridge.</p>
<figure><img src="/images/bridge.jpg" alt="The bridge in winter"></figure>
</article>
<section id="comments"><h2>Comments</h2>
<div class="comment"><p>Great article! I crossed that bridge as a child, and I still remember the smell of the river in summer.</p></div>
</section></main>
<aside><h3>Most read</h3><ul><li><a href="/a">Council votes on parking fees</a></li><li><a href="/b">Local team wins cup</a></li></ul></aside>
<footer><p>Copyright River Town News. All rights reserved. Privacy policy. Terms of use.</p></footer>
</body></html>"""


# --- html_to_text ----------------------------------------------------------------

def test_html_to_text_makes_one_paragraph_per_block():
    html = "<article><h1>Title</h1><p>One <b>bold</b> word.</p><ul><li>first</li><li>second</li></ul></article>"
    assert html_to_text(html) == "Title\n\nOne bold word.\n\nfirst\n\nsecond"


def test_html_to_text_keeps_text_around_comments_and_inline_elements():
    html = "<p>before <!-- a note --> after <a href='x'>link</a>, <img src='i.png' alt='alt words'>end</p>"
    assert html_to_text(html) == "before after link, end"


def test_html_to_text_drops_scripts_styles_and_keeps_code_lines():
    html = "<div><script>var secret = 1;</script><style>p{}</style><p>Text</p><pre>line one\n  line two</pre>tail</div>"
    assert html_to_text(html) == "Text\n\nline one\n  line two\n\ntail"


def test_html_to_text_splits_table_cells_and_collapses_spaces():
    html = "<table><tr><td>a1</td><td>b1</td></tr><tr><td>a2</td><td>b2&nbsp;&nbsp; x</td></tr></table>"
    assert html_to_text(html) == "a1 b1\n\na2 b2 x"


def test_html_to_text_of_nothing_is_empty():
    assert html_to_text("") == ""
    assert html_to_text("   ") == ""


# --- extract_html ------------------------------------------------------------------

def test_extract_html_keeps_the_article_and_drops_the_boilerplate():
    result = extract_html(article_page(), "https://news.example/2024/bridge")
    for paragraph in BODY:
        assert paragraph in result.text
    for boilerplate in ("Accept all cookies", "Most read", "All rights reserved", "Great article", "Sport"):
        assert boilerplate not in result.text
    assert result.title == "The old bridge"
    assert result.word_count == len(result.text.split())
    assert not result.thin


def test_extract_html_keeps_links_as_absolute_addresses_and_leaves_images_out():
    result = extract_html(article_page(), "https://news.example/2024/bridge")
    linked = extract_html(boilerplate_page(), "https://news.example/2024/bridge")
    assert 'href="https://news.example/history/bridge"' in linked.text_html
    # Images are not extracted: the option brought captions and photo credits.
    assert "<img" not in result.text_html and "bridge in winter" not in result.text
    # The markup stays in the HTML only: the text has the link's words.
    assert "full history" in linked.text and "href" not in linked.text


def boilerplate_page() -> str:
    """An article with the boilerplate that trafilatura keeps inside it."""
    return f"""<!doctype html><html><head><title>The Old Bridge | River Town News</title></head><body>
<main><article>
<h1>The old bridge</h1>
<p>{BODY[0]}</p>
<p>Read also: <a href="/2024/ferry">The ferry that crossed the river before the bridge was built</a></p>
<p>{BODY[1]} The <a href="/history/bridge">full history</a> of the bridge is in the town archive.</p>
<p>Photo: Jane Doe © River Town News 2024</p>
<p>{BODY[2]}</p>
</article></main></body></html>"""


def test_extract_html_keeps_the_body_and_the_links_in_its_prose():
    result = extract_html(boilerplate_page(), "https://news.example/2024/bridge")
    for paragraph in BODY:
        assert paragraph in result.text
    assert "The full history of the bridge is in the town archive." in result.text
    assert 'href="https://news.example/history/bridge"' in result.text_html


def test_clean_fragment_keeps_prose_and_drops_what_only_points_elsewhere():
    fragment = (
        "<article><h2>How the arches carry the load</h2>"
        f"<p>{BODY[0]} See <a href='https://a.example/arch'>the survey</a> for the figures.</p>"
        "<ul><li>Stone arches carry weight by compression.</li>"
        "<li><a href='https://a.example/x'>Council votes on parking fees</a></li></ul>"
        "<pre><a href='https://a.example/code'>a link in code</a> stays</pre>"
        "<h3>Related articles</h3></article>"
    )
    text = html_to_text(clean_fragment(fragment))
    assert text == (f"How the arches carry the load\n\n{BODY[0]} See the survey for the figures.\n\n"
                    "Stone arches carry weight by compression.\n\na link in code stays")
    assert clean_fragment("") == "" and clean_fragment("   ") == ""


def fragment(paragraphs: list[str]) -> str:
    return "<article>" + "".join(f"<p>{p}</p>" for p in paragraphs) + "</article>"


def test_the_article_rule_takes_the_precision_result_only_when_it_keeps_nearly_all_the_text():
    boilerplate = "Subscribe to our newsletter for the best stories of the week."
    long_body = BODY * 8  # the boilerplate is less than 2% of the default result
    runs = {"default": fragment(long_body + [boilerplate]), "precision": fragment(long_body)}
    assert boilerplate not in article_text(runs.__getitem__)
    # When favor_precision cuts the body, the default result is kept whole.
    runs["precision"] = fragment(long_body[:4])
    text = article_text(runs.__getitem__)
    assert boilerplate in text and text.count(BODY[0]) == 8


def test_a_thin_result_gives_way_to_a_longer_favor_recall_result():
    def after_recall(paragraphs: list[str], recalled) -> tuple[str, str]:
        return recall_when_thin(fragment(paragraphs), html_to_text(fragment(paragraphs)), recalled)

    recalled_html, recalled_text = after_recall(["Only a teaser."], lambda: fragment(BODY))
    assert recalled_html == fragment(BODY) and recalled_text == "\n\n".join(BODY)
    # A long enough result is not read again.
    longer = fragment(BODY + ["Comments: 12. Log in to reply."])
    assert after_recall(BODY, lambda: longer) == (fragment(BODY), "\n\n".join(BODY))
    # A thin result stays when favor_recall finds less.
    assert after_recall(["Only a teaser."], lambda: "") == (fragment(["Only a teaser."]), "Only a teaser.")


def test_html_to_text_as_markdown_marks_headings_items_and_code():
    html = ("<article><h2>Title</h2><p>Text with <a href='https://x.example'>a link</a>.</p>"
            "<ul><li>one</li><li><p>two</p></li></ul><pre>x = 1\ny = 2</pre><h3></h3><p>end</p></article>")
    assert html_to_text(html, markdown=True) == (
        "## Title\n\nText with a link.\n\n- one\n\n- two\n\n```\nx = 1\ny = 2\n```\n\nend"
    )


def test_a_short_page_is_thin():
    result = extract_html(article_page(["Only a few words here about the bridge and the river."]), "https://n.example/")
    assert result.word_count < THIN_WORDS
    assert result.thin


def test_an_empty_page_is_thin_and_keeps_its_title():
    result = extract_html("<html><head><title>App</title></head><body><div id='root'></div></body></html>")
    assert result.text == "" and result.word_count == 0 and result.thin
    assert result.title == "App"


def test_challenge_page_looks_blocked_and_an_article_does_not():
    challenge = "<html><head><title>Just a moment...</title></head><body><p>Checking your browser.</p></body></html>"
    assert looks_blocked(challenge)
    assert not looks_blocked(article_page())


def test_content_state_text_becomes_escaped_html_one_paragraph_per_line():
    result = extracted_from_text("First block <script>x</script>\nSecond block\n\nThird", "Title")
    assert result.text_html == (
        "<article><p>First block &lt;script&gt;x&lt;/script&gt;</p><p>Second block</p><p>Third</p></article>"
    )
    assert result.text == "First block <script>x</script>\n\nSecond block\n\nThird"
    assert (result.title, result.word_count, result.thin) == ("Title", 6, True)


# --- real pages: the development set ------------------------------------------

@pytest.mark.slow
def test_on_real_pages_kb_scores_at_least_as_well_as_trafilatura_alone():
    """An eighth of the news development set (every 8th page): kb's
    extraction against trafilatura with its default options, by the set's
    own snippet measure (issues 15 and 28)."""
    import trafilatura

    from benchmarks.bench_extraction import NewsSet, html_of

    news = NewsSet(shared_path("eval", "extraction"))
    pages = news.pages[::8]
    raw = {p.key: html_of(p) for p in pages}
    kb = news.f1([news.counts(p, extract_html(raw[p.key], p.url).text) for p in pages])
    alone = news.f1([news.counts(p, trafilatura.extract(raw[p.key], url=p.url) or "") for p in pages])
    assert kb["f1"] >= alone["f1"], (kb, alone)


@pytest.mark.slow  # 38 real pages through kb and trafilatura: about 6 s of CPU
def test_on_real_pages_of_every_type_kb_scores_above_trafilatura_alone():
    """Every 40th page of the WCXB development split (38 pages, all 7 page types): kb's
    extraction against trafilatura with its default options, by the split's
    word F1 (issue 28). The block choice was fitted on these pages too, so
    this checks the shipped path, not the held-out figure (see
    benchmarks/extraction.md for that)."""
    import trafilatura

    from benchmarks.bench_extraction import WcxbSet, html_of

    wcxb = WcxbSet(shared_path("eval", "wcxb-dev"))
    pages = wcxb.pages[::40]
    raw = {p.key: html_of(p) for p in pages}
    kb = wcxb.f1([wcxb.counts(p, extract_html(raw[p.key], p.url).text) for p in pages])
    alone = wcxb.f1([wcxb.counts(p, trafilatura.extract(raw[p.key], url=p.url) or "") for p in pages])
    # 0.899 against 0.793 on 3 December 2026; the margin leaves room for a
    # new fit of the model.
    assert kb["f1"] > alone["f1"] + 0.05, (kb, alone)


@pytest.mark.slow  # 75 real pages through kb: about 8 s of CPU
def test_on_the_news_set_kb_keeps_the_precision_of_the_rules_after_the_model():
    """The news development set of the repository (benchmarks/data/, 75
    pages, word-shingle F1 as the news benchmark counts): 0.9721 with the
    rules after the model of issue 58, 0.9478 before them, 0.9718 without
    the boxes of related stories and newsletters, 0.9701 without those and
    the deks, 0.9699 without those and the video player's controls,
    0.9673 without those and the far runs of link titles on pages that are
    not articles, 0.9661 without those and the links above the story,
    0.9609 without those and the gallery rule, 0.9554 without that and the
    far runs of doubtful blocks."""
    from benchmarks.bench_extraction import page_counts, scores
    from benchmarks.bench_news_dev import load_pages

    result = scores([page_counts(page["main_text"], extract_html(page["html"]).text) for page in load_pages()])
    assert result["f1"] >= 0.972, result


@pytest.mark.parametrize("mode", ["default", "precision", "recall"])
def test_trafilatura_runs_without_the_fingerprint_give_what_extract_gives(mode):
    """trafilatura_fragment() calls bare_extraction() and trafilatura's HTML
    output itself, to skip the fingerprint of extract(); the fragment must
    stay what extract() gives, for a made-up page and every 100th real page
    of both sets."""
    import copy

    import lxml.html
    import trafilatura

    from benchmarks.bench_extraction import NewsSet, WcxbSet, html_of
    from kb.enrich.extract import MODES

    pages = [(article_page(), "https://town.example/news/bridge")]
    for dev in (NewsSet(shared_path("eval", "extraction")), WcxbSet(shared_path("eval", "wcxb-dev"))):
        pages += [(html_of(page), page.url) for page in dev.pages[::100]]
    for html, url in pages:
        tree = trafilatura.load_html(html)
        output = trafilatura.extract(copy.deepcopy(tree), url=url, output_format="html", include_images=False,
                                     include_tables=True, include_comments=False, include_links=True, **MODES[mode])
        body = lxml.html.document_fromstring(output).find("body") if output else None
        expected = "" if body is None else lxml.html.tostring(body, encoding="unicode").strip()
        got = trafilatura_fragment(copy.deepcopy(tree), url, mode)
        assert got.removeprefix("<article>").removesuffix("</article>") == \
            expected.removeprefix("<body>").removesuffix("</body>"), url


# --- PDF -----------------------------------------------------------------------------

def make_pdf(paragraphs: list[str], title: str = "Bridges of the Valley") -> bytes:
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_textbox(pymupdf.Rect(50, 50, 550, 800), "\n\n".join(paragraphs), fontsize=10)
    doc.set_metadata({"title": title})
    data = doc.tobytes()
    doc.close()
    return data


def test_extract_pdf_reads_the_text_layer():
    result = extract_pdf(make_pdf(BODY))
    assert "four hundred years" in result.text
    assert "road bridge two miles down the valley" in result.text
    assert result.title == "Bridges of the Valley"
    assert result.word_count >= THIN_WORDS
    assert result.text_html.startswith("<article>")


def test_extract_pdf_names_a_bad_file():
    with pytest.raises(ValueError, match="paper.pdf is not a readable PDF"):
        extract_pdf(b"%PDF-1.7 this is not really a pdf", "https://x.example/paper.pdf")


# --- extract_file (kb extract-file) ------------------------------------------------------

def test_extract_file_prints_what_the_chunker_sees(tmp_path):
    page = tmp_path / "bridge.html"
    page.write_text(article_page(), encoding="utf-8")
    text = extract_file(page, url="https://news.example/2024/bridge")
    assert text == extract_html(article_page(), "https://news.example/2024/bridge").text
    assert BODY[0] in text and "Accept all cookies" not in text


def test_extract_file_reads_a_saved_pdf(tmp_path):
    path = tmp_path / "paper.pdf"
    path.write_bytes(make_pdf(BODY))
    assert "four hundred years" in extract_file(path)


def test_extract_file_reads_a_page_in_another_encoding(tmp_path):
    page = tmp_path / "latin1.html"
    html = article_page([p + " Café crème." for p in BODY]).replace("<head>", '<head><meta charset="iso-8859-1">')
    page.write_bytes(html.encode("iso-8859-1"))
    assert "Café crème" in extract_file(page)


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing.html", None, "missing.html: no such file"),
        ("empty.html", b"  \n", "empty.html: the file is empty"),
        ("image.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "image.png: the file is binary"),
    ],
)
def test_extract_file_names_bad_input(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    with pytest.raises((FileNotFoundError, ValueError), match=message):
        extract_file(path)


# --- addresses and content types ----------------------------------------------------------

ARXIV = frozenset({"arxiv.org", "www.arxiv.org"})


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("https://arxiv.org/pdf/2401.01234", "https://arxiv.org/abs/2401.01234"),
        ("https://arxiv.org/pdf/2401.01234v2", "https://arxiv.org/abs/2401.01234v2"),
        ("https://www.arxiv.org/pdf/2401.01234v2.pdf", "https://www.arxiv.org/abs/2401.01234v2"),
        ("http://arxiv.org/pdf/hep-th/9901001", "http://arxiv.org/abs/hep-th/9901001"),
        ("https://arxiv.org/abs/2401.01234", "https://arxiv.org/abs/2401.01234"),
        ("https://example.org/pdf/2401.01234", "https://example.org/pdf/2401.01234"),
        ("https://arxiv.org/list/cs.CL/recent", "https://arxiv.org/list/cs.CL/recent"),
    ],
)
def test_rewrite_arxiv(url, expected):
    assert rewrite_arxiv(url, ARXIV) == expected


@pytest.mark.parametrize(
    ("content_type", "url", "kind"),
    [
        ("text/html; charset=utf-8", "https://a.example/post", "page"),
        (None, "https://a.example/post", "page"),
        ("application/pdf", "https://a.example/file", "pdf"),
        ("application/octet-stream", "https://a.example/paper.PDF", "pdf"),
        ("application/octet-stream", "https://a.example/setup.exe", "binary"),
        ("image/png", "https://a.example/x.png", "binary"),
        ("application/zip", "https://a.example/x.zip", "binary"),
        ("text/plain", "https://a.example/notes.txt", "page"),
    ],
)
def test_kind_of_content(content_type, url, kind):
    assert kind_of_content(content_type, url) == kind


def test_a_page_of_too_many_elements_is_refused_before_it_is_parsed(monkeypatch):
    """A page is read block by block: 1,500,000 short paragraphs (12 MB)
    took 281 s of CPU and 4.7 GB, 60,000 took 18.6 s (the red team, 7
    December 2026). Past MAX_PAGE_ELEMENTS or MAX_PAGE_CHARS kb refuses the
    page by name, as text and as bytes, before lxml builds its tree; a page
    at the limit is read."""
    import trafilatura

    def no_parse(*args, **kwargs):
        raise AssertionError("the page was parsed")

    flood = "<html><body>" + "<p>w" * (MAX_PAGE_ELEMENTS + 1) + "</body></html>"
    with monkeypatch.context() as patched:
        patched.setattr(trafilatura, "load_html", no_parse)
        for html in (flood, flood.encode()):
            with pytest.raises(PageTooLarge, match=f"https://flood.example/: the page has {MAX_PAGE_ELEMENTS + 3:,} "
                                                   f"elements, more than the {MAX_PAGE_ELEMENTS:,} that kb reads"):
                extract_html(html, "https://flood.example/")
    long_text = "<html><body><p>" + "w" * MAX_PAGE_CHARS + "</p></body></html>"
    assert page_size_refusal(long_text) == f"the page has more than {MAX_PAGE_CHARS:,} characters, the most that kb reads"
    at_limit = "<html><body>" + "<p>w" * (MAX_PAGE_ELEMENTS - 2) + "</body></html>"
    assert page_size_refusal(at_limit) is None


def test_extract_file_names_a_saved_page_that_is_too_large(tmp_path):
    path = tmp_path / "flood.html"
    path.write_text("<html><body>" + "<p>w" * (MAX_PAGE_ELEMENTS + 1) + "</body></html>")
    with pytest.raises(ValueError, match=f"{path}: the page has {MAX_PAGE_ELEMENTS + 3:,} elements"):
        extract_file(path)

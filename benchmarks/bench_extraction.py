"""Extraction quality: kb's extract stage against trafilatura alone.

From one run:

1. Real pages, two development sets in ../shared/eval:
   - extraction/: 400 news and other pages in many languages; snippets that
     the main text must hold and must not hold, counted over all pages
     (its score.py);
   - wcxb-dev/: 1,497 pages of 7 types (article, forum, product, collection,
     listing, documentation, service); word F1 of each page against its
     hand-made main text, averaged (its score.py).
   Rows: kb's `extract_html` (the documents stage and `kb extract-file`),
   kb's Telegram web parser (`source_parsers.extract_html`, Markdown; on one
   fold of the pages only), trafilatura alone as both score.py call it, and
   with --others every other extractor that pip installed here. F1 over
   all pages and per page type; CPU and wall time per page, p50 and p95,
   with the load average.

2. Synthetic pages: SciFact abstracts (../shared/eval/scifact) inside five
   page templates, scored by word 4-gram shingles. The true body is known
   exactly, so the table shows lost body text clearly.

3. With --cv: nested 5-fold cross-validation of what was tuned, the block
   choice (kb.enrich.block_choice: its trees and its selection per page
   type), by benchmarks/train_block_choice.py: fitted on 4 folds of both
   sets together, scored on the 5th, beside trafilatura on the same fold.
   The rules of kb.enrich.page_types are not tuned. The rows of kb's
   extract stage above use the shipped model, fitted on all pages. --cv
   needs the "train" extra (LightGBM): `.venv/bin/pip install -e ".[train]"`.

Run:
    .venv/bin/python benchmarks/bench_extraction.py [--no-synthetic] [--others] [--cv --cache FILE] [--json FILE]

It exits with status 2 when ../shared (or KB_SHARED_DIR) has no
development sets, and with status 1 when kb scores below trafilatura alone
on either set or on any page type.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import html
import importlib.util
import json
import os
import random
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from kb.enrich.extract import extract_html  # noqa: E402

SHARED = Path(os.environ.get("KB_SHARED_DIR", REPO.parent / "shared"))
DEFAULT_CORPUS = SHARED / "eval" / "scifact" / "corpus.jsonl"
NEWS_SET = SHARED / "eval" / "extraction"
WCXB_SET = SHARED / "eval" / "wcxb-dev"


# --- the measure -------------------------------------------------------------------

_WORD = re.compile(r"\w+", re.UNICODE)


def shingles(text: str, n: int = 4) -> Counter:
    """Word n-grams of a text, counted. A text shorter than n words is one
    shingle, so a short body still counts."""
    words = _WORD.findall(text or "")
    if not words:
        return Counter()
    return Counter(tuple(words[i:i + n]) for i in range(max(1, len(words) - n + 1)))


def page_counts(true: str, pred: str) -> tuple[float, float, float]:
    """(tp, fp, fn) of one page, normalized to sum to 1."""
    t, p = shingles(true), shingles(pred)
    tp = sum((t & p).values())
    fp = sum((p - t).values())
    fn = sum((t - p).values())
    total = tp + fp + fn
    return (tp / total, fp / total, fn / total) if total else (0.0, 0.0, 0.0)


def scores(counts: list[tuple[float, float, float]]) -> dict[str, float]:
    def precision(tp, fp, fn):
        if fp == fn == 0:
            return 1.0
        return tp / (tp + fp) if tp + fp else 0.0

    def recall(tp, fp, fn):
        if fp == fn == 0:
            return 1.0
        return tp / (tp + fn) if tp + fn else 0.0

    # As in the public benchmark: a page with no predicted shingle has no
    # precision (it counts in recall only), and the reverse.
    p = statistics.mean(precision(*c) for c in counts if c[0] + c[1] > 0)
    r = statistics.mean(recall(*c) for c in counts if c[0] + c[2] > 0)
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    exact = sum(1 for c in counts if c[1] == c[2] == 0) / len(counts)
    return {"f1": f1, "precision": p, "recall": r, "exact": exact}


# --- the pages -----------------------------------------------------------------------

@dataclass
class Abstract:
    title: str
    sentences: list[str]


@dataclass
class Page:
    html: str
    body: str  # the true article body: what an extractor should return
    template: str


def load_abstracts(path: Path) -> list[Abstract]:
    abstracts = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            item = json.loads(line)
            text = " ".join(item.get("text", "").split())
            sentences = [s for s in re.split(r"(?<=[.!?])\s+(?=[A-Z(])", text) if s]
            if len(text.split()) >= 120 and len(sentences) >= 4:
                abstracts.append(Abstract(item["title"].strip(), sentences))
    return abstracts


class Builder:
    """Makes one page from an article and random boilerplate."""

    def __init__(self, abstracts: list[Abstract], rng: random.Random):
        self.abstracts = abstracts
        self.rng = rng

    # Pieces of natural-language boilerplate, from other abstracts.
    def other(self) -> Abstract:
        return self.rng.choice(self.abstracts)

    def teaser(self, words: int = 25) -> str:
        sentence = " ".join(self.other().sentences[0].split()[:words])
        return sentence.rstrip(".,;") + "..."

    def comment_text(self) -> str:
        return " ".join(self.rng.sample(self.other().sentences, k=2))

    def paragraphs(self, article: Abstract) -> list[str]:
        sentences = list(article.sentences)
        out, i = [], 0
        while i < len(sentences):
            size = self.rng.randint(2, 4)
            out.append(" ".join(sentences[i:i + size]))
            i += size
        return out

    def body_blocks(self, paragraphs: list[str], *, tag: str = "p") -> tuple[str, str]:
        """HTML of the body and its true text. Sometimes one paragraph is a list
        or a quote, as in real articles."""
        parts, truth = [], []
        for n, p in enumerate(paragraphs):
            form = self.rng.random()
            if n > 0 and form < 0.12:
                items = re.split(r"(?<=[.!?])\s+", p)
                parts.append("<ul>" + "".join(f"<li>{html.escape(s)}</li>" for s in items) + "</ul>")
            elif n > 0 and form < 0.2:
                parts.append(f"<blockquote><p>{html.escape(p)}</p></blockquote>")
            elif tag == "br":
                parts.append(f"{html.escape(p)}<br><br>")
            else:
                parts.append(f"<{tag}>{html.escape(p)}</{tag}>")
            truth.append(p)
        return "\n".join(parts), "\n\n".join(truth)

    def nav(self) -> str:
        sections = self.rng.sample(
            ["News", "World", "Science", "Health", "Technology", "Opinion", "Culture", "Sport", "Business",
             "Climate", "Education", "Podcasts", "Video", "Newsletters", "Events", "Jobs"], k=10)
        return "<nav class='site-nav'><ul>" + "".join(
            f"<li><a href='/{s.lower()}'>{s}</a></li>" for s in sections) + "</ul></nav>"

    def cookie_banner(self) -> str:
        return ("<div id='cookie-consent' class='banner'><p>We and our partners use cookies and similar "
                "technologies to store and access information on your device, to measure how you use our "
                "site and to show you personalised content and advertising. You can accept all cookies, "
                "reject them, or choose which ones we may use in the settings.</p>"
                "<button>Accept all</button> <button>Reject</button> <a href='/privacy'>Settings</a></div>")

    def related(self, count: int = 4) -> str:
        items = "".join(
            f"<li><a href='/story/{self.rng.randint(1000, 9999)}'><h4>{html.escape(self.other().title)}</h4>"
            f"<p>{html.escape(self.teaser())}</p></a></li>"
            for _ in range(count))
        return f"<section class='related'><h3>Related stories</h3><ul>{items}</ul></section>"

    def comments(self, count: int) -> str:
        names = ["Maria K.", "dr_jones", "Sam", "P. Okafor", "lena.w", "Tom R."]
        items = "".join(
            f"<li class='comment'><div class='comment-author'>{self.rng.choice(names)}</div>"
            f"<div class='comment-body'><p>{html.escape(self.comment_text())}</p></div>"
            f"<a class='reply' href='#'>Reply</a></li>"
            for _ in range(count))
        return f"<section id='comments' class='comments'><h3>{count} comments</h3><ol>{items}</ol></section>"

    def footer(self) -> str:
        return ("<footer class='site-footer'><div class='links'><a href='/about'>About us</a> "
                "<a href='/contact'>Contact</a> <a href='/careers'>Careers</a> <a href='/privacy'>Privacy policy</a> "
                "<a href='/terms'>Terms of use</a></div><p>Copyright 2024 The Daily Review Media Group. All rights "
                "reserved. No part of this site may be reproduced without our written permission. Registered "
                "office: 12 Harbour Street, Port City.</p></footer>")

    def newsletter(self) -> str:
        return ("<div class='newsletter'><h4>Get the morning briefing</h4><p>The most important science and "
                "health stories of the day, in your inbox every morning before eight. Free, and you can "
                "unsubscribe at any time.</p><input type='email' placeholder='Email'><button>Sign up</button></div>")

    def byline(self) -> str:
        return (f"<div class='byline'>By <a href='/authors/{self.rng.randint(1, 99)}'>Staff Reporter</a> · "
                f"{self.rng.randint(1, 28)} March 2024 · {self.rng.randint(3, 12)} min read</div>")

    def share(self) -> str:
        return "<div class='share'><a href='#'>Share</a> <a href='#'>Post</a> <a href='#'>Email</a> <a href='#'>Print</a></div>"

    def ad(self) -> str:
        return ("<div class='ad-slot'><span>Advertisement</span><p>Continue reading below</p>"
                "<iframe src='/ads/slot'></iframe></div>")

    def author_bio(self) -> str:
        return (f"<div class='author-bio'><h4>About the author</h4><p>{html.escape(self.comment_text())}</p></div>")

    # The templates.
    def news(self, a: Abstract) -> Page:
        blocks, truth = self.body_blocks(self.paragraphs(a))
        parts = blocks.split("\n")
        if len(parts) > 2:  # an ad between paragraphs, as news sites do
            parts.insert(len(parts) // 2, self.ad())
        doc = f"""<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">
<title>{html.escape(a.title)} | The Daily Review</title>
<meta name="description" content="{html.escape(self.teaser())}">
<script>window.dataLayer = window.dataLayer || []; function gtag(){{dataLayer.push(arguments);}}</script>
<style>.site-nav li{{display:inline}}</style></head>
<body>{self.cookie_banner()}
<header class="masthead"><a class="logo" href="/">The Daily Review</a>{self.nav()}</header>
<main><article class="story">
<header><h1>{html.escape(a.title)}</h1>{self.byline()}{self.share()}</header>
<div class="story-body">{''.join(parts)}</div>
{self.author_bio() if self.rng.random() < 0.5 else ''}
</article>
{self.related()}
{self.comments(self.rng.randint(0, 5))}
</main>
<aside class="sidebar">{self.newsletter()}<h3>Most read</h3><ol>{''.join(f"<li><a href='/m/{i}'>{html.escape(self.other().title)}</a></li>" for i in range(5))}</ol></aside>
{self.footer()}</body></html>"""
        return Page(doc, truth, "news")

    def blog(self, a: Abstract) -> Page:
        blocks, truth = self.body_blocks(self.paragraphs(a))
        tags = "".join(f"<a rel='tag' href='/tag/{t}'>{t}</a> " for t in self.rng.sample(
            ["biology", "medicine", "papers", "notes", "reading", "genetics", "methods"], k=3))
        doc = f"""<!DOCTYPE html><html><head><title>{html.escape(a.title)} – Lab Notebook</title></head>
<body class="single-post"><div id="page" class="site">
<header id="masthead"><p class="site-title"><a href="/">Lab Notebook</a></p>
<p class="site-description">Notes on papers I read, and what I learned from them</p>{self.nav()}</header>
<div id="content"><div id="primary" class="content-area">
<div class="post type-post hentry">
<h2 class="entry-title">{html.escape(a.title)}</h2>
<div class="entry-meta">Posted on March {self.rng.randint(1, 28)}, 2024 by admin</div>
<div class="entry-content">{blocks}</div>
<div class="entry-footer">Tags: {tags}</div>
</div>
<nav class="post-navigation"><a href="/prev">← {html.escape(self.other().title)}</a>
<a href="/next">{html.escape(self.other().title)} →</a></nav>
{self.comments(self.rng.randint(1, 6))}
</div>
<div id="secondary" class="widget-area">
<section class="widget"><h3>About me</h3><p>{html.escape(self.comment_text())}</p></section>
<section class="widget"><h3>Recent posts</h3><ul>{''.join(f"<li><a href='/p/{i}'>{html.escape(self.other().title)}</a></li>" for i in range(5))}</ul></section>
<section class="widget"><h3>Archives</h3><ul><li>March 2024</li><li>February 2024</li><li>January 2024</li></ul></section>
</div></div>
{self.footer()}</div></body></html>"""
        return Page(doc, truth, "blog")

    def docs(self, a: Abstract) -> Page:
        blocks, truth = self.body_blocks(self.paragraphs(a))
        toc = "".join(f"<li><a href='/docs/{i}'>{html.escape(' '.join(self.other().title.split()[:5]))}</a></li>"
                      for i in range(12))
        doc = f"""<html><head><title>{html.escape(a.title)}</title></head><body>
<div class="topbar"><a href="/">Research Wiki</a> <input placeholder="Search the wiki"> <a href="/login">Log in</a></div>
<div class="layout"><div class="toc"><h3>Contents</h3><ul>{toc}</ul></div>
<div class="page"><div class="breadcrumb"><a href="/">Home</a> › <a href="/topics">Topics</a> › {html.escape(a.title[:40])}</div>
<div id="content"><h1>{html.escape(a.title)}</h1>{blocks}</div>
<div class="cite-box"><h4>Cite this page</h4><p>Research Wiki contributors. {html.escape(a.title)}. Retrieved 2024.</p></div>
<div class="page-meta">This page was last edited on 3 March 2024. Content is available under a free licence unless
otherwise noted.</div></div></div>
{self.footer()}</body></html>"""
        return Page(doc, truth, "docs")

    def table_layout(self, a: Abstract) -> Page:
        blocks, truth = self.body_blocks(self.paragraphs(a), tag="br")
        doc = f"""<html><head><title>{html.escape(a.title)}</title></head><body bgcolor="#ffffff">
<table width="100%" border="0"><tr><td colspan="2"><font size="5">Department of Life Sciences</font>
<br><a href="/">Home</a> | <a href="/people">People</a> | <a href="/research">Research</a> | <a href="/teaching">Teaching</a></td></tr>
<tr><td width="180" valign="top"><b>Menu</b><br><a href="/seminars">Seminars</a><br><a href="/pubs">Publications</a><br>
<a href="/jobs">Open positions</a><br><a href="/contact">Contact</a><br><br><b>News</b><br><font size="2">{html.escape(self.teaser(18))}</font></td>
<td valign="top"><font size="4"><b>{html.escape(a.title)}</b></font><br><br>{blocks}</td></tr>
<tr><td colspan="2"><font size="1">Last updated 2019. Webmaster: web@lifesci.example. Best viewed with any browser.</font></td></tr>
</table></body></html>"""
        return Page(doc, truth, "table_layout")

    def div_soup(self, a: Abstract) -> Page:
        paragraphs = self.paragraphs(a)
        cls = lambda: "c" + "".join(self.rng.choices("abcdefghijklmnop0123456789", k=6))  # noqa: E731
        parts, truth = [], []
        for n, p in enumerate(paragraphs):
            parts.append(f"<div class='{cls()}'><div class='{cls()}'>{html.escape(p)}</div></div>")
            truth.append(p)
            if n == 0 and len(paragraphs) > 2:
                parts.append(f"<div class='{cls()}'><a href='/x'>Read more: {html.escape(self.other().title)}</a></div>")
        doc = f"""<!DOCTYPE html><html><head><title>{html.escape(a.title)}</title>
<script src="/static/app.3f9a1.js" defer></script></head><body>
<div id="__next"><div class="{cls()}"><div class="{cls()}">{self.nav()}</div></div>
{self.cookie_banner()}
<div class="{cls()}"><div class="{cls()}"><div class="{cls()}"><span class="{cls()}">{html.escape(a.title)}</span></div>
<div class="{cls()}">{''.join(parts)}</div></div>
<div class="{cls()}">{self.related(3)}</div></div>
<div class="{cls()}">{self.newsletter()}</div>
{self.footer()}</div></body></html>"""
        return Page(doc, "\n\n".join(truth), "div_soup")

    def build(self, article: Abstract) -> Page:
        template = self.rng.choice([self.news, self.blog, self.docs, self.table_layout, self.div_soup])
        return template(article)


def make_pages(abstracts: list[Abstract], count: int, seed: int) -> list[Page]:
    rng = random.Random(seed)
    builder = Builder(abstracts, rng)
    articles = rng.sample(abstracts, k=min(count, len(abstracts)))
    return [builder.build(a) for a in articles]


# --- the synthetic pages: extractors and run ------------------------------------------

def ours(page_html: str) -> str:
    """What the documents stage stores as the text of a page."""
    return extract_html(page_html, "https://site.example/article").text


def trafilatura_alone(page_html: str) -> str:
    """trafilatura called as the public benchmark calls it."""
    import trafilatura

    return trafilatura.extract(page_html, include_comments=False) or ""


EXTRACTORS: dict[str, Callable[[str], str]] = {"kb extract_html": ours, "trafilatura": trafilatura_alone}


def evaluate(pages: list[Page]) -> dict[str, dict]:
    results = {}
    for name, extractor in EXTRACTORS.items():
        extractor(pages[0].html)  # warm-up: imports and caches stay out of the timing
        counts, by_template, seconds = [], {}, []
        for page in pages:
            started = time.perf_counter()
            predicted = extractor(page.html)
            seconds.append(time.perf_counter() - started)
            c = page_counts(page.body, predicted)
            counts.append(c)
            by_template.setdefault(page.template, []).append(c)
        results[name] = scores(counts) | {
            "ms_per_page_p50": 1000 * statistics.median(seconds),
            "ms_per_page_p95": 1000 * percentile(seconds, 95),
            "by_template_f1": {t: round(scores(cs)["f1"], 4) for t, cs in sorted(by_template.items())},
        }
    return results


def percentile(values: list[float], q: int) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


# --- the development sets of real pages ------------------------------------------------------

def load_dev_set(folder: Path):
    """The news set's own score.py, so that the figures are the ones its
    README gives. Raises FileNotFoundError when the folder is absent."""
    script = folder / "score.py"
    if not script.exists():
        raise FileNotFoundError(f"{folder}: no development set here (no score.py)")
    spec = importlib.util.spec_from_file_location("extraction_dev_score", script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class DevPage:
    key: str  # "news/<key>" or "wcxb/<id>": unique over both sets
    url: str
    kind: str  # the page type of the set's annotation; "news" for the news set
    path: Path


class NewsSet:
    """The 400 pages of ../shared/eval/extraction: snippets that the text
    must hold and must not hold, counted over all pages (its score.py)."""

    name = "news"

    def __init__(self, folder: Path):
        self.dev = load_dev_set(folder)
        self.pages = [DevPage(f"news/{key}", item["url"].strip(), "news", folder / "html" / f"{key}.html.gz")
                      for key, item in self.dev.SNIPPETS.items()]

    def counts(self, page: DevPage, text: str) -> tuple[int, int, int]:
        """(tp, fp, fn) of one page, as the set's score.py counts them."""
        snippets = self.dev.SNIPPETS[page.key.removeprefix("news/")]
        text = self.dev.norm(text)
        tp = sum(1 for s in snippets["with"] if self.dev.norm(s) in text)
        fp = sum(1 for s in snippets["without"] if self.dev.norm(s) in text)
        return tp, fp, len(snippets["with"]) - tp

    @staticmethod
    def f1(counts: list[tuple[int, int, int]]) -> dict[str, float]:
        tp, fp, fn = (sum(c[i] for c in counts) for i in range(3))
        p = tp / (tp + fp) if tp + fp else 0.0
        r = tp / (tp + fn) if tp + fn else 0.0
        return {"f1": 2 * p * r / (p + r) if p + r else 0.0, "precision": p, "recall": r, "pages": len(counts)}


_WORDS = re.compile(r"\w+")


class WcxbSet:
    """The 1,497 pages of ../shared/eval/wcxb-dev: word F1 of each page
    against its hand-made main text, averaged (its score.py)."""

    name = "wcxb"

    def __init__(self, folder: Path):
        self.truth: dict[str, str] = {}
        self.pages = []
        for path in sorted((folder / "dev" / "ground-truth").glob("*.json")):
            item = json.loads(path.read_text(encoding="utf-8"))
            kind = ((item.get("_internal") or {}).get("page_type") or {})
            kind = kind.get("primary", "article") if isinstance(kind, dict) else (kind or "article")
            key = f"wcxb/{path.stem}"
            self.truth[key] = item["ground_truth"].get("main_content") or ""
            self.pages.append(DevPage(key, item.get("url") or "", "collection" if kind == "category" else kind,
                                      folder / "dev" / "html" / f"{path.stem}.html.gz"))

    def counts(self, page: DevPage, text: str) -> tuple[float, float, float]:
        """(precision, recall, F1) of the words of one page (WCXB's measure)."""
        predicted, true = _WORDS.findall((text or "").lower()), _WORDS.findall(self.truth[page.key].lower())
        if not true:
            return (1.0, 1.0, 1.0) if not predicted else (0.0, 0.0, 0.0)
        if not predicted:
            return (0.0, 0.0, 0.0)
        overlap = sum((Counter(predicted) & Counter(true)).values())
        p, r = overlap / len(predicted), overlap / len(true)
        return p, r, 2 * p * r / (p + r) if p + r else 0.0

    @staticmethod
    def f1(counts: list[tuple[float, float, float]]) -> dict[str, float]:
        if not counts:
            return {"f1": 0.0, "precision": 0.0, "recall": 0.0, "pages": 0}
        return {"f1": statistics.mean(c[2] for c in counts), "precision": statistics.mean(c[0] for c in counts),
                "recall": statistics.mean(c[1] for c in counts), "pages": len(counts)}


def html_of(page: DevPage) -> bytes:
    return gzip.decompress(page.path.read_bytes())


def dev_extractors(others: bool) -> dict[str, Callable[[bytes, str], str]]:
    import trafilatura

    from kb.telegram import source_parsers

    extractors = {
        "kb extract_html": lambda page, url: extract_html(page, url).text,
        "kb Telegram web": lambda page, url: source_parsers.extract_html(page, url)[0],
        # As both sets' score.py call it.
        "trafilatura": lambda page, url: trafilatura.extract(page, url=url) or "",
    }
    if others:
        extractors |= other_extractors()
    return extractors


def other_extractors() -> dict[str, Callable[[bytes, str], str]]:
    """Other extractors that pip installs here, each with its documented
    main-content call. One that is not installed is left out."""
    found = {}
    if importlib.util.find_spec("resiliparse"):
        def resiliparse(page: bytes, url: str) -> str:
            from resiliparse.extract.html2text import extract_plain_text
            from resiliparse.parse.encoding import bytes_to_str, detect_encoding
            from resiliparse.parse.html import HTMLTree

            return extract_plain_text(HTMLTree.parse(bytes_to_str(page, detect_encoding(page))), main_content=True)
        found["resiliparse 2"] = resiliparse
    if importlib.util.find_spec("readability"):
        def readability(page: bytes, url: str) -> str:
            import lxml.html
            from readability import Document

            summary = Document(page, url=url).summary(html_partial=True)
            return lxml.html.fromstring(summary).text_content() if summary.strip() else ""
        found["readability-lxml"] = readability
    if importlib.util.find_spec("justext"):
        def justext_(page: bytes, url: str) -> str:
            import justext

            return "\n".join(p.text for p in justext.justext(page, justext.get_stoplist("English"))
                             if not p.is_boilerplate)
        found["justext"] = justext_
    if importlib.util.find_spec("goose3"):
        def goose(page: bytes, url: str) -> str:
            from goose3 import Goose

            with Goose({"enable_image_fetching": False}) as g:
                return g.extract(raw_html=page.decode("utf-8", "replace")).cleaned_text or ""
        found["goose3"] = goose
    if importlib.util.find_spec("newspaper"):
        def newspaper(page: bytes, url: str) -> str:
            from newspaper import Article

            article = Article(url or "https://site.example/")
            article.download(input_html=page.decode("utf-8", "replace"))
            article.parse()
            return article.text or ""
        found["newspaper4k"] = newspaper
    if importlib.util.find_spec("boilerpy3"):
        def boilerpy(page: bytes, url: str) -> str:
            from boilerpy3 import extractors

            return extractors.ArticleExtractor(raise_on_failure=False).get_content(page.decode("utf-8", "replace"))
        found["boilerpy3"] = boilerpy
    return found


def _quiet(extractor: Callable[[bytes, str], str]) -> Callable[[bytes, str], str]:
    """An extractor that fails on a page returns no text: the page scores 0."""
    def run(page: bytes, url: str) -> str:
        try:
            return extractor(page, url)
        except Exception:  # noqa: BLE001 - other libraries fail in many ways on real pages
            return ""
    return run


def evaluate_dev(sets: list, others: bool, limit: int | None) -> tuple[dict, dict]:
    """(scores and times of each extractor on each set, its text of each
    page). The extractors run on each page one after the other, so that
    load on the machine hits all alike. CPU time is the figure to compare
    on a shared machine; wall time is what a user waits."""
    extractors = {name: _quiet(f) for name, f in dev_extractors(others).items()}
    predictions: dict[str, dict[str, str]] = {name: {} for name in extractors}
    wall: dict[str, list[float]] = {name: [] for name in extractors}
    cpu: dict[str, list[float]] = {name: [] for name in extractors}
    first = sets[0].pages[0]
    for extractor in extractors.values():  # warm-up: imports and caches stay out of the timing
        extractor(html_of(first), first.url)
    for dev in sets:
        for page in dev.pages[:limit]:
            raw = html_of(page)
            for name, extractor in extractors.items():
                if name not in ALL_PAGES and fold_of(page) != ONE_FOLD:
                    continue
                started, cpu_started = time.perf_counter(), time.process_time()
                predictions[name][page.key] = extractor(raw, page.url)
                cpu[name].append(time.process_time() - cpu_started)
                wall[name].append(time.perf_counter() - started)
    results = {}
    for name in extractors:
        if not cpu[name]:
            continue  # a one-fold row with no page of that fold under --limit
        results[name] = {"times": {"cpu_ms_p50": 1000 * statistics.median(cpu[name]),
                                   "cpu_ms_p95": 1000 * percentile(cpu[name], 95),
                                   "wall_ms_p50": 1000 * statistics.median(wall[name]),
                                   "wall_ms_p95": 1000 * percentile(wall[name], 95)}}
        for dev in sets:
            pages = [p for p in dev.pages[:limit] if p.key in predictions[name]]
            results[name][dev.name] = set_scores(dev, pages, predictions[name])
    return results, predictions


# The rows that run on every page. The others run on one fold (a fifth of
# the pages, the same for all), to keep the run short on a shared machine:
# the Telegram web parser (the same extract_html, written as Markdown) and
# the other extractors. Each row has its own page count.
ALL_PAGES = frozenset({"kb extract_html", "trafilatura"})
ONE_FOLD = 0


def set_scores(dev, pages: list[DevPage], predictions: dict[str, str]) -> dict:
    """The set's figure over all its pages and per page type."""
    counts = {page.key: dev.counts(page, predictions.get(page.key, "")) for page in pages}
    out = {"all": dev.f1(list(counts.values()))}
    for kind in sorted({page.kind for page in pages}):
        out[kind] = dev.f1([counts[p.key] for p in pages if p.kind == kind])
    return out


# --- cross-validation of every tuned choice ------------------------------------------------------

FOLDS = 5


def fold_of(page: DevPage) -> int:
    """A fixed split that follows no site, language or type: a hash of the key."""
    return int(hashlib.sha256(page.key.encode()).hexdigest(), 16) % FOLDS


def mean_spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}"


# --- main ------------------------------------------------------------------------------------------

def print_dev(results: dict[str, dict], sets: list) -> None:
    print(f"{'extractor':<20} {'CPU ms p50':>10} {'p95':>7} {'wall ms p50':>11} {'p95':>7}   "
          + "   ".join(f"{dev.name} F1 (P/R)" for dev in sets))
    for name, r in results.items():
        t = r["times"]
        print(f"{name:<20} {t['cpu_ms_p50']:10.1f} {t['cpu_ms_p95']:7.1f} {t['wall_ms_p50']:11.1f} "
              f"{t['wall_ms_p95']:7.1f}   "
              + "   ".join(f"{r[dev.name]['all']['f1']:.4f} ({r[dev.name]['all']['precision']:.3f}/"
                           f"{r[dev.name]['all']['recall']:.3f})" for dev in sets))
    for dev in sets:
        kinds = [k for k in next(iter(results.values()))[dev.name] if k != "all"]
        if len(kinds) < 2:
            continue
        print(f"\n{dev.name}: word F1 per page type (pages)")
        counts = next(iter(results.values()))[dev.name]
        print(f"{'extractor':<20} " + " ".join(f"{k[:13] + ' (' + str(counts[k]['pages']) + ')':>18}" for k in kinds))
        for name, r in results.items():
            print(f"{name:<20} " + " ".join(f"{r[dev.name][k]['f1']:18.4f}" for k in kinds))


def print_synthetic(pages: list[Page], seed: int, results: dict[str, dict]) -> None:
    print(f"Synthetic pages: {len(pages)} pages, seed {seed}, templates: "
          f"{dict(sorted(Counter(p.template for p in pages).items()))} (shingle F1, per page)")
    print(f"{'extractor':<22} {'prec':>6} {'recall':>6} {'F1':>6} {'exact':>6} {'p50 ms':>7} {'p95 ms':>7}")
    for name, r in results.items():
        print(f"{name:<22} {r['precision']:6.4f} {r['recall']:6.4f} {r['f1']:6.4f} {r['exact']:6.3f} "
              f"{r['ms_per_page_p50']:7.1f} {r['ms_per_page_p95']:7.1f}")
    for name, r in results.items():
        print(f"  {name}: F1 by template {r['by_template_f1']}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--news-set", type=Path, default=NEWS_SET, help="the folder of the 400-page news set")
    parser.add_argument("--wcxb-set", type=Path, default=WCXB_SET, help="the folder of the WCXB development split")
    parser.add_argument("--limit", type=int, help="only the first N pages of each set (a quick look)")
    parser.add_argument("--fold", type=int, choices=range(FOLDS),
                        help="only the pages of this fold of the cross-validation split (a fifth of each set)")
    parser.add_argument("--others", action="store_true", help="also score the other extractors that are installed")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="SciFact corpus.jsonl")
    parser.add_argument("--pages", type=int, default=200, help="synthetic pages")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-synthetic", action="store_true", help="skip the synthetic table")
    parser.add_argument("--cv", action="store_true", help="nested cross-validation of the block choice")
    parser.add_argument("--cache", type=Path, help="keep trafilatura's runs for --cv in this file")
    parser.add_argument("--json", type=Path, help="also write all figures to this file")
    args = parser.parse_args()
    try:
        sets = [NewsSet(args.news_set), WcxbSet(args.wcxb_set)]
    except FileNotFoundError as exc:
        print(f"{exc}. The development sets live in ../shared/eval next to the repository; "
              "give --news-set and --wcxb-set or set KB_SHARED_DIR.", file=sys.stderr)
        return 2
    if args.fold is not None:
        for dev in sets:
            dev.pages = [p for p in dev.pages if fold_of(p) == args.fold]
    out: dict = {"load_before": os.getloadavg(), "fold": args.fold}
    out["dev"], predictions = evaluate_dev(sets, args.others, args.limit)
    out["load_after"] = os.getloadavg()
    print(f"Real pages: {', '.join(f'{len(d.pages[:args.limit])} of {d.name}' for d in sets)}; "
          f"load average {out['load_before'][0]:.1f} before, {out['load_after'][0]:.1f} after")
    print_dev(out["dev"], sets)
    if not args.no_synthetic:
        if not args.corpus.exists():
            print(f"{args.corpus}: no such file, so no synthetic table. Give --corpus.", file=sys.stderr)
        else:
            pages = make_pages(load_abstracts(args.corpus), args.pages, args.seed)
            out["synthetic"] = evaluate(pages)
            print()
            print_synthetic(pages, args.seed, out["synthetic"])
    if args.cv:
        if args.limit or args.fold is not None:
            print("--cv needs the whole development sets: leave out --limit and --fold.", file=sys.stderr)
            return 2
        import train_block_choice

        table = train_block_choice.block_table(sets, args.cache)
        out["cv"] = train_block_choice.nested_cv(sets, table, train_block_choice.Scorer(sets, table))
        print()
        train_block_choice.print_table(out["cv"])
    if args.json:
        args.json.write_text(json.dumps(out, indent=1, default=str), encoding="utf-8")
    failed = [f"{dev.name} {kind}" for dev in sets for kind, s in out["dev"]["kb extract_html"][dev.name].items()
              if s["f1"] < out["dev"]["trafilatura"][dev.name][kind]["f1"]]
    if failed:
        print(f"FAIL: kb's extract stage scores below trafilatura alone on: {', '.join(failed)}.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Extraction quality: the `documents` extract stage against trafilatura alone.

The measure is the one of the public article-extraction benchmarks: word
4-gram shingles of the predicted text against the true article body;
precision and recall per page (the counts normalized per page, so a long page
weighs no more than a short one), averaged over the pages; F1 from the two
averages.

The public benchmark pages are not available offline here, and no package
ships them. So this benchmark builds its own pages: real scientific text
(SciFact abstracts, from ../shared/eval/scifact) inside realistic page
templates (news site, blog, documentation page, old table layout, "div soup"
without semantic tags). The boilerplate is natural language too (teasers,
comments, author notes made of other abstracts), which is the hard case for
an extractor. The true body is known exactly, because the page is built
from it. The templates were written before the extractor was measured on
them, and the extractor was not tuned to them.

Run:
    .venv/bin/python benchmarks/bench_extraction.py [--pages 200] [--seed 7] [--json]

It exits with status 1 when our extract stage scores below trafilatura.
"""

from __future__ import annotations

import argparse
import html
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

from kb.extract import extract_html  # noqa: E402

SHARED = Path(os.environ.get("KB_SHARED_DIR", REPO.parent / "shared"))
DEFAULT_CORPUS = SHARED / "eval" / "scifact" / "corpus.jsonl"


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


# --- the extractors -----------------------------------------------------------------

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
            "by_template_f1": {t: round(scores(cs)["f1"], 4) for t, cs in sorted(by_template.items())},
        }
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="SciFact corpus.jsonl")
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--save-pages", type=Path, help="write the pages and their true bodies to this folder")
    args = parser.parse_args()
    if not args.corpus.exists():
        print(f"{args.corpus}: no such file. Give --corpus or set KB_SHARED_DIR.", file=sys.stderr)
        return 2
    pages = make_pages(load_abstracts(args.corpus), args.pages, args.seed)
    if args.save_pages:
        args.save_pages.mkdir(parents=True, exist_ok=True)
        for n, page in enumerate(pages):
            (args.save_pages / f"{n:04d}-{page.template}.html").write_text(page.html, encoding="utf-8")
            (args.save_pages / f"{n:04d}-{page.template}.txt").write_text(page.body, encoding="utf-8")
    results = evaluate(pages)
    if args.json:
        print(json.dumps({"pages": len(pages), "seed": args.seed, "results": results}, indent=2))
    else:
        print(f"{len(pages)} pages, seed {args.seed}, templates: "
              f"{dict(sorted(Counter(p.template for p in pages).items()))}")
        print(f"{'extractor':<18} {'F1':>6} {'prec':>6} {'recall':>6} {'exact':>6} {'ms/page':>8}")
        for name, r in results.items():
            print(f"{name:<18} {r['f1']:6.3f} {r['precision']:6.3f} {r['recall']:6.3f} {r['exact']:6.3f} "
                  f"{r['ms_per_page_p50']:8.1f}")
        for name, r in results.items():
            print(f"  {name}: F1 by template {r['by_template_f1']}")
    if results["kb extract_html"]["f1"] < results["trafilatura"]["f1"]:
        print("FAIL: the extract stage scores below trafilatura alone.", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

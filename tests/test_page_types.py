"""Page types from a page's own signals (kb.enrich.page_types): on small pages
made here, on hostile markup, and on a few real pages of ../shared/eval/wcxb-dev."""

from __future__ import annotations

import gzip
import json

import lxml.html
import pytest

from kb.enrich.page_types import PageType, count_post_containers, page_type, schema_types
from tests.shared_data import shared_path


def page(head: str = "", body: str = "<p>Some words.</p>") -> lxml.html.HtmlElement:
    return lxml.html.document_fromstring(f"<html><head>{head}</head><body>{body}</body></html>")


def json_ld(data: object) -> str:
    return f'<script type="application/ld+json">{json.dumps(data)}</script>'


@pytest.mark.parametrize(("head", "kind"), [
    (json_ld({"@type": "DiscussionForumPosting", "headline": "x"}), PageType.FORUM),
    (json_ld({"@context": "https://schema.org", "@graph": [{"@type": "WebPage"}, {"@type": "QAPage"}]}),
     PageType.FORUM),
    (json_ld({"@type": "Product", "offers": {"@type": "Offer", "price": "3"}}), PageType.PRODUCT),
    (json_ld([{"@type": "CollectionPage"}, {"@type": "Product", "offers": {"@type": "Offer"}}]),
     PageType.COLLECTION),
    ('<meta property="og:type" content="product">', PageType.PRODUCT),
    ('<meta property="og:type" content="product.group">', PageType.COLLECTION),
    (json_ld({"@type": "TechArticle"}), PageType.DOCUMENTATION),
    (json_ld({"@type": "NewsArticle"}), PageType.ARTICLE),
    ("", PageType.ARTICLE),
])
def test_schema_org_and_open_graph_name_the_page_type(head, kind):
    assert page_type(page(head), "https://site.example/some/page") == kind


@pytest.mark.parametrize(("url", "kind"), [
    ("https://forum.example/t/how-to-fix-the-build/12345", PageType.FORUM),  # Discourse
    ("https://site.example/threads/my-first-lathe.5521/", PageType.FORUM),  # XenForo
    ("https://board.example/viewtopic.php?t=361697", PageType.FORUM),  # phpBB
    ("https://q.example/questions/21553327/why-is-it-bad", PageType.FORUM),  # Stack Exchange
    ("https://community.example/anything", PageType.FORUM),
    ("https://shop.example/products/wool-runner", PageType.PRODUCT),  # Shopify
    ("https://shop.example/collections/sneakers", PageType.COLLECTION),
    ("https://docs.example.org/en/stable/quickstart.html", PageType.DOCUMENTATION),
    ("https://lib.readthedocs.io/en/latest/user/advanced/", PageType.DOCUMENTATION),
    ("https://site.example/docs/getting-started", PageType.DOCUMENTATION),
    ("https://news.example/2024/05/the-bridge", PageType.ARTICLE),
    ("https://site.example/blog/", PageType.LISTING),
    ("https://site.example/blog/the-bridge", PageType.ARTICLE),
    ("https://site.example/tag/bridges", PageType.LISTING),
    ("https://site.example/", PageType.LISTING),
    (None, PageType.ARTICLE),
])
def test_the_address_names_the_page_type_of_common_software(url, kind):
    assert page_type(page(), url) == kind


def post(author: str, text: str) -> str:
    return f'<div class="message"><span class="username">{author}</span><p>{text}</p></div>'


def test_three_post_containers_with_authors_make_a_thread_and_two_do_not():
    three = page(body="".join(post(f"user{n}", "A reply with some words.") for n in range(3)))
    two = page(body="".join(post(f"user{n}", "A reply with some words.") for n in range(2)))
    assert count_post_containers(three) == 3
    assert page_type(three, "https://site.example/page") == PageType.FORUM
    assert page_type(two, "https://site.example/page") == PageType.ARTICLE


def test_hostile_json_ld_is_skipped_not_fatal():
    """Broken JSON, deep nesting and odd @type values come from the page:
    they cost no error and no unbounded work."""
    too_deep = '{"@graph": [' * 5000 + '{"@type": "Thing"}' + "]}" * 5000  # past Python's recursion limit
    deep = '{"@graph": [' * 50 + '{"@type": "DiscussionForumPosting"}' + "]}" * 50  # past kb's depth limit
    head = ('<script type="application/ld+json">{not json</script>'
            + f'<script type="application/ld+json">{too_deep}</script>'
            + f'<script type="application/ld+json">{deep}</script>'
            + json_ld({"@type": [1, None, {"x": 1}, "Product"]}))
    tree = page(head)
    assert "Product" in schema_types(tree)
    assert page_type(tree, "https://site.example/page") == PageType.ARTICLE  # no Offer; the forum type too deep


def test_fifteen_headings_that_are_links_make_an_index():
    teasers = "".join(f'<h3><a href="/story/{n}">Story {n}</a></h3><p>A teaser.</p>' for n in range(15))
    assert page_type(page(body=teasers), "https://site.example/page") == PageType.LISTING
    assert page_type(page(body=teasers[: len(teasers) // 2]), "https://site.example/page") == PageType.ARTICLE


def wcxb_page(file_id: str) -> tuple[lxml.html.HtmlElement, str, str]:
    folder = shared_path("eval", "wcxb-dev", "dev")
    truth = json.loads((folder / "ground-truth" / f"{file_id}.json").read_text(encoding="utf-8"))
    html = gzip.decompress((folder / "html" / f"{file_id}.html.gz").read_bytes())
    return lxml.html.document_fromstring(html), truth["url"], truth["_internal"]["page_type"]["primary"]


@pytest.mark.parametrize("file_id", ["0564", "0549", "0580", "0632", "0239"])
def test_real_pages_get_the_type_of_their_annotation(file_id):
    """A Stack Overflow question, a NodeBB thread, a Shopify product and a
    Shopify collection, a software manual: each names its own type."""
    tree, url, annotated = wcxb_page(file_id)
    assert page_type(tree, url) == annotated

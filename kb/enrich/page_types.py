"""The kind of a web page, from signals in its HTML and its address.

kb reads a forum thread, a shop's category page and a news article with
different extraction settings (kb.enrich.extract): the posts after the first are
the content of a thread, the items are the content of a category page, and
an article loses precision with either setting. This module only says
which kind a page is. Each rule below reads one signal that the page gives
about itself, and the first rule that matches decides:

1. schema.org types (JSON-LD or microdata): a site that marks a page as a
   DiscussionForumPosting or a QAPage says that it is a thread; Product with
   an Offer says one product; CollectionPage or OfferCatalog a category.
2. og:type (Open Graph): "product" is one product, "product.group" a group.
3. The address: forum software puts threads under fixed paths (Discourse
   /t/<slug>/<id>, XenForo /threads/, phpBB viewtopic.php, vBulletin
   showthread.php, Stack Exchange /questions/<id>); shop software puts
   products and categories under fixed paths (Shopify /products/ and
   /collections/); documentation lives under /docs/ or on a docs.* host.
4. The structure: three or more post containers (elements whose class or
   id names a post, a message or a reply, that each hold an author) are a
   thread; many <pre> blocks with a navigation tree are documentation.
5. An article type of schema.org (Article and its kinds).
6. An index of articles: TEASERS or more headings that are links, or the
   address of a section's index (/news, /blog, /tag/..., the home page).
7. Else an article: the kind that trafilatura's defaults were made for.

The patterns are general facts of web software, not rules for single sites.
The signals cost a few milliseconds: one walk over the parsed tree.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

import lxml.html


class PageType(StrEnum):
    ARTICLE = "article"
    FORUM = "forum"
    PRODUCT = "product"
    COLLECTION = "collection"
    LISTING = "listing"
    DOCUMENTATION = "documentation"
    SERVICE = "service"


# schema.org types that name the kind of the whole page.
_SCHEMA_FORUM = frozenset({"DiscussionForumPosting", "QAPage"})
_SCHEMA_COLLECTION = frozenset({"CollectionPage", "OfferCatalog", "SomeProducts"})
_SCHEMA_DOCUMENTATION = frozenset({"TechArticle", "APIReference"})
_SCHEMA_ARTICLE = frozenset({
    "Article", "NewsArticle", "BlogPosting", "Report", "ScholarlyArticle", "AnalysisNewsArticle",
    "OpinionNewsArticle", "ReviewNewsArticle", "ReportageNewsArticle", "LiveBlogPosting", "Review",
})

# Addresses of forum software, shops and documentation sites.
_FORUM_PATH = re.compile(
    r"/t/[^/]+/\d+|/threads?/|/questions/\d+|viewtopic\.php|showthread\.php|/topic/\d|/discussions?/\d"
    r"|/forums?/.+\d|/community/.+\d|/comments/\w+/")
_FORUM_HOST = re.compile(r"^(forums?|community|discuss|discourse|answers|boards|talk)\.")
_PRODUCT_PATH = re.compile(r"/products?/[^/]+|/dp/\w+|/itm/\d+|/ip/.+/\d+|/p/[^/]+|/listing/\d+")
_COLLECTION_PATH = re.compile(r"/collections?/[^/]+/?$|/c/[^/]+|/cat/|/categor(y|ies)/|/b/[^/]+|/shop/?$")
_DOCUMENTATION_PATH = re.compile(
    r"/docs?/|/documentation/|/manual/|/reference/|/man-?pages/|/api/|/handbook/|/tutorial/|/userguide/|/wiki/")
_DOCUMENTATION_HOST = re.compile(r"^(docs?|developer|developers|wiki|devdocs)\.|\.readthedocs\.io$|\.gitbook\.io$")

# A post container: its class or id names a post, and it holds an author.
_POST_CLASS = re.compile(r"\b(post|message|comment|reply|answer)s?\b|topic-post|post-body|postbody|messagecontent",
                         re.IGNORECASE)
_AUTHOR_CLASS = re.compile(r"author|username|user-name|poster|creator|byline|user-info|userinfo", re.IGNORECASE)
POST_CONTAINERS = 3  # one post is an article with a reply box; three are a conversation
# A teaser is a heading whose words are a link to another page. An article
# ends with a few ("Related stories"); an index of articles is made of them.
TEASERS = 15
# The address of a section's index: /news, /blog/, /tag/..., or the home page.
_LISTING_PATH = re.compile(r"^/?$|^/(news|blog|articles|stories|posts|archives?|jobs|events|trending|latest|"
                           r"issues|podcasts?)/?$|^/(tags?|topics?|lists?|chart)/[^/]+/?$")


@dataclass(frozen=True)
class Signals:
    """What a page says about its own kind."""

    schema_types: frozenset[str]
    og_type: str
    host: str
    path: str  # lowercase, with the query
    post_containers: int
    teasers: int


def page_signals(tree: lxml.html.HtmlElement, url: str | None) -> Signals:
    parts = urlsplit(url or "")
    path = (parts.path + ("?" + parts.query if parts.query else "")).lower()
    og_type = tree.xpath('string(//meta[@property="og:type"]/@content)').strip().lower()
    return Signals(
        schema_types=frozenset(schema_types(tree)),
        og_type=og_type,
        host=(parts.hostname or "").lower(),
        path=path,
        post_containers=count_post_containers(tree),
        teasers=count_teasers(tree),
    )


def classify(signals: Signals) -> PageType:
    """The first rule of the module's list that matches."""
    types = signals.schema_types
    if types & _SCHEMA_FORUM:
        return PageType.FORUM
    if "Product" in types and "Offer" in types | {"AggregateOffer"} and not types & _SCHEMA_COLLECTION:
        return PageType.PRODUCT
    if types & _SCHEMA_COLLECTION:
        return PageType.COLLECTION
    if signals.og_type in ("product", "product.item") or signals.og_type.endswith(":item"):
        return PageType.PRODUCT
    if signals.og_type == "product.group":
        return PageType.COLLECTION
    if _FORUM_PATH.search(signals.path) or _FORUM_HOST.match(signals.host):
        return PageType.FORUM
    if _PRODUCT_PATH.search(signals.path):
        return PageType.PRODUCT
    if _COLLECTION_PATH.search(signals.path):
        return PageType.COLLECTION
    if (types & _SCHEMA_DOCUMENTATION or _DOCUMENTATION_HOST.search(signals.host)
            or _DOCUMENTATION_PATH.search(signals.path)):
        return PageType.DOCUMENTATION
    if signals.post_containers >= POST_CONTAINERS:
        return PageType.FORUM
    if types & _SCHEMA_ARTICLE:
        return PageType.ARTICLE
    if signals.teasers >= TEASERS or (signals.host and _LISTING_PATH.search(signals.path)):
        return PageType.LISTING
    return PageType.ARTICLE


def page_type(tree: lxml.html.HtmlElement, url: str | None) -> PageType:
    return classify(page_signals(tree, url))


def schema_types(tree: lxml.html.HtmlElement) -> set[str]:
    """The schema.org types that a page declares, in JSON-LD and microdata.
    JSON-LD that does not parse is skipped: it is the site's error."""
    found: set[str] = set()
    for script in tree.xpath('//script[@type="application/ld+json"]'):
        try:
            data = json.loads(script.text_content() or "null")
        except (ValueError, RecursionError):
            continue
        _collect_types(data, found, depth=0)
    for itemtype in tree.xpath("//@itemtype"):
        found.add(str(itemtype).rstrip("/").rsplit("/", 1)[-1])
    return found


def _collect_types(data: object, found: set[str], depth: int) -> None:
    """The @type values of a JSON-LD object, of its @graph and of its main
    entity. depth stops a hostile page that nests objects without end."""
    if depth > 6:
        return
    if isinstance(data, list):
        for item in data[:200]:
            _collect_types(item, found, depth + 1)
        return
    if not isinstance(data, dict):
        return
    kind = data.get("@type")
    for name in kind if isinstance(kind, list) else [kind]:
        if isinstance(name, str):
            found.add(name.rsplit("/", 1)[-1])
    for key in ("@graph", "mainEntity", "offers"):
        if key in data:
            _collect_types(data[key], found, depth + 1)


def count_teasers(tree: lxml.html.HtmlElement) -> int:
    """Headings (h2 to h4) that hold a link, outside navigation."""
    return sum(1 for heading in tree.iter("h2", "h3", "h4")
               if heading.find(".//a[@href]") is not None and not any(True for _ in heading.iterancestors("nav")))


def count_post_containers(tree: lxml.html.HtmlElement) -> int:
    """How many elements look like one post of a thread: a class or id that
    names a post, with an author element inside. Nested matches count once
    (the outermost)."""
    count = 0
    for element in tree.iter("article", "div", "li", "section"):
        marks = f"{element.get('class', '')} {element.get('id', '')}"
        if not _POST_CLASS.search(marks):
            continue
        if any(_POST_CLASS.search(f"{a.get('class', '')} {a.get('id', '')}") for a in element.iterancestors()):
            continue
        if any(_AUTHOR_CLASS.search(d.get("class", "")) for d in element.iter() if isinstance(d.tag, str)):
            count += 1
    return count

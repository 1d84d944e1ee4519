"""Documents: the full text behind the links and X Articles of the bookmarks.

For each web address that a bookmark links to:
- An X Article whose GraphQL content_state the capture kept: that text is
  the document. It is the authoritative copy; no page is opened.
- Any other X Article: the X context renders it, one page at a time (X
  throttles one login across browsers), and never scrolls (the article view
  unmounts what is off screen). While the page renders, the GraphQL answer
  that carries the article (its content_state) is kept as a raw file
  (raw/x-articles/<id>.json), and its text is the document: it is the
  authoritative copy, and it proves that the render was complete. Only
  when no such answer came does the text come from the page (the DOM).
  Why: a Bookmarks page carries only the title and preview of an article.
- A file (by its Content-Type): fetched with httpx, not rendered. A PDF goes
  through pymupdf4llm; any other file fails as `binary`.
- Any other page: the clean context (no storage state) renders it, with
  several workers. A page that is thin at domcontentloaded is read once more
  at networkidle: many pages fill in their text with JavaScript.

Every connection goes through the fetch guard (kb/guards/fetch_guard.py): a link,
a redirect or a page's script that goes to a loopback, private or cloud
metadata address fails with the reason "private address", which names the
host and the address.

Each address is fetched once. A failure is stored with its reason and is
tried again only on request (`retry`). Links to X posts are not documents:
the capture holds the posts that the owner sees (quoted posts).

No DuckDB connection (so no writer lock) is open while the pages load:
the fetcher reads the addresses, closes, fetches, and writes the results in
groups as they come (document_store.WRITE_EVERY results, or WRITE_EVERY_S
seconds), each group in one short transaction. A killed or timed-out run
loses at most one group; the next run fetches only the addresses with no
row. Only a small summary of each result stays in memory.

This room sits above x and enrich: it renders with the X browser (kb/x) and
reads pages with the extraction of kb/enrich.
"""

// The kb search page. Every text from the index or the wiki is untrusted:
// it goes into the page as text nodes (textContent), never as HTML. The one
// exception is a wiki page body, which the server renders and sanitizes.
"use strict";

const DEBOUNCE_MS = 180;
const $ = (id) => document.getElementById(id);
const detail = () => $("detail");

// --- small helpers ------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.className = value;
    else if (key === "href" || key === "src") {
      const url = key === "href" && String(value).startsWith("#") ? value : safeUrl(value);
      if (url) node.setAttribute(key, url);
    } else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// Only http and https addresses go into href and src.
function safeUrl(value) {
  try {
    const url = new URL(String(value), location.href);
    return url.protocol === "http:" || url.protocol === "https:" ? url.href : null;
  } catch (err) {
    return null;
  }
}

function externalLink(url, text) {
  return el("a", { href: url, target: "_blank", rel: "noopener noreferrer", text: text || url });
}

// The text with the given [start, end) spans in <mark>, as nodes.
function marked(text, spans) {
  const fragment = document.createDocumentFragment();
  let at = 0;
  for (const [start, end] of spans || []) {
    if (start < at) continue;
    fragment.append(document.createTextNode(text.slice(at, start)));
    fragment.append(el("mark", { text: text.slice(start, end) }));
    at = end;
  }
  fragment.append(document.createTextNode(text.slice(at)));
  return fragment;
}

function day(iso) {
  return iso ? String(iso).slice(0, 10) : "no date";
}

function plural(count, word) {
  return `${count} ${word}${count === 1 ? "" : "s"}`;
}

async function getJSON(url, signal) {
  const response = await fetch(url, { signal, headers: { Accept: "application/json" } });
  let body = null;
  try {
    body = await response.json();
  } catch (err) {
    throw new Error(`${url}: the answer is not JSON (HTTP ${response.status})`);
  }
  if (!response.ok) throw new Error(body && body.error ? body.error : `HTTP ${response.status}`);
  return body;
}

function showError(target, err) {
  target.replaceChildren(el("p", { class: "error", role: "alert", text: err.message || String(err) }));
}

function setHash(params) {
  location.hash = new URLSearchParams(params).toString();
}

// --- search as you type -----------------------------------------------------------

let timer = null;
let inFlight = null;
let searchSeq = 0;

// The search and its filters, as the address keeps them (?q=...&author=...).
const SEARCH_FIELDS = ["q", "author", "folder", "source", "after", "before", "mode"];

function filters() {
  const values = {};
  for (const name of SEARCH_FIELDS) {
    const value = $(name).value.trim();
    if (value) values[name] = value;
  }
  return values;
}

// The address keeps the search, so that a search can be bookmarked, shared
// and reloaded. replaceState: typing makes no new history entry per letter.
// The fragment (#bookmark=...) names the open view and stays as it is.
function keepInAddress(values) {
  const query = new URLSearchParams(values).toString();
  history.replaceState(null, "", `${location.pathname}${query ? `?${query}` : ""}${location.hash}`);
}

// The search in the address, into the form. True when it holds a query.
function searchFromAddress() {
  const params = new URLSearchParams(location.search);
  for (const name of SEARCH_FIELDS) {
    if (params.has(name)) $(name).value = params.get(name);
  }
  return Boolean(params.get("q"));
}

function scheduleSearch() {
  clearTimeout(timer);
  timer = setTimeout(runSearch, DEBOUNCE_MS);
}

async function runSearch() {
  clearTimeout(timer);
  const values = filters();
  keepInAddress(values);
  const seq = ++searchSeq;
  if (inFlight) inFlight.abort();
  inFlight = new AbortController();
  const signal = inFlight.signal;
  if (!values.q) {
    $("hits").replaceChildren();
    $("wiki-hits").replaceChildren();
    $("wiki-heading").hidden = true;
    $("search-info").textContent = "Type to search. Results show while you type.";
    return;
  }
  // Wiki pages have no author, date or source kind: with such a filter only
  // bookmarks can match; with source "wiki" only the wiki.
  const wikiOnly = values.source === "wiki";
  const bookmarkOnly = !wikiOnly && (values.author || values.folder || values.source || values.after || values.before);
  $("search-info").textContent = "Searching…";
  const bookmarkParams = new URLSearchParams(values);
  const [bookmarks, wiki] = await Promise.allSettled([
    wikiOnly ? Promise.resolve(null) : getJSON(`/api/search?${bookmarkParams}`, signal),
    bookmarkOnly ? Promise.resolve(null) : getJSON(`/api/wiki/search?${new URLSearchParams({ q: values.q, mode: values.mode || "hybrid" })}`, signal),
  ]);
  if (seq !== searchSeq) return; // a newer search has started
  renderHits(bookmarks, wikiOnly);
  renderWikiHits(wiki);
}

function renderHits(result, wikiOnly) {
  const list = $("hits");
  const info = $("search-info");
  list.replaceChildren();
  if (wikiOnly) {
    info.textContent = "Wiki pages only (source: wiki).";
    return;
  }
  if (result.status === "rejected") {
    if (result.reason && result.reason.name === "AbortError") return;
    showError(list, result.reason);
    info.textContent = "";
    return;
  }
  const data = result.value;
  // A deep search is a hybrid search that the cross-encoder sorted again.
  info.textContent = `${plural(data.hits.length, "bookmark")} · ${data.rerank ? "deep" : data.mode} · ${data.took_ms ?? 0} ms`;
  for (const hit of data.hits) list.append(hitItem(hit));
}

function hitItem(hit) {
  const open = () => setHash({ bookmark: hit.tweet_id });
  const thumbs = el("div", { class: "thumbs" });
  for (const media of hit.media || []) {
    if (media.url && safeUrl(media.url)) {
      thumbs.append(el("img", { src: media.url, alt: media.alt_text || media.kind || "media", loading: "lazy",
                                title: media.kind }));
    }
  }
  const item = el("li", { class: "hit", tabindex: "0", "data-tweet-id": hit.tweet_id,
                          onclick: (event) => { if (!event.target.closest("a")) open(); },
                          onkeydown: (event) => { if (event.key === "Enter") open(); } },
    el("div", { class: "meta" },
      el("span", { class: "author", text: `@${hit.author || "unknown"}` }),
      el("time", { datetime: hit.created_at || "", text: day(hit.created_at) }),
      el("span", { class: "badge", text: hit.best_source }),
      hit.exact_match ? el("span", { class: "badge exact", text: "exact" }) : null,
      el("span", { class: "count", text: `${plural(hit.chunk_count, "passage")} · ${plural(hit.word_count, "word")}` })),
    el("p", { class: "passage" }, marked(hit.best_chunk, hit.highlights)),
    el("div", { class: "from" }, "from ", externalLink(hit.best_ref)),
    thumbs.childElementCount ? thumbs : null);
  return item;
}

function renderWikiHits(result) {
  const list = $("wiki-hits");
  list.replaceChildren();
  $("wiki-heading").hidden = true;
  if (!result || result.status === "rejected" || !result.value) {
    if (result && result.status === "rejected" && result.reason.name !== "AbortError") showError(list, result.reason);
    return;
  }
  const hits = result.value.hits;
  $("wiki-heading").hidden = hits.length === 0;
  for (const hit of hits) {
    list.append(el("li", { class: "wiki-hit" },
      el("a", { href: `#${new URLSearchParams({ wiki: hit.path })}`, class: "title", text: hit.title }),
      el("span", { class: "badge", text: hit.type }),
      el("span", { class: "muted path", text: hit.path }),
      el("p", { class: "passage" }, marked(hit.snippet, hit.highlights))));
  }
}

// --- detail views -------------------------------------------------------------------

async function showBookmark(tweetId) {
  const target = detail();
  target.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  let card;
  try {
    card = await getJSON(`/api/bookmark/${encodeURIComponent(tweetId)}`);
  } catch (err) {
    showError(target, err);
    return;
  }
  const article = el("article", { class: "bookmark", "data-tweet-id": card.tweet_id },
    el("header", {},
      el("strong", { text: card.author_name || card.author }),
      " ", el("span", { class: "author", text: `@${card.author}` }),
      " · ", el("time", { datetime: card.created_at || "", text: day(card.created_at) }),
      " · ", externalLink(card.url, "open on X")),
    el("p", { class: "post-text", text: card.text }));
  if ((card.thread || []).length) {
    article.append(el("h3", { text: "The author's thread" }),
      el("ol", { class: "thread" }, card.thread.map((post) =>
        el("li", {}, el("p", { class: "post-text", text: post.text }), externalLink(post.url, "open on X")))));
  }
  if ((card.folders || []).length) {
    article.append(el("p", { class: "folders" }, "Folders: ",
      card.folders.map((name) => el("span", { class: "badge", text: name }))));
  }
  if (card.quoted) {
    article.append(el("blockquote", { class: "quoted" },
      el("div", { class: "author", text: `@${card.quoted.author || "unknown"} ${card.quoted.author_name || ""}` }),
      el("p", { class: "post-text", text: card.quoted.text || "" })));
  }
  if (card.article) {
    article.append(el("p", { class: "article-link" }, "Article: ", externalLink(card.article.url, card.article.title)));
  }
  if ((card.links || []).length) {
    article.append(el("h3", { text: "Links" }),
      el("ul", { class: "links" }, card.links.map((link) =>
        el("li", {}, externalLink(link.url, link.title || link.url), " ",
          el("span", { class: "badge", text: link.kind || "link" }),
          link.from_quote ? el("span", { class: "muted", text: " (in the quoted post)" }) : null))));
  }
  if ((card.media || []).length) {
    article.append(el("h3", { text: "Media" }),
      el("div", { class: "media" }, card.media.map((media) => el("figure", {},
        safeUrl(media.url) ? el("img", { src: media.url, alt: media.alt_text || media.kind, loading: "lazy" }) : null,
        el("figcaption", {},
          el("span", { class: "badge", text: media.kind }),
          media.video_url ? externalLink(media.video_url, "video") : null,
          media.alt_text ? el("div", { class: "alt", text: `Alt text: ${media.alt_text}` }) : null,
          media.caption ? el("div", { class: "caption", text: media.caption }) : null)))));
  }
  const documents = card.documents || [];
  article.append(el("h3", { text: "Documents" }));
  if (!documents.length) article.append(el("p", { class: "muted", text: "No text of this bookmark is in the index." }));
  article.append(el("ul", { class: "documents" }, documents.map((doc) =>
    el("li", {},
      el("span", { class: "badge", text: doc.source }), " ",
      el("a", { href: `#${new URLSearchParams({ doc: doc.ref, offset: 0 })}`, class: "doc-link", text: doc.ref }),
      el("span", { class: "muted", text: ` · ${plural(doc.passages, "passage")} · ${plural(doc.words, "word")}` })))));
  if (documents.length > 1) {
    article.append(el("p", {}, el("a", { href: `#${new URLSearchParams({ doc: card.tweet_id, offset: 0 })}`,
                                         text: "Read every text of this bookmark" })));
  }
  target.replaceChildren(article);
}

// Page starts seen per document, so "Previous" goes back to the page before.
const pageStarts = new Map();

// Pages as the MCP tool read_document gives them: `offset` counts words, a
// page holds at most about 2,000 words and ends at a passage end when it can.
async function showDocument(id, offset) {
  const target = detail();
  target.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  let page;
  try {
    page = await getJSON(`/api/document?${new URLSearchParams({ id, offset })}`);
  } catch (err) {
    showError(target, err);
    return;
  }
  const starts = pageStarts.get(id) || new Set([0]);
  starts.add(page.offset);
  if (page.next_offset !== null) starts.add(page.next_offset);
  pageStarts.set(id, starts);
  const previous = Math.max(0, ...[...starts].filter((start) => start < page.offset));
  const go = (newOffset) => setHash({ doc: id, offset: newOffset });
  const range = page.page_words
    ? `Words ${page.offset + 1}–${page.offset + page.page_words} of ${page.total_words}` : "No words";
  const pager = () => el("nav", { class: "pager" },
    el("button", { type: "button", class: "prev", disabled: page.offset === 0 ? "" : false,
                   onclick: () => go(previous), text: "← Previous" }),
    el("span", { class: "page-info", text: range }),
    el("button", { type: "button", class: "next", disabled: page.has_more ? false : "",
                   onclick: () => go(page.next_offset), text: "Next →" }));
  const list = el("ol", { class: "passages" });
  for (const part of page.parts) {
    list.append(el("li", { "data-position": part.position },
      el("div", { class: "meta" }, el("span", { class: "badge", text: part.source }),
        el("span", { class: "muted", text: `passage ${part.position + 1}` +
          (part.whole_passage ? "" : " (goes on in the next or previous page)") })),
      el("p", { class: "passage-text", text: part.text })));
  }
  const title = page.ref ? externalLink(page.ref)
    : el("a", { href: `#${new URLSearchParams({ bookmark: page.tweet_id })}`, text: `every text of bookmark ${page.tweet_id}` });
  target.replaceChildren(el("article", { class: "document", "data-id": id },
    el("header", {}, el("h2", { text: "Document" }), title,
      el("p", { class: "muted", text: `${plural(page.total_passages, "passage")} · ${plural(page.total_words, "word")}` })),
    pager(), list, pager()));
  target.scrollTop = 0;
}

async function showWiki(path, anchor) {
  const target = detail();
  target.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  let page;
  try {
    page = await getJSON(`/api/wiki/page?${new URLSearchParams({ path })}`);
  } catch (err) {
    showError(target, err);
    return;
  }
  const body = el("div", { class: "wiki-body" });
  // The server rendered the Markdown with raw HTML off and only safe
  // attributes and addresses (kb_assets/web/wiki_html.py).
  body.innerHTML = page.html;
  for (const link of body.querySelectorAll("a.external")) {
    link.target = "_blank";
    link.rel = "noopener noreferrer";
  }
  const facts = el("dl", { class: "frontmatter" });
  for (const [key, value] of Object.entries(page.frontmatter || {})) {
    facts.append(el("dt", { text: key }), el("dd", { text: Array.isArray(value) ? value.join(", ") : String(value) }));
  }
  target.replaceChildren(el("article", { class: "wiki-page", "data-path": page.path },
    el("div", { class: "meta" }, el("span", { class: "badge", text: page.type }), el("span", { class: "muted", text: page.path })),
    facts.childElementCount ? facts : null, body));
  const spot = anchor ? document.getElementById(`w-${anchor}`) : null;
  if (spot) {
    spot.classList.add("target");
    spot.scrollIntoView({ block: "start" });
  } else {
    target.scrollTop = 0;
  }
}

async function showStatus() {
  const target = detail();
  target.replaceChildren(el("p", { class: "muted", text: "Loading…" }));
  let status;
  try {
    status = await getJSON("/api/status");
  } catch (err) {
    showError(target, err);
    return;
  }
  updateHeader(status);
  const index = status.index || {};
  const capture = status.capture || {};
  const rows = (pairs) => el("table", {}, el("tbody", {}, pairs.map(([key, value]) =>
    el("tr", {}, el("th", { text: key }), el("td", { text: value ?? "–" })))));
  const stages = el("table", { class: "stages" },
    el("thead", {}, el("tr", {}, el("th", { text: "stage" }), el("th", { text: "done" }), el("th", { text: "coverage" }))),
    el("tbody", {}, (index.stages || []).map((stage) => el("tr", {},
      el("th", { text: stage.stage }),
      el("td", { text: `${stage.done} of ${stage.of}` }),
      el("td", {}, stage.percent === null ? "–" : el("meter", { min: 0, max: 100, value: stage.percent }),
        stage.percent === null ? "" : ` ${stage.percent}%`)))));
  const services = el("table", { class: "services" }, el("tbody", {},
    Object.entries(status.services || {}).map(([name, svc]) => el("tr", { class: svc.ready ? "ready" : "not-ready" },
      el("th", { text: name }), el("td", { class: "state", text: svc.ready ? "ready" : "not ready" }),
      el("td", { text: svc.detail })))));
  const bySource = Object.entries(index.by_source || {}).map(([source, n]) =>
    [`${source}`, `${plural(n.passages, "passage")} of ${plural(n.bookmarks, "bookmark")}`]);
  const wiki = status.wiki || {};
  target.replaceChildren(el("article", { class: "status" },
    el("h2", { text: "Status" }),
    el("p", {}, "Last sync: ", el("strong", { class: "last-sync", text: index.last_sync || capture.last_capture || "never" }),
      ` · KB_HOME ${status.kb_home} · `, externalLink(status.dagster_ui, "Dagster UI")),
    index.error ? el("p", { class: "error", text: `Index: ${index.error}` }) : null,
    el("h3", { text: "Coverage per stage" }), stages,
    el("h3", { text: "Index" }), rows([["bookmarks (cards)", index.bookmarks], ["bookmarks with passages", index.indexed_bookmarks],
      ["passages", index.chunks], ["model", index.model], ["vector index", index.vector_index ? "yes" : "no (exact search)"],
      ...bySource]),
    el("h3", { text: "Capture" }), rows([["sync batches", capture.batches], ["incomplete batches", capture.incomplete_batches],
      ["last capture", capture.last_capture]]),
    el("h3", { text: "Wiki" }), rows([["pages", wiki.exists ? wiki.pages : "no wiki yet"],
      ...Object.entries(wiki.by_type || {})]),
    el("h3", { text: "Services" }), services,
    el("p", { class: "muted", text: `Made at ${status.generated_at}.` })));
}

function updateHeader(status) {
  const index = status.index || {};
  const link = $("dagster-link");
  if (safeUrl(status.dagster_ui)) link.href = safeUrl(status.dagster_ui);
  $("sync-line").textContent = `${plural(index.bookmarks || 0, "bookmark")} · last sync ${day(index.last_sync || (status.capture || {}).last_capture)}`;
}

function showWelcome() {
  detail().replaceChildren(el("div", { class: "welcome" },
    el("h2", { text: "Search your bookmarks and the wiki" }),
    el("p", { text: "Click a result to open the bookmark, its documents and its media. " +
      "The filters apply before ranking. The page reads the index and the wiki only." })));
}

// --- routing: the fragment names the open view, so Back works --------------------

function route() {
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.has("status")) return showStatus();
  if (params.has("bookmark")) return showBookmark(params.get("bookmark"));
  if (params.has("doc")) return showDocument(params.get("doc"), Number(params.get("offset") || 0));
  if (params.has("wiki")) return showWiki(params.get("wiki"), params.get("anchor") || "");
  return showWelcome();
}

async function loadFolders() {
  const data = await getJSON("/api/folders");
  $("folder-names").replaceChildren(...data.folders.map((folder) =>
    el("option", { value: folder.name, text: `${folder.name} (${plural(folder.bookmarks, "bookmark")})` })));
}

function start() {
  $("search-form").addEventListener("submit", (event) => { event.preventDefault(); runSearch(); });
  $("q").addEventListener("input", scheduleSearch);
  for (const name of ["author", "folder"]) $(name).addEventListener("input", scheduleSearch);
  for (const name of ["source", "after", "before", "mode"]) $(name).addEventListener("change", runSearch);
  window.addEventListener("hashchange", route);
  route();
  if (searchFromAddress()) runSearch();
  getJSON("/api/status").then(updateHeader).catch(() => {});
  loadFolders().catch(() => {});
}

start();

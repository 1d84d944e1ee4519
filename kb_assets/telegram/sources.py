"""Assets of the Telegram inflow: `parsed_sources` and `gated_sources`.

Each inbox item is one partition of `sources`; the inbox sensor adds it.

- `parsed_sources`: the item as Markdown with YAML frontmatter, at
  raw/parsed/<type>/<slug>.md in the wiki folder, and its row in the DuckDB
  table `sources`.
- `gated_sources`: duplicates found, then the quality gate's verdict (table
  `gate_results`). A rejected or duplicate source's file moves to
  raw/rejected/. Downstream (the wiki) ingests the rows whose status is
  `accepted`, from the file at `sources.parsed_path`.

Both write DuckDB, so both are in the pool `duckdb`. The parse and the gate
call (network, models) run with no DuckDB connection open; each write is
one short transaction after them.
"""


import json
import os
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg

from kb_assets.keys import OVERRIDE_TAG, RETRY_ON_ASSET_FAILURE_TAG, SOURCE_PASSAGES, WIKI_PAGES
from kb_assets.partitions import sources
from kb_assets.run_config_rules import check_override_tag
from kb.telegram.source_parsers import (
    ParsedSource,
    PermanentParseError,
    TransientParseError,
    check_length,
    content_hash,
    decode_text,
    parse_markdown,
    parse_pdf,
    parse_text,
    parse_voice,
    parse_web,
    parse_youtube,
    read_file,
    render_markdown,
    render_with_browser,
    split_frontmatter,
)
from kb.urls import normalize_url
from kb.x.browser import Browser
from kb.duckdb_store import DuckDBStore
from kb.telegram.gate import GateVerdict, read_purpose
from kb.atomic_files import write_atomic
from kb.wiki.repo import Wiki, raw_files_lock
from kb.wiki.schema import ID_PREFIX_CHARS, NAME_MAX_CHARS, parsed_body, parsed_frontmatter, source_slug
from kb.wiki_files import read_frontmatter
from kb.settings import Settings, get_settings
from kb.telegram.inbox import Inbox, InboxError, InboxItem
from kb_resources.services import BrowserResource, QualityGateResource
from kb_resources.stores import DuckDBResource

# Transient errors that the parsers name (timeouts, HTTP 5xx) retry after
# the waits of KB_SOURCE_RETRY_WAITS_S (default 60, 120 and 240 seconds: at
# most 3 times) over the item's whole life. A
# RetryPolicy cannot give these waits (Dagster's exponential backoff is
# delay * (2^n - 1): 60, 180, 420), so the asset raises RetryRequested with
# the wait. The count lives in sources.transient_failures, so a run that is
# started again (run retry, backfill) does not reset it.
TRANSIENT_WAITS_S = get_settings().source_retry_waits
MAX_TRANSIENT_RETRIES = len(TRANSIENT_WAITS_S)
# Errors that no parser names (a bug, a locked file) retry by this policy.
UNEXPECTED_ERROR_RETRY = dg.RetryPolicy(max_retries=3, delay=60, backoff=dg.Backoff.EXPONENTIAL)

# Run tag of an /override run: ingest a rejected or duplicate source anyway.

PARSED_DIR = Path("raw/parsed")
REJECTED_DIR = Path("raw/rejected")


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


def url_key(url: str | None) -> str | None:
    if not url:
        return None
    try:
        return normalize_url(url)
    except ValueError:
        return None


# --- parsing -------------------------------------------------------------------------


def parse_item(item: InboxItem, inbox: Inbox, settings: Settings, browser: Browser | None) -> ParsedSource:
    """The parser for the item's type. Raises PermanentParseError or TransientParseError."""
    attachment = inbox.attachment_path(item)
    if item.type in ("pdf", "md", "voice") and attachment is None:
        raise PermanentParseError(f"inbox item {item.id}: the {item.type} item has no attachment")
    if item.type in ("web", "youtube") and not item.url:
        raise PermanentParseError(f"inbox item {item.id}: the {item.type} item has no URL")
    timeout = settings.kb_browser_timeout_s
    if item.type == "web":
        render = (lambda url: render_with_browser(browser, url, timeout)) if browser is not None else None
        return parse_web(item.url, timeout_s=timeout, render=render)
    if item.type == "youtube":
        return parse_youtube(item.url, proxy=settings.kb_youtube_proxy,
                             insecure=settings.kb_youtube_insecure, timeout_s=timeout)
    if item.type == "pdf":
        return parse_pdf(attachment)
    if item.type == "md":
        return parse_markdown(attachment)
    if item.type == "text":
        text = item.text if item.text is not None else decode_text(read_file(attachment), str(attachment))
        return parse_text(text)
    if item.type == "voice":
        return parse_voice(attachment, settings.kb_whisper_model)
    raise PermanentParseError(f"inbox item {item.id}: unknown type {item.type!r}")


def write_parsed_file(wiki_dir: Path, item: InboxItem, parsed: ParsedSource, fetched_at: datetime) -> Path:
    """Write raw/parsed/<type>/<slug>.md in the format of kb.wiki.schema
    (the specification's frontmatter, then `# Title`). Returns the path
    relative to the wiki folder.

    A parsed file that an ingest committed never changes: the citations of
    the wiki point to its paragraphs. A new parse of the same text keeps
    that file; a new parse with another text is a new file that names the
    earlier one (`supersedes`), and the ingest of it marks the earlier one
    superseded. Copies that no ingest took yet are replaced."""
    wiki = Wiki(path=str(wiki_dir))
    slug = source_slug(item.id, parsed.title or item.type)
    frontmatter = parsed_frontmatter(
        resource_id=item.id, resource_type=item.type, source_url=parsed.url or item.url, title=parsed.title,
        fetched_at=fetched_at.isoformat(timespec="seconds"), char_count=parsed.char_count, parser=parsed.parser,
        extra=parsed.extra,
    )
    body = parsed_body(parsed.title, parsed.body)
    # The name holds only 8 characters of the id, so the frontmatter decides
    # which files are this item's.
    prefix = slug[:ID_PREFIX_CHARS]
    mine = sorted(old for old in [*wiki_dir.glob(f"{PARSED_DIR}/*/{prefix}*.md"), *wiki_dir.glob(f"{REJECTED_DIR}/{prefix}*.md")]
                  if str(read_frontmatter(old).get("resource_id")) == item.id)
    ingested = [old for old in mine if (wiki_dir / ".git").exists() and wiki.tracked(str(old.relative_to(wiki_dir)))]
    latest = max(ingested, key=lambda f: f.stat().st_mtime_ns, default=None)
    if latest is not None and split_frontmatter(latest.read_text(encoding="utf-8"))[1].strip() == body.strip():
        return latest.relative_to(wiki_dir)  # the same text: the ingested file stays the source
    relative = PARSED_DIR / item.type / f"{slug}.md"
    number = 2
    while relative in {f.relative_to(wiki_dir) for f in ingested}:
        relative = PARSED_DIR / item.type / f"{slug[:NAME_MAX_CHARS - 3].rstrip('-')}-{number}.md"
        number += 1
    if latest is not None:
        frontmatter["supersedes"] = str(latest.relative_to(wiki_dir))
    write_atomic(wiki_dir / relative, render_markdown(frontmatter, body).encode())
    for old in mine:
        if old not in ingested and old != wiki_dir / relative:
            old.unlink(missing_ok=True)
    return relative


def count_transient_failure(duckdb: DuckDBStore, item: InboxItem, error: str) -> int:
    """Add one transient failure to the item's lifetime count; return the count."""
    now = utc_now()
    with duckdb.transaction() as conn:
        row = conn.execute("SELECT transient_failures FROM sources WHERE item_id = ?", [item.id]).fetchone()
        count = (row[0] if row else 0) + 1
        if row:
            conn.execute("UPDATE sources SET transient_failures = ?, error = ?, updated_at = ? WHERE item_id = ?",
                         [count, error, now, item.id])
        else:
            conn.execute(
                """INSERT INTO sources (item_id, type, origin, chat_id, message_id, url, url_norm, received_at,
                       status, error, transient_failures, updated_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'retrying', ?, ?, ?)""",
                [item.id, item.type, item.origin, item.chat_id, item.message_id, item.url, url_key(item.url),
                 item.received_at, error, count, now])
    return count


def record_failure(duckdb: DuckDBStore, item: InboxItem, error: str) -> None:
    now = utc_now()
    with duckdb.transaction() as conn:
        updated = conn.execute("UPDATE sources SET status = 'failed', error = ?, updated_at = ? WHERE item_id = ? RETURNING 1",
                               [error, now, item.id]).fetchall()
        if not updated:
            conn.execute(
                """INSERT INTO sources (item_id, type, origin, chat_id, message_id, url, url_norm, received_at,
                       status, error, updated_at)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'failed', ?, ?)""",
                [item.id, item.type, item.origin, item.chat_id, item.message_id, item.url, url_key(item.url),
                 item.received_at, error, now])


def save_parsed_row(duckdb: DuckDBStore, item: InboxItem, parsed: ParsedSource, relative: Path,
                    fetched_at: datetime, transient_failures: int) -> dict:
    """Replace the item's row in `sources` with the parse result."""
    url = parsed.url or item.url
    row = {
        "item_id": item.id, "type": item.type, "origin": item.origin,
        "chat_id": item.chat_id, "message_id": item.message_id,
        "url": url, "url_norm": url_key(url), "content_hash": content_hash(parsed.body),
        "title": parsed.title, "parsed_path": str(relative),
        "char_count": parsed.char_count, "parser": parsed.parser,
        "received_at": item.received_at, "fetched_at": fetched_at,
        "status": "parsed", "error": None, "duplicate_of": None,
        "transient_failures": transient_failures, "updated_at": fetched_at,
    }
    with duckdb.transaction() as conn:
        conn.execute("DELETE FROM sources WHERE item_id = ?", [item.id])
        columns = ", ".join(row)
        conn.execute(f"INSERT INTO sources ({columns}) VALUES ({', '.join('?' for _ in row)})", list(row.values()))
    return row


def transient_failures_so_far(duckdb: DuckDBStore, item_id: str) -> int:
    with duckdb.connect() as conn:
        row = conn.execute("SELECT transient_failures FROM sources WHERE item_id = ?", [item_id]).fetchone()
    return row[0] if row else 0


def is_override(context: dg.AssetExecutionContext, item_known: bool | None = None) -> bool:
    """True for a run of the bot's /override. The UI can set the tag too: an
    override with another value, or for an id that is not in the inbox, fails
    the step before it writes anything. `item_known`: the caller has read
    the item from the inbox already (None: look it up)."""
    # op_execution_context.run_tags also works when a test invokes the asset directly.
    value = context.op_execution_context.run_tags.get(OVERRIDE_TAG)
    if value is None:
        return False
    item_id = context.partition_key
    if item_known is None:
        item_known = Inbox(get_settings().inbox_dir).find(item_id) is not None
    return check_override_tag(value, item_known, item_id)


def fail(description: str, item_id: str) -> dg.Failure:
    """A failure that no retry can fix."""
    return dg.Failure(description=description, allow_retries=False, metadata={"item_id": item_id})


@dg.asset(
    partitions_def=sources,
    group_name="telegram",
    retry_policy=UNEXPECTED_ERROR_RETRY,
    kinds={"duckdb"},
    description="Each inbox item parsed to Markdown with YAML frontmatter (raw/parsed/<type>/<slug>.md "
                "in the wiki folder) and its row in the DuckDB table `sources`.",
)
def parsed_sources(context: dg.AssetExecutionContext, duckdb: DuckDBResource, browser: BrowserResource) -> dg.MaterializeResult:
    duckdb, browser = duckdb.get_client(), browser.get_client()
    settings = get_settings()
    item_id = context.partition_key
    inbox = Inbox(settings.inbox_dir)
    try:
        item = inbox.get(item_id)
    except InboxError as exc:
        raise fail(str(exc), item_id) from None

    if is_override(context, item_known=True):
        # The owner asked for this source: give it its retries again.
        with duckdb.transaction() as conn:
            conn.execute("UPDATE sources SET transient_failures = 0 WHERE item_id = ?", [item_id])
    failures = transient_failures_so_far(duckdb, item_id)
    if failures > MAX_TRANSIENT_RETRIES:
        raise fail(f"inbox item {item_id}: {failures} transient failures so far; the limit is "
                   f"{MAX_TRANSIENT_RETRIES} retries over the item's life", item_id)

    try:
        parsed = parse_item(item, inbox, settings, browser)
        check_length(item.type, parsed, item.url or item.file_name or f"inbox item {item_id}")
    except PermanentParseError as exc:
        record_failure(duckdb, item, str(exc))
        raise fail(str(exc), item_id) from None
    except TransientParseError as exc:
        count = count_transient_failure(duckdb, item, str(exc))
        if count > MAX_TRANSIENT_RETRIES:
            message = f"{exc} (transient failure {count}; no retries are left)"
            record_failure(duckdb, item, message)
            raise fail(message, item_id) from None
        wait = TRANSIENT_WAITS_S[count - 1]
        context.log.warning(f"inbox item {item_id}: transient failure {count}: {exc}. Retry in {wait} s.")
        raise dg.RetryRequested(max_retries=MAX_TRANSIENT_RETRIES, seconds_to_wait=wait) from exc

    fetched_at = utc_now()
    with raw_files_lock(settings.wiki_dir):  # an ingest must not see raw/ change
        relative = write_parsed_file(settings.wiki_dir, item, parsed, fetched_at)
    row = save_parsed_row(duckdb, item, parsed, relative, fetched_at, failures)
    context.log.info(f"inbox item {item_id}: {item.type} parsed by {parsed.parser}: {parsed.title!r}")
    return dg.MaterializeResult(metadata={
        "item_id": item.id,
        "type": item.type,
        "title": parsed.title,
        "url": dg.MetadataValue.url(row["url"]) if row["url"] else "",
        "parsed_path": dg.MetadataValue.path(str(settings.wiki_dir / relative)),
        "char_count": parsed.char_count,
        "parser": parsed.parser,
        "content_hash": row["content_hash"],
    })


# --- the gate ------------------------------------------------------------------------


def find_duplicate(duckdb: DuckDBStore, item_id: str, url_norm: str | None, digest: str | None) -> str | None:
    """The earliest other item with the same URL key or the same words that
    the gate has judged already."""
    with duckdb.connect() as conn:
        row = conn.execute(
            """SELECT item_id FROM sources
               WHERE item_id <> ? AND status IN ('accepted', 'rejected')
                 AND ((? IS NOT NULL AND url_norm = ?) OR (? IS NOT NULL AND content_hash = ?))
               ORDER BY received_at, item_id LIMIT 1""",
            [item_id, url_norm, url_norm, digest, digest],
        ).fetchone()
    return row[0] if row else None


def locate_parsed_file(wiki_dir: Path, parsed_path: str) -> Path:
    """The parsed file, in raw/parsed or (after an earlier rejection) raw/rejected."""
    path = wiki_dir / parsed_path
    if path.exists():
        return path
    moved = wiki_dir / REJECTED_DIR / Path(parsed_path).name
    if moved.exists():
        return moved
    raise FileNotFoundError(f"the parsed file {path} is missing; materialize parsed_sources for this partition again")


def move_parsed_file(wiki_dir: Path, current: Path, rejected: bool, item_type: str) -> Path:
    """Rejected and duplicate sources live in raw/rejected/, accepted ones in
    raw/parsed/<type>/. Returns the new path relative to the wiki folder."""
    target_dir = wiki_dir / (REJECTED_DIR if rejected else PARSED_DIR / item_type)
    target = target_dir / current.name
    if current != target:
        target_dir.mkdir(parents=True, exist_ok=True)
        os.replace(current, target)
    return target.relative_to(wiki_dir)


@dg.asset(
    partitions_def=sources,
    group_name="telegram",
    deps=[parsed_sources],
    kinds={"duckdb"},
    description="The quality gate's verdict on each parsed source (DuckDB `gate_results`, `sources.status`): "
                "accepted, rejected (file moved to raw/rejected/) or duplicate.",
)
def gated_sources(context: dg.AssetExecutionContext, duckdb: DuckDBResource, gate: QualityGateResource) -> dg.MaterializeResult:
    duckdb, gate = duckdb.get_client(), gate.get_client()
    settings = get_settings()
    item_id = context.partition_key
    override = is_override(context)
    with duckdb.connect() as conn:
        row = conn.execute(
            "SELECT type, url, url_norm, content_hash, parsed_path, title, status FROM sources WHERE item_id = ?",
            [item_id],
        ).fetchone()
    if row is None or row[4] is None:
        raise fail(f"inbox item {item_id}: not parsed yet; materialize parsed_sources first", item_id)
    item_type, url, url_norm, digest, parsed_path, title, _ = row
    try:
        current = locate_parsed_file(settings.wiki_dir, parsed_path)
    except FileNotFoundError as exc:
        raise fail(str(exc), item_id) from None

    duplicate_of = None if override else find_duplicate(duckdb, item_id, url_norm, digest)
    verdict: GateVerdict | None = None
    if duplicate_of:
        decision = "duplicate"
    else:
        _, body = split_frontmatter(current.read_text(encoding="utf-8"))
        item = Inbox(settings.inbox_dir).find(item_id)
        verdict = gate.judge(body, read_purpose(settings.wiki_dir), log=context.log, source_type=item_type,
                             url=url, file_name=item.file_name if item else None, title=title)
        decision = "accepted" if override or verdict.accepted else "rejected"

    with raw_files_lock(settings.wiki_dir):  # an ingest must not see raw/ change
        new_path = move_parsed_file(settings.wiki_dir, current, decision != "accepted", item_type)
    now = utc_now()
    with duckdb.transaction() as conn:
        conn.execute(
            "UPDATE sources SET status = ?, duplicate_of = ?, parsed_path = ?, error = NULL, updated_at = ? WHERE item_id = ?",
            [decision, duplicate_of, str(new_path), now, item_id],
        )
        conn.execute("DELETE FROM gate_results WHERE item_id = ?", [item_id])
        conn.execute(
            """INSERT INTO gate_results (item_id, score, topics, reason, gate, model, attempts, threshold,
                   decision, overridden, gated_at, raw_answer, errors)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            [item_id,
             verdict.score if verdict else None,
             json.dumps(verdict.topics if verdict else []),
             verdict.reason if verdict else f"duplicate of {duplicate_of}",
             verdict.gate if verdict else "not-called",
             verdict.model if verdict else None,
             verdict.attempts if verdict else 0,
             verdict.threshold if verdict else settings.kb_gate_threshold,
             decision, override, now, verdict.raw_answer if verdict else None,
             json.dumps(verdict.errors if verdict else [])],
        )
    context.log.info(f"inbox item {item_id}: {decision}"
                     + (f" (score {verdict.score}, gate {verdict.gate})" if verdict else f" of {duplicate_of}"))
    metadata = {
        "item_id": item_id,
        "status": decision,
        "title": title or "",
        "type": item_type,
        "url": url or "",
        "parsed_path": str(new_path),
        "overridden": override,
    }
    if verdict:
        metadata.update({
            "score": verdict.score if verdict.score is not None else -1,
            "threshold": verdict.threshold,
            "topics": ", ".join(verdict.topics),
            "reason": verdict.reason,
            "gate": verdict.gate,
            "gate_tries": verdict.attempts,
        })
    if duplicate_of:
        metadata["duplicate_of"] = duplicate_of
    return dg.MaterializeResult(metadata=metadata)


# The wiki stage's asset (kb_assets/wiki/wiki_pages.py): it ingests the accepted sources.

source_intake_job = dg.define_asset_job(
    "source_intake",
    # One run per item takes it all the way: parse, gate, index, wiki. The
    # run's state is then the item's state (the bot's /status reads it).
    # The index (source_passages) and the wiki both follow the gate, and
    # neither waits for the other: a source is searchable before the agent
    # has written about it, and also when the agent fails.
    selection=dg.AssetSelection.assets(parsed_sources, gated_sources, SOURCE_PASSAGES, WIKI_PAGES),
    # Run retries (dagster.yaml) are for runs whose process died. An asset
    # that failed has used its own retries already; one more run would break
    # "a permanent error fails at once" and the 3-retry limit.
    tags={RETRY_ON_ASSET_FAILURE_TAG: "false"},
    # The steps run one after the other: one run worker process, not
    # one more interpreter start (all of kb's imports) per step.
    executor_def=dg.in_process_executor,
    description="One inbox item: parse it, pass it through the quality gate, index it for search, and ingest it into the wiki.",
)

"""What a command's runs did, and what they could not read or do: the
counts and the problems at the end of `kb sync`, `kb import` and the stage
commands (`kb extract`, `kb transcribe`, `kb translate`, `kb normalize`).

Everything comes from the metadata that each asset records in its
materialization; the report of a command (kb/apps/sync.py SyncReport)
holds it per stage.
"""

from __future__ import annotations


def _values(report, asset: str) -> list[tuple[str, dict]]:
    """(batch, metadata) of each materialization of `asset` in the report."""
    return [(stage.batch, stage.metadata[asset]) for stage in report.stages if asset in stage.metadata]


def _total(report, asset: str, key: str) -> int:
    return sum(value for _, values in _values(report, asset)
               if isinstance(value := values.get(key), int) and not isinstance(value, bool))


def stage_counts(report) -> list[str]:
    """One line for each stage that ran: what it did, in numbers."""
    lines = []
    if _values(report, "x_raw_pages"):
        bad = _total(report, "x_raw_pages", "bad_pages")
        read = _total(report, "x_raw_pages", "pages") - bad
        lines.append(f"Pages read: {read}" + (f" ({bad} not readable)" if bad else ""))
    if _values(report, "bookmarks"):
        lines.append(f"Bookmarks: {_total(report, 'bookmarks', 'new_bookmarks')} new, "
                     f"{_total(report, 'bookmarks', 'updated_bookmarks')} updated")
    if _values(report, "documents"):
        tried, ok = _total(report, "documents", "fetched"), _total(report, "documents", "ok")
        lines.append(f"Documents fetched: {ok}" + (f" ({tried - ok} failed)" if tried > ok else ""))
    if _values(report, "captions"):
        lines.append(f"Photos captioned: {_total(report, 'captions', 'captioned')}")
    if _values(report, "transcripts"):
        lines.append(f"Videos transcribed: {_total(report, 'transcripts', 'transcribed')}")
    if _values(report, "translations"):
        lines.append(f"Texts translated: {_total(report, 'translations', 'translated')}")
    if _values(report, "chunk_index"):
        written, embedded = _total(report, "chunk_index", "chunks_written"), _total(report, "chunk_index", "chunks_embedded")
        cached = f" ({embedded} embedded, the rest from the vector cache)" if embedded < written else ""
        lines.append(f"Passages indexed: {written}{cached}")
    return lines


def unreadable_pages(report, asset: str) -> list[str]:
    """The pages that `asset` (x_raw_pages or bookmarks) could not read,
    and each batch that read no page at all."""
    problems = []
    for batch, values in _values(report, asset):
        problems += [f"Could not read {line}" for line in values.get("unreadable_pages") or []]
        # Folder lists, folder pages and threads count: an import of them alone is one.
        pages = values.get("pages", values.get("raw_pages", 0)) + values.get("answers", 0)
        if pages - values.get("bad_pages", 0) <= 0:
            problems.append(f"Batch {batch}: no page was read, so no bookmark came in.")
    return problems


def failed_items(report, asset: str) -> list[str]:
    """The items that `asset` could not do ("<item>: <reason>"), as its metadata names them."""
    return [line for _, values in _values(report, asset) for line in values.get("failures") or []]


def skipped(report, asset: str) -> list[str]:
    """Why `asset` did nothing, when it was off (no key, no backend)."""
    return sorted({f"{asset}: nothing was done: {values['skipped']}"
                   for _, values in _values(report, asset) if values.get("skipped")})


def index_failures(report) -> list[str]:
    """The bookmarks that the index stages could not cut or index. A fault
    of kb, not of the web: the command fails and names each one; `kb index`
    tries them again."""
    return [f"Could not index {line}" for asset in ("chunks", "chunk_index") for line in failed_items(report, asset)]


# The outside service that each enrichment stage waits for, and its items.
SERVICES = {
    "captions": ("photos", "the caption backend (KB_CAPTION_BACKEND)"),
    "transcripts": ("videos", "the transcription backend (KB_TRANSCRIBE_BACKEND)"),
    "translations": ("foreign passages", "Groq (translations)"),
}


def waiting_for_services(report) -> list[str]:
    """One line per service that stopped or was off while items wait for
    it, with how many wait; and the X Articles that wait for the X login.
    Nothing that waits is left out in silence: the next sync takes them.
    (A caption run that waits for more photos is no outage: not named.)"""
    from kb_assets.keys import STOPPED

    lines = []
    for asset, (items, service) in SERVICES.items():
        runs = _values(report, asset)
        whys = [why for _, values in runs
                if (why := values.get(STOPPED) or ("" if values.get("below_threshold") else values.get("skipped")))]
        if not whys:
            continue
        # Each run counts its own partition's items; the coverage check of
        # the last run counts what waits in every batch after all of them.
        checks = _values(report, f"{asset}_coverage")
        waiting = checks[-1][1].get("waiting") if checks else sum(values.get("waiting") or 0 for _, values in runs)
        if waiting:
            lines.append(f"{waiting} {items} wait for {service}: {whys[-1]}")
    articles = _total(report, "documents", "articles_waiting_for_login")
    if articles:
        lines.append(f"{articles} X Articles wait for the X login.")
    # The sites: each failed link is named above; here their number, by reason.
    reasons: dict[str, int] = {}
    for _, values in _values(report, "documents"):
        for reason, count in (values.get("failed") or {}).items():
            reasons[reason] = reasons.get(reason, 0) + count
    if reasons:
        by_reason = ", ".join(f"{reason} {count}" for reason, count in sorted(reasons.items()))
        lines.append(f"{sum(reasons.values())} links wait for their sites ({by_reason}): "
                     "`kb extract --retry` fetches them again.")
    return lines

"""Asset `translations`: an English version of each foreign chunk, cached by
the hash of the chunk text.

A chunk is a candidate (FOREIGN_CHUNK_SQL) when:
- its language tag is not English: the chunk's own tag (X's tag of a post,
  the detected language of a transcript), else the bookmark's tag. X puts
  tags for "no language" (und, zxx) and its own marks in the ISO 639
  local-use range qaa-qtz (qme: media links only, qht: hashtags only, qam,
  qct, qst ...): these are not a foreign language; or
- most of its letters are not Latin (a Russian article under an English
  post has no tag of its own).

The cache (`translations`) holds each text hash once: english NULL means
the model found it English already, so it is never sent again. The index
(`chunk_index`) then shows the English in `text` and the original in
`source_text`.

No DuckDB connection (and so no writer lock) is open while the model
works: each group of translations is written in its own short transaction,
so an interrupted run keeps what it did.
"""

# No `from __future__ import annotations`: Dagster reads the config class
# from the real annotation of the asset function.
from datetime import datetime, timezone

import dagster as dg
import duckdb

from kb.queries import partition_bookmarks
from kb_assets.run_choices import excluded_in_run
from kb.settings import excluded_sources
from kb_assets.enrich.enrichment import (ResultWriter, WaitingConfig, coverage_check, failure_list, from_batches,
                                         goes_on_after_failure, service_stopped, with_checks)
from kb_assets.partitions import sync_batches
from kb.settings import get_settings
from kb.enrich.translator import TranslateError
from kb_resources.services import TranslatorResource
from kb_resources.stores import DuckDBResource

WRITE_EVERY = 20  # translations per write: an interrupted run loses at most this many
FAILURES_IN_A_ROW = 3  # then the endpoint is taken as down and the run stops

# A condition on `c` (chunks) and `b` (bookmarks): the text has a letter,
# and its language tag is not English, or less than half of its letters are
# Latin. A text of ASCII only (strlen, in bytes, equals length) has only
# Latin letters, so the two regular expressions that count them run only on
# the other texts: the coverage check reads every chunk of the store at each
# sync, and with them on every text it took 160 ms at 1,000 bookmarks (30 ms now).
FOREIGN_CHUNK_SQL = r"""(
    regexp_matches(c.text, '\p{L}')
    AND (
        (lower(split_part(coalesce(c.lang, b.lang, ''), '-', 1)) NOT IN ('', 'en', 'und', 'zxx')
         AND NOT regexp_matches(lower(split_part(coalesce(c.lang, b.lang, ''), '-', 1)), '^q[a-t][a-z]$'))
        OR (strlen(c.text) <> length(c.text)
            AND 2 * length(regexp_replace(c.text, '[^\p{Latin}]', '', 'g'))
                < length(regexp_replace(c.text, '[^\p{L}]', '', 'g')))
    )
)"""


def foreign_chunks(conn: duckdb.DuckDBPyConnection, tweet_ids: list[str] | None, skip: set[str]) -> list[tuple]:
    """(text_hash, text, cached, english, batch) of each distinct foreign
    chunk text of these bookmarks (None: of every live bookmark); batch: the
    oldest sync batch of a bookmark that holds it."""
    # The bookmarks and sources first, in a CTE: the regular expressions of
    # FOREIGN_CHUNK_SQL then read only their chunks. As one WHERE, DuckDB ran
    # them on every chunk of the store (0.2 s at 1,000 bookmarks, for a sync
    # of 20).
    return conn.execute(
        f"""WITH c AS (SELECT * FROM chunks WHERE NOT list_contains(?, source)
                        AND (? OR list_contains(?, tweet_id)))
            SELECT c.text_hash, any_value(c.text), bool_or(t.text_hash IS NOT NULL), any_value(t.english),
                   min(b.batch)
            FROM c JOIN bookmarks b ON b.tweet_id = c.tweet_id AND b.removed_at IS NULL
            LEFT JOIN translations t ON t.text_hash = c.text_hash
            WHERE {FOREIGN_CHUNK_SQL}
            GROUP BY c.text_hash ORDER BY c.text_hash""",
        [sorted(skip), tweet_ids is None, tweet_ids or []],
    ).fetchall()


def waiting_by_batch(conn: duckdb.DuckDBPyConnection, skip: set[str]) -> dict[str, int]:
    """How many foreign chunk texts wait for a translation, per sync batch of
    their live bookmark (the partition whose run translates them)."""
    return dict(conn.execute(
        f"""SELECT b.batch, count(DISTINCT c.text_hash)
            FROM chunks c JOIN bookmarks b ON b.tweet_id = c.tweet_id AND b.removed_at IS NULL
            LEFT JOIN translations t ON t.text_hash = c.text_hash
            WHERE {FOREIGN_CHUNK_SQL} AND NOT list_contains(?, c.source) AND t.text_hash IS NULL
            GROUP BY b.batch""",
        [sorted(skip)],
    ).fetchall())


def translation_coverage(conn: duckdb.DuckDBPyConnection, skip: set[str]) -> dict[str, int]:
    rows = foreign_chunks(conn, None, skip)
    done = [row for row in rows if row[2]]
    return {"foreign_texts": len(rows), "translated": sum(1 for row in done if row[3] is not None),
            "already_english": sum(1 for row in done if row[3] is None), "waiting": len(rows) - len(done)}


class TranslationsConfig(WaitingConfig):
    limit: int = 0  # most chunk texts in this run; 0: every one that waits


def translate_chunks(
    context: dg.AssetExecutionContext, config: TranslationsConfig, duckdb: DuckDBResource, translator: TranslatorResource
) -> dg.MaterializeResult:
    duckdb, translator = duckdb.get_client(), translator.get_client()
    batch = context.partition_key
    skip = excluded_in_run(context)
    with duckdb.connect() as conn:
        live = None if config.every_batch else partition_bookmarks(conn, batch)[0]
        waiting = [(text_hash, text, origin) for text_hash, text, cached, _, origin
                   in foreign_chunks(conn, live, skip) if not cached]
    off = translator.off_reason()
    if off:
        context.log.info(f"No translations: {off}")
        return dg.MaterializeResult(metadata={"translated": 0, "waiting": len(waiting), "skipped": off})
    all_waiting = len(waiting)
    if config.limit > 0:
        waiting = waiting[:config.limit]

    model = translator.model_name()
    client = translator.client()
    failures: list[str] = []
    in_a_row = 0

    context.log.info(f"Translating {len(waiting)} chunk text(s) with {model}")
    stop: str | None = None
    # The writer keeps what was translated, also when the run stops.
    with ResultWriter(duckdb, "translations", WRITE_EVERY) as writer:
        for text_hash, text, _origin in waiting:
            try:
                english = translator.translate(text, client)
            except TranslateError as exc:
                failures.append(f"{text_hash[:12]}: {exc}")
                context.log.warning(f"Chunk text {text_hash[:12]} not translated: {exc}")
                in_a_row += 1
                if exc.fatal or in_a_row >= FAILURES_IN_A_ROW:
                    stop = str(exc)
                    break
                continue
            in_a_row = 0
            writer.add({"text_hash": text_hash, "english": english, "model": model,
                        "translated_at": datetime.now(timezone.utc)})

    written = writer.written
    metadata = {
        "translated": sum(row["english"] is not None for row in written),
        "already_english": sum(row["english"] is None for row in written),
        "failed": len(failures),
        "failures": failure_list(failures),
        "waiting": all_waiting - len(written),
        "from_batches": from_batches(origin for _, _, origin in waiting),
        "model": model,
    }
    if stop or failures:
        return service_stopped(
            context, (f"Translation stopped: {stop}. " if stop else f"{len(failures)} chunk text(s) were not "
                      f"translated; first: {failures[0]}. ") + f"{len(written)} result(s) were stored; "
            "the next run goes on with the rest.", metadata)
    return dg.MaterializeResult(metadata=metadata)


def translations_coverage(duckdb: DuckDBResource) -> dg.AssetCheckResult:
    duckdb = duckdb.get_client()
    skip = excluded_sources()
    with duckdb.connect() as conn:
        numbers = translation_coverage(conn, skip)
    turned_off = get_settings().owner_config().get("translate", True) is False
    return coverage_check(numbers, done=numbers["translated"] + numbers["already_english"],
                          total=numbers["foreign_texts"], off=turned_off, off_key="translate_off")


TRANSLATIONS_COVERAGE = dg.AssetCheckSpec(
    "translations_coverage", asset="translations",
    description="Share of the foreign chunk texts that have a cached translation (or were found English). "
    "Passes when none waits, or when the owner set translate = false.")


# The coverage check runs in this step: see with_checks().
@dg.asset(
    partitions_def=sync_batches,
    deps=["chunks"],
    group_name="enrich",
    kinds={"duckdb"},
    description="English translations of the foreign chunks, cached by text hash "
    "(english NULL: the text was English already).",
    check_specs=[TRANSLATIONS_COVERAGE],
)
def translations(
    context: dg.AssetExecutionContext, config: TranslationsConfig, duckdb: DuckDBResource, translator: TranslatorResource
) -> dg.MaterializeResult:
    return with_checks(goes_on_after_failure(context, "kb translate", translate_chunks, context, config, duckdb, translator),
                       translations_coverage(duckdb))

"""Asset `translations`: an English version of each foreign chunk, cached by
the hash of the chunk text.

kb/enrich/foreign_text.py says which chunk is foreign and holds the cache
(`translations`): each text hash once, english NULL when the model found it
English already, so it is never sent again. The index (`chunk_index`) then
shows the English in `text` and the original in `source_text`.

No DuckDB connection (and so no writer lock) is open while the model
works: each group of translations is written in its own short transaction,
so an interrupted run keeps what it did.
"""

# No `from __future__ import annotations`: Dagster reads the config class
# from the real annotation of the asset function.
import dagster as dg

from kb.enrich.foreign_text import translate_waiting, translation_coverage, waiting_texts
from kb_assets.enrich.enrichment import (batches_of_run, coverage_check, coverage_spec, failure_list, from_batches,
                                         goes_on_after_failure, service_stopped, stage_check_spec, with_checks)
from kb_assets.partitions import sync_batches
from kb_assets.run_choices import excluded_in_run
from kb.settings import excluded_sources
from kb_resources.services import TranslatorResource
from kb_resources.stores import DuckDBResource


class TranslationsConfig(dg.Config):
    limit: int = 0  # most chunk texts in this run; 0: every one that waits


def translate_chunks(
    context: dg.AssetExecutionContext, config: TranslationsConfig, duckdb: DuckDBResource, translator: TranslatorResource
) -> dg.MaterializeResult:
    duckdb, translator = duckdb.get_client(), translator.get_client()
    batch = context.partition_key
    skip = excluded_in_run(context)
    with duckdb.connect() as conn:
        waiting = waiting_texts(conn, batch, skip)
    off = translator.off_reason()
    if off:
        context.log.info(f"No translations: {off}")
        return dg.MaterializeResult(metadata={"translated": 0, "waiting": len(waiting), "skipped": off})
    all_waiting = len(waiting)
    if config.limit > 0:
        waiting = waiting[:config.limit]

    model = translator.model_name()
    context.log.info(f"Translating {len(waiting)} chunk text(s) with {model}")
    run = translate_waiting(duckdb, translator, waiting,
                            on_failure=lambda text_hash, exc: context.log.warning(
                                f"Chunk text {text_hash[:12]} not translated: {exc}"))
    written, failures, stop = run.written, run.failures, run.stop
    metadata = {
        "translated": sum(row["english"] is not None for row in written),
        "already_english": sum(row["english"] is None for row in written),
        "failed": len(failures),
        "failures": failure_list(failures),
        "waiting": all_waiting - len(written),
        # The texts of the partition's bookmarks (kb.queries.partition_bookmarks).
        "from_batches": from_batches([batch] * len(waiting)),
        "model": model,
    }
    if stop or failures:
        return service_stopped(
            context, (f"Translation stopped: {stop}. " if stop else f"{len(failures)} chunk text(s) were not "
                      f"translated; first: {failures[0]}. ") + f"{len(written)} result(s) were stored; "
            "the next run goes on with the rest.", metadata)
    return dg.MaterializeResult(metadata=metadata)


def translations_coverage(duckdb: DuckDBResource, translator: TranslatorResource,
                          batches: list[str]) -> dg.AssetCheckResult:
    with duckdb.get_client().connect() as conn:
        numbers = translation_coverage(conn, excluded_sources(), batches)
    # The owner's `translate = false` (config.toml) reaches the translator as turned_off.
    turned_off = bool(translator.get_client().turned_off)
    return coverage_check(TRANSLATIONS_COVERAGE.name, numbers, done=numbers["translated"] + numbers["already_english"],
                          total=numbers["foreign_texts"], off=turned_off, off_key="translate_off")


TRANSLATIONS_COVERAGE = coverage_spec(
    "translations_coverage", "translations",
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
    check_specs=[TRANSLATIONS_COVERAGE, stage_check_spec("translations")],
)
def translations(
    context: dg.AssetExecutionContext, config: TranslationsConfig, duckdb: DuckDBResource, translator: TranslatorResource
) -> dg.MaterializeResult:
    result = goes_on_after_failure(context, "kb translate", translate_chunks, context, config, duckdb, translator)
    return with_checks(context, result, translations_coverage(duckdb, translator, batches_of_run(context)))

"""The `kb` command. Each command is a thin layer over a function that the
assets, the MCP server and the tests also use. Heavy imports happen inside
the commands, so `kb --help` starts fast."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import warnings

import click

from kb.apps.printing import print_hits, print_stage_line, print_sync_report

# No HF_HUB_OFFLINE here: it reached every process (kb up passes the
# environment on), and faster-whisper `small` for voice notes never
# downloaded. The models that kb ships load from their folders with
# local_files_only (kb/index/embed_local.py); only they are offline on purpose.
# Dagster warns about beta parameters at import; the owner cannot act on that.
warnings.filterwarnings("ignore", message=r".*is currently in (beta|preview).*")
# Dagster's notes on how it resolves kb's jobs: nothing for the owner to do.
warnings.filterwarnings("ignore", message=r"(?s)Asset job .* materializes assets with varying BackfillPolicies")
warnings.filterwarnings("ignore", message=r"(?s)Found asset job named .* passed to `jobs` parameter")


def _echo_json(payload) -> None:
    click.echo(json.dumps(payload, indent=2, default=str, ensure_ascii=False))


def _finish(report) -> None:
    """Print the report of a command's runs; exit 1 when a stage failed or
    something could not be read or done."""
    print_sync_report(report)
    sys.exit(0 if report.ok else 1)


@click.group()
def main() -> None:
    """kb: your X bookmarks and Telegram sources in one searchable store."""
    from kb.apps.quick_exit import skip_final_collection
    from kb.store.private_files import private_process

    skip_final_collection()  # a command that loaded Dagster ends seconds sooner
    private_process()  # KB_HOME, logs and backups are the owner's only (kb/store/private_files.py)
    _tighten_home()


def _tighten_home() -> None:
    """Tell the owner once when kb made an existing KB_HOME or backup
    folder private (an older kb made them 0755)."""
    from kb.store.private_files import private_home
    from kb.settings import get_settings

    try:
        notes = private_home(get_settings())
    except (ValueError, OSError):
        return  # bad settings: the command itself says what is wrong
    for note in notes:
        click.echo(note, err=True)


# --- X capture -------------------------------------------------------------------


@main.command()
def login() -> None:
    """Open a browser on X. Sign in by hand. kb keeps the login state in
    ~/.config/kb/state.json (mode 0600) and never prints it."""
    from kb.apps.login import run_login
    from kb.settings import get_settings

    run_login(get_settings())


SOURCE_KINDS = ("post", "thread", "quote", "article", "link", "image", "video")


def _exclusion_options(command):
    """--no-<source> flags: exclude a source kind for this run only, on top of
    `exclude` in ~/.config/kb/config.toml."""
    for kind in reversed(SOURCE_KINDS):
        command = click.option(f"--no-{kind}", f"no_{kind}", is_flag=True,
                               help=f"Skip the {kind} source for this run, and take it out of the index.")(command)
    return command


def _exclusions(flags: dict) -> list[str]:
    """The kinds to leave out; the run carries them as the tag kb/exclude."""
    return [kind for kind in SOURCE_KINDS if flags.get(f"no_{kind}")]


@main.command()
@click.option("--full", is_flag=True, help="Capture all bookmarks, not only new ones, and mark removed ones.")
@_exclusion_options
def sync(full: bool, **exclusions) -> None:
    """Capture new bookmarks and carry them through every stage."""
    from kb.apps.sync import run_sync

    _finish(run_sync(full=full, exclude=_exclusions(exclusions), on_stage=print_stage_line))


@main.command()
@click.option("--full", is_flag=True, help="Capture all bookmarks, not only new ones, and mark removed ones.")
def capture(full: bool) -> None:
    """Capture new bookmarks only: no links, captions, transcripts,
    translations or index. The next `kb sync` does those."""
    from kb.apps.sync import run_capture

    _finish(run_capture(full=full, on_stage=print_stage_line))


@main.command("import")
@click.argument("pages", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@_exclusion_options
def import_pages(pages: tuple[str, ...], **exclusions) -> None:
    """Import saved X answers (JSON) as one sync batch, with no browser: Bookmarks
    pages, BookmarkFoldersSlice and BookmarkFolderTimeline answers (named
    folder-<folder id>-0001.json, as the capture names them) and TweetDetail
    answers, in any order."""
    from kb.apps.sync import run_sync

    _finish(run_sync(files=[str(Path(p).resolve()) for p in pages], exclude=_exclusions(exclusions),
                     on_stage=print_stage_line))


@main.command()
@click.argument("pages", nargs=-1, type=click.Path(exists=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def inspect(pages: tuple[str, ...], as_json: bool) -> None:
    """Report what captured data holds. With PAGES: just those raw Bookmarks pages."""
    from kb.apps.capture_report import format_report, inspect_report
    from kb.settings import get_settings

    report = inspect_report([Path(p) for p in pages] or None, get_settings())
    _echo_json(report) if as_json else click.echo(format_report(report))


# --- search ----------------------------------------------------------------------


@main.command()
@click.argument("query")
@click.option("-n", "limit", default=10, show_default=True, help="Number of hits.")
@click.option("--author", help="Only posts by this handle.")
@click.option("--source", help="Only this source kind: post, thread, quote, article, link, image, video, wiki.")
@click.option("--after", help="Posts on or after this date (YYYY-MM-DD).")
@click.option("--before", help="Posts before this date (YYYY-MM-DD).")
@click.option("--folder", help="Only bookmarks in this bookmark folder (its name on X).")
@click.option("--mode", type=click.Choice(["hybrid", "bm25", "dense"]), default="hybrid", show_default=True)
@click.option("--rerank", is_flag=True, help="Deep search: a cross-encoder sorts the first 20 hits again. "
                                             "Better order, but about 0.3 s more on a quiet machine (0.7 s at p95).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object with a `hits` list.")
def search(query, limit, author, source, after, before, folder, mode, rerank, as_json) -> None:
    """Search bookmarks: hybrid (vector + BM25), one best passage per bookmark."""
    from kb.index.rerank import RerankError
    from kb.index.search import search as run_search

    try:
        response = run_search(query, limit=limit, author=author, source=source, after=after,
                              before=before, folder=folder, mode=mode, rerank=rerank)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    except RerankError as exc:
        raise click.ClickException(str(exc)) from exc
    if response.note:
        # Nothing to search: say what to do, and fail so that a script notices.
        if as_json:
            _echo_json(response.to_dict())
        click.echo(response.note, err=True)
        sys.exit(1)
    _echo_json(response.to_dict()) if as_json else print_hits(response)


@main.command("index")
@click.option("--rebuild", is_flag=True, help="Drop the vectors and the model record first: after a change of "
              "embedding model.")
@_exclusion_options
def index_command(rebuild: bool, **exclusions) -> None:
    """Index every sync batch and the wiki again. With --rebuild, after a
    change of embedding model: unchanged texts come from the vector cache of
    the new model, when it has them. --no-<source> takes a source kind out."""
    from kb.apps.sync import rebuild_index

    _finish(rebuild_index(rebuild=rebuild, exclude=_exclusions(exclusions), on_stage=print_stage_line))


@main.command()
@click.argument("dest", required=False, type=click.Path())
@click.option("--no-dagster", is_flag=True, help="Leave out the Dagster home (runs, inbox cursor).")
def backup(dest: str | None, no_dagster: bool) -> None:
    """Write one archive of KB_HOME: DuckDB, LanceDB, the wiki as a git bundle, raw files."""
    from kb.apps.backup import BackupError, create_backup

    try:
        result = create_backup(Path(dest) if dest else None, include_dagster=not no_dagster)
    except BackupError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(str(result.archive))


@main.command()
@click.argument("archive", type=click.Path(exists=True, dir_okay=False))
@click.option("--force", is_flag=True, help="Restore into a KB_HOME that is not empty (its content moves aside).")
def restore(archive: str, force: bool) -> None:
    """Restore a `kb backup` archive into KB_HOME, which must be empty."""
    from kb.apps.backup import BackupError, restore_backup

    try:
        result = restore_backup(Path(archive), force=force)
    except BackupError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"Restored into {result.home}: {result.checked_files} files checked against their checksums.")
    if result.moved_aside:
        click.echo(f"The earlier content of KB_HOME is in {result.moved_aside}.")
    for note in result.notes:
        click.echo(f"Note: {note}")


# --- demo --------------------------------------------------------------------------


@main.command()
@click.option("--home", type=click.Path(file_okay=False), default="kb-demo", show_default=True,
              help="KB_HOME for the demo. It never touches your real store.")
def demo(home: str) -> None:
    """Run the whole graph on the sample capture that kb ships, with the local
    embedder and no login, key or server, then print a few searches."""
    from kb.apps.demo import run_demo

    sys.exit(run_demo(Path(home)))


# --- status ------------------------------------------------------------------------


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--all", "show_all", is_flag=True, help="Also show the settings that your setup does not use.")
def status(as_json: bool, show_all: bool) -> None:
    """Coverage per stage, last sync, and the readiness of each service."""
    from kb.apps.status import format_status, collect_status

    report = collect_status()
    _echo_json(report) if as_json else click.echo(format_status(report, show_all))


# --- documents and wiki ------------------------------------------------------------


@main.command("extract-file")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--url", help="The page's address, for relative links and site rules.")
def extract_file(path: str, url: str | None) -> None:
    """Print the main text that the chunker would see for one saved HTML file."""
    from kb.enrich.extract import extract_file as extract

    try:
        click.echo(extract(Path(path), url))
    except (FileNotFoundError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


@main.group()
def wiki() -> None:
    """The git wiki."""


@wiki.command("check")
@click.argument("path", required=False, type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One list per kind of finding.")
def wiki_check(path: str | None, as_json: bool) -> None:
    """Deterministic checks of a wiki folder: dangling links, orphans, stubs,
    index.md against the files, frontmatter and the page schemas of the
    specification (names, sections, the marker), claims without a citation,
    duplicate pages, contradictions between pages, claims that their cited
    source does not hold, and stale claims (the local model; no LLM)."""
    from kb.index.embed_vectors import EmbedderError
    from kb.wiki.checks import check_wiki, findings_count, format_findings
    from kb.settings import get_settings

    try:
        findings = check_wiki(Path(path) if path else get_settings().wiki_dir)
    except FileNotFoundError as exc:
        raise click.UsageError(str(exc)) from exc
    except EmbedderError as exc:
        raise click.ClickException(f"kb wiki check compares texts with the local model, which is not usable: {exc}") from exc
    _echo_json(findings) if as_json else click.echo(format_findings(findings))
    sys.exit(1 if findings_count(findings) else 0)


@wiki.command("migrate")
@click.argument("path", required=False, type=click.Path(file_okay=False))
def wiki_migrate(path: str | None) -> None:
    """Move a wiki of kb's earlier format to the page schemas and names of
    the owner's specification, in one commit. Every cited claim stays,
    word for word; links follow the new names; index.md is built again."""
    from datetime import date

    from kb.settings import get_settings
    from kb.wiki.migrate import MigrateError, migrate_wiki, migration_summary
    from kb.wiki.repo import Wiki

    folder = Path(path) if path else get_settings().wiki_dir
    if not (folder / "wiki").is_dir() or not (folder / ".git").exists():
        raise click.UsageError(f"{folder} is not a kb wiki: it needs a wiki/ folder and a git repository")
    try:
        result = migrate_wiki(Wiki.from_settings(path=str(folder)), date.today().isoformat())
    except MigrateError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(migration_summary(result))


@main.command()
@click.option("--limit", type=int, default=0, help="Caption at most this many photos (0: all that wait).")
@click.option("--retry", is_flag=True, help="Try photos that failed before once more.")
def caption(limit: int, retry: bool) -> None:
    """Caption the photos that wait now, whatever their number, then index them."""
    from kb.apps.caption_run import run_captions

    result = run_captions(limit=limit, retry=retry)
    _echo_json(result)
    sys.exit(0 if result.get("ok", True) and not result.get("index_errors") else 1)


_LIMIT = click.option("--limit", type=int, default=0, show_default=True, help="Do at most this many items (0: all that wait).")


@main.command()
@_LIMIT
@click.option("--retry", is_flag=True, help="Fetch the addresses that failed before once more.")
def extract(limit: int, retry: bool) -> None:
    """Fetch the full text behind the links and X Articles that wait, then index it."""
    from kb.apps.stage_runs import run_extract

    _finish(run_extract(limit=limit, retry=retry, on_stage=print_stage_line))


@main.command()
@_LIMIT
@click.option("--retry", is_flag=True, help="Transcribe the videos that failed before once more.")
def transcribe(limit: int, retry: bool) -> None:
    """Transcribe the videos that wait, then index the transcripts. A failed
    video is tried again only with --retry: a retry starts a GPU or a paid
    service again."""
    from kb.apps.stage_runs import run_transcribe

    _finish(run_transcribe(limit=limit, retry=retry, on_stage=print_stage_line))


@main.command()
@_LIMIT
def translate(limit: int) -> None:
    """Translate the foreign passages that wait into English, then index them."""
    from kb.apps.stage_runs import run_translate

    _finish(run_translate(limit=limit, on_stage=print_stage_line))


@main.command()
def normalize() -> None:
    """Rebuild the tables bookmarks, authors, media and links from every raw
    page, oldest batch first. Use it after a change of the page parser."""
    from kb.apps.stage_runs import run_normalize

    _finish(run_normalize(on_stage=print_stage_line))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind. Keep loopback unless you know why.")
@click.option("--dagster-port", default=3000, show_default=True, help="Port of the Dagster UI.")
@click.option("--web-port", default=8765, show_default=True, help="Port of the search page (kb web).")
@click.option("--no-bot", is_flag=True, help="Do not run the Telegram bot.")
@click.option("--no-web", is_flag=True, help="Do not run the search page.")
def up(host: str, dagster_port: int, web_port: int, no_bot: bool, no_web: bool) -> None:
    """Run the always-on system: one Dagster code server, the Dagster daemon
    (sensors, schedules, retries), the Dagster UI, the Telegram bot and the
    search page. Logs go to $KB_HOME/logs/. Ctrl-C stops every part."""
    from kb.apps.up import run_up

    sys.exit(run_up(host=host, dagster_port=dagster_port, web_port=web_port, bot=not no_bot, web=not no_web))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind. Keep loopback unless you know why.")
@click.option("--port", default=8765, show_default=True)
def web(host: str, port: int) -> None:
    """A search page in the browser, over the same search function."""
    from kb.apps.lifeline import watch_lifeline
    from kb.apps.web import serve

    watch_lifeline()  # as a part of kb up: it stops when kb up dies

    serve(host=host, port=port)


# --- evaluation --------------------------------------------------------------------


@main.group("eval")
def eval_group() -> None:
    """Measure the quality of kb's stages."""


@eval_group.command("retrieval")
@click.argument("folder", type=click.Path(exists=True, file_okay=False))
@click.option("--split", required=True, help="Split name: reads queries.NAME.jsonl and qrels.NAME.tsv.")
@click.option("--mode", type=click.Choice(["bm25", "dense", "hybrid", "all"]), default="all", show_default=True)
@click.option("--rerank", is_flag=True, help="Deep search: a cross-encoder sorts the first 20 hits again "
                                             "(1 to 3 s per query).")
@click.option("--json", "as_json", is_flag=True)
def eval_retrieval(folder: str, split: str, mode: str, rerank: bool, as_json: bool) -> None:
    """nDCG@10, Recall@100 and median query time on a BEIR-format folder."""
    from kb.apps.eval_retrieval import evaluate
    from kb.index.rerank import RerankError

    modes = ["bm25", "dense", "hybrid"] if mode == "all" else [mode]
    try:
        result = evaluate(Path(folder), split, modes, rerank=rerank)
    except RerankError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        _echo_json(result)
        return
    click.echo(f"{'mode':<8} {'nDCG@10':>8} {'R@100':>8} {'p50 ms':>8}")
    for name, m in result.items():
        click.echo(f"{name:<8} {m['ndcg@10']:>8.3f} {m['recall@100']:>8.3f} {m['p50_ms']:>8.1f}")


if __name__ == "__main__":
    main()

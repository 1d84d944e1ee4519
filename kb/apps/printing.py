"""What the `kb` command and `kb demo` print: one copy of each format."""

from __future__ import annotations

import sys

import click

from kb.readable import readable_text


def print_sync_report(report) -> None:
    if report.gone_runs:
        click.echo(f"Marked {len(report.gone_runs)} runs failed: their worker process is gone. "
                   "Their pool slots are free.")
    if report.resumed:
        click.echo(f"Re-executed from failure the runs of earlier batches: {', '.join(report.resumed)}.")
    if report.caught_up:
        click.echo(f"Caught up the work that waits in earlier batches, one run each: {', '.join(report.caught_up)}.")
    for stage in report.stages:
        mark = "ok" if stage.ok else "FAILED"
        earlier = f" (batch {stage.batch})" if stage.batch and stage.batch != report.batch else ""
        line = f"  {stage.stage + earlier:<21} {mark:<7} {stage.seconds:6.1f} s"
        click.echo(line + (f"  {stage.error}" if stage.error else ""))
    from kb.apps.run_report import stage_counts

    for line in stage_counts(report):
        click.echo(line)
    for note in report.notes:
        click.echo(f"Note: {note}", err=True)
    for problem in report.problems:
        click.echo(f"Problem: {problem}", err=True)
    if report.run_ids:
        click.echo(f"Dagster runs: {', '.join(report.run_ids)}")
    name = report.title or f"Batch {report.batch}"
    if report.failed:
        click.echo(f"{name}: these stages failed: {', '.join(report.failed)}.", err=True)
    elif report.problems:
        click.echo(f"{name}: the stages finished, but with {len(report.problems)} problem(s); see above.", err=True)
    elif report.stages:
        click.echo(f"{name}: all stages finished.")


def print_stage_line(name: str, number: int, total: int) -> None:
    if sys.stderr.isatty():
        done = "#" * (number - 1) + "." * (total - number + 1)
        click.echo(f"[{done}] {number}/{total} {name}", err=True)


def print_hits(response) -> None:
    hits = response.hits
    if not hits:
        click.echo("No results.")
        return
    # Strangers wrote the text of a hit: a control character in it (ESC of
    # a terminal's escape sequence) must not reach the owner's terminal.
    for n, hit in enumerate(hits, start=1):
        date = str(hit.created_at)[:10] if hit.created_at else "?"
        reranked = f"  rerank {hit.rerank_score:.2f}" if hit.rerank_score is not None else ""
        click.echo(readable_text(f"{n}. @{hit.author}  {date}  score {hit.score:.3f}{reranked}  [{hit.best_source}]"))
        click.echo("   " + readable_text(" ".join(hit.best_chunk.split()))[:400])
        click.echo(readable_text(f"   from {hit.best_ref}"))

"""Per-run choices, carried by run tags.

A choice for one run (`kb sync --no-image`) is a run tag, not an environment
variable: a run that the daemon, a sensor or the UI launches (in another
process) carries it too, and the UI shows it and lets the owner edit it.
"""

from __future__ import annotations

import dagster as dg

from kb.settings import excluded_sources

# Source kinds to leave out in this run, comma-separated: "image,video".
EXCLUDE_TAG = "kb/exclude"


def excluded_in_run(context: dg.AssetExecutionContext | dg.AssetCheckExecutionContext | None) -> set[str]:
    """The source kinds that this run leaves out: the owner's config and the
    run's tag kb/exclude."""
    tag = ""
    if context is not None:
        tag = context.run.tags.get(EXCLUDE_TAG, "")
    return excluded_sources(for_this_run=tag)

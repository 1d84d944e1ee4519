"""The state of an inbox item, as the bot shows it. No Dagster here.

Dagster is the only state store of an item; kb_assets/source_states.py
reads it from the Dagster instance. This module holds only the shape of the
answer, so that the bot can use it without importing Dagster.

States:
    received    in the inbox; the inbox sensor has not seen it yet
    queued      a partition of `sources`; no run has started
    processing  a run of the partition is queued or running
    parsed      parsed, but the gate has not run yet
    retrying    the last run failed and Dagster will run it again
    failed      the last run failed for good (the error says why)
    refused     the wiki change was refused by a rule of the wiki (the rule is
                the error), and no try is left
    stuck       (a try, not an item) kb stopped a try that ran longer than
                KB_STUCK_MINUTES; it uses a retry
    rejected    the quality gate scored it below the threshold
    duplicate   an earlier item has the same URL or the same words
    approved    accepted by the gate; the wiki has not run yet
    waiting     accepted, but the wiki agent has no endpoint (ANTHROPIC_BASE_URL)
    ingesting   the wiki agent is working on it
    done        in the wiki (the commit SHA says where)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class State(StrEnum):
    """The one list of states. A member equals its string (State.DONE ==
    "done"), so the metadata of Dagster and the JSON of `kb status` hold the
    plain words."""

    RECEIVED = "received"
    QUEUED = "queued"
    PROCESSING = "processing"
    PARSED = "parsed"
    RETRYING = "retrying"
    FAILED = "failed"
    REFUSED = "refused"
    REJECTED = "rejected"
    DUPLICATE = "duplicate"
    APPROVED = "approved"
    WAITING = "waiting"
    INGESTING = "ingesting"
    DONE = "done"
    STUCK = "stuck"


STATES = tuple(State)
# The states of an observation that records one failed try: each uses one
# retry of the budget (kb/retries.py, kb_assets/retry_budget.py).
FAILED_TRY_STATES = (State.RETRYING, State.FAILED, State.STUCK)
# The states that end an item: each one is told to the owner once.
FINAL_STATES = (State.DONE, State.FAILED, State.REFUSED, State.REJECTED, State.DUPLICATE)


@dataclass(frozen=True)
class ItemState:
    item_id: str
    state: State
    error: str | None = None
    commit: str | None = None
    score: int | None = None
    duplicate_of: str | None = None
    title: str | None = None
    # Set when every try of the quality gate failed and the score is the
    # default: the words that say so (kb.telegram.gate.default_accept_note).
    gate_note: str | None = None
    # How the gate decided: scored, skipped-no-key or skipped-errors (None before the gate).
    gate: str | None = None

    @property
    def score_text(self) -> str | None:
        """The score as /status shows it: the number, `not scored` when the
        gate had no key (DEEPSEEK_API_KEY), or None before the gate."""
        if self.gate == "skipped-no-key":
            return "not scored (no DEEPSEEK_API_KEY)"
        if self.score is None:
            return None
        return f"{self.score}" + (" (a default, not a score of the model)" if self.gate_note else "")


# Gives the state of each item id. It blocks (it reads the Dagster instance),
# so async code runs it in a thread.
StateReader = Callable[[list[str]], dict[str, ItemState]]

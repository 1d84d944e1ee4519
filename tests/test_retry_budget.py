"""The one retry rule (kb/retries.py): 3 retries after 60, 120 and 240 s,
and a count that no new run resets (kb_assets/retry_budget.py). Before,
an unexpected error retried at 60, 180 and 420 s by a RetryPolicy of its
own, and a run retry started the wiki's count again."""

from __future__ import annotations

import dagster as dg
import pytest

from kb.retries import RetryBudget
from kb_assets.keys import ROOT_RUN_TAG
from kb_resources.services import TelegramNotifierResource, WikiAgentResource
from kb_resources.stores import WikiResource
from tests.test_wiki_agent import ephemeral_instance, materialize_source, record_gate_decision, PARSED  # noqa: F401
from tests.test_wiki_agent import wiki  # noqa: F401  (the fixture)

DAY = "2026-11-30"


def test_the_budget_is_the_specifications():
    budget = RetryBudget()
    assert (budget.retries, budget.tries, budget.waits_s) == (3, 4, (60, 120, 240))
    assert [budget.wait_after(n) for n in range(4)] == [60, 120, 240, None]
    assert RetryBudget.doubling(60, 3) == budget
    assert budget.left(2) == 1 and budget.left(7) == 0


def test_the_in_process_loop_waits_the_budget_and_stops_after_the_last_try():
    import tenacity

    slept, told = [], []
    tries = []

    def flaky():
        tries.append(1)
        raise ConnectionError("down")

    with pytest.raises(tenacity.RetryError):
        for attempt in RetryBudget().retrying((ConnectionError,), lambda n, e, w: told.append((n, w)),
                                              sleep=slept.append):
            with attempt:
                flaky()
    assert len(tries) == 4 and slept == [60, 120, 240] and told == [(1, 60), (2, 120), (3, 240)]
    # An error outside `retry_on` is not retried: it comes out as it is.
    with pytest.raises(ValueError):
        for attempt in RetryBudget().retrying((ConnectionError,), sleep=slept.append):
            with attempt:
                raise ValueError("a bug")
    assert slept == [60, 120, 240]


def lint_resources() -> dict:
    return {"wiki": WikiResource.from_settings(), "wiki_agent": WikiAgentResource.from_settings(),
            "telegram": TelegramNotifierResource.from_settings()}


def test_an_unexpected_error_of_a_wiki_task_waits_the_budget_then_fails(wiki, monkeypatch):  # noqa: F811
    """The budget's doubling waits (here from 0.1 s: 0.1, 0.2, 0.4), not
    Dagster's exponential backoff (0.1, 0.3, 0.7), and the same 3 retries."""
    from kb_assets.wiki import wiki_pages as stage

    monkeypatch.setattr(stage, "budget", lambda: RetryBudget.doubling(0.1, 3))
    monkeypatch.setattr(stage, "lint_wiki", lambda *a, **k: (_ for _ in ()).throw(OSError("git is locked")))
    with ephemeral_instance() as instance:
        result = run_lint(instance)
    waits = [e.event_specific_data.seconds_to_wait for e in result.all_node_events if e.is_step_up_for_retry]
    assert waits == [0.1, 0.2, 0.4]
    failure = [e for e in result.all_node_events if e.is_step_failure][0]
    assert "(try 4 of 4): error outside the change: OSError: git is locked" in str(failure.event_specific_data)


def run_lint(instance, tags=None) -> dg.ExecuteInProcessResult:
    from kb_assets.wiki.wiki_pages import wiki_lint

    return dg.materialize([wiki_lint], partition_key=DAY, instance=instance, raise_on_error=False,
                          resources=lint_resources(), tags=tags or {})


def test_a_run_retry_goes_on_with_the_count_and_a_new_request_starts_one(wiki, monkeypatch):  # noqa: F811
    from kb_assets.wiki import wiki_pages as stage

    calls = []

    def broken(*args, **kwargs):
        calls.append(1)
        raise OSError("git is locked")

    monkeypatch.setattr(stage, "lint_wiki", broken)
    with ephemeral_instance() as instance:
        first = run_lint(instance)
        assert not first.success and len(calls) == 4
        assert len([e for e in first.all_node_events if e.is_step_up_for_retry]) == 3
        # Dagster's run retry of the same request (its root run): no try is left, nothing runs.
        again = run_lint(instance, tags={ROOT_RUN_TAG: first.run_id, "dagster/parent_run_id": first.run_id})
        assert not again.success and len(calls) == 4
        failure = [e for e in again.all_node_events if e.is_step_failure][0]
        assert "4 failed tries so far, also in earlier runs; no retry is left" in str(failure.event_specific_data)
        # A new request (the next /lint, a schedule tick) has its own budget.
        third = run_lint(instance)
        assert not third.success and len(calls) == 8


def test_a_source_s_wiki_count_is_never_reset_by_a_new_run(wiki, monkeypatch, kb_home):  # noqa: F811
    record_gate_decision("src1", "accepted", PARSED)
    # The quickest failure of the agent, with no CLI start: a file where the agent's rooms go.
    (kb_home / "agent").write_text("not a folder")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://127.0.0.1:9")
    with ephemeral_instance() as instance:
        first = materialize_source(instance, "src1")
        assert not first.success
        assert len([e for e in first.all_node_events if e.is_step_up_for_retry]) == 3
        second = materialize_source(instance, "src1")  # a run retry, a backfill, the waiting sensor
        assert not second.success
        assert not [e for e in second.all_node_events if e.is_step_up_for_retry]
        failure = [e for e in second.all_node_events if e.is_step_failure][0]
        assert "no retry is left" in str(failure.event_specific_data)

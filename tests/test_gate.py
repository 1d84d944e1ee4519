"""The quality gate against a loopback OpenAI-compatible server: the real
`openai` client, real HTTP."""

import json
import time

import pytest

from kb.telegram.gate import (
    DEFAULT_PURPOSE,
    FALLBACK_SCORE,
    QualityGate,
    parse_answer,
    purpose_is_default,
    read_purpose,
    source_excerpt,
)
from kb.wiki.playbook import PURPOSE_MD
from kb.wiki.prompt_data import DATA_NOTE
from tests.fake_openai_chat import FakeOpenAIChat, chat, status

FAKE_KEY = "sk-TEST-SECRET-GATE-KEY-0001"
PURPOSE = "# Purpose\nI collect sources about distributed databases and consensus."


@pytest.fixture
def gate_env(monkeypatch):
    def configure(base_url: str, key: str | None = FAKE_KEY):
        monkeypatch.setenv("KB_GATE_BASE_URL", base_url)
        monkeypatch.setenv("KB_GATE_MODEL", "deepseek-chat")
        if key:
            monkeypatch.setenv("DEEPSEEK_API_KEY", key)
        return QualityGate.from_settings()
    return configure


def test_good_json_is_scored_and_the_request_has_the_gate_rules(gate_env):
    answer = json.dumps({"score": 81, "topics": ["Raft Consensus", "distributed_systems", "raft consensus"],
                         "rationale": "A clear explanation of Raft."})
    long_source = "Raft elects a leader. " * 2000  # ~44,000 characters
    with FakeOpenAIChat(chat(answer)) as server:
        verdict = gate_env(server.base_url).judge(long_source, PURPOSE, source_type="pdf", file_name="raft.pdf",
                                                  title="In Search of an Understandable Consensus Algorithm")
    assert (verdict.score, verdict.gate, verdict.attempts, verdict.accepted) == (81, "scored", 1, True)
    assert verdict.topics == ["raft-consensus", "distributed-systems"]
    assert verdict.reason == "A clear explanation of Raft."
    assert verdict.raw_answer == answer  # kept as it came, for audit
    [request] = server.requests
    assert server.paths == ["/chat/completions"]
    assert request["temperature"] == 0
    assert request["max_tokens"] == 400
    assert request["response_format"] == {"type": "json_object"}
    assert request["model"] == "deepseek-chat"
    system, user = request["messages"]
    assert system["role"] == "system" and system["content"].startswith(PURPOSE)
    # The spec's bar and rubric.
    for rule in ("is this content?", "0-30: spam", "30-60: thin", "60-80: useful", "80-100: excellent",
                 "When you are unsure, give 65.", '"rationale": "<1-2 sentences>"'):
        assert rule in system["content"]
    # What the source is, then only the start of its text: ~2,000 tokens, cut at a word.
    header, text = user["content"].split("\n\nText:\n")
    assert header.startswith(DATA_NOTE + "\n```json\n") and header.endswith("\n```")
    assert json.loads(header.split("```json\n")[1].removesuffix("\n```")) == {
        "type": "pdf", "file_name": "raft.pdf", "title": "In Search of an Understandable Consensus Algorithm"}
    assert text == source_excerpt(long_source)
    assert 7_000 < len(text) <= 8_000
    assert long_source.startswith(text)
    assert server.headers[0]["authorization"] == f"Bearer {FAKE_KEY}"


def test_score_is_clamped_and_topics_are_at_most_six(gate_env):
    answer = json.dumps({"score": 140, "topics": [f"Topic {n}" for n in range(9)], "reason": "great"})
    with FakeOpenAIChat(chat(answer)) as server:
        verdict = gate_env(server.base_url).judge("text", PURPOSE)
    assert verdict.score == 100
    assert verdict.topics == [f"topic-{n}" for n in range(6)]
    with FakeOpenAIChat(chat('{"score": -7, "topics": [], "reason": "spam"}')) as server:
        verdict = gate_env(server.base_url).judge("text", PURPOSE)
    assert (verdict.score, verdict.accepted) == (0, False)


def test_below_the_threshold_is_rejected(gate_env, monkeypatch):
    monkeypatch.setenv("KB_GATE_THRESHOLD", "60")
    with FakeOpenAIChat(chat('{"score": 59, "topics": ["ads"], "reason": "an advert"}')) as server:
        verdict = gate_env(server.base_url).judge("buy now", PURPOSE)
    assert (verdict.score, verdict.threshold, verdict.accepted, verdict.skipped) == (59, 60, False, False)


def test_bad_json_then_good_json_uses_the_second_answer(gate_env):
    with FakeOpenAIChat(chat("I think this is a 7 out of 10"), chat('{"score": 70, "topics": [], "reason": "ok"}')) as server:
        verdict = gate_env(server.base_url).judge("text", PURPOSE)
    assert (verdict.score, verdict.attempts, verdict.gate) == (70, 2, "scored")
    assert verdict.errors[0]["try"] == 1 and "not JSON" in verdict.errors[0]["error"]
    assert len(server.requests) == 2


def test_four_failures_accept_with_65_and_mark_gate_skipped(gate_env):
    with FakeOpenAIChat(status(500, "boom"), chat("not json"), status(503, "overloaded"), chat('{"topics": []}')) as server:
        verdict = gate_env(server.base_url).judge("text", PURPOSE)
    assert len(server.requests) == 4  # three waits, four tries; the client itself does not retry
    assert (verdict.score, verdict.gate, verdict.accepted, verdict.skipped) == (FALLBACK_SCORE, "skipped-errors", True, True)
    assert [e["try"] for e in verdict.errors] == [1, 2, 3, 4]
    assert "InternalServerError" in verdict.errors[0]["error"]
    assert "no 'score'" in verdict.errors[3]["error"]
    assert all(FAKE_KEY not in e["error"] for e in verdict.errors)
    assert "failed 4 tries" in verdict.reason and "no 'score'" in verdict.reason


def test_the_gate_waits_the_set_times_between_tries_and_accepts_only_after_the_last(gate_env, monkeypatch):
    """A model outage of a few seconds must not let a source in unscored:
    the tries wait KB_GATE_RETRY_WAITS_S, and an answer on the last try counts."""
    monkeypatch.setenv("KB_GATE_RETRY_WAITS_S", "1,2")
    with FakeOpenAIChat(status(503, "down"), status(503, "down"), chat('{"score": 40, "reason": "thin"}')) as server:
        gate = gate_env(server.base_url)
        assert gate.retry_waits_s == [1, 2] and gate.tries == 3
        verdict = gate.judge("text", PURPOSE)
    assert (verdict.score, verdict.gate, verdict.accepted, verdict.attempts) == (40, "scored", False, 3)
    assert [e["try"] for e in verdict.errors] == [1, 2]
    arrivals = server.arrivals
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:])]
    assert 0.9 < gaps[0] < 1.9 and 1.9 < gaps[1] < 3.5, gaps


def test_errors_accept_even_when_the_threshold_is_above_65(gate_env, monkeypatch):
    monkeypatch.setenv("KB_GATE_THRESHOLD", "90")
    with FakeOpenAIChat(status(503, "overloaded")) as server:
        verdict = gate_env(server.base_url).judge("text", PURPOSE)
    assert (verdict.score, verdict.accepted) == (65, True)
    assert len(server.requests) == 4


def test_a_wait_below_zero_is_a_bad_setting(monkeypatch):
    from kb.settings import get_settings

    monkeypatch.setenv("KB_GATE_RETRY_WAITS_S", "60,-5")
    with pytest.raises(ValueError, match="KB_GATE_RETRY_WAITS_S"):
        get_settings()


def test_no_key_accepts_without_a_call(gate_env):
    with FakeOpenAIChat(chat('{"score": 1}')) as server:
        gate = gate_env(server.base_url, key=None)
        verdict = gate.judge("text", PURPOSE)
    assert server.requests == []
    assert (verdict.score, verdict.gate, verdict.accepted) == (None, "skipped-no-key", True)
    assert gate.readiness()[0] is False


def test_unreachable_endpoint_counts_as_failures(gate_env):
    with FakeOpenAIChat(chat("{}")) as server:
        url = server.base_url
    verdict = gate_env(url).judge("text", PURPOSE)  # the server is closed now
    assert verdict.gate == "skipped-errors"
    assert all("APIConnectionError" in e["error"] for e in verdict.errors)


@pytest.mark.parametrize("content, expected", [
    ('```json\n{"score": 55, "topics": ["a b"], "reason": "r"}\n```', (55, ["a-b"], "r")),
    ('{"score": 72.6, "topics": "single topic"}', (73, ["single-topic"], "")),
    # The specification's key wins over kb's earlier one.
    ('{"score": 64, "rationale": "Real content. Short.", "reason": "old"}', (64, [], "Real content. Short.")),
])
def test_answer_parsing(content, expected):
    assert parse_answer(content) == expected


@pytest.mark.parametrize("content", ['{"score": "high"}', '{"score": true}', "[1, 2]", "", None])
def test_answers_that_are_not_the_asked_json_are_errors(content):
    with pytest.raises(ValueError):
        parse_answer(content)


def test_purpose_comes_from_the_wiki_or_a_default(tmp_path):
    assert read_purpose(tmp_path) == DEFAULT_PURPOSE and purpose_is_default(tmp_path)
    # A new wiki's placeholder tells the model nothing: the default stands in.
    (tmp_path / "purpose.md").write_text(PURPOSE_MD)
    assert read_purpose(tmp_path) == DEFAULT_PURPOSE and purpose_is_default(tmp_path)
    (tmp_path / "purpose.md").write_text(PURPOSE)
    assert read_purpose(tmp_path) == PURPOSE and not purpose_is_default(tmp_path)


def test_kb_status_asks_the_owner_to_write_purpose_while_it_is_the_placeholder():
    from kb.apps.status import _purpose_state, format_status
    from kb.settings import get_settings

    settings = get_settings()
    settings.wiki_dir.mkdir(parents=True)
    (settings.wiki_dir / "purpose.md").write_text(PURPOSE_MD)
    report = {"kb_home": str(settings.home), "capture": {"last_sync": None, "batches": 0},
              "normalized": {"state": "missing"}, "index": {}, "services": {}}
    text = format_status({**report, "purpose": _purpose_state(settings)})
    assert f"purpose.md is not written yet: write {settings.wiki_dir / 'purpose.md'}." in text
    assert "the quality gate uses a\n  default purpose" in text
    (settings.wiki_dir / "purpose.md").write_text(PURPOSE)
    assert "purpose.md" not in format_status({**report, "purpose": _purpose_state(settings)})

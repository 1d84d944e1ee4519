"""The retrieval evaluation on a tiny BEIR folder made by the test, through
the real chunker, embedder (hash test embedder), LanceDB index and search."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from kb.apps.eval_retrieval import EvalDataError, document_chunks, evaluate, load_beir, ndcg_at, recall_at
from kb.index.embedder import Embedder

LONG_TEXT = " ".join(f"Filler sentence number {i} talks about weather and clouds." for i in range(40)) + \
    " The final sentence mentions the zirconium isotope ratio."

DOCS = {
    "d1": ("Sourdough", "Feeding a sourdough starter with rye flour keeps it active."),
    "d2": ("Espresso", "Grind size and dose decide espresso extraction time."),
    "d3": ("Raft", "Raft elects a leader and replicates a log across servers."),
    "d4": ("Geology", LONG_TEXT),
    "d5": ("Gardening", "Tomato plants need full sun and deep watering."),
    "d6": ("Rye bread", "Rye bread uses a sourdough starter and a long proof."),
}
QUERIES = {
    "q1": "sourdough starter rye",
    "q2": "espresso grind extraction",
    "q3": "zirconium isotope",
    "q4": "leader election log replication",
    "q5": "a query with no judgement",
}
QRELS = [("q1", "d1", 1), ("q1", "d6", 1), ("q2", "d2", 1), ("q3", "d4", 2), ("q4", "d3", 1)]


def write_beir(folder: Path, split: str = "test") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "corpus.jsonl").open("w") as fh:
        for doc_id, (title, text) in DOCS.items():
            fh.write(json.dumps({"_id": doc_id, "title": title, "text": text}) + "\n")
    with (folder / f"queries.{split}.jsonl").open("w") as fh:
        for qid, text in QUERIES.items():
            fh.write(json.dumps({"_id": qid, "text": text}) + "\n")
    with (folder / f"qrels.{split}.tsv").open("w") as fh:
        fh.write("query-id\tcorpus-id\tscore\n")
        for row in QRELS:
            fh.write("\t".join(map(str, row)) + "\n")
    return folder


def test_metrics_by_hand():
    judged = {"b": 1, "c": 1}
    assert ndcg_at(["a", "b", "c"], judged) == pytest.approx(
        (1 / math.log2(3) + 1 / math.log2(4)) / (1 + 1 / math.log2(3)))
    assert ndcg_at(["b", "c"], judged) == pytest.approx(1.0)
    assert ndcg_at(["x"], judged) == 0.0
    assert recall_at(["a", "b"], judged, 100) == 0.5
    assert recall_at(["c", "a", "b"], judged, 2) == 0.5


def test_long_documents_become_several_passages():
    rows = document_chunks("d4", {"title": "Geology", "text": LONG_TEXT})
    assert len(rows) >= 2
    assert rows[0]["text"].startswith("Geology")
    assert {r["tweet_id"] for r in rows} == {"d4"}
    assert "zirconium" in rows[-1]["text"]


def test_evaluate_runs_every_mode_through_the_index(tmp_path):
    folder = write_beir(tmp_path / "tiny")
    result = evaluate(folder, "test", ["bm25", "dense", "hybrid"], embedder=Embedder.from_settings(backend="hash"))
    assert set(result) == {"bm25", "dense", "hybrid"}
    for mode, figures in result.items():
        assert figures["queries"] == 4, mode  # q5 has no judgement
        assert 0.0 <= figures["ndcg@10"] <= 1.0
        assert figures["p50_ms"] > 0
    # Each query shares its rare words with its relevant documents only, and
    # the corpus has fewer than 100 documents: every relevant one is found.
    assert result["bm25"]["recall@100"] == 1.0
    assert result["bm25"]["ndcg@10"] == pytest.approx(1.0)
    assert result["hybrid"]["ndcg@10"] == pytest.approx(1.0)


def test_evaluate_one_mode(tmp_path):
    folder = write_beir(tmp_path / "tiny", split="dev")
    result = evaluate(folder, "dev", ["bm25"], embedder=Embedder.from_settings(backend="hash"))
    assert list(result) == ["bm25"]


def test_bad_folders_give_clear_errors(tmp_path):
    folder = write_beir(tmp_path / "tiny")
    with pytest.raises(EvalDataError, match=r"queries\.train\.jsonl is missing"):
        load_beir(folder, "train")
    with pytest.raises(ValueError, match="mode='sparse'"):
        evaluate(folder, "test", ["sparse"], embedder=Embedder.from_settings(backend="hash"))
    (folder / "corpus.jsonl").write_text('{"_id": "d1", "title": "x", "text": "y"}\nnot json\n')
    with pytest.raises(EvalDataError, match="line 2 is not JSON"):
        load_beir(folder, "test")


@pytest.mark.slow
def test_kb_eval_retrieval_rerank(tmp_path, monkeypatch):
    """--rerank measures the deep search: the cross-encoder keeps the judged
    documents first, and a bad model setting stops the run with its reason."""
    from click.testing import CliRunner

    from kb.apps.cli import main

    folder = write_beir(tmp_path / "tiny")
    monkeypatch.setenv("KB_EMBED_BACKEND", "hash")
    args = ["eval", "retrieval", str(folder), "--split", "test", "--mode", "hybrid", "--rerank", "--json"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    figures = json.loads(result.output)["hybrid"]
    assert figures["queries"] == 4 and figures["ndcg@10"] == pytest.approx(1.0) and figures["recall@100"] == 1.0
    monkeypatch.setenv("KB_RERANK_MODEL", str(tmp_path / "no-model"))
    failed = CliRunner().invoke(main, args)
    assert failed.exit_code == 1 and "KB_RERANK_MODEL=" in failed.output

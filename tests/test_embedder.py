"""The Embedder resource: Ollama through a loopback server that speaks its
HTTP API, the bundled local model loaded offline, the hash test embedder,
and the LanceDB vector cache."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from kb.index.embed_ollama import OLLAMA_DOCUMENT_PROMPT, OLLAMA_QUERY_PROMPT
from kb.index.embed_vectors import EmbedderError
from kb.index.embedder import Embedder, forget_backend_choice
from kb.index.vector_cache import CACHE_TABLE
from kb.settings import get_settings
from tests.fake_ollama import DIM, FakeOllama

# The model before bge-small-en-v1.5: the tests of its two runtimes (ONNX
# Runtime and PyTorch) and of its int8 weights name it. `kb wiki check` uses it.
MINILM = "all-MiniLM-L6-v2"


@pytest.fixture(autouse=True)
def fresh_backend_choice():
    # `auto` decides once per process; each test starts a new decision.
    forget_backend_choice()
    yield
    forget_backend_choice()


@pytest.fixture
def ollama(monkeypatch):
    with FakeOllama() as fake:
        monkeypatch.setenv("OLLAMA_URL", fake.url)
        yield fake


def closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def test_auto_uses_ollama_when_it_has_the_model(ollama):
    embedder = Embedder.from_settings()
    assert embedder.resolved_backend() == "ollama"
    assert embedder.model_name == "ollama:embeddinggemma"
    assert embedder.dim == DIM

    docs = embedder.embed_documents(["Rust borrow checker explained", "Sourdough starter care"])
    query = embedder.embed_query("how does the borrow checker work")

    assert docs.shape == (2, DIM) and docs.dtype == np.float32
    assert np.allclose(np.linalg.norm(docs, axis=1), 1.0, atol=1e-5)
    # embeddinggemma's asymmetric prompts reach the server.
    sent = ollama.embed_inputs()
    assert OLLAMA_DOCUMENT_PROMPT.format(text="Rust borrow checker explained") in sent
    assert OLLAMA_QUERY_PROMPT.format(text="how does the borrow checker work") in sent
    assert float(docs[0] @ query) > float(docs[1] @ query)


def test_ollama_batches_and_never_embeds_unchanged_text_twice(ollama):
    texts = [f"passage number {i} about topic {i % 3}" for i in range(5)]
    first = Embedder.from_settings(batch_size=2)
    vectors = first.embed_documents(texts)
    calls = [r for r in ollama.requests if r["path"] == "/api/embed" and "dimension probe" not in str(r["body"])]
    assert [len(r["body"]["input"]) for r in calls] == [2, 2, 1]

    # A new embedder (as in a new run) finds the vectors in the LanceDB cache.
    before = len(ollama.embed_inputs())
    second = Embedder.from_settings(batch_size=2)
    again = second.embed_documents(texts + ["a new passage", texts[0]])
    new_inputs = ollama.embed_inputs()[before:]
    assert new_inputs == [OLLAMA_DOCUMENT_PROMPT.format(text="a new passage")]
    assert np.allclose(again[:5], vectors, atol=1e-6)
    assert np.allclose(again[6], vectors[0], atol=1e-6)
    assert second.stats == {"embedded": 1, "cached": 6}
    assert (get_settings().lancedb_dir / f"{CACHE_TABLE}.lance").is_dir()


def test_cache_is_per_model(ollama):
    Embedder.from_settings(backend="hash").embed_documents(["same text"])
    ollama_embedder = Embedder.from_settings(backend="ollama")
    ollama_embedder.embed_documents(["same text"])
    assert ollama_embedder.stats["embedded"] == 1


def test_auto_falls_back_to_local_when_ollama_lacks_the_model(monkeypatch):
    with FakeOllama(models=["nomic-embed-text:latest"]) as fake:
        monkeypatch.setenv("OLLAMA_URL", fake.url)
        embedder = Embedder.from_settings()
        assert embedder.resolved_backend() == "local"
        assert embedder.model_name == "local:bge-small-en-v1.5"
        assert embedder.dim == 384
        status = embedder.readiness()
    assert status["ollama"]["answers"] is True
    assert status["ollama"]["has_model"] is False
    assert "ollama pull embeddinggemma" in status["ollama"]["error"]
    assert (status["local"]["present"], status["local"]["dim"]) == (True, 384)
    assert status["active"] == "local:bge-small-en-v1.5"


def test_auto_falls_back_to_local_when_ollama_does_not_answer(monkeypatch):
    monkeypatch.setenv("OLLAMA_URL", closed_port_url())
    embedder = Embedder.from_settings()
    assert embedder.resolved_backend() == "local"
    status = embedder.readiness()
    assert status["ollama"]["answers"] is False
    assert "does not answer" in status["ollama"]["error"]


def test_ollama_backend_names_the_missing_model(monkeypatch):
    with FakeOllama(models=["nomic-embed-text:latest"]) as fake:
        monkeypatch.setenv("OLLAMA_URL", fake.url)
        # kb status says so without asking for a vector.
        status = Embedder.from_settings(backend="ollama").readiness()
        assert (status["active"], status["ready"]) == ("ollama:embeddinggemma", False)
        assert [r["path"] for r in fake.requests] == ["/api/tags"]
        with pytest.raises(EmbedderError, match="ollama pull embeddinggemma"):
            Embedder.from_settings(backend="ollama").embed_documents(["text"])


def test_the_official_ollama_client_makes_every_call(ollama):
    Embedder.from_settings().embed_documents(["one passage"])
    agents = {r["user_agent"].split("/")[0] for r in ollama.requests}
    assert [r["path"] for r in ollama.requests][:1] == ["/api/tags"]
    assert agents == {"ollama-python"}


def test_an_ollama_error_names_the_server_and_the_reason(ollama):
    ollama.embed_error = (500, "llama runner process has terminated: out of memory")
    with pytest.raises(EmbedderError) as caught:
        Embedder.from_settings(backend="ollama").embed_documents(["text"])
    message = str(caught.value)
    assert ollama.url in message and "out of memory" in message and "\n" not in message


def test_readiness_with_ollama(ollama):
    status = Embedder.from_settings().readiness()
    assert status["ollama"] == {"url": ollama.url, "model": "embeddinggemma", "answers": True,
                                "has_model": True, "error": None}
    assert status["active"] == "ollama:embeddinggemma"
    assert status["ready"] is True


def test_unknown_backend_is_an_error(monkeypatch):
    monkeypatch.setenv("KB_EMBED_BACKEND", "openai")
    with pytest.raises(EmbedderError, match="'openai' is unknown"):
        Embedder.from_settings().model_name


def test_local_model_loads_offline_and_ranks_a_paraphrase_first(monkeypatch):
    # Any hub access would go to a closed port and fail.
    monkeypatch.setenv("HF_ENDPOINT", closed_port_url())
    embedder = Embedder.from_settings(backend="local")
    query = embedder.embed_query("How do I bake bread at home?")
    docs = embedder.embed_documents([
        "The central bank raised interest rates by a quarter point.",
        "A beginner's guide to making your own loaf in a home kitchen oven.",
    ])
    unrelated, paraphrase = docs @ query
    assert paraphrase > unrelated + 0.2


def test_hash_embedder_is_deterministic():
    first = Embedder.from_settings(backend="hash", use_cache=False).embed_documents(["alpha beta", "gamma"])
    second = Embedder.from_settings(backend="hash", use_cache=False).embed_documents(["alpha beta", "gamma"])
    assert np.array_equal(first, second)
    query = Embedder.from_settings(backend="hash").embed_query("beta")
    assert first[0] @ query > 0.5 and abs(first[1] @ query) < 1e-6


# --- `auto` keeps to the model that the index records ---------------------------


def passage(tweet_id: str, text: str) -> dict:
    from datetime import datetime, timezone

    url = f"https://x.com/alice/status/{tweet_id}"
    return {"chunk_id": f"{tweet_id}-post-0", "tweet_id": tweet_id, "url": url, "author": "alice",
            "created_at": datetime(2024, 3, 1, tzinfo=timezone.utc), "source": "post", "ref": url,
            "position": 0, "text": text}


def test_auto_keeps_to_the_recorded_backend_when_ollama_starts(ollama):
    from kb.index.client import ChunkIndex

    index = ChunkIndex.from_settings()
    index.replace_chunks(["1"], [passage("1", "written with the hash embedder")],
                         Embedder.from_settings(backend="hash"))
    # Ollama answers and has the model, but the index holds hash vectors.
    auto = Embedder.from_settings()
    assert auto.resolved_backend() == "ollama"
    index.replace_chunks(["2"], [passage("2", "a second passage")], auto)
    assert index.model_info() == ("hash:bow-256", 256)
    assert index.counts()["chunks"] == 2
    assert not ollama.embed_inputs()  # nothing went to Ollama


def test_auto_does_not_fall_back_to_local_for_an_ollama_index(monkeypatch):
    from kb.index.client import ChunkIndex

    index = ChunkIndex.from_settings()
    with FakeOllama() as fake:
        monkeypatch.setenv("OLLAMA_URL", fake.url)
        index.replace_chunks(["1"], [passage("1", "written through Ollama")], Embedder.from_settings())
    assert index.model_info() == ("ollama:embeddinggemma", DIM)
    # Ollama is gone. `auto` would take the local model: the index keeps to Ollama.
    forget_backend_choice()
    with pytest.raises(EmbedderError) as caught:
        index.replace_chunks(["2"], [passage("2", "a second passage")], Embedder.from_settings())
    message = str(caught.value)
    assert "\n" not in message
    assert "does not answer" in message and "holds vectors of ollama:embeddinggemma" in message
    assert "kb index --rebuild" in message
    assert index.counts()["chunks"] == 1 and index.model_info() == ("ollama:embeddinggemma", DIM)


@pytest.mark.slow
def test_onnx_runtime_gives_the_vectors_of_sentence_transformers(pytorch_checks):
    # Two texts, the second past the 256-token limit: see PYTORCH_CHECKS.
    result = pytorch_checks["onnx_against_torch"]
    assert result["onnx_shape"] == result["torch_shape"] == [2, 384]
    assert result["min_cosine"] > 0.9999


def test_queries_use_int8_weights_and_passages_the_full_ones():
    """KB_QUERY_INT8 (default on): a query on ONNX Runtime runs on the int8
    file, so its vector is near the full one but not equal; a few passages
    keep the full weights (the test above checks them against PyTorch)."""
    from kb.index.embed_local import local_model_path
    from kb.index.embed_onnx import load_onnx_model, onnx_int8_file, onnx_model_file

    text = "how does the borrow checker decide how long a reference lives"
    full = load_onnx_model("all-MiniLM-L6-v2").encode([text])[0]
    int8 = Embedder.from_settings(backend="local", local_model=MINILM, use_cache=False).embed_query(text)
    assert 0.98 < float(full @ int8) < 0.99999
    # The same text without int8 weights: the full vector, not the int8 one
    # from the process-wide query cache.
    plain = Embedder.from_settings(backend="local", local_model=MINILM, use_cache=False,
                                   query_int8=False).embed_query(text)
    assert float(full @ plain) > 0.99999
    few = Embedder.from_settings(backend="local", local_model=MINILM, use_cache=False).embed_documents([text])[0]
    assert float(full @ few) > 0.99999
    path = local_model_path("all-MiniLM-L6-v2")
    assert onnx_int8_file(path).stat().st_size < onnx_model_file(path).stat().st_size / 3

def test_passages_load_no_query_model_and_cached_passages_load_no_model(tmp_path, monkeypatch):
    """`kb wiki check` embeds passages only. It must not load the int8 query
    model, and when the cache holds every vector it must load no model
    (benchmarks/wiki_check.md: 0.15 s and 0.3 s of CPU for nothing)."""
    import kb.index.embed_onnx as onnx_module

    texts = ["The harbour guild kept records of cargo in 1820.", "A kiln fires the glaze of a pot at night."]
    loaded: list[dict] = []

    def check_run() -> np.ndarray:
        models: dict = {}
        monkeypatch.setattr(onnx_module, "_ONNX_MODELS", models)  # as in a new process
        vectors = Embedder.from_settings(backend="local", local_model=MINILM, onnx_documents=True,
                                         cache_dir=str(tmp_path / "vectors")).embed_documents(texts)
        loaded.append(models)
        return vectors

    cold, warm = check_run(), check_run()
    assert [int8 for _, _, int8 in loaded[0]] == [False]  # the full weights only
    assert loaded[1] == {}
    assert float((cold * warm).sum(axis=1).min()) > 0.99999


def test_int8_passages_have_their_own_name_in_the_vector_cache(tmp_path):
    """`kb wiki check` embeds passages with the int8 weights. The index
    shares the vector cache and needs the full vectors: the int8 ones go
    under another model name, and the full ones stay as they were."""
    text = "The harbour guild kept records of cargo in 1820."
    folder = str(tmp_path / "vectors")
    full = Embedder.from_settings(backend="local", local_model=MINILM, onnx_documents=True, cache_dir=folder)
    int8 = Embedder.from_settings(backend="local", local_model=MINILM, onnx_documents=True, int8_documents=True,
                                  cache_dir=folder)
    assert int8.model_name == full.model_name + "+int8"
    first = full.embed_documents([text])[0]
    small = int8.embed_documents([text])[0]
    assert 0.98 < float(first @ small) < 0.99999
    assert int8.stats == {"embedded": 1, "cached": 0}  # not the full vector from the cache
    again = Embedder.from_settings(backend="local", local_model=MINILM, onnx_documents=True, cache_dir=folder)
    assert float(again.embed_documents([text])[0] @ first) > 0.99999 and again.stats["cached"] == 1


def test_local_runtimes(monkeypatch):
    from kb.index.embed_local import local_runtimes

    monkeypatch.delenv("KB_LOCAL_RUNTIME", raising=False)
    assert local_runtimes() == ("onnx", "torch")
    monkeypatch.setenv("KB_LOCAL_RUNTIME", "torch")
    assert local_runtimes() == ("torch", "torch")
    monkeypatch.setenv("KB_LOCAL_RUNTIME", "gpu")
    with pytest.raises(EmbedderError, match="KB_LOCAL_RUNTIME"):
        local_runtimes()


# --- the checks that need PyTorch: one fresh interpreter ------------------------
# Importing PyTorch and sentence-transformers costs about 10 s of CPU in each
# process. The check of a few texts needs a fresh interpreter (it must see
# that a few texts import no PyTorch), so the other PyTorch checks run in that
# interpreter after it, and the test process imports no PyTorch. Each check
# below starts from the state that its test had in this process before.
PYTORCH_CHECKS = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import kb.index.embed_onnx as onnx_module
    from kb.index.embed_local import load_local_model
    from kb.index.embed_onnx import load_onnx_model
    from kb.index.embedder import FEW_TEXTS, Embedder
    results = {}

    # A sync with a few new bookmarks, then a large batch.
    texts = [f"Note {i}: the query planner skips cold partitions of table {i}." for i in range(FEW_TEXTS + 8)]
    embedder = Embedder.from_settings(backend="local", local_model="all-MiniLM-L6-v2", use_cache=False)
    few = embedder.embed_documents(texts[:5])
    torch_after_few = "torch" in sys.modules
    many = embedder.embed_documents(texts)
    results["few_and_many"] = {"torch_after_few": torch_after_few, "torch_after_many": "torch" in sys.modules,
                               "cosine": float((few * many[:5]).sum(axis=1).min())}

    # ONNX Runtime against sentence-transformers.
    texts = ["Homelab log: patched CVE-2024-3094 on all my Debian boxes today.",
             "Sourdough bread: feeding the starter and shaping the loaf " * 40]  # past the 256-token limit
    onnx = load_onnx_model("all-MiniLM-L6-v2").encode(texts)
    torch = load_local_model("all-MiniLM-L6-v2").encode(texts, normalize_embeddings=True)
    results["onnx_against_torch"] = {"onnx_shape": list(onnx.shape), "torch_shape": list(torch.shape),
                                     "min_cosine": float((onnx * torch).sum(axis=1).min())}

    # The cache folder cannot be made: XDG_CACHE_HOME is a file.
    blocker, cache_dir = sys.argv[1], sys.argv[2]
    open(blocker, "w").close()
    os.environ["XDG_CACHE_HOME"] = blocker
    os.environ["KB_ONNX_SHARED_DIR"] = blocker  # and the install's folder: no ONNX file anywhere
    onnx_module._ONNX_MODELS.clear()  # no model from the checks above
    onnx_module._ONNX_FAILED.clear()
    vector = Embedder.from_settings(backend="local", local_model="all-MiniLM-L6-v2", cache_dir=cache_dir).embed_query(
        "sourdough starter, embedded on PyTorch")
    results["without_onnx"] = {"shape": list(vector.shape), "norm": float(np.linalg.norm(vector)),
                               "blocker": blocker, "failure": onnx_module._ONNX_FAILED.get("all-MiniLM-L6-v2")}
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def pytorch_results() -> dict:
    return {}


@pytest.fixture
def pytorch_checks(pytorch_results, kb_home, tmp_path) -> dict:
    """The results of PYTORCH_CHECKS, run once for this file. The first test
    that asks runs it, with the clean environment of conftest.kb_home."""
    if not pytorch_results:
        env = {**os.environ, "KB_HOME": str(tmp_path / "home"), "HF_HUB_OFFLINE": "1"}
        env.pop("KB_LOCAL_RUNTIME", None)
        done = subprocess.run([sys.executable, "-c", PYTORCH_CHECKS, str(tmp_path / "not-a-folder"),
                               str(tmp_path / "vectors")], capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        pytorch_results.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return pytorch_results


@pytest.mark.slow
def test_without_a_usable_onnx_file_the_model_runs_on_pytorch(pytorch_checks):
    result = pytorch_checks["without_onnx"]
    assert result["shape"] == [384] and abs(result["norm"] - 1.0) < 1e-4
    assert result["blocker"] in result["failure"]


@pytest.mark.slow  # PyTorch loads for its fixture
def test_a_few_texts_are_embedded_without_pytorch_and_match_a_large_batch(pytorch_checks):
    """A sync with a few new bookmarks embeds them on ONNX Runtime and never
    imports PyTorch; a large batch runs on PyTorch. Same vectors."""
    assert pytorch_checks["few_and_many"] == {"torch_after_few": False, "torch_after_many": True,
                                              "cosine": pytest.approx(1.0, abs=1e-4)}

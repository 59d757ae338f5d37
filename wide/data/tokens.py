"""Tokenizer loading and a content-addressed cache of tokenized documents.

Documents are tokenized once, without special tokens, and stored under
``<cache>/tokens/<key>/`` as ``ids.npy`` (all token ids, concatenated, ``uint32``) and
``offsets.npy`` (``int64``, ``n_docs + 1`` document boundaries) plus ``meta.json``. ``key`` is the
sha256 of the tokenizer's full serialized definition and of the documents' text, so any change to
either gives a new entry, and packing, splitting, ``seq_len`` or token budgets reuse the same one.
Arrays are read back memory-mapped with ``allow_pickle=False``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

__all__ = [
    "TokenizedDocs",
    "load_tokenizer",
    "model_max_length",
    "tokenize_documents",
    "tokenizer_fingerprint",
]

_FORMAT = 1
_UNBOUNDED = 10**8  # transformers' "no limit" model_max_length is ~1e30


def load_tokenizer(name_or_path: str):
    """``AutoTokenizer`` for an asset name (fetched if needed), a local folder or a hub name."""
    from transformers import AutoTokenizer

    from wide.assets import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model(name_or_path))


def model_max_length(tokenizer, resolved: str | None = None) -> int | None:
    """The longest sequence the tokenizer or the model's local ``config.json`` admits, if stated."""
    limits = []
    if 0 < int(getattr(tokenizer, "model_max_length", 0) or 0) < _UNBOUNDED:
        limits.append(int(tokenizer.model_max_length))
    config = Path(resolved) / "config.json" if resolved else None
    if config is not None and config.is_file():
        cfg = json.loads(config.read_text())
        cfg = cfg.get("text_config", cfg)
        if isinstance(cfg.get("max_position_embeddings"), int):
            limits.append(cfg["max_position_embeddings"])
    return min(limits) if limits else None


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of everything that decides how the tokenizer maps text to ids."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        body = backend.to_str()
    else:  # slow tokenizer: its vocabulary and class stand in for the definition
        body = json.dumps(sorted(tokenizer.get_vocab().items()))
    extra = json.dumps([type(tokenizer).__name__, tokenizer.all_special_tokens], sort_keys=True)
    return hashlib.sha256((body + extra).encode("utf-8")).hexdigest()


def _docs_digest(docs: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for doc in docs:
        digest.update(doc.encode("utf-8"))
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True)
class TokenizedDocs:
    """Token ids of ``n_docs`` documents, concatenated, with their boundaries."""

    ids: np.ndarray
    """``[n_tokens]`` uint32."""
    offsets: np.ndarray
    """``[n_docs + 1]`` int64; document ``i`` is ``ids[offsets[i]:offsets[i + 1]]``."""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def doc(self, i: int) -> np.ndarray:
        return self.ids[self.offsets[i] : self.offsets[i + 1]]

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


def _tokenize(tokenizer, docs: Sequence[str], batch: int = 512) -> TokenizedDocs:
    chunks, lengths = [], []
    for start in range(0, len(docs), batch):
        encoded = tokenizer(list(docs[start : start + batch]), add_special_tokens=False, verbose=False)
        for ids in encoded["input_ids"]:
            chunks.append(np.asarray(ids, dtype=np.uint32))
            lengths.append(len(ids))
    ids = np.concatenate(chunks) if chunks else np.zeros(0, dtype=np.uint32)
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return TokenizedDocs(ids, offsets)


def tokenize_documents(
    tokenizer, docs: Sequence[str], *, cache_root: Path | None = None, use_cache: bool = True
) -> TokenizedDocs:
    """Tokenize ``docs`` without special tokens, through the on-disk cache.

    Args:
        tokenizer: a Hugging Face tokenizer.
        docs: the documents.
        cache_root: folder holding cache entries; default ``<WIDE_CACHE>/tokens``.
        use_cache: read and write the cache; ``False`` always tokenizes and writes nothing.
    """
    if not use_cache:
        return _tokenize(tokenizer, docs)
    if cache_root is None:
        from wide.assets import cache_dir

        cache_root = cache_dir() / "tokens"
    key = hashlib.sha256(
        f"{_FORMAT}:{tokenizer_fingerprint(tokenizer)}:{_docs_digest(docs)}".encode()
    ).hexdigest()[:32]
    entry = cache_root / key
    if (entry / "meta.json").is_file():
        ids = np.load(entry / "ids.npy", mmap_mode="r", allow_pickle=False)
        offsets = np.load(entry / "offsets.npy", allow_pickle=False)
        if len(offsets) == len(docs) + 1 and offsets[-1] == len(ids):
            return TokenizedDocs(ids, offsets)
    tokens = _tokenize(tokenizer, docs)
    cache_root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=cache_root))
    try:
        np.save(tmp / "ids.npy", tokens.ids, allow_pickle=False)
        np.save(tmp / "offsets.npy", tokens.offsets, allow_pickle=False)
        meta = {
            "format": _FORMAT,
            "tokenizer": getattr(tokenizer, "name_or_path", ""),
            "n_docs": len(tokens),
            "n_tokens": int(tokens.offsets[-1]),
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        if entry.exists() and not (entry / "meta.json").is_file():
            shutil.rmtree(entry, ignore_errors=True)  # a broken entry; replace it
        try:
            os.replace(tmp, entry)
        except OSError:  # another process wrote the same entry first; both are identical
            pass
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokens

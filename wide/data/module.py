"""``TextDataModule``: causal-LM batches from any text source, packed or one document per row.

Pipeline (all deterministic): ``load_documents(source)`` → held-out split by document
(:func:`wide.data.corpus.split_indices`) → tokenization through the on-disk cache
(:mod:`wide.data.tokens`) → ``pack`` or ``sample`` rows → ``DataLoader`` of dicts
``input_ids [B, T]``, ``attention_mask [B, T]``, ``labels [B, T]`` (``T = seq_len``, int64).

``pack``: every document becomes ``[bos] + ids + [eos]`` (``bos`` only where the tokenizer adds one
by default, e.g. Gemma), the split's documents are concatenated in order, cut to the token budget and
chunked into ``seq_len`` rows; the tail shorter than ``seq_len`` is dropped. ``labels == input_ids``
and the mask is all ones (the model shifts labels itself).

``sample``: one document per row, truncated to ``seq_len``, right-padded with ``pad_token_id`` (or
``eos``), ``attention_mask = 0`` and ``labels = -100`` on padding; documents of fewer than 2 tokens
are skipped and rows are taken in order until the token budget is spent.

Training rows are shuffled by a generator seeded with ``seed`` and the epoch, through a resumable
loader (:mod:`wide.data.resumable`); validation rows are not.
"""

from __future__ import annotations

from typing import Literal

import lightning as L
from lightning.pytorch.utilities import rank_zero_info
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from wide.data.corpus import DEFAULT_VAL_FRACTION, split_indices
from wide.data.resumable import ResumableLoader
from wide.data.sources import check_source, load_documents
from wide.data.tokens import TokenizedDocs, load_tokenizer, model_max_length, tokenize_documents

__all__ = ["TextDataModule", "pack_rows", "sample_rows"]

IGNORE_INDEX = -100


class _RowDataset(Dataset):
    """Rows of equal-length int64 arrays, served as dicts of tensors."""

    def __init__(self, arrays: dict[str, np.ndarray]):
        self.arrays = arrays

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: torch.from_numpy(np.ascontiguousarray(v[i])) for k, v in self.arrays.items()}


def _with_specials(ids: np.ndarray, bos: int | None, eos: int | None) -> np.ndarray:
    head = [bos] if bos is not None else []
    tail = [eos] if eos is not None else []
    return np.concatenate([np.asarray(head, np.int64), ids.astype(np.int64), np.asarray(tail, np.int64)])


def pack_rows(
    tokens: TokenizedDocs,
    indices: list[int],
    seq_len: int,
    *,
    bos: int | None,
    eos: int | None,
    max_tokens: int | None = None,
) -> dict[str, np.ndarray]:
    """Concatenate documents ``indices`` (with specials) and chunk into ``[N, seq_len]`` rows."""
    pieces = [_with_specials(tokens.doc(i), bos, eos) for i in indices]
    stream = np.concatenate(pieces) if pieces else np.zeros(0, np.int64)
    if max_tokens is not None:
        stream = stream[:max_tokens]
    n = len(stream) // seq_len
    input_ids = stream[: n * seq_len].reshape(n, seq_len)
    return {"input_ids": input_ids, "attention_mask": np.ones_like(input_ids), "labels": input_ids.copy()}


def sample_rows(
    tokens: TokenizedDocs,
    indices: list[int],
    seq_len: int,
    *,
    bos: int | None,
    eos: int | None,
    pad: int,
    max_tokens: int | None = None,
) -> dict[str, np.ndarray]:
    """One document per ``[seq_len]`` row, truncated and right-padded; ``labels = -100`` on padding."""
    rows, total = [], 0
    for i in indices:
        ids = _with_specials(tokens.doc(i), bos, eos)[:seq_len]
        if len(ids) < 2:
            continue
        if max_tokens is not None and total + len(ids) > max_tokens:
            break
        rows.append(ids)
        total += len(ids)
    input_ids = np.full((len(rows), seq_len), pad, dtype=np.int64)
    attention_mask = np.zeros((len(rows), seq_len), dtype=np.int64)
    for r, ids in enumerate(rows):
        input_ids[r, : len(ids)] = ids
        attention_mask[r, : len(ids)] = 1
    labels = np.where(attention_mask == 1, input_ids, IGNORE_INDEX)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def _adds_bos(tokenizer) -> bool:
    bos = tokenizer.bos_token_id
    return bos is not None and tokenizer("a", add_special_tokens=True)["input_ids"][:1] == [bos]


class TextDataModule(L.LightningDataModule):
    """Causal-LM text batches with a fixed held-out split.

    Args:
        tokenizer: asset name (e.g. ``smollm2-135m``), local tokenizer/model folder, or hub name.
        source: ``default`` (BoolQ Wikipedia passages), a prose corpus name (``lambada``, ``coqa``,
            ``squad``, ``drop``, ``boolq``), ``mixture`` (all five interleaved, `wide.data.mixture`; or
            ``mixture:lambada=2,coqa=1``, which may also name local files or folders), a
            ``.txt``/``.jsonl``/``.parquet`` file or folder (e.g. the shards of ``wide data generate``), a
            ``save_to_disk`` folder, or a hub dataset name (needs ``datasets``).
        seq_len: tokens per row ``T``.
        batch_size: rows per batch ``B``.
        mode: ``pack`` (concatenate and chunk) or ``sample`` (one padded document per row).
        val_fraction: fraction of documents held out for validation, in ``[0, 1)``; 0 disables it.
        val_docs: exact number of held-out documents; overrides ``val_fraction``.
        max_train_tokens: cap on training tokens (before chunking or padding); ``None`` = all.
        max_val_tokens: cap on validation tokens; ``None`` = all.
        num_workers: ``DataLoader`` worker processes.
        seed: seed of the training shuffle (the split does not depend on it).
        text_field: column or JSON key holding the text, for row-based sources.
        split: split of a saved ``DatasetDict`` or hub dataset (hub default ``train``).
        cache_tokens: keep tokenized documents under ``<WIDE_CACHE>/tokens``.
    """

    def __init__(
        self,
        tokenizer: str = "smollm2-135m",
        source: str = "default",
        seq_len: int = 256,
        batch_size: int = 4,
        mode: Literal["pack", "sample"] = "pack",
        val_fraction: float = DEFAULT_VAL_FRACTION,
        val_docs: int | None = None,
        max_train_tokens: int | None = None,
        max_val_tokens: int | None = None,
        num_workers: int = 0,
        seed: int = 17,
        text_field: str = "text",
        split: str | None = None,
        cache_tokens: bool = True,
    ):
        super().__init__()
        if not isinstance(tokenizer, str) or not tokenizer:
            raise ValueError(f"tokenizer={tokenizer!r} must be an asset name, a local path or a hub name")
        if mode not in ("pack", "sample"):
            raise ValueError(f"mode={mode!r} must be 'pack' or 'sample'")
        if not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"seq_len={seq_len!r} must be an int >= 2")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size={batch_size!r} must be an int >= 1")
        for name, value in (("max_train_tokens", max_train_tokens), ("max_val_tokens", max_val_tokens)):
            if value is not None and (value < 1 or (mode == "pack" and value < seq_len)):
                raise ValueError(f"{name}={value} leaves no room for one {mode} row of seq_len={seq_len}")
        if val_docs is None and not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be in [0, 1)")
        if val_docs is not None and val_docs < 0:
            raise ValueError(f"val_docs={val_docs} must be >= 0")
        if num_workers < 0:
            raise ValueError(f"num_workers={num_workers} must be >= 0")
        check_source(source, split)
        self.save_hyperparameters()
        self.tokenizer = None
        self.train_data: dict[str, np.ndarray] | None = None
        self.val_data: dict[str, np.ndarray] | None = None
        self.stats: dict[str, int] = {}

    def _load_tokenizer(self):
        if self.tokenizer is None:
            from wide.assets import resolve_model

            resolved = resolve_model(self.hparams.tokenizer)
            tokenizer = load_tokenizer(resolved)
            limit = model_max_length(tokenizer, resolved)
            if limit is not None and self.hparams.seq_len > limit:
                raise ValueError(
                    f"seq_len={self.hparams.seq_len} exceeds the maximum sequence length {limit} of "
                    f"tokenizer/model {self.hparams.tokenizer!r}"
                )
            if self.hparams.mode == "pack" and tokenizer.eos_token_id is None:
                raise ValueError(
                    f"tokenizer={self.hparams.tokenizer!r} has no eos_token; mode='pack' needs one "
                    "to separate documents"
                )
            self.tokenizer = tokenizer
        return self.tokenizer

    def _tokenized(self) -> tuple[TokenizedDocs, list[int], list[int]]:
        hp = self.hparams
        tokenizer = self._load_tokenizer()
        docs = load_documents(hp.source, text_field=hp.text_field, split=hp.split)
        train_idx, val_idx = split_indices(docs, val_fraction=hp.val_fraction, val_docs=hp.val_docs)
        tokens = tokenize_documents(tokenizer, docs, use_cache=hp.cache_tokens)
        return tokens, train_idx, val_idx

    def prepare_data(self) -> None:
        """Fetch assets and fill the token cache (runs once per node)."""
        self._tokenized()

    def setup(self, stage: str | None = None) -> None:
        """Build training and validation rows; raises ``ValueError`` if a split cannot fill one row."""
        if self.train_data is not None:
            return
        hp = self.hparams
        tokens, train_idx, val_idx = self._tokenized()
        tok = self.tokenizer
        bos = tok.bos_token_id if _adds_bos(tok) else None
        eos = tok.eos_token_id
        pad = tok.pad_token_id if tok.pad_token_id is not None else (eos if eos is not None else 0)

        def rows(indices: list[int], max_tokens: int | None) -> dict[str, np.ndarray]:
            if hp.mode == "pack":
                return pack_rows(tokens, indices, hp.seq_len, bos=bos, eos=eos, max_tokens=max_tokens)
            return sample_rows(tokens, indices, hp.seq_len, bos=bos, eos=eos, pad=pad, max_tokens=max_tokens)

        train = rows(train_idx, hp.max_train_tokens)
        val = rows(val_idx, hp.max_val_tokens) if val_idx else None
        for name, data, idx in (("training", train, train_idx), ("validation", val, val_idx)):
            if data is not None and len(data["input_ids"]) == 0:
                n_tok = int(sum(tokens.lengths()[idx]))
                raise ValueError(
                    f"seq_len={hp.seq_len}: the {name} split of source {hp.source!r} ({len(idx)} "
                    f"documents, {n_tok} tokens) is too short for one {hp.mode} row"
                )
        self.train_data, self.val_data = train, val
        self.stats = {
            "train_docs": len(train_idx),
            "val_docs": len(val_idx),
            "train_rows": len(train["input_ids"]),
            "val_rows": 0 if val is None else len(val["input_ids"]),
            "train_tokens": int(train["attention_mask"].sum()),
            "val_tokens": 0 if val is None else int(val["attention_mask"].sum()),
        }
        rank_zero_info(self.describe(int(tokens.lengths().sum())))

    def describe(self, total_tokens: int) -> str:
        """One line on what was loaded: documents and tokens of the source, of training and of the held-out split."""
        s, hp = self.stats, self.hparams
        held_out = (f"held-out {s['val_docs']:,} documents -> {s['val_tokens']:,} tokens in {s['val_rows']:,} rows"
                    if s["val_docs"] else "no held-out split (val_fraction=0)")
        return (f"wide data: {hp.source!r}: {s['train_docs'] + s['val_docs']:,} documents, {total_tokens:,} tokens; "
                f"training {s['train_docs']:,} documents -> {s['train_tokens']:,} tokens in {s['train_rows']:,} rows "
                f"of {hp.seq_len} ({hp.mode}); {held_out}")

    def _loader(self, data: dict[str, np.ndarray], shuffle: bool) -> DataLoader:
        workers = {"num_workers": self.hparams.num_workers, "persistent_workers": self.hparams.num_workers > 0}
        if shuffle:  # resumable order, sharded over data-parallel ranks (see wide.data.resumable)
            strategy = getattr(self.trainer, "strategy", None) if self.trainer is not None else None
            ranks = getattr(strategy, "distributed_sampler_kwargs", None) or {}
            return ResumableLoader(_RowDataset(data), batch_size=self.hparams.batch_size, seed=self.hparams.seed,
                                   num_replicas=ranks.get("num_replicas", 1), rank=ranks.get("rank", 0), **workers)
        return DataLoader(_RowDataset(data), batch_size=self.hparams.batch_size, shuffle=False, **workers)

    def train_dataloader(self) -> DataLoader:
        if self.train_data is None:
            self.setup("fit")
        return self._loader(self.train_data, shuffle=True)

    def val_dataloader(self) -> DataLoader | list:
        if self.train_data is None:
            self.setup("validate")
        return [] if self.val_data is None else self._loader(self.val_data, shuffle=False)

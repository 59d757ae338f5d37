"""Causal-LM text data: the default corpus, local files, saved HF datasets; packed or per document.

``TextDataModule`` is imported lazily so that the readers and the split (no Lightning needed) stay
cheap to import.
"""

from wide.data.corpus import (
    DEFAULT_CORPUS,
    DEFAULT_VAL_FRACTION,
    default_corpus_documents,
    default_corpus_split,
    split_documents,
    split_indices,
)
from wide.data.olmo import PROSE_CORPORA, TASKS, prose_corpus, task_data_dir
from wide.data.saved import read_saved_dataset, read_saved_table
from wide.data.sources import load_documents

__all__ = [
    "DEFAULT_CORPUS",
    "DEFAULT_VAL_FRACTION",
    "PROSE_CORPORA",
    "TASKS",
    "TextDataModule",
    "default_corpus_documents",
    "default_corpus_split",
    "load_documents",
    "prose_corpus",
    "read_saved_dataset",
    "read_saved_table",
    "split_documents",
    "split_indices",
    "task_data_dir",
]


def __getattr__(name: str):
    if name == "TextDataModule":
        from wide.data.module import TextDataModule

        return TextDataModule
    raise AttributeError(f"module 'wide.data' has no attribute {name!r}")

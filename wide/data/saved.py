"""Read Hugging Face ``datasets.save_to_disk`` folders with pyarrow alone.

A saved ``Dataset`` folder holds ``state.json`` (naming its Arrow files under ``_data_files``),
``dataset_info.json`` and one or more ``data-0000i-of-0000n.arrow`` files written as Arrow IPC
*streams*. A saved ``DatasetDict`` folder holds ``dataset_dict.json`` (``{"splits": [...]}``) and one
such folder per split. Reading them needs no ``datasets`` install.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

__all__ = [
    "is_saved_dataset",
    "is_saved_dataset_dict",
    "read_saved_dataset",
    "read_saved_table",
    "saved_dataset_splits",
]


def is_saved_dataset(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by ``Dataset.save_to_disk``."""
    path = Path(path)
    return (path / "state.json").is_file() and any(path.glob("*.arrow"))


def is_saved_dataset_dict(path: str | Path) -> bool:
    """Whether ``path`` is a folder written by ``DatasetDict.save_to_disk``."""
    return (Path(path) / "dataset_dict.json").is_file()


def saved_dataset_splits(path: str | Path) -> list[str]:
    """Split names of a saved ``DatasetDict`` folder, in the order the file lists them."""
    info = json.loads((Path(path) / "dataset_dict.json").read_text())
    return list(info["splits"])


def _read_arrow(file: Path) -> pa.Table:
    with pa.memory_map(str(file), "r") as source:
        try:
            return ipc.open_stream(source).read_all()
        except pa.ArrowInvalid:
            # Files written by other tools may use the random-access format instead of a stream.
            source.seek(0)
            return ipc.open_file(source).read_all()


def read_saved_table(path: str | Path, split: str | None = None) -> pa.Table:
    """Read a ``save_to_disk`` folder into one pyarrow Table.

    Args:
        path: a saved ``Dataset`` folder, or a saved ``DatasetDict`` folder together with ``split``.
        split: which split of a ``DatasetDict`` to read; ignored for a plain ``Dataset`` folder.

    Returns:
        The rows of every Arrow shard, concatenated in shard order.

    Raises:
        ValueError: if ``path`` is not a saved dataset, or ``split`` is missing or unknown.
    """
    path = Path(path)
    if is_saved_dataset_dict(path):
        splits = saved_dataset_splits(path)
        if split is None or split not in splits:
            raise ValueError(
                f"split={split!r}: {path} is a saved DatasetDict; pick one of its splits {splits}"
            )
        path = path / split
    if not is_saved_dataset(path):
        raise ValueError(
            f"path={str(path)!r} is not a datasets.save_to_disk folder "
            "(expected state.json and data-*.arrow files)"
        )
    state = json.loads((path / "state.json").read_text())
    names = [entry["filename"] for entry in state.get("_data_files", [])]
    files = [path / name for name in names] if names else sorted(path.glob("data-*.arrow"))
    tables = [_read_arrow(file) for file in files]
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="default")


def read_saved_dataset(path: str | Path, split: str | None = None) -> list[dict]:
    """Read a ``save_to_disk`` folder into a list of row dicts (see :func:`read_saved_table`)."""
    return read_saved_table(path, split).to_pylist()

import json

import pytest

from wide.data.saved import read_saved_dataset, read_saved_table

from .conftest import write_saved_dataset


def test_reads_sharded_dataset_in_order(tmp_path):
    rows = [{"text": f"doc {i}", "label": i, "choices": {"text": ["a", "b"]}} for i in range(7)]
    write_saved_dataset(tmp_path / "ds", rows, shards=3)
    assert read_saved_dataset(tmp_path / "ds") == rows
    assert read_saved_table(tmp_path / "ds").num_rows == 7


def test_dataset_dict_needs_a_known_split(tmp_path):
    write_saved_dataset(tmp_path / "dd" / "train", [{"text": "t"}])
    write_saved_dataset(tmp_path / "dd" / "validation", [{"text": "v"}])
    (tmp_path / "dd" / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "validation"]}))
    assert read_saved_dataset(tmp_path / "dd", split="validation") == [{"text": "v"}]
    with pytest.raises(ValueError, match="split=None.*'train', 'validation'"):
        read_saved_dataset(tmp_path / "dd")


def test_rejects_other_folders(tmp_path):
    with pytest.raises(ValueError, match="not a datasets.save_to_disk folder"):
        read_saved_table(tmp_path)

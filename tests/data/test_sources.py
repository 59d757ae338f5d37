import gzip
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from wide.data.sources import load_documents, source_kind

from .conftest import write_saved_dataset


def test_every_local_format_gives_the_same_documents(tmp_path, docs, txt_file):
    rows = [{"text": d, "id": i} for i, d in enumerate(docs)]
    (tmp_path / "c.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(tmp_path / "c.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    write_saved_dataset(tmp_path / "saved", rows, shards=2)
    (tmp_path / "txts").mkdir()
    for i, d in enumerate(docs):
        (tmp_path / "txts" / f"{i:03d}.txt").write_text(d + "\n")
    (tmp_path / "shards").mkdir()
    pq.write_table(pa.Table.from_pylist(rows[:10]), tmp_path / "shards" / "a.parquet")
    pq.write_table(pa.Table.from_pylist(rows[10:]), tmp_path / "shards" / "b.parquet")
    for source in (txt_file, "c.jsonl", "c.jsonl.gz", "c.parquet", "saved", "txts", "shards"):
        path = source if source == txt_file else tmp_path / source
        assert load_documents(str(path)) == docs, source


def test_txt_paragraphs_stripped_and_deduplicated(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("first line\nsame paragraph\n\n\n  second  \n\nfirst line\nsame paragraph\n\n   \n")
    assert load_documents(str(path)) == ["first line\nsame paragraph", "second"]


def test_text_field(tmp_path):
    (tmp_path / "c.jsonl").write_text(json.dumps({"body": "hello"}) + "\n")
    assert load_documents(str(tmp_path / "c.jsonl"), text_field="body") == ["hello"]
    with pytest.raises(ValueError, match="text_field='text'.*line 1"):
        load_documents(str(tmp_path / "c.jsonl"))
    write_saved_dataset(tmp_path / "saved", [{"body": "x"}])
    with pytest.raises(ValueError, match=r"text_field='text' is not a column.*\['body'\]"):
        load_documents(str(tmp_path / "saved"))


@pytest.mark.parametrize(
    "source, message",
    [
        pytest.param("", "source=''", id="empty-name"),
        pytest.param("./missing.txt", "does not exist", id="missing-file"),
        pytest.param("org/some-dataset", "needs the `datasets` package", id="hub-without-datasets"),
    ],
)
def test_unknown_sources(monkeypatch, source, message):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    with pytest.raises(ValueError, match=message):
        source_kind(source)


def test_bad_files(tmp_path):
    (tmp_path / "c.csv").write_text("text\nx\n")
    with pytest.raises(ValueError, match="unsupported file type '.csv'"):
        source_kind(str(tmp_path / "c.csv"))
    (tmp_path / "empty.txt").write_text("\n \n\n")
    with pytest.raises(ValueError, match="no non-empty documents"):
        load_documents(str(tmp_path / "empty.txt"))
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match="no .txt, .jsonl, .parquet"):
        source_kind(str(tmp_path / "folder"))


def test_named_sources_are_known_without_fetching():
    assert source_kind("default") == "default"
    assert source_kind("lambada") == "prose"

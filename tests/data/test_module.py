import json

import numpy as np
import pytest
import torch

import wide.data.tokens as tokens_mod
from wide.data import TextDataModule

from .conftest import save_tokenizer


def _dm(tokenizer_dir, source, **kw):
    kw = {"seq_len": 16, "batch_size": 3, **kw}
    dm = TextDataModule(tokenizer=tokenizer_dir, source=str(source), **kw)
    dm.setup("fit")
    return dm


def _val_docs(docs, **split):
    from wide.data.corpus import split_documents

    return split_documents(docs, **split)[1]


def test_pack_rows_are_the_concatenated_documents(tokenizer_dir, txt_file, docs):
    dm = _dm(tokenizer_dir, txt_file)
    batch = next(iter(dm.val_dataloader()))
    assert set(batch) == {"input_ids", "attention_mask", "labels"}
    assert all(v.shape == (3, 16) and v.dtype == torch.int64 for v in batch.values())
    assert torch.equal(batch["labels"], batch["input_ids"]) and bool(batch["attention_mask"].all())
    # the rows are doc0 [EOS] doc1 [EOS] ... over the held-out documents in source order, tail dropped
    tok = dm.tokenizer
    held_out = _val_docs(docs, val_fraction=0.1)
    stream = [t for d in held_out for t in [*tok(d, add_special_tokens=False)["input_ids"], tok.eos_token_id]]
    flat = dm.val_data["input_ids"].reshape(-1).tolist()
    assert flat == stream[: len(flat)] and len(stream) - len(flat) < 16
    assert dm.stats["val_docs"] == 4 and dm.stats["train_docs"] == 36


def test_sample_rows_pad_right_with_ignored_labels(tokenizer_dir, txt_file, docs):
    dm = _dm(tokenizer_dir, txt_file, mode="sample", seq_len=24, val_docs=5)
    data = dm.val_data
    assert data["input_ids"].shape == (5, 24)
    tok = dm.tokenizer
    for row, doc in enumerate(_val_docs(docs, val_docs=5)):
        ids = [*tok(doc, add_special_tokens=False)["input_ids"], tok.eos_token_id][:24]
        n = len(ids)
        assert data["input_ids"][row, :n].tolist() == ids
        assert (data["input_ids"][row, n:] == tok.pad_token_id).all()
        assert data["attention_mask"][row].tolist() == [1] * n + [0] * (24 - n)
        assert data["labels"][row, :n].tolist() == ids and (data["labels"][row, n:] == -100).all()
    assert (data["attention_mask"] == 0).any(), "some documents are shorter than seq_len"


def test_bos_is_added_where_the_tokenizer_adds_it(tmp_path, txt_file):
    dm = _dm(save_tokenizer(tmp_path / "bos", add_bos=True), txt_file, mode="sample", seq_len=64)
    bos, eos = dm.tokenizer.bos_token_id, dm.tokenizer.eos_token_id
    assert (dm.train_data["input_ids"][:, 0] == bos).all()
    assert (dm.train_data["input_ids"] == eos).sum() == len(dm.train_data["input_ids"])


def test_token_budgets(tokenizer_dir, txt_file):
    dm = _dm(tokenizer_dir, txt_file, max_train_tokens=50, max_val_tokens=16)
    assert dm.train_data["input_ids"].shape == (3, 16) and dm.val_data["input_ids"].shape == (1, 16)
    dm = _dm(tokenizer_dir, txt_file, mode="sample", seq_len=64, max_train_tokens=60)
    assert 0 < dm.stats["train_tokens"] <= 60


def test_deterministic_and_seeded_shuffle(tokenizer_dir, txt_file):
    first = [next(iter(_dm(tokenizer_dir, txt_file).train_dataloader()))["input_ids"] for _ in range(2)]
    assert torch.equal(*first)
    other = next(iter(_dm(tokenizer_dir, txt_file, seed=18).train_dataloader()))["input_ids"]
    assert not torch.equal(first[0], other)
    val = [next(iter(_dm(tokenizer_dir, txt_file, seed=s).val_dataloader()))["input_ids"] for s in (1, 2)]
    assert torch.equal(*val), "validation rows do not depend on the seed"


def test_token_cache_is_reused(tokenizer_dir, txt_file, tmp_path, monkeypatch):
    dm = _dm(tokenizer_dir, txt_file)
    entries = list((tmp_path / "cache" / "tokens").iterdir())
    assert len(entries) == 1 and {p.name for p in entries[0].iterdir()} == {"ids.npy", "offsets.npy", "meta.json"}
    assert json.loads((entries[0] / "meta.json").read_text())["n_docs"] == 40

    def no_tokenizing(*args, **kwargs):
        raise AssertionError("tokenized again instead of reading the cache")

    monkeypatch.setattr(tokens_mod, "_tokenize", no_tokenizing)
    again = _dm(tokenizer_dir, txt_file, seq_len=8, mode="sample", val_docs=3)  # other settings, same cache
    assert again.stats["val_docs"] == 3
    assert np.array_equal(_dm(tokenizer_dir, txt_file).train_data["input_ids"], dm.train_data["input_ids"])


def test_no_validation_split(tokenizer_dir, txt_file):
    dm = _dm(tokenizer_dir, txt_file, val_fraction=0.0)
    assert dm.val_dataloader() == [] and dm.stats["train_docs"] == 40


@pytest.mark.parametrize(
    "kwargs, field",
    [
        pytest.param({"mode": "stream"}, "mode=", id="mode"),
        pytest.param({"seq_len": 1}, "seq_len=", id="seq-len"),
        pytest.param({"batch_size": 0}, "batch_size=", id="batch-size"),
        pytest.param({"val_fraction": 1.5}, "val_fraction=", id="val-fraction"),
        pytest.param({"max_train_tokens": 8}, "max_train_tokens=", id="budget-below-seq-len"),
        pytest.param({"source": "no/such-thing"}, "source=", id="unknown-source"),
        pytest.param({"source": "missing.jsonl"}, "does not exist", id="missing-file"),
    ],
)
def test_bad_arguments_fail_at_construction(tokenizer_dir, txt_file, kwargs, field, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    kwargs = {"tokenizer": tokenizer_dir, "source": str(txt_file), "seq_len": 16, **kwargs}
    with pytest.raises(ValueError, match=field):
        TextDataModule(**kwargs)


def test_data_errors_fail_at_setup_before_training(tmp_path, tokenizer_dir, txt_file):
    with pytest.raises(ValueError, match="seq_len=128 exceeds the maximum sequence length 64"):
        _dm(save_tokenizer(tmp_path / "short", model_max_length=64), txt_file, seq_len=128)
    (tmp_path / "blank.txt").write_text("\n\n")
    with pytest.raises(ValueError, match="no non-empty documents"):
        _dm(tokenizer_dir, tmp_path / "blank.txt")
    (tmp_path / "tiny.txt").write_text("the cat sat\n\na dog ran\n\nthe sun\n")
    with pytest.raises(ValueError, match="seq_len=64: the training split .* too short"):
        _dm(tokenizer_dir, tmp_path / "tiny.txt", seq_len=64)


def test_fits_with_a_lightning_trainer(tokenizer_dir, txt_file):
    import lightning as L
    from transformers import LlamaConfig, LlamaForCausalLM

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            cfg = LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                              num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
            self.model = LlamaForCausalLM(cfg)

        def training_step(self, batch, _):
            return self.model(**batch).loss

        def validation_step(self, batch, _):
            self.log("val_loss", self.model(**batch).loss)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    dm = TextDataModule(tokenizer=tokenizer_dir, source=str(txt_file), seq_len=16, batch_size=2, mode="sample")
    trainer = L.Trainer(fast_dev_run=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Tiny(), datamodule=dm)
    assert trainer.state.finished

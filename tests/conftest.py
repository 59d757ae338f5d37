import logging
import sys

import pytest
import torch

import wide  # noqa: F401  (registers routers and policies)


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is at the time of writing (the capture of the running test)."""

    def write(self, text):
        return sys.stderr.write(text)

    def flush(self):
        sys.stderr.flush()


@pytest.fixture(autouse=True)
def _lightning_logs_to_the_current_stderr():
    """Lightning's log handler keeps the stderr of the moment Lightning was first imported (a collection-time
    stream, or an earlier test's capture, closed after it: "--- Logging error ---", lines missing from capfd)."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        for handler in logging.getLogger(name).handlers:
            if type(handler) is logging.StreamHandler and not isinstance(handler.stream, _CurrentStderr):
                handler.stream = _CurrentStderr()  # not setStream: it flushes the old, maybe closed, stream


def tiny_config(arch: str = "llama", **overrides):
    """A tiny random config with GQA ratio 4 (8 q heads, 2 kv heads)."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}[arch]
    kw = dict(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=8,
              num_key_value_heads=2, head_dim=16, max_position_embeddings=256, pad_token_id=0, eos_token_id=1,
              bos_token_id=2, tie_word_embeddings=False)
    kw.update(overrides)
    return cls(**kw)


def tiny_model(arch: str = "llama", seed: int = 0, **overrides):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(tiny_config(arch, **overrides)).eval()


@pytest.fixture(params=["llama", "qwen2", "qwen3"])
def arch(request):
    return request.param


TINY_TEXT = (
    "The quick brown fox jumps over the lazy dog. A routed model skips some heads and channels for each token. "
    "Lightning trains the routers while the backbone stays frozen. Perplexity measures how surprised a model is. "
)


def build_tiny_tokenizer(path):
    """A byte-level BPE tokenizer trained offline on a few sentences, saved as an HF folder."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # sorted: the alphabet comes back in a different order in every process, and its first 64 then differ (a
    # different tokenizer, and different fits, per test run)
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())[:64]
    trainer = trainers.BpeTrainer(vocab_size=96, special_tokens=["<pad>", "<eos>", "<bos>"],
                                  initial_alphabet=alphabet, show_progress=False)
    tok.train_from_iterator([TINY_TEXT] * 4, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                   model_max_length=256)
    fast.save_pretrained(path)
    return fast


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A saved tiny random Llama with a matching tokenizer: a stand-in for a real model folder."""
    path = tmp_path_factory.mktemp("tiny-llama")
    tok = build_tiny_tokenizer(path)
    model = tiny_model("llama", vocab_size=max(96, len(tok)), num_hidden_layers=2)
    model.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_corpus(tmp_path_factory):
    """A small local .txt corpus (blank-line separated documents)."""
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    docs = [f"Document {i}. " + TINY_TEXT * (1 + i % 3) for i in range(40)]
    path.write_text("\n\n".join(docs))
    return str(path)

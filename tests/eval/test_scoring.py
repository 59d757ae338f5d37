"""Log-likelihood scoring, perplexity windows and the sparsity meter on tiny random models."""

import math

import pytest
import torch

import wide
from tests.conftest import tiny_model
from wide.eval.loglik import Encoder, Request, loglikelihoods
from wide.eval.meter import SparsityMeter, merge_sparsity
from wide.eval.perplexity import perplexity, windows


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from tests.conftest import build_tiny_tokenizer

    return build_tiny_tokenizer(tmp_path_factory.mktemp("tok"))


REQS = [Request("The quick brown fox", " jumps over"), Request("A routed model skips some heads and", " channels."),
        Request("Lightning trains ", "the routers while the backbone stays"), Request("dog", " is")]


def reference(model, tok, req):
    """Unbatched, unpadded: full logits of context+continuation, sum over the continuation tokens."""
    ctx, cont = Encoder(tok, add_bos=False).pair(req.context, req.continuation)
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ctx + cont])).logits.float(), -1)[0]
    return sum(logp[len(ctx) - 1 + j, t].item() for j, t in enumerate(cont))


def test_encoder_moves_trailing_space_like_lm_eval(tok):
    enc = Encoder(tok, add_bos=False)
    ctx, cont = enc.pair("Lightning trains ", "the")
    assert ctx == enc.encode("Lightning trains") and ctx + cont == enc.encode("Lightning trains the")
    bos_ctx, _ = Encoder(tok, add_bos=True).pair("dog", " is")
    assert bos_ctx[0] == tok.bos_token_id


@pytest.mark.parametrize("routed", [False, True], ids=["dense", "topk"])
def test_loglikelihood_matches_reference_and_is_batch_invariant(tok, routed):
    model = tiny_model("llama", vocab_size=96, num_hidden_layers=2)
    if routed:
        wide.apply_wide(model, wide.WideConfig(router="topk", ffn_group_size=16)).eval()
    one = loglikelihoods(model, tok, REQS, batch_size=1)
    four = loglikelihoods(model, tok, REQS, batch_size=4)
    for req, (a, ga), (b, gb) in zip(REQS, one, four):
        assert a == pytest.approx(reference(model, tok, req), abs=1e-4)
        assert a == pytest.approx(b, abs=1e-4) and ga == gb


def test_padding_does_not_count_toward_sparsity(tok):
    model = wide.apply_wide(tiny_model("llama", vocab_size=96, num_hidden_layers=2),
                            wide.WideConfig(router="topk", sparsity=0.5, ffn_group_size=16)).eval()
    meter = SparsityMeter(model)
    loglikelihoods(model, tok, REQS, batch_size=4, meter=meter)
    res = meter.result()
    # top-k keeps exactly half of the groups of every real token; padded positions would skew nothing
    # here, so also check the token count is that of the real tokens only
    assert res["sparsity"] == pytest.approx(0.5) and set(res["by_kind"]) == {"attn", "ffn"}
    enc = Encoder(tok, add_bos=False)
    n_real = sum(len(sum(enc.pair(r.context, r.continuation), [])) - 1 for r in REQS)
    assert res["tokens"] == n_real
    assert len(res["per_layer"]["attn"]) == 2


def test_meter_is_token_weighted_and_dense_is_zero():
    merged = merge_sparsity([
        {"sparsity": 0.2, "by_kind": {"ffn": 0.2}, "per_layer": {"ffn": [0.2]}, "layers": [0], "tokens": 300},
        {"sparsity": 0.6, "by_kind": {"ffn": 0.6}, "per_layer": {"ffn": [0.6]}, "layers": [0], "tokens": 100},
    ])
    assert merged["sparsity"] == pytest.approx(0.3) and merged["tokens"] == 400
    dense = SparsityMeter(tiny_model("llama", num_hidden_layers=1))
    dense.update(torch.tensor(5.0))
    assert dense.result()["sparsity"] == 0.0 and dense.result()["tokens"] == 5


@pytest.mark.parametrize("n,window,stride", [(10, 4, 4), (11, 4, 2), (9, 9, 9), (100, 16, 5), (3, 8, 8)])
def test_windows_score_each_prediction_at_most_once(n, window, stride):
    spans = windows(n, window, stride)
    scored = []
    for begin, end, k in spans:
        assert 0 < end - begin <= window and k <= end - begin - 1
        scored += list(range(end - k, end))
    assert len(scored) == len(set(scored)) and 0 not in scored and max(scored) == n - 1
    if stride < window:  # every token after the first, exactly once
        assert sorted(scored) == list(range(1, n))
    else:  # non-overlapping: a window's first token has no context and is skipped
        assert len(scored) == n - len(spans)
    with pytest.raises(ValueError, match="stride"):
        windows(n, window, window + 1)


def test_perplexity_matches_manual_and_batching(tok):
    model = tiny_model("llama", vocab_size=96, num_hidden_layers=2)
    docs = ["The quick brown fox jumps over the lazy dog.", "Perplexity measures how surprised a model is."]
    a = perplexity(model, tok, docs, window=16, batch_size=1)
    b = perplexity(model, tok, docs, window=16, batch_size=3)
    assert a["ppl"] == pytest.approx(b["ppl"], rel=1e-5) and a["tokens"] == b["tokens"]
    from wide.eval.perplexity import token_stream

    ids = torch.from_numpy(token_stream(tok, docs))
    nll, n = 0.0, 0
    for begin, end, k in windows(len(ids), 16, 16):
        with torch.no_grad():
            logits = model(ids[None, begin:end]).logits[0].float()
        nll += torch.nn.functional.cross_entropy(logits[-k - 1:-1], ids[end - k:end], reduction="sum").item()
        n += k
    assert a["ppl"] == pytest.approx(math.exp(nll / n), rel=1e-5) and a["tokens"] == n
    assert a["sparsity"]["sparsity"] == 0.0
    overlapping = perplexity(model, tok, docs, window=16, stride=8)
    assert overlapping["tokens"] == len(ids) - 1

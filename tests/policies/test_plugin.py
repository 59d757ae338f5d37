"""Adding a policy is one class, one registration and one YAML line: a throw-away plug-in with slot names of its
own and its own eval decision, trained and evaluated end to end on a tiny model, its registration undone."""

import pytest
import torch

import wide
from tests.test_recipes import tiny_args
from wide.io.checkpoint import load_trained, read_metadata
from wide.cli import main
from wide.policies import RouterSlot


class TopHalf(wide.Policy):
    """The throw-away policy: WIDE's groups under slot names of its own; in eval every token runs exactly the
    better half of its groups (training keeps the default hard Gumbel decision)."""

    def slots(self, shape, cfg):
        g = cfg.attn_group_size or shape.gqa_ratio
        return [RouterSlot("heads", shape.num_heads // g, g, gates=("attn",)),
                RouterSlot("channels", shape.intermediate_size // cfg.ffn_group_size, cfg.ffn_group_size,
                           gates=("ffn",))]

    def eval_mask(self, router, hidden, *, backend="torch"):
        margin = router.execute_decision(hidden, backend=backend, margin=True)
        keep = margin.topk(margin.shape[-1] // 2, dim=-1).indices
        return torch.zeros_like(margin, dtype=torch.bool).scatter_(-1, keep, True)


RECIPE = """\
model:
  class_path: wide.tasks.RouterCalibration
  init_args:
    routing:
      granularity: tophalf
      attn_group_size: 2
      ffn_group_size: 32
"""


def test_a_registered_policy_trains_and_evaluates(monkeypatch, tmp_path, tiny_model_dir, tiny_corpus):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match="granularity: unknown policy 'tophalf'"):
        wide.WideConfig(granularity="tophalf")
    with monkeypatch.context() as m:
        m.setattr(wide.POLICIES, "_items", dict(wide.POLICIES._items))  # restored when the context ends
        wide.register_policy("tophalf")(TopHalf)
        (tmp_path / "recipe.yaml").write_text(RECIPE)
        main(["fit", "--config", str(tmp_path / "recipe.yaml"), *tiny_args(tmp_path, tiny_model_dir, tiny_corpus),
              "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0"])
        ckpt = tmp_path / "wide" / "routers.safetensors"
        cfg = read_metadata(ckpt)["wide_config"]
        assert cfg.granularity == "tophalf"

        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        wide.apply_wide(model, cfg)
        load_trained(model, ckpt)
        wl = model.model.layers[0].wide
        assert set(wl.routers) == {"heads", "channels"} and set(wl.gating) == {"attn", "ffn"}
        ids = torch.randint(3, 96, (2, 7), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ref = model(ids).logits
            stats = wide.sparsity_stats(model)
            assert all(stats.skip[k].eq(0.5).all() for k in ("attn", "ffn"))  # the plug-in's eval decision
            assert wl.group_mask["attn"].sum(-1).eq(2).all() and wl.group_mask["ffn"].sum(-1).eq(2).all()
            wide.enable_kernels(model, "torch")
            torch.testing.assert_close(model(ids).logits, ref, atol=2e-5, rtol=1e-4)
        wide.set_coherent_decode(model, 1)  # the default coherent decision serves the plug-in too
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
        assert out.shape == (2, 10) and wl.group_mask["ffn"].shape == (2, 1, 4)
        assert (wl.group_mask["ffn"] == wl.group_mask["ffn"][:1]).all()
    assert "tophalf" not in wide.POLICIES

"""Adding a router is one class, one registration and one YAML line: a throw-away plug-in, trained and evaluated
end to end on a tiny model, its registration undone afterwards."""

import pytest
import torch

import wide
from tests.test_recipes import tiny_args
from wide.io.checkpoint import load_trained, read_metadata
from wide.cli import main


class Gate(wide.Router):
    """The throw-away router: a linear map of the normalised residual to two logits per group."""

    def __init__(self, spec: wide.RouterSpec, scale: float = 1.0):
        super().__init__(spec)
        self.scale = scale
        self.proj = torch.nn.Linear(spec.hidden_size, 2 * spec.num_groups)

    def forward(self, hidden):
        return self.scale * self.proj(wide.routers.rms_normalize(hidden)).unflatten(-1, (self.num_groups, 2))


RECIPE = """\
model:
  class_path: wide.tasks.RouterCalibration
  init_args:
    routing:
      router: throwaway
      attn_group_size: 2
      ffn_group_size: 32
"""


def test_a_registered_router_trains_and_evaluates(monkeypatch, tmp_path, tiny_model_dir, tiny_corpus):
    from transformers import AutoModelForCausalLM

    with pytest.raises(ValueError, match="router: unknown router 'throwaway'"):
        wide.WideConfig(router="throwaway")
    with monkeypatch.context() as m:
        m.setattr(wide.ROUTERS, "_items", dict(wide.ROUTERS._items))  # restored when the context ends
        wide.register_router("throwaway")(Gate)
        assert wide.WideConfig(router="throwaway").router == "throwaway"
        (tmp_path / "recipe.yaml").write_text(RECIPE)
        main(["fit", "--config", str(tmp_path / "recipe.yaml"), *tiny_args(tmp_path, tiny_model_dir, tiny_corpus),
              "--trainer.max_steps", "2", "--trainer.limit_val_batches", "0"])
        ckpt = tmp_path / "wide" / "routers.safetensors"
        cfg = read_metadata(ckpt)["wide_config"]
        assert cfg.router == "throwaway"

        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
        wide.apply_wide(model, cfg)
        load_trained(model, ckpt)
        routers = [r for layer in model.model.layers for r in layer.wide.routers.values()]
        assert routers and all(isinstance(r, Gate) for r in routers)
        ids = torch.randint(3, 96, (2, 7), generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            ref = model(ids).logits
            rate = wide.sparsity_stats(model).realized().item()
            wide.enable_kernels(model, "torch")
            torch.testing.assert_close(model(ids).logits, ref, atol=2e-5, rtol=1e-4)
        assert wide.sparsity_stats(model).realized().item() == pytest.approx(rate)
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3, do_sample=False)
        assert out.shape == (2, 10)
    assert "throwaway" not in wide.ROUTERS

import pytest

from wide import WideConfig


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        pytest.param({"sparsity": 1.0}, "sparsity", id="sparsity-one"),
        pytest.param({"sparsity": -0.1}, "sparsity", id="sparsity-negative"),
        pytest.param({"sparsity": "half"}, "sparsity", id="sparsity-str"),
        pytest.param({"attn_sparsity": 1.5}, "attn_sparsity", id="attn-sparsity"),
        pytest.param({"ffn_sparsity": -1}, "ffn_sparsity", id="ffn-sparsity"),
        pytest.param({"targets": "mlp"}, "targets", id="targets"),
        pytest.param({"granularity": "widht"}, "granularity", id="granularity-typo"),
        pytest.param({"attn_group_size": 0}, "attn_group_size", id="attn-group-zero"),
        pytest.param({"ffn_group_size": 24}, "ffn_group_size", id="ffn-group-not-16"),
        pytest.param({"router": "lowrnak"}, "router", id="router-typo"),
        pytest.param({"router": 3}, "router", id="router-type"),
        pytest.param({"router_rank": 0}, "router_rank", id="rank"),
        pytest.param({"backend": "cuda"}, "backend", id="backend"),
        pytest.param({"dense_layers": ["a"]}, "dense_layers", id="dense-layers"),
    ],
)
def test_bad_config_names_field(kwargs, field):
    with pytest.raises(ValueError, match=f"^{field}:"):
        WideConfig(**kwargs)


def test_close_name_suggested():
    with pytest.raises(ValueError, match="Did you mean 'lowrank'"):
        WideConfig(router="lowrnak")


def test_roundtrip_dict():
    cfg = WideConfig(sparsity=0.25, ffn_sparsity=0.4, attn_group_size=2, ffn_group_size=32, dense_layers=[0, -1])
    assert WideConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.target_for("ffn") == 0.4 and cfg.target_for("attn") == 0.25 and cfg.per_kind_targets

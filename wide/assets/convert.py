"""Conversion of a reassembled GGUF checkpoint into a plain fp32 Hugging Face folder."""

from __future__ import annotations

from pathlib import Path

from wide.assets.errors import AssetIntegrityError


def package_versions() -> dict[str, str]:
    """Versions of the packages a build depends on (recorded in its manifest)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("transformers", "gguf", "torch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            pass
    return found


def convert_gguf(gguf: Path, out: Path) -> None:
    """Dequantize a GGUF checkpoint to fp32 and save it as a plain Hugging Face folder."""
    import torch
    from transformers import AutoTokenizer

    from wide.io.loading import pretrained_lm

    kwargs: dict = {"dtype": torch.float32}
    try:  # transformers >= 5.x keeps GGUF blocks packed unless asked to unpack them
        from transformers import GgufConfig

        kwargs["quantization_config"] = GgufConfig(dequantize=True)
    except ImportError:
        pass
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = pretrained_lm(gguf.parent, gguf_file=gguf.name, **kwargs)
    # The weights are dense fp32 now; the GGUF quantizer marker only blocks save_pretrained.
    model.hf_quantizer = None
    for config in {id(c): c for c in (model.config, model.config.get_text_config())}.values():
        if hasattr(config, "quantization_config"):
            del config.quantization_config
    max_positions = getattr(model.config.get_text_config(), "max_position_embeddings", None)
    if max_positions:
        tokenizer.model_max_length = int(max_positions)
    with torch.no_grad():
        ids = tokenizer("The capital of France is Paris.", return_tensors="pt").input_ids
        if not torch.isfinite(model(ids).logits).all():
            raise AssetIntegrityError(f"{gguf.name}: the converted model gives non-finite logits")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)

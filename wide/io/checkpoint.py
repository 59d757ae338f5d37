"""Trained-tensor checkpoints: routers (and adapters) as one safetensors file carrying its own identity.

A checkpoint holds only what was trained, plus JSON metadata: the ``WideConfig``, the stage, the step
and the base model's identity (architecture, shapes, a hash of its config and a fingerprint of its
embedding), so it refuses to load onto another model with a clear error. Files are written atomically
(temp file + rename) so a crash never leaves a half-written checkpoint behind.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from wide.config import WideConfig
from wide.io.adapters import adapter_buffers, is_adapter_name

FORMAT = "wide-trained/1"
IDENTITY_FIELDS = ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                   "intermediate_size", "vocab_size")


def config_identity(config) -> dict[str, Any]:
    """Architecture, shapes and a hash of them, from an HF config alone (no weights needed)."""
    cfg = config.get_text_config() if hasattr(config, "get_text_config") else config
    ident = {f: getattr(cfg, f, None) for f in IDENTITY_FIELDS}
    ident["config_hash"] = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    ident["name_or_path"] = getattr(cfg, "_name_or_path", "") or getattr(config, "_name_or_path", "")
    return ident


def model_identity(model: nn.Module) -> dict[str, Any]:
    """Architecture, shapes, a config hash and an embedding fingerprint of an HF causal LM.

    Reads the first embedding rows, so call it on the unsharded model (``WideTask`` caches it before FSDP).
    """
    ident = config_identity(model.config)
    emb = model.get_input_embeddings().weight
    with torch.no_grad():
        sample = emb[:16].detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16)
    ident["embedding_fingerprint"] = hashlib.sha256(sample.numpy().tobytes()).hexdigest()[:16]
    return ident


def is_router_name(name: str) -> bool:
    """Whether a parameter or module name lies inside a routed layer's routers (`wide.modeling.wrap` names them)."""
    return ".wide.routers." in f".{name}"


def is_trained_name(name: str) -> bool:
    """Whether a parameter name belongs to what `wide` trains and saves: routers and adapters (LoRA, SHiRA)."""
    return is_router_name(name) or is_adapter_name(name)


def trained_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """What a trained-tensor checkpoint holds, by name: router and adapter parameters, and adapter buffers
    (a sparse adapter's support indices, fixed before training but part of what was trained)."""
    out = {name: p for name, p in model.named_parameters() if is_trained_name(name)}
    out.update(adapter_buffers(model))
    return out


def trained_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """CPU copies of the router and adapter tensors (whether or not they currently require grad), by name.

    Raises:
        ValueError: The model is sharded (FSDP2): its full tensors need every rank, so the training side
            gathers them (``wide.distributed.gather_trained_state``) and passes them to ``save_trained``.
    """
    out = {}
    for name, p in trained_tensors(model).items():
        if _is_sharded(p):
            raise ValueError(f"checkpoint: {name} is sharded; gather the trained tensors on every rank "
                             "(wide.distributed.gather_trained_state) and pass them as state=")
        out[name] = p.detach().to("cpu").contiguous()
    return out


def _is_sharded(t: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover - torch built without distributed
        return False
    return isinstance(t, DTensor)


def check_finite(state: dict[str, torch.Tensor], step: int, path: Path) -> None:
    bad = [k for k, t in state.items() if t.is_floating_point() and not bool(torch.isfinite(t).all())]
    if bad:
        raise FloatingPointError(
            f"non-finite trained tensors at step {step} ({len(bad)}, e.g. {bad[0]}); nothing was written, "
            f"{path} keeps the last good state"
        )


def save_trained(model: nn.Module, path: str | os.PathLike, *, config: WideConfig, stage: str, step: int = 0,
                 extra: Optional[dict[str, Any]] = None, state: Optional[dict[str, torch.Tensor]] = None,
                 identity: Optional[dict[str, Any]] = None) -> Path:
    """Writes the trained tensors of ``model`` to ``path`` (a ``.safetensors`` file), atomically.

    Args:
        state: The trained tensors, already gathered when the model is sharded (default:
            ``trained_state(model)``).
        identity: The base model's identity (default: ``model_identity(model)``; pass a cached one
            for a sharded model).

    Raises:
        FloatingPointError: Some tensor is NaN or inf; the file at ``path`` is left as it was.
    """
    path = Path(path)
    state = trained_state(model) if state is None else state
    check_finite(state, step, path)
    path.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "format": FORMAT,
        "wide_config": json.dumps(config.to_dict()),
        "base_model": json.dumps(identity if identity is not None else model_identity(model)),
        "stage": stage,
        "step": str(int(step)),
        "extra": json.dumps(extra or {}),
    }
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        save_file(state, tmp, metadata=meta)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it 0600; give it the permissions open() would
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())  # the rename must not reach the disk before the data
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def read_metadata(path: str | os.PathLike) -> dict[str, Any]:
    """The checkpoint's metadata, JSON fields decoded; ``ValueError`` if it is not a wide checkpoint."""
    path = Path(path)
    if path.is_dir():
        path = path / "routers.safetensors"
    if not path.is_file():
        raise ValueError(f"checkpoint: {path} does not exist")
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except Exception as err:  # safetensors raises its own error type without the path
        raise ValueError(f"checkpoint: {path} is not a safetensors file ({err})") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"checkpoint: {path} is not a wide checkpoint (format {meta.get('format')!r})")
    try:
        config = WideConfig.from_dict(json.loads(meta["wide_config"]))
    except ValueError as err:  # a plug-in router that cannot be imported here, say
        raise ValueError(f"checkpoint: {path}: {err}") from None
    return {
        "path": str(path),
        "wide_config": config,
        "base_model": json.loads(meta["base_model"]),
        "stage": meta.get("stage", ""),
        "step": int(meta.get("step", 0)),
        "extra": json.loads(meta.get("extra", "{}")),
    }


def check_identity(model: nn.Module, expected: dict[str, Any], where: str = "checkpoint") -> None:
    check_identity_dicts(expected, model_identity(model), where)


def check_identity_dicts(expected: dict[str, Any], have: dict[str, Any], where: str = "checkpoint",
                         fields: tuple[str, ...] = (*IDENTITY_FIELDS, "embedding_fingerprint")) -> None:
    """Raises ``ValueError`` naming every difference in ``fields`` between two model identities (default:
    shapes and weights; ``IDENTITY_FIELDS`` alone compares what a config tells, without weights)."""
    diffs = [f"{k}: checkpoint {expected.get(k)!r} vs model {have.get(k)!r}"
             for k in fields if expected.get(k) != have.get(k)]
    if diffs:
        raise ValueError(
            f"{where}: made for another model ({expected.get('name_or_path') or expected.get('model_type')}); "
            + "; ".join(diffs)
        )


def load_trained(model: nn.Module, path: str | os.PathLike, *, strict: bool = True,
                 prefixes: tuple[str, ...] = ()) -> dict[str, Any]:
    """Loads router (and LoRA) tensors into an already routed ``model`` after checking its identity.

    Args:
        model: The routed model (``apply_wide`` already applied with the checkpoint's config).
        path: The ``.safetensors`` file (or a folder holding ``routers.safetensors``).
        strict: Every tensor in the file must find its parameter with the same shape.
        prefixes: Only load tensors whose name contains one of these (e.g. ``(".wide.routers.",)``).

    Returns:
        The checkpoint's metadata.
    """
    meta = read_metadata(path)
    check_identity(model, meta["base_model"])
    params = {**dict(model.named_parameters()), **dict(adapter_buffers(model))}
    with safe_open(meta["path"], framework="pt") as f:
        keys = [k for k in f.keys() if not prefixes or any(p in k for p in prefixes)]
        missing = [k for k in keys if k not in params]
        if missing and strict:
            raise ValueError(f"checkpoint: {len(missing)} tensors have no parameter in the model, e.g. {missing[:3]}")
        with torch.no_grad():
            for k in keys:
                if k not in params:
                    continue
                t = f.get_tensor(k)
                if t.shape != params[k].shape:
                    raise ValueError(f"checkpoint: {k} has shape {tuple(t.shape)}, model {tuple(params[k].shape)}")
                params[k].copy_(t.to(params[k].device, params[k].dtype))
    return meta

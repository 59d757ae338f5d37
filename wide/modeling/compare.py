"""Dense against routed generation on the same prompts (`wide.Generator.compare`, ``wide generate --compare``).

The dense side is the routed model's own backbone with routing off (`WideRuntime.routing_off`): no router runs and
no mask is made, so every routed linear, MLP and attention call takes HF's own ops (``F.linear``, the MLP's
``down(act(gate) * up)``, the model's attention implementation) on the same weights, dtype and device, with no second
copy of the model. It runs through its own `Generator` with the routed one's batch size, cache length, chunk sizes
and CUDA-graph setting; its prompts of 2048 tokens and more run as one eager forward, as a `Generator` over a plain HF
model does (HF's attention reads the whole static cache under a chunk's mask, so that is the faster dense prefill).

Both sides decode greedily exactly ``max_new_tokens`` tokens (EOS does not stop them), so their tokens/s count the
same work. Each side first runs every prompt once untimed (three new tokens: that captures every chunk size the
prompts use and the decode step, and compiles the kernels); the timed runs then only replay.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional, Sequence

import torch

if TYPE_CHECKING:
    from wide.modeling.generate import Generator

WARMUP_TOKENS = 3  # token 0 from the prefill, 1 an eager decode step, 2 captures the decode graph


@dataclass
class SideRun:
    """One side's timed run of one prompt.

    Attributes:
        tokens: The new tokens, one list per row.
        wall_s: Seconds from the call to its tokens on the host (the device synchronized on both ends).
    """

    tokens: list[list[int]]
    wall_s: float

    @property
    def new_tokens(self) -> int:
        return sum(len(row) for row in self.tokens)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_s if self.wall_s > 0 else float("nan")


@dataclass
class PromptComparison:
    """Dense and routed runs of one prompt.

    Attributes:
        prompt_tokens: Tokens of the prompt per row.
        dense: The dense backbone's run.
        routed: The routed model's run.
        skipped: Realized skip rates of the routed model over the prompt and its routed completion (one eager
            forward): per kind, ``total`` (the kinds averaged, the training target's rate) and ``by_weight``.
    """

    prompt_tokens: int
    dense: SideRun
    routed: SideRun
    skipped: dict[str, float]

    @property
    def ratio(self) -> float:
        """Routed tokens/s over dense tokens/s (above 1: routing pays)."""
        return self.routed.tokens_per_s / self.dense.tokens_per_s

    @property
    def matching(self) -> int:
        """New tokens the two sides agree on, position by position."""
        return sum(a == b for d, r in zip(self.dense.tokens, self.routed.tokens) for a, b in zip(d, r))

    @property
    def first_divergence(self) -> Optional[int]:
        """The first new-token position where some row differs (``None``: the greedy tokens are identical)."""
        hits = [next((i for i, (a, b) in enumerate(zip(d, r)) if a != b), None)
                for d, r in zip(self.dense.tokens, self.routed.tokens)]
        hits = [i for i in hits if i is not None]
        return min(hits) if hits else None

    def to_dict(self) -> dict:
        side = lambda s: {"new_tokens": s.new_tokens, "wall_s": s.wall_s, "tokens_per_s": s.tokens_per_s,  # noqa: E731
                          "tokens": s.tokens}
        return {"prompt_tokens": self.prompt_tokens, "dense": side(self.dense), "routed": side(self.routed),
                "ratio": self.ratio, "skipped": self.skipped, "matching": self.matching,
                "first_divergence": self.first_divergence}


@dataclass
class GenerationComparison:
    """What `Generator.compare` measured: one `PromptComparison` per prompt, totals, and where it ran."""

    prompts: list[PromptComparison]
    max_new_tokens: int
    device: str
    dtype: str
    graphs: bool

    def tokens_per_s(self, side: str) -> float:
        """All prompts' new tokens over all their seconds, of ``side`` (``dense`` or ``routed``)."""
        runs = [getattr(p, side) for p in self.prompts]
        wall = sum(r.wall_s for r in runs)
        return sum(r.new_tokens for r in runs) / wall if wall > 0 else float("nan")

    @property
    def ratio(self) -> float:
        return self.tokens_per_s("routed") / self.tokens_per_s("dense")

    @property
    def skipped(self) -> dict[str, float]:
        """The prompts' skip rates averaged, each weighted by its tokens (prompt and completion)."""
        w = [(p.prompt_tokens + p.routed.new_tokens / len(p.routed.tokens)) for p in self.prompts]
        return {k: sum(wi * p.skipped[k] for wi, p in zip(w, self.prompts)) / sum(w) for k in self.prompts[0].skipped}

    @property
    def matching(self) -> int:
        return sum(p.matching for p in self.prompts)

    @property
    def new_tokens(self) -> int:
        """New tokens per side, all prompts."""
        return sum(p.routed.new_tokens for p in self.prompts)

    def to_dict(self) -> dict:
        return {"device": self.device, "dtype": self.dtype, "graphs": self.graphs,
                "max_new_tokens": self.max_new_tokens, "prompts": [p.to_dict() for p in self.prompts],
                "total": {"dense_tokens_per_s": self.tokens_per_s("dense"),
                          "routed_tokens_per_s": self.tokens_per_s("routed"), "ratio": self.ratio,
                          "skipped": self.skipped, "new_tokens": self.new_tokens, "matching": self.matching,
                          "identical_prompts": sum(p.first_divergence is None for p in self.prompts)}}


def dense_prompt_forward(model: torch.nn.Module, prompt: torch.Tensor, rest: Optional[torch.Tensor] = None):
    """``prefill="dense"`` as one eager pass: ``prompt [B, T]`` with routing off into a dynamic cache, then ``rest
    [B, S]`` (if any) routed over it. Returns ``(the prompt's last logits [B, V], rest's logits [B, S, V] or None)``;
    the runtime's records are then rest's alone (what a dense-prompt generation routes)."""
    from transformers import DynamicCache

    from wide.modeling.wrap import runtime_of

    from wide.modeling.generate import cache_kwarg

    kw = {cache_kwarg(model): DynamicCache(config=model.config), "use_cache": True}
    with torch.inference_mode():
        with runtime_of(model).routing_off():
            first = model(input_ids=prompt, **kw).logits[:, -1]
        out = model(input_ids=rest, **kw).logits if rest is not None and rest.shape[1] else None
    return first, out


def skipped_share(model, ids: torch.Tensor, dense_prompt: int = 0) -> dict[str, float]:
    """Realized skip rates of one eager forward over ``ids [B, T]``: per kind, ``total`` (the kinds averaged) and
    ``by_weight`` (each kind weighted by its routed weights). ``dense_prompt``: the first that many tokens run with
    routing off into a cache and are not counted (what a ``prefill="dense"`` generation routes: the rest only)."""
    import wide

    if dense_prompt:
        dense_prompt_forward(model, ids[:, :dense_prompt], ids[:, dense_prompt:])
    else:
        with torch.inference_mode():
            model(input_ids=ids, use_cache=False)
    stats = wide.sparsity_stats(model)
    if stats is None or (dense_prompt and ids.shape[1] <= dense_prompt):  # nothing ran routed
        return {"total": 0.0, "by_weight": 0.0}
    out = {kind: float(stats.realized(kind)) for kind in stats.kinds}
    out["total"] = float(stats.realized())
    out["by_weight"] = float(stats.realized_by_weight())
    return out


def _dense_prompt(gen: "Generator", ids: torch.Tensor) -> int:
    """The prompt tokens ``gen`` runs with routing off (its ``prefill="dense"``), 0 otherwise."""
    return ids.shape[1] if getattr(gen, "prefill", "routed") == "dense" else 0


def compare_generation(gen: "Generator", prompts: Sequence[torch.Tensor], max_new_tokens: int,
                       warmup: bool = True) -> GenerationComparison:
    """Times ``prompts`` through the routed ``gen`` and through a dense twin of it (see the module docstring)."""
    from wide.modeling.generate import _check
    from wide.modeling.wrap import runtime_of

    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, Sequence) or not prompts:
        raise ValueError("prompts: must be a non-empty list of int64 tensors [batch_size, T], got "
                         f"{type(prompts).__name__}")
    if getattr(gen.model, "wide_runtime", None) is None:
        raise ValueError("model: not routed (wide.load or wide.apply_wide + enable_kernels); nothing to compare")
    runtime = runtime_of(gen.model)
    for ids in prompts:
        _check(gen.model, ids, max_new_tokens, None, gen.max_cache_len, 1)
        if ids.shape[0] != gen.batch_size:
            raise ValueError(f"prompts: a prompt of {ids.shape[0]} rows, this Generator was made for batch_size="
                             f"{gen.batch_size}")
    dense = gen._dense_twin()
    sides = (("dense", dense, runtime.routing_off), ("routed", gen, contextlib.nullcontext))
    if warmup:
        for _, g, ctx in sides:
            for ids in prompts:
                n = WARMUP_TOKENS if ids.shape[1] + WARMUP_TOKENS <= gen.max_cache_len else max_new_tokens
                with ctx():
                    g.generate(ids, max_new_tokens=n)
    out = []
    for ids in prompts:
        runs = {}
        for name, g, ctx in sides:
            with ctx():
                runs[name] = _timed(g, ids, max_new_tokens)
        routed_ids = torch.cat([ids, torch.tensor(runs["routed"].tokens, device=ids.device)], dim=1)
        out.append(PromptComparison(ids.shape[1], runs["dense"], runs["routed"], skipped_share(gen.model, routed_ids,
                                                                                    _dense_prompt(gen, ids))))
    return GenerationComparison(out, max_new_tokens, str(gen.device), str(gen.model.dtype).removeprefix("torch."),
                                gen.graphs and dense.graphs)


def _timed(gen: "Generator", ids: torch.Tensor, max_new_tokens: int) -> SideRun:
    cuda = ids.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize(ids.device)
    t0 = time.perf_counter()
    y = gen.generate(ids, max_new_tokens=max_new_tokens)
    tokens = y[:, ids.shape[1]:].tolist()  # waits for the device
    return SideRun(tokens, time.perf_counter() - t0)

"""`WideLayer`: the routers of one decoder layer and the masks they produced for the current forward."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from wide.modeling.normroute import norm_route
from wide.modeling.runtime import WideRuntime
from wide.policies.base import SUBLAYERS, Policy, RouterSlot
from wide.policies.coherent import selection_groups


class WideLayer(nn.Module):
    """Holds one decoder layer's routers (``routers[kind]``, one per policy slot) and the masks they produced.

    The masks live only for the current forward, per gated sub-layer: ``group_mask["attn"] [B, T, G]`` (and its
    per-head expansion ``head_mask``) and ``group_mask["ffn"]`` (``ffn_mask``): float 0/1, straight-through in
    training, bool in eval. Which router gates which sub-layer, and where it reads the residual, the policy's
    slots declare (`wide.policies.RouterSlot`); how a router's input becomes its mask, the policy decides
    (`wide.policies.Policy.mask`).
    """

    def __init__(self, layer_idx: int, slots: list[RouterSlot], routers: dict[str, nn.Module], policy: Policy,
                 runtime: WideRuntime):
        super().__init__()
        self.layer_idx = layer_idx
        self.slots = {s.kind: s for s in slots}
        self.gating = {sub: s for s in slots for sub in s.gates}  # gated sub-layer -> the slot whose mask gates it
        self._reads = {sub: [s for s in slots if s.reads == sub] for sub in SUBLAYERS}
        self.routers = nn.ModuleDict(routers)
        self.policy = policy
        object.__setattr__(self, "runtime", runtime)  # shared, not a submodule
        self.group_mask: dict[str, torch.Tensor] = {}
        self._head_src: Optional[tuple[torch.Tensor, int]] = None  # (group mask, heads per group)
        self._head_mask: Optional[torch.Tensor] = None
        self.ffn_mask: Optional[torch.Tensor] = None
        self.forced: dict[str, torch.Tensor] = {}  # per slot kind: a mask that replaces the router's (tests, analysis)
        self.kernels_enabled = False
        self.backend = "auto"
        self._kernel_masks: dict[str, tuple] = {}
        self._coherent: dict[str, dict] = {}
        self.reset_decode_state()
        self.routed_weights: dict[str, int] = {}  # weight elements each kind's routing covers (set by apply_wide)
        self.early_kv = False  # enable_kernels: the routed q projection can run K/V first (`EarlyLinear`)
        self._pending: Optional[torch.cuda.Stream] = None  # the side stream still deciding this step's mask
        self._heads_zeroed = False  # this forward's attention output is zero in every skipped head (see take_...)
        # per gated sub-layer: the residual stream its closing reduction-width GEMM may add in its epilogue, left by
        # a decode step's decoder-layer wrapper (`wide.modeling.fused_residual`); taking it removes it
        self.pending_residual: dict[str, torch.Tensor] = {}
        # per sub-layer read: (the residual stream, the mask) a fused epilogue decided for it
        # (`wide.kernels.gemm_k_route`, `wide.modeling.fused_residual`); taken by the routing hook of that tensor
        self.prerouted: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        # per gated sub-layer: (norm, routed layer, sub-layer) whose norm and router its closing GEMM may run too
        self.pending_route: dict[str, tuple] = {}

    def decides_at(self, sublayer: str) -> bool:
        """Whether some router of this layer reads the input of ``sublayer`` (``attn`` or ``ffn``)."""
        return bool(self._reads[sublayer])

    def reset_decode_state(self) -> None:
        """Forgets the routers' batch-coherent decode state (a new sequence, or new settings)."""
        self._coherent = {kind: {} for kind in self.slots}

    def _decide(self, kind: str, residual: torch.Tensor) -> torch.Tensor:
        """The mask ``[B, T, G]`` of slot ``kind`` for ``residual [B, T, D]``: forced, else the policy's decision."""
        if kind in self.forced:
            mask = self.forced[kind].to(residual.device, torch.float32)
            return mask.expand(*residual.shape[:2], self.slots[kind].num_groups)
        rt = self.runtime
        return self.policy.mask(self.routers[kind], residual, training=self.training, tau=rt.tau,
                                noise_like=rt.gumbel_like, backend=self.backend if self.use_kernels() else "torch",
                                coherent=rt.coherent, state=self._coherent[kind])

    def kernel_mask(self, kind: str):
        """``(bool mask [B, T, G], RoutingPlan)`` of the current forward, built once and shared by paired ops."""
        self.join_routing()
        if kind not in self._kernel_masks:
            from wide.kernels import make_plan

            mask = self.group_mask[kind]
            mask = mask if mask.dtype == torch.bool else mask > 0.5
            self._kernel_masks[kind] = (mask, make_plan(mask, self._density_hint(kind),
                                                           selection_groups(self._coherent.values(), mask)))
        return self._kernel_masks[kind]

    def _density_hint(self, kind: str) -> Optional[float]:
        # the router's expected rate lets the kernels pick a path with no host sync; forced masks
        # (tests, analysis) have no router behind them and are measured instead
        slot = self.gating.get(kind)
        if self.forced or slot is None:
            return None
        router = self.routers[slot.kind]
        return min(1.0, max(0.0, 1.0 - router.expected_sparsity()))

    def use_kernels(self) -> bool:
        return self.kernels_enabled and not self.training

    def _overlap_stream(self, residual: torch.Tensor) -> Optional[torch.cuda.Stream]:
        """The side stream a routed CUDA decode step decides its attention mask on, or ``None``: the router
        (a few latency-bound launches) then runs beside the dense K/V projections, which the routed q projection
        launches first (`wide.modeling.inference.EarlyLinear`) and whose output it waits for the mask after.

        Between the fork and the join the main stream runs only the attention norm and cuBLAS K/V: no kernel that
        shares `wide.kernels`' arrival counters with the router's (`arrival_counters` must not be used on two
        streams at once) — keep it so when adding work to that window."""
        if not (self.early_kv and self.runtime.overlap_routing and self.use_kernels() and residual.shape[1] == 1
                and not torch.compiler.is_compiling()):
            return None
        return self.runtime.side_stream(residual.device)

    @property
    def routing_pending(self) -> bool:
        """Whether this step's attention mask is still being decided on the side stream."""
        return self._pending is not None

    def join_routing(self) -> None:
        """Makes the current stream wait for the side stream's routing (every reader of the masks calls this)."""
        if self._pending is not None:
            torch.cuda.current_stream(self._pending.device).wait_stream(self._pending)
            self._pending = None

    @property
    def routes_heads(self) -> bool:
        """Whether this forward routed the attention heads (no tensor work)."""
        return self._head_src is not None

    @property
    def head_mask(self) -> Optional[torch.Tensor]:
        """``[B, T, Hq]`` per-head mask, expanded from the group mask on first use: the fused kernels read
        the group mask directly, so routed inference never launches the expansion."""
        if self._head_mask is None and self._head_src is not None:
            self.join_routing()
            mask, per_group = self._head_src
            self._head_mask = mask if per_group == 1 else mask.repeat_interleave(per_group, dim=-1)
        return self._head_mask

    def mark_heads_zeroed(self) -> None:
        """The routed attention (`wide.modeling.attention`) returns an output that is exactly zero in every
        (token, head group) this forward's mask skips: the fused kernel writes those zeros, the reference path
        multiplies by the mask."""
        self._heads_zeroed = True

    def take_heads_zeroed(self) -> bool:
        """Whether the attention output reaching ``o_proj`` is already zero where its mask skips (then the
        reduction-width GEMM skips its masking pass: ``gemm_k(x_masked=True)``); reading it clears it, so only
        the output of this layer's own attention call counts."""
        zeroed, self._heads_zeroed = self._heads_zeroed, False
        return zeroed

    def _set_heads(self, mask: Optional[torch.Tensor], per_group: int = 1) -> None:
        self._head_src = None if mask is None else (mask, per_group)
        self._head_mask = None

    def route_attention(self, residual: torch.Tensor, norm: Optional[nn.Module] = None) -> None:
        """Called with the pre-attention-norm residual ``[B, T, D]``: starts the layer's forward. ``norm``: the norm
        about to read it (a decode step may compute its output with the router: `wide.modeling.normroute`)."""
        self.join_routing()
        self._set_heads(None)
        self._heads_zeroed = False
        self.ffn_mask = None
        self.group_mask = {}
        self._kernel_masks = {}
        if not self.runtime.routing:
            return  # routing off: no masks, every group executes (`WideRuntime.routing_off`)
        if residual.shape[1] > 1:
            self.reset_decode_state()  # a prefill starts a new sequence: forget the decode-time selection
        slots = self._reads["attn"]
        if not slots:
            return
        side = self._overlap_stream(residual)
        if side is None or self._preroute("attn", residual) is not None:
            self._route(slots, residual, norm)
            return
        # the router reads the residual after the work queued so far; the masks, plans and kernels that read its
        # decisions come after `join_routing`
        side.wait_stream(torch.cuda.current_stream(residual.device))
        with torch.cuda.stream(side):
            self._route(slots, residual)
        self._pending = side

    def route_ffn(self, residual: torch.Tensor, norm: Optional[nn.Module] = None) -> None:
        """Called with the pre-FFN-norm residual ``[B, T, D]`` (``norm``: as in `route_attention`)."""
        self.join_routing()
        if self.runtime.routing:  # routing off (`WideRuntime.routing_off`): no masks, every group executes
            self._route(self._reads["ffn"], residual, norm)

    def _preroute(self, sublayer: str, residual: torch.Tensor) -> Optional[torch.Tensor]:
        """The mask a fused epilogue decided for ``residual`` (the input of ``sublayer``), if it did."""
        pre = self.prerouted.get(sublayer)
        return pre[1] if pre is not None and pre[0] is residual else None

    def _route(self, slots: list[RouterSlot], residual: torch.Tensor, norm: Optional[nn.Module] = None) -> None:
        pre = self._preroute(slots[0].reads, residual) if slots else None
        self.prerouted.clear()
        for i, slot in enumerate(slots):
            mask = pre if i == 0 else None
            if mask is None and norm is not None and i == 0:
                mask = norm_route(self, slot, residual, norm)
            if mask is None:
                mask = self._decide(slot.kind, residual)
            for sub in slot.gates:
                self.group_mask[sub] = mask
                if sub == "attn":
                    self._set_heads(mask, slot.group_size or 1)  # group size 0: [B, T, 1] broadcasts over the heads
                else:
                    self.ffn_mask = mask
                self.runtime.record(self.layer_idx, sub, mask)

    def clear(self) -> None:
        self.join_routing()
        self.group_mask, self.ffn_mask = {}, None
        self._set_heads(None)
        self._heads_zeroed = False
        self._kernel_masks = {}


def mask_heads(out: torch.Tensor, head_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``out [B, T, H, D]`` times ``head_mask [B, T, H]`` (or ``[B, T, 1]``)."""
    if head_mask is None:
        return out
    if head_mask.shape[:2] != out.shape[:2]:
        raise RuntimeError(f"routing mask {tuple(head_mask.shape)} does not match attention output {tuple(out.shape)}")
    return out * head_mask.unsqueeze(-1).to(out.dtype)


def mask_channels(h: torch.Tensor, group_mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``h [B, T, I]`` times ``group_mask [B, T, G]`` expanded over ``I / G`` channels per group."""
    if group_mask is None:
        return h
    g = group_mask.shape[-1]
    shaped = h.unflatten(-1, (g, h.shape[-1] // g))
    return (shaped * group_mask.unsqueeze(-1).to(h.dtype)).flatten(-2)


class MaskedActivation(nn.Module):
    """Replaces the MLP's activation: ``act(gate) ⊙ mask``, so ``up`` and ``down`` see masked channels.

    Multiplying after the activation zeroes ``act(gate) ⊙ up`` for skipped channels, which is exactly
    the routed FFN; gate/up/down stay the original modules (peft can still wrap them).
    """

    def __init__(self, act: nn.Module, wide_layer: WideLayer):
        super().__init__()
        self.act = act
        object.__setattr__(self, "wide_layer", wide_layer)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return mask_channels(self.act(h), self.wide_layer.ffn_mask)

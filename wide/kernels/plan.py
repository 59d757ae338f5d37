"""Routing plan: the per-group token order that the routed kernels share.

WIDE's "mask reordering": for each group, the tokens that execute it are moved to the front of a
permutation, so a kernel tile of that group reads only active rows and tiles past the group's count
hold only inactive tokens (they just write zeros). One plan is built per layer and router and passed to
the paired ops (gate/up -> down share the FFN plan; Q -> attention -> O share the attention plan).

Everything is computed on the device with no host synchronization, lazily, and cached on the plan, so a
plan built before a CUDA-graph capture can be used inside it. On CUDA the partition and the group list take
one Triton launch each (`wide.kernels.triton.partition`, imported on first use); elsewhere plain torch.
"""

from __future__ import annotations

import torch


class RoutingPlan:
    """Per-group token permutation, counts and group-activity list for one routing mask.

    Args:
        mask: routing decision ``[B, T, G]`` or ``[M, G]`` (bool, True = execute).
        density_hint: expected fraction of executed (token, group) pairs (the router's target, say).
            When given, kernels choose between their routed and dense paths from it without reading
            the mask on the host (no synchronization); it never changes results, only speed.
        group_list: :meth:`group_list`'s ``(order, n_needed)`` when the caller already has it (batch-coherent
            decode's selection writes it), so the plan launches nothing to build it. It must describe ``mask``.
    """

    def __init__(self, mask: torch.Tensor, density_hint: float | None = None,
                 group_list: tuple[torch.Tensor, torch.Tensor] | None = None):
        if mask.dtype != torch.bool:
            raise TypeError(f"RoutingPlan needs a bool mask, got {mask.dtype}")
        if mask.dim() < 2:
            raise ValueError(f"mask must be [..., G], got shape {tuple(mask.shape)}")
        if density_hint is not None and not 0.0 <= density_hint <= 1.0:
            raise ValueError(f"density_hint: must be in [0, 1], got {density_hint!r}")
        self.mask = mask
        self.density_hint = density_hint
        self._cache: dict[str, object] = {}
        if group_list is not None:
            order, n = group_list
            if tuple(order.shape) != (self.n_groups,) or tuple(n.shape) != (1,):
                raise ValueError(f"group_list: expected ([{self.n_groups}], [1]) tensors, got "
                                 f"({tuple(order.shape)}, {tuple(n.shape)})")
            self._cache["groups"] = (order, n)

    @property
    def n_groups(self) -> int:
        return self.mask.shape[-1]

    @property
    def shape(self) -> torch.Size:
        return self.mask.shape

    @property
    def rows_shared(self) -> bool:
        """Whether every row (token) is known to run the same groups, from the mask's layout alone (no tensor
        work): one row, or rows that are one row broadcast (batch-coherent decode's ``selection.expand``)."""
        # from shapes and strides only (a reshape could copy an oddly strided mask)
        return all(size <= 1 or stride == 0 for size, stride in zip(self.mask.shape[:-1], self.mask.stride()[:-1]))

    def matches(self, mask: torch.Tensor) -> bool:
        """Cheap check that ``mask`` is the mask this plan was built from (shape and storage)."""
        return mask is self.mask or (
            mask.shape == self.mask.shape and mask.data_ptr() == self.mask.data_ptr()
        )

    def token_order(self, flat: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """Stable partition of tokens per group, active first.

        Args:
            flat: treat all leading dims as one token axis (FFN ops); else per batch row (attention;
                the mask must then be ``[B, T, G]``).

        Returns:
            perm: ``[R, G, T']`` int32, token indices; the first ``counts[r, g]`` are active,
                ascending, the rest inactive, ascending. ``R = 1, T' = M`` when flat, else ``R = B``.
            counts: ``[R, G]`` int32.
        """
        # one batch row: both orders are the same partition of [1, T, G] (one launch for q and attention)
        key = "flat" if flat or (self.mask.dim() == 3 and self.mask.shape[0] == 1) else "rows"
        if key not in self._cache:
            m = self.mask.reshape(1, -1, self.n_groups) if flat else self.mask
            if m.dim() != 3:
                raise ValueError(f"a per-row plan needs a [B, T, G] mask, got {tuple(self.mask.shape)}")
            self._cache[key] = _partition(m)
        return self._cache[key]  # type: ignore[return-value]

    def memo(self, key: str, value: object = None) -> object:
        """A product another op family derives from this plan (`wide.kernels.experts`' grouped layout), cached
        under ``key``: stores ``value`` when given, returns the cached one (``None`` before)."""
        if value is not None:
            self._cache[key] = value
        return self._cache.get(key)

    def built(self, what: str) -> bool:
        """Whether the cached product ``what`` (``"groups"``: :meth:`group_list`) already exists."""
        return what in self._cache

    def group_list(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Groups needed by at least one token, compacted.

        Returns:
            order: ``[G]`` int32, needed groups first (ascending), then the unused ones.
            n_needed: ``[1]`` int32, how many groups lead ``order``.
        """
        if "groups" not in self._cache:
            rows = self.mask.reshape(-1, self.n_groups)
            # one Triton launch on CUDA (decode builds this list per layer and kind, where ~10 small torch
            # launches would cost more than the GEMV saves)
            triton_list = None
            if rows.is_cuda:
                try:
                    from .triton.partition import group_list as triton_list
                except ImportError:
                    pass
            if triton_list is not None:
                self._cache["groups"] = triton_list(rows)
            else:  # the groups as the "tokens" of a single column
                perm, counts = _stable_partition(rows.any(0).view(1, -1, 1))
                self._cache["groups"] = (perm.view(-1), counts.view(1))
        return self._cache["groups"]  # type: ignore[return-value]

    def tile_order(self, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Tokens (all leading dims flattened) sorted by mask pattern, and each tile's needed groups.

        One permutation for all groups, for reduction-side GEMMs (``gemm_k_sorted``): tokens that run the
        same groups end up in the same tiles, so a tile of ``block_m`` sorted tokens needs fewer groups than
        a tile in sequence order. The sort key is the mask's bits, the most evenly split groups first (up to
        62 of them; lexicographic order); stable, on the device, no host synchronization.

        Returns:
            rows: ``[M]`` int32, token indices in sorted order.
            tile_list: ``[n_tiles, G]`` int32, per tile of ``block_m`` sorted tokens the groups one of them
                runs first (ascending), then the others; ``n_tiles = ceil(M / block_m)``.
            tile_count: ``[n_tiles]`` int32, how many groups lead each ``tile_list`` row.
        """
        if block_m < 1:
            raise ValueError(f"block_m: must be >= 1, got {block_m}")
        key = f"tiles{block_m}"
        if key not in self._cache:
            self._cache[key] = _tile_order(self.mask.reshape(-1, self.n_groups), block_m)
        return self._cache[key]  # type: ignore[return-value]

    def tile_share(self, block_m: int) -> float:
        """Share of (tile, group) pairs of :meth:`tile_order` that some token of the tile runs (the work
        ``gemm_k_sorted`` does, relative to dense). Synchronizes with the host once (cached)."""
        key = f"share{block_m}"
        if key not in self._cache:
            _, tl_, tc = self.tile_order(block_m)
            self._cache[key] = float(tc.sum().item()) / max(1, tl_.numel())
        return self._cache[key]  # type: ignore[return-value]

    def density(self) -> float:
        """Fraction of executed (token, group) pairs. Synchronizes with the host once (cached): the
        triton backend asks only for large prefill-sized calls, never under CUDA-graph capture."""
        if "density" not in self._cache:
            self._cache["density"] = float(self.mask.sum().item()) / max(1, self.mask.numel())
        return self._cache["density"]  # type: ignore[return-value]

    def expected_density(self) -> float:
        """``density_hint`` when given (no host sync), else the measured :meth:`density`."""
        return self.density_hint if self.density_hint is not None else self.density()

    def known_all_active(self) -> bool:
        """True only when every pair is known to execute: measured (one host sync) when no hint was
        given; with a hint, never assumed (the caller then keeps its masking pass)."""
        return self.density_hint is None and self.density() == 1.0

    def materialize(self, flat: bool | None = None) -> "RoutingPlan":
        """Compute the cached tensors now (before a graph capture, say); ``None`` builds both orders."""
        self.group_list()
        if flat in (None, True):
            self.token_order(True)
        if flat in (None, False) and self.mask.dim() == 3:
            self.token_order(False)
        return self


def plan_for(mask: torch.Tensor, plan: RoutingPlan | None) -> RoutingPlan:
    """``plan`` when it was built for ``mask`` (a new plan when ``None``); a plan of another mask is an error."""
    if plan is None:
        return RoutingPlan(mask)
    if not plan.matches(mask):
        raise ValueError(f"plan was built for a mask of shape {tuple(plan.shape)}, not this one "
                         f"({tuple(mask.shape)}, or another tensor)")
    return plan


def pattern_order(rows: torch.Tensor) -> torch.Tensor:
    """``rows [M, G]`` bool -> ``[M]`` int64 token order, lexicographic by mask bits (tokens running the same
    groups end up next to each other), the most evenly split groups first (they separate the most tokens), up
    to 62 of them; stable, on the device, no host read."""
    G = rows.shape[1]
    bits = min(G, 62)
    balance = (rows.float().mean(0) - 0.5).abs()
    lead = torch.argsort(balance, stable=True)[:bits]
    weight = torch.pow(2, torch.arange(bits - 1, -1, -1, device=rows.device, dtype=torch.int64))
    key = (rows[:, lead].to(torch.int64) * weight).sum(-1)
    return torch.argsort(key, descending=True, stable=True)


def _tile_order(rows: torch.Tensor, block_m: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``rows [M, G]`` bool -> (order ``[M]``, tile lists ``[n_tiles, G]``, counts ``[n_tiles]``), int32."""
    M, G = rows.shape
    order = pattern_order(rows)
    n_tiles = -(-M // block_m)
    sorted_rows = rows[order]
    if n_tiles * block_m != M:
        sorted_rows = torch.cat([sorted_rows, sorted_rows.new_zeros(n_tiles * block_m - M, G)])
    need = sorted_rows.view(n_tiles, block_m, G).any(1)  # [n_tiles, G]
    tile_list, tile_count = _stable_partition(need.view(n_tiles, G, 1))
    return order.to(torch.int32), tile_list.view(n_tiles, G), tile_count.view(n_tiles)


def _partition(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One Triton launch on CUDA (when Triton is there); the torch version elsewhere."""
    if mask.is_cuda:
        try:
            from .triton.partition import partition
        except ImportError:
            pass
        else:
            return partition(mask)
    return _stable_partition(mask)


def _stable_partition(mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``mask [R, T, G]`` -> (perm ``[R, G, T]`` int32, counts ``[R, G]`` int32), active first."""
    a = mask.transpose(1, 2).to(torch.int32).contiguous()  # [R, G, T]
    counts = a.sum(-1, dtype=torch.int32)
    before_active = torch.cumsum(a, -1, dtype=torch.int32) - a
    idx = torch.arange(a.shape[-1], device=a.device, dtype=torch.int32)
    # an inactive token lands after all active ones, in order among the inactive
    dest = torch.where(a.bool(), before_active, counts.unsqueeze(-1) + idx - before_active)
    perm = torch.empty_like(a, memory_format=torch.contiguous_format)
    perm.scatter_(-1, dest.long(), idx.expand_as(a).contiguous())
    return perm, counts


@torch.compiler.disable  # built eagerly under torch.compile, like the ops that read it
def make_plan(mask: torch.Tensor, density_hint: float | None = None,
              group_list: tuple[torch.Tensor, torch.Tensor] | None = None) -> RoutingPlan:
    """Build a reusable routing plan for a bool mask ``[B, T, G]`` (or ``[M, G]``).

    The tensors are computed on first use and cached; call ``plan.materialize()`` to compute them
    eagerly (e.g. before capturing a CUDA graph that uses the plan). ``density_hint`` (expected
    executed fraction) lets kernels pick their path without a host sync; ``group_list``, when the caller
    has it, spares the plan building its own (see `RoutingPlan`).
    """
    return RoutingPlan(mask, density_hint, group_list)

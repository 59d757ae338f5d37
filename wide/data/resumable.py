"""A training ``DataLoader`` whose order survives a restart: Lightning saves its position in ``.ckpt``.

The order is a pure function of ``(seed, epoch)`` (``DistributedSampler``'s permutation, the same as a
``RandomSampler`` seeded with ``seed`` in epoch 0 on one process), each data-parallel rank takes every
``num_replicas``-th row of it, and ``state_dict`` records how many batches the current epoch has
handed out. Lightning stores that in ``.ckpt`` (``loops.fit_loop.state_dict.combined_loader``) and,
on ``--ckpt_path``, calls ``load_state_dict`` before iterating again, so a resumed run sees exactly
the batches an uninterrupted run would have seen next. Because the sampler already is a
``DistributedSampler``, Lightning leaves it in place under DDP / FSDP.
"""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader, Dataset, DistributedSampler

__all__ = ["ResumableLoader", "ResumableSampler"]


class ResumableSampler(DistributedSampler):
    """``DistributedSampler`` that can start ``start`` rows into its (per-rank) epoch order once."""

    def __init__(self, dataset: Dataset, *, num_replicas: int = 1, rank: int = 0, shuffle: bool = True,
                 seed: int = 0):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
        self.start = 0

    def __iter__(self) -> Iterator[int]:
        indices = list(super().__iter__())
        start, self.start = self.start, 0
        return iter(indices[start:])


class ResumableLoader(DataLoader):
    """``DataLoader`` over a ``ResumableSampler`` with Lightning's ``state_dict`` / ``load_state_dict``.

    ``len()`` stays the full epoch length after a restore (Lightning counts the batches already done).
    """

    def __init__(self, dataset: Dataset, *, batch_size: int, seed: int, num_replicas: int = 1, rank: int = 0,
                 **kwargs: Any):
        sampler = ResumableSampler(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        super().__init__(dataset, batch_size=batch_size, sampler=sampler, **kwargs)
        self._consumed = 0  # batches handed out in the current epoch
        self._skip = 0  # batches to skip when the next epoch iterator starts (set by load_state_dict)

    def __iter__(self) -> Iterator[Any]:
        skip, self._skip = self._skip, 0
        self.sampler.start = skip * self.batch_size
        self._consumed = skip
        for batch in super().__iter__():
            self._consumed += 1  # counted when handed out, so a checkpoint at batch end includes it
            yield batch

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": int(self.sampler.epoch),
            "samples": self._consumed * self.batch_size * self.sampler.num_replicas,  # global, all ranks
            "seed": int(self.sampler.seed),
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("seed", self.sampler.seed) != self.sampler.seed:
            raise ValueError(
                f"data.seed: the checkpoint was written with seed {state['seed']}, this run uses "
                f"{self.sampler.seed}; resume with the same seed or start a new run"
            )
        per_rank = state["samples"] // self.sampler.num_replicas
        batches = per_rank // self.batch_size
        self._skip = 0 if batches >= len(self) else batches  # an exhausted epoch restarts at the next one

"""Greedy generation with decode steps (and, with `Generator`, prompt chunks) replayed from CUDA graphs.

HF ``generate`` runs decode steps eagerly unless it compiles the whole forward; a routed model's ops are
graph breaks there, so an eager step stays bound by the host issuing ~40 launches per layer (an 8B-shaped
batch-1 step: ≈ 24 ms eager against ≈ 6 ms replayed on an H200). ``generate`` here prefills eagerly into a
``StaticCache``, runs the first decode step eagerly (it compiles the kernels and makes their buffers), captures
the next one and replays that graph for every later token: the token and its position live in fixed device
buffers updated in place, the static cache advances its own write position on the device, and the routed
kernels read masks, plans and lengths on the device, so nothing is re-issued from the host. Without CUDA (or
with ``graphs=False``) the same loop runs eagerly.

An eager prefill is host-bound too below a few thousand tokens (each routed op costs 100–300 µs of host time,
BENCHMARKS.md). `Generator` keeps one static cache and its graphs across calls: a prompt is cut into chunks of
a few fixed sizes (the last one filled up with copies of its last token), each chunk's forward is replayed from
the graph captured for its size with the chunk's ids and positions in fixed buffers, and the decode step is
captured once. The routed prefill attention reads each chunk's position from its causal mask on the device.

Greedy decoding (or temperature sampling, ``temperature > 0``: Gumbel-max on the device, outside the captured graphs)
of unpadded batches (every row as long as the others), which is what the speed numbers in BENCHMARKS.md time;
padding, top-k / top-p and stopping strings stay with HF ``generate``.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import warnings
from typing import Callable, Optional, Sequence, Union

import torch
from torch import nn

from wide.policies.coherent import restart_schedule

StopIds = Union[int, Sequence[int], None]
"""An EOS token id, a list of them (any one ends a row), or ``None``."""


def _check(model: nn.Module, input_ids, max_new_tokens: int, eos_token_id, max_cache_len: Optional[int],
           check_every: int, temperature: float = 0.0) -> None:
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2 or input_ids.dtype != torch.long:
        raise ValueError("input_ids: must be an int64 tensor [B, T] of unpadded rows, got "
                         f"{type(input_ids).__name__} {getattr(input_ids, 'shape', '')} {getattr(input_ids, 'dtype', '')}")
    if input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids: needs at least one row and one token, got shape {tuple(input_ids.shape)}")
    if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be an int >= 1, got {max_new_tokens!r}")
    dev = next(model.parameters()).device
    if input_ids.device != dev:
        raise ValueError(f"input_ids: on {input_ids.device}, the model is on {dev}")
    vocab = model.config.get_text_config().vocab_size
    if int(input_ids.min()) < 0 or int(input_ids.max()) >= vocab:
        raise ValueError(f"input_ids: token ids must be in [0, {vocab}), got [{int(input_ids.min())}, "
                         f"{int(input_ids.max())}]")
    if eos_token_id is not None:
        ids = [eos_token_id] if isinstance(eos_token_id, int) and not isinstance(eos_token_id, bool) else eos_token_id
        if not (isinstance(ids, (list, tuple)) and ids
                and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in ids)):
            raise ValueError(f"eos_token_id: must be a token id in [0, {vocab}), a non-empty list of them, or None, "
                             f"got {eos_token_id!r}")
    need = input_ids.shape[1] + max_new_tokens
    if max_cache_len is not None and max_cache_len < need:
        raise ValueError(f"max_cache_len: {max_cache_len} cannot hold the prompt ({input_ids.shape[1]}) and "
                         f"max_new_tokens ({max_new_tokens})")
    if not isinstance(check_every, int) or check_every < 1:
        raise ValueError(f"check_every: must be an int >= 1, got {check_every!r}")
    if not (isinstance(temperature, (int, float)) and temperature >= 0):
        raise ValueError(f"temperature: must be a number >= 0 (0: greedy), got {temperature!r}")
    if model.training:
        raise ValueError("model: in training mode; call model.eval() first (routed kernels run in eval only)")


def next_token(logits: torch.Tensor, temperature: float = 0.0,
               generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """``[B, 1]`` next tokens of ``logits [B, V]``: the argmax, or with ``temperature > 0`` a draw from
    ``softmax(logits / temperature)`` by Gumbel-max (no host sync, so decode steps stay asynchronous)."""
    if temperature == 0:
        return logits.argmax(-1, keepdim=True)
    gumbel = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_(generator=generator)
    return (logits.float() / temperature - gumbel.log_()).argmax(-1, keepdim=True)


@torch.inference_mode()
def generate(model: nn.Module, input_ids: torch.Tensor, *, max_new_tokens: int, eos_token_id: StopIds = None,
             pad_token_id: Optional[int] = None, graphs: Optional[bool] = None,
             max_cache_len: Optional[int] = None, check_every: int = 16, temperature: float = 0.0,
             generator: Optional[torch.Generator] = None, prefill: str = "routed") -> torch.Tensor:
    """Greedy continuation of ``input_ids``, decode steps replayed from a CUDA graph (see the module docstring).

    Args:
        model: An HF causal LM in eval mode, routed (``wide.load`` / ``enable_kernels``) or dense.
        input_ids: ``[B, T]`` int64 prompt tokens, no padding, on the model's device.
        max_new_tokens: Tokens to add per row.
        eos_token_id: A row that emits it (or any of a list of them: a chat model ends its turn with its own
            token, `stop_token_ids`) is finished: its later positions hold ``pad_token_id``; the loop stops once every
            row is finished (checked every ``check_every`` steps, one host sync each).
        pad_token_id: Filler after EOS (default: ``eos_token_id``, the first of a list).
        graphs: Capture and replay decode steps (default: on CUDA devices).
        max_cache_len: Static cache length (default: prompt + ``max_new_tokens``).
        check_every: Steps between EOS checks on the host.
        temperature: 0 for greedy; above 0, sample each token from ``softmax(logits / temperature)``.
        generator: The random generator of the sampling (on the model's device; default: torch's global one).
        prefill: ``"routed"`` or ``"dense"`` (the prompt with routing off, only decode steps routed; see `Generator`).

    Returns:
        ``[B, T + n]`` int64: the prompt and ``n <= max_new_tokens`` new tokens (``n`` is smaller only when
        every row finished early).
    """
    _check(model, input_ids, max_new_tokens, eos_token_id, max_cache_len, check_every, temperature)
    gen = Generator(model, batch_size=input_ids.shape[0], max_cache_len=max_cache_len or input_ids.shape[1] + max_new_tokens,
                    chunk=None, graphs=graphs, prefill=prefill)
    return gen._run(input_ids, max_new_tokens, eos_token_id, pad_token_id, check_every, temperature, generator)


def cache_kwarg(model: nn.Module) -> str:
    """The forward keyword that takes a KV cache: ``cache`` from transformers 5.2x on (``past_key_values`` still
    works there with a deprecation warning, until 5.40), ``past_key_values`` before."""
    return _cache_kwarg_of(type(model))


@functools.lru_cache(maxsize=None)
def _cache_kwarg_of(cls: type) -> str:
    return "cache" if "cache" in inspect.signature(cls.forward).parameters else "past_key_values"

def stop_token_ids(tokenizer, model: Optional[nn.Module] = None) -> list[int]:
    """The tokens that end a completion: the tokenizer's EOS first, then the model's generation EOS ids (a chat
    model ends its turn with its own: Qwen2.5's ``<|im_end|>`` beside ``<|endoftext|>``). Every loop that stops on
    EOS takes the whole list: on the first alone, chat answers ran to ``max_new_tokens`` (`wide data generate` made
    444 tokens/s on an H200 that way)."""
    ids = [getattr(tokenizer, "eos_token_id", None)]
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids += list(extra) if isinstance(extra, (list, tuple)) else [extra]
    return list(dict.fromkeys(i for i in ids if isinstance(i, int) and not isinstance(i, bool)))


def cut_at_stop(tokens: list[int], stops, keep: bool = True) -> list[int]:
    """``tokens`` up to the first of ``stops``, which ``keep`` includes (all of them when none occurs)."""
    stop = set(stops)
    for i, tok in enumerate(tokens):
        if tok in stop:
            return tokens[:i + keep]
    return tokens


PREFILL_MODES = ("routed", "dense")  # `Generator`'s ``prefill``: how the prompt runs (the decode steps are routed)
DEFAULT_CHUNKS = (1024, 512, 256, 128)  # `Generator`'s chunk sizes (those longer than its cache are left out)
DENSE_WHOLE_FROM = 2048  # prompts a model without routed kernels runs as one eager forward, from this length


class _Chunk:
    """One prompt-chunk size: its input buffers and, once captured, its graph and that graph's logits."""

    def __init__(self, size: int, batch: int, device: torch.device):
        self.size = size
        self.ids = torch.zeros(batch, size, dtype=torch.long, device=device)  # the chunk's tokens
        self.pos = torch.arange(size, device=device)  # ... their positions
        self.last = torch.zeros(1, dtype=torch.long, device=device)  # ... the index of the last real one
        self.graph = self.logits = None


class Generator:
    """Greedy generation that keeps its static cache and CUDA graphs from one call to the next.

    A prompt runs as chunks: as many of the largest size in ``chunk`` as fit, then the remainder in the smallest
    size that holds it (filled up with copies of its last token, whose keys the decode steps overwrite before
    anything reads them); where that last chunk would overrun the cache, the remainder is cut into smaller sizes
    (and where no sizes fit, the prompt runs as one eager forward). Each size is captured once, on first use,
    after one eager chunk of that size (which compiles the kernels); the decode step likewise. Later calls only
    replay. Prompts of at least ``whole_from`` tokens run as one eager forward instead. By default a model with routed kernels always chunks (its routed
    attention reads only each chunk's visible keys, and chunks of 1024 beat one eager forward up to 4k tokens on
    an H200, BENCHMARKS.md), and any other model chunks below 2048 tokens (HF's attention over a static cache
    with a chunk's mask reads every cached position, so from there one eager forward is faster). ``chunk=None``
    runs every prompt as one eager forward (what `wide.generate` does).

    Args:
        model: An HF causal LM in eval mode, routed or dense. Routed models with batch-coherent decode must
            keep no activation memory across steps (``memory=0``, the default): a new call restarts the
            selection schedule, not a memory of the previous call's steps.
        batch_size: Rows of every call's prompts (unpadded, all of one length).
        max_cache_len: Positions in the static cache: every call's prompt (rounded up to its chunks) and its
            new tokens must fit.
        chunk: Prompt chunk size(s) in tokens, one graph each (``None``: no chunks; default 1024, 512, 256 and 128,
            those up to ``max_cache_len``).
        whole_from: Prompts at least this long run as one eager forward (``None``: always chunks; ``"auto"``,
            the default: ``None`` with routed kernels enabled, else 2048).
        graphs: Capture and replay (default: on CUDA devices).
        prefill: ``"routed"`` (default), or ``"dense"``: the prompt with routing off (the dense model's cache and first
            token, at dense prefill cost), only the decode steps routed; no prompt token runs as a decode step.

    Example:
        >>> gen = wide.Generator(model, batch_size=1, max_cache_len=4096)
        >>> out = gen.generate(ids, max_new_tokens=128, eos_token_id=tok.eos_token_id)
    """

    def __init__(self, model: nn.Module, *, batch_size: int, max_cache_len: int,
                 chunk: Union[int, Sequence[int], None] = DEFAULT_CHUNKS, whole_from: Union[int, str, None] = "auto",
                 graphs: Optional[bool] = None, prefill: str = "routed"):
        from transformers import StaticCache

        for name, v in (("batch_size", batch_size), ("max_cache_len", max_cache_len)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
        sizes = (chunk,) if isinstance(chunk, int) else tuple(chunk) if chunk is not None else ()
        if chunk is DEFAULT_CHUNKS:
            sizes = tuple(c for c in sizes if c <= max_cache_len) or (max_cache_len,)
        if chunk is not None and (not sizes or any(not isinstance(c, int) or isinstance(c, bool)
                                                   or not 1 <= c <= max_cache_len for c in sizes)):
            raise ValueError(f"chunk: must be None or ints in [1, max_cache_len={max_cache_len}], got {chunk!r}")
        if whole_from == "auto":
            routed = any(getattr(m, "kernels_enabled", False) for m in model.modules())
            whole_from = None if routed else DENSE_WHOLE_FROM
        elif whole_from is not None and (not isinstance(whole_from, int) or isinstance(whole_from, bool)
                                         or whole_from < 1):
            raise ValueError(f"whole_from: must be None, 'auto' or an int >= 1, got {whole_from!r}")
        if prefill not in PREFILL_MODES:
            raise ValueError(f"prefill: must be one of {', '.join(PREFILL_MODES)}, got {prefill!r}")
        if model.training:
            raise ValueError("model: in training mode; call model.eval() first (routed kernels run in eval only)")
        dev = next(model.parameters()).device
        graphs = dev.type == "cuda" if graphs is None else graphs
        if graphs and dev.type != "cuda":
            raise ValueError(f"graphs: CUDA graphs need a CUDA device, the model is on {dev}")
        runtime = getattr(model, "wide_runtime", None)
        coherent = getattr(runtime, "coherent", None)
        if coherent is not None and coherent.memory > 0 and sizes:
            raise ValueError(f"model: batch-coherent decode with memory={coherent.memory} would carry its activation "
                             "memory from one call into the next; use memory=0 or wide.generate")
        self.model, self.batch_size, self.max_cache_len, self.graphs = model, batch_size, max_cache_len, graphs
        self.sizes = tuple(sorted(set(sizes), reverse=True))
        self.whole_from = whole_from
        self.device = dev
        self.runtime = runtime
        self.prefill = prefill
        self.cache = StaticCache(config=model.config, max_cache_len=max_cache_len)
        self._kw = cache_kwarg(model)
        if sizes and any(getattr(layer, "is_sliding", False) for layer in getattr(self.cache, "layers", [])):
            raise ValueError("chunk: the model has sliding-window layers, whose cache cannot take a filled-up last "
                             "chunk back; use chunk=None")
        self._chunks: dict[int, _Chunk] = {}
        self._tok = torch.zeros(batch_size, 1, dtype=torch.long, device=dev)  # a decode step's input
        self._pos = torch.zeros(1, dtype=torch.long, device=dev)  # ... and its position
        self._step_graph = self._step_logits = None
        self._eager_step = False  # the decode step has run eagerly once (compiled kernels, made buffers)
        self._keep: list = []  # decode-time state tensors the decode graph reads (kept alive across calls)

    def plan(self, tokens: int) -> list[int]:
        """The chunk sizes a prompt of ``tokens`` runs as (``[]``: one eager forward)."""
        if not self.sizes or (self.whole_from is not None and tokens >= self.whole_from):
            return []
        big = self.sizes[0]
        out = [big] * (tokens // big)
        rest, room = tokens - big * len(out), self.max_cache_len - big * len(out)
        while rest:
            fits = [c for c in self.sizes if rest <= c <= room]
            if fits:  # the rest in one chunk, filled up, within the cache
                out.append(min(fits))
                break
            # no size holds the rest within the cache: the largest size below it, then what is left
            below = [c for c in self.sizes if c <= rest]
            if not below:
                return []  # chunks cannot fit this prompt in the cache: one eager forward
            out.append(max(below))
            rest, room = rest - out[-1], room - out[-1]
        return out

    def compare(self, prompts: Sequence[torch.Tensor], *, max_new_tokens: int, warmup: bool = True):
        """Tokens/s of the routed model against its dense backbone on the same prompts, greedy.

        The dense side is this model with routing off (every group runs HF's own ops on the same weights) in a
        `Generator` of its own with this one's sizes and graph setting; both sides decode exactly
        ``max_new_tokens`` tokens (EOS ignored) and, with ``warmup``, first run each prompt untimed (which captures
        the graphs). See `wide.modeling.compare`.

        Args:
            prompts: ``[batch_size, T]`` int64 prompts (unpadded) on the model's device; ``T`` may differ between them.
            max_new_tokens: Tokens each side adds per row.
            warmup: Run every prompt on each side once, untimed, before timing.

        Returns:
            A `wide.modeling.compare.GenerationComparison`: per prompt, both sides' tokens and seconds, the routed
            model's realized skip rates and how far the greedy tokens agree; totals; ``.to_dict()`` for JSON.
        """
        from wide.modeling.compare import compare_generation

        return compare_generation(self, prompts, max_new_tokens, warmup=warmup)

    def _dense_twin(self) -> "Generator":
        """The `Generator` `compare` runs the dense side through (made once, so its graphs are kept too)."""
        twin = getattr(self, "_dense", None)
        if twin is None:
            twin = self._dense = Generator(self.model, batch_size=self.batch_size, max_cache_len=self.max_cache_len,
                                           chunk=self.sizes or None, whole_from=DENSE_WHOLE_FROM, graphs=self.graphs)
        return twin

    # ---- forwards -------------------------------------------------------------------------------

    def _chunk_forward(self, c: _Chunk) -> torch.Tensor:
        return self.model(input_ids=c.ids, **{self._kw: self.cache}, use_cache=True, cache_position=c.pos,
                          logits_to_keep=c.last).logits

    def _step(self) -> torch.Tensor:
        return self.model(input_ids=self._tok, **{self._kw: self.cache}, use_cache=True,
                          cache_position=self._pos).logits

    @contextlib.contextmanager
    def _chunks_trusted(self):
        """Prompt chunks made here carry HF's plain causal masks: routed attention may take them under capture."""
        if self.runtime is None:
            yield
            return
        old = self.runtime.causal_chunks
        self.runtime.causal_chunks = True
        try:
            yield
        finally:
            self.runtime.causal_chunks = old

    def _capture(self, fn: Callable[[], torch.Tensor], what: str):
        """``(graph, its output)`` of ``fn`` (which the caller has run eagerly once), or ``(None, None)`` with a
        warning when it cannot be captured."""
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fn()
            return graph, out
        except Exception as err:  # noqa: BLE001 - something in the forward syncs with the host: stay eager
            warnings.warn(f"wide.Generator: the {what} could not be captured in a CUDA graph "
                          f"({type(err).__name__}: {str(err)[:200]}); running it eagerly", stacklevel=4)
            torch.cuda.synchronize()
            return None, None

    def _side(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        """``fn`` eagerly on a side stream (the warm-up before a capture, as CUDA graphs want it)."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = fn()
        torch.cuda.current_stream().wait_stream(side)
        return out

    def _set_length(self, n: int) -> None:
        """Sets the static cache's write position (transformers' static layers write at their own device counter,
        not at ``cache_position``): 0 for a new prompt, the prompt's length after a filled-up last chunk."""
        for layer in getattr(self.cache, "layers", []):
            held = getattr(layer, "cumulative_length", None)
            if isinstance(held, torch.Tensor):
                held.fill_(n)  # in place: captured graphs hold its address
            elif isinstance(held, int):
                layer.cumulative_length = n

    def _prefill(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Runs the prompt into the cache; returns the last prompt token's logits ``[B, V]``."""
        T = input_ids.shape[1]
        self._set_length(0)
        plan = self.plan(T)
        if not plan:
            return self.model(input_ids=input_ids, **{self._kw: self.cache}, use_cache=True, logits_to_keep=1,
                              cache_position=torch.arange(T, device=self.device)).logits[:, -1]
        logits, start = None, 0
        with self._chunks_trusted():
            for size in plan:
                c = self._chunks.get(size)
                if c is None:
                    c = self._chunks[size] = _Chunk(size, self.batch_size, self.device)
                n = min(size, T - start)
                c.ids[:, :n].copy_(input_ids[:, start:start + n])
                if n < size:  # filler: keys written past the prompt are overwritten by the decode steps before use
                    c.ids[:, n:].copy_(input_ids[:, start + n - 1:start + n].expand(-1, size - n))
                c.pos.copy_(torch.arange(start, start + size, device=self.device))
                c.last.fill_(n - 1)
                if c.graph is not None:
                    c.graph.replay()
                    logits = c.logits
                elif self.graphs:
                    logits = self._side(lambda: self._chunk_forward(c)).clone()  # compiles the kernels: then capture
                    c.graph, c.logits = self._capture(lambda: self._chunk_forward(c), f"prompt chunk of {size}")
                    if c.graph is None:
                        self.graphs = False
                else:
                    logits = self._chunk_forward(c)
                start += n
        self._set_length(T)  # the decode steps write over the last chunk's filler
        return logits[:, -1]

    def _prompt(self, input_ids: torch.Tensor) -> torch.Tensor:
        """`_prefill`, with routing off for ``prefill="dense"``: the routed prefill's sequence start (an unpadded
        batch) is made first, so the decode steps see the state a routed prompt would have left."""
        runtime = self.runtime
        if self.prefill != "dense" or runtime is None or not runtime.routing:
            return self._prefill(input_ids)
        runtime.begin_forward(None, input_ids.shape[1])
        with runtime.routing_off():
            return self._prefill(input_ids)

    def _keep_state(self) -> None:
        """Holds the routed layers' decode-time state (coherent selections) that a captured step reads."""
        self._keep = [dict(state) for wl in getattr(self.runtime, "layers", []) or []
                      for state in getattr(wl, "_coherent", {}).values()]

    def _restart_state(self) -> None:
        """A new sequence: the coherent selection's schedule starts again (the decode graph's state, in place)."""
        for state in self._keep:
            restart_schedule(state)

    # ---- the loop -------------------------------------------------------------------------------

    @torch.inference_mode()
    def generate(self, input_ids: torch.Tensor, *, max_new_tokens: int, eos_token_id: StopIds = None,
                 pad_token_id: Optional[int] = None, check_every: int = 16, temperature: float = 0.0,
                 generator: Optional[torch.Generator] = None,
                 tails: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """Greedy (or sampled) continuation of ``input_ids [batch_size, T]``; arguments and result as in
        `wide.generate`. ``tails``: prompt tokens past ``input_ids`` that rows feed through their first decode steps
        (``(tokens [batch_size, E], counts [batch_size])``, see `_run`; `wide.modeling.batched.generate_many`)."""
        _check(self.model, input_ids, max_new_tokens, eos_token_id, self.max_cache_len, check_every, temperature)
        if input_ids.shape[0] != self.batch_size:
            raise ValueError(f"input_ids: {input_ids.shape[0]} rows, this Generator was made for batch_size="
                             f"{self.batch_size}")
        if tails is not None and not (tails[0].shape[0] == tails[1].shape[0] == self.batch_size
                                      and tails[0].shape[1] <= max_new_tokens):
            raise ValueError(f"tails: [{self.batch_size}, E <= max_new_tokens] tokens and [{self.batch_size}] counts, "
                             f"got {tuple(tails[0].shape)} and {tuple(tails[1].shape)}")
        if tails is not None and self.prefill == "dense":
            raise ValueError("tails: they feed prompt tokens through routed decode steps; a Generator with "
                             "prefill='dense' takes whole prompts only")
        return self._run(input_ids, max_new_tokens, eos_token_id, pad_token_id, check_every, temperature, generator,
                         tails)

    def _run(self, input_ids: torch.Tensor, max_new_tokens: int, eos_token_id: StopIds,
             pad_token_id: Optional[int], check_every: int, temperature: float = 0.0,
             generator: Optional[torch.Generator] = None,
             tails: Optional[tuple[torch.Tensor, torch.Tensor]] = None) -> torch.Tensor:
        """``tails``: ``(tokens [B, E], counts [B])``, prompt tokens past ``input_ids`` that row ``b`` feeds through
        its first ``counts[b]`` decode steps instead of its own predictions (prompts of different lengths in one
        unpadded batch: `wide.modeling.batched.generate_many`); they are written to the output like generated
        tokens, and a stop token among them does not end the row."""
        dev = input_ids.device
        B, T = input_ids.shape
        stops = None if eos_token_id is None else torch.tensor(
            [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id), dtype=torch.long, device=dev)
        pad = (int(stops[0]) if stops is not None else None) if pad_token_id is None else pad_token_id
        out = torch.empty(B, T + max_new_tokens, dtype=torch.long, device=dev)
        out[:, :T] = input_ids
        forced_steps = 0 if tails is None else tails[0].shape[1]

        def force(i: int) -> None:
            """Puts row b's prompt token ``i`` past ``input_ids`` in ``_tok`` where ``i < counts[b]``."""
            if i < forced_steps:
                self._tok[:, 0] = torch.where(i < tails[1], tails[0][:, i], self._tok[:, 0])

        self._tok.copy_(next_token(self._prompt(input_ids), temperature, generator))
        force(0)
        self._pos.fill_(T)
        self._restart_state()
        done = torch.zeros(B, dtype=torch.bool, device=dev)

        def emit(i: int, logits: Optional[torch.Tensor]) -> None:
            """Writes token ``i`` (held in ``_tok``), then the next step's input and position."""
            nonlocal done
            tok = self._tok[:, 0]
            if stops is not None:
                out[:, T + i] = torch.where(done, torch.full_like(tok, pad), tok)
                stopped = torch.isin(tok, stops)
                done = done | (stopped if i >= forced_steps else stopped & (i >= tails[1]))
            else:
                out[:, T + i] = tok
            if logits is not None:
                self._tok.copy_(next_token(logits[:, -1], temperature, generator))
                force(i + 1)
                self._pos.add_(1)

        n = max_new_tokens
        for i in range(max_new_tokens):
            if stops is not None and i and i % check_every == 0 and bool(done.all()):
                n = i
                break
            if i == max_new_tokens - 1:
                emit(i, None)
                break
            if self._step_graph is not None:
                self._step_graph.replay()
                emit(i, self._step_logits)
            elif self.graphs and self._eager_step:
                # an earlier step ran eagerly (compiled the kernels, made their buffers): capture this one
                self._step_graph, self._step_logits = self._capture(self._step, "decode step")
                if self._step_graph is None:
                    self.graphs = False
                    emit(i, self._step())
                    continue
                self._keep_state()
                self._step_graph.replay()
                emit(i, self._step_logits)
            elif self.graphs:
                emit(i, self._side(self._step))
                self._eager_step = True
            else:
                emit(i, self._step())
        return out[:, :T + n]

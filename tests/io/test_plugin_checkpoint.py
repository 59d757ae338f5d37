"""A router given by ``class_path`` in YAML (the README's plug-in): `wide fit` trains it, and its checkpoint
evaluates (`wide eval`), exports (`wide export`) and reloads (`wide.load`) with the logits it was evaluated
with; a plug-in module that cannot be imported is one error line naming the class path, wherever it is met."""

import importlib
import json
import re
import sys

import pytest
import torch

import wide
from tests.eval.fakes import build_fake_olmo_eval
from tests.reliability.conftest import LORA_RECIPE, fit_args, run_wide
from wide.cli import main

MODULE = "wide_plugin_io_routers"
PLUGIN = '''
import torch
import wide


class MyRouter(wide.Router):
    def __init__(self, spec, hidden: int = 64):
        super().__init__(spec)
        self.net = torch.nn.Sequential(torch.nn.Linear(spec.hidden_size, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 2 * spec.num_groups))

    def forward(self, hidden):
        return self.net(hidden.float()).unflatten(-1, (self.num_groups, 2))
'''


def recipe(path, class_path: str):
    path.write_text(
        "model:\n"
        "  class_path: wide.tasks.RouterCalibration\n"
        "  init_args:\n"
        "    routing:\n"
        "      router:\n"
        f"        class_path: {class_path}\n"
        "        init_args: {hidden: 16}\n"
    )
    return path


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """The throw-away plug-in module, importable for this module's tests."""
    folder = tmp_path_factory.mktemp("plugin")
    (folder / f"{MODULE}.py").write_text(PLUGIN)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        yield folder
    sys.modules.pop(MODULE, None)


@pytest.fixture(scope="module")
def trained(plugin_dir, tmp_path_factory, tiny_model_dir, tiny_corpus):
    """`wide fit` of the plug-in router for 2 steps on the tiny model: its routers.safetensors."""
    out = tmp_path_factory.mktemp("plugin-fit")
    cfg = recipe(out / "plugin.yaml", f"{MODULE}.MyRouter")
    assert main(fit_args(out, tiny_model_dir, tiny_corpus, "--trainer.max_steps", "2",
                         "--trainer.limit_val_batches", "0", recipe=cfg)) == 0
    path = out / "wide" / "routers.safetensors"
    assert path.is_file()
    return path


@pytest.fixture
def unimportable(plugin_dir, monkeypatch):
    """The plug-in's module gone, as on a machine where its package is not installed."""
    monkeypatch.delitem(sys.modules, MODULE, raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p != str(plugin_dir)])
    importlib.invalidate_caches()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_plugin_checkpoint_evaluates(trained, tmp_path, capsys, monkeypatch):
    cache = tmp_path / "cache"
    build_fake_olmo_eval(cache)
    monkeypatch.setenv("WIDE_CACHE", str(cache))
    out = tmp_path / "ev"
    rc = main(["eval", "--checkpoint", str(trained), "--tasks", "boolq", "--limit", "2", "--ppl-source", "none",
               "--device", "cpu", "--output", str(out)])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((out / "results.json").read_text())
    assert result["model"]["method"] == "width/MyRouter" and result["model"]["checkpoint"]["step"] == 2
    assert result["model"]["routing"]["router"] == {"class_path": f"{MODULE}.MyRouter", "init_args": {"hidden": 16}}
    assert result["tasks"]["boolq"]["n"] == 2 and 0 <= result["tasks"]["boolq"]["sparsity"]["sparsity"] <= 1


def test_plugin_checkpoint_exports_and_reloads_with_equal_logits(trained, tmp_path, capsys):
    from safetensors.torch import load_file

    from wide.io import load_model

    out = tmp_path / "exported"
    assert main(["export", "--checkpoint", str(trained), "--out", str(out)]) == 0, capsys.readouterr().err
    assert "width/MyRouter" in capsys.readouterr().out
    ref = load_model(checkpoint=str(trained), device="cpu").model  # as `wide eval` scored it
    got = wide.load(out, kernels=False)
    router = got.model.layers[0].wide.routers["ffn"]
    assert type(router).__module__ == MODULE and type(router).__name__ == "MyRouter" and router.net[0].out_features == 16
    saved = load_file(str(trained))
    params = dict(got.named_parameters())
    assert saved and all(torch.equal(params[k], v) for k, v in saved.items()), "the trained router tensors reload"
    ids = torch.randint(3, 90, (2, 11), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(_logits(got, ids), _logits(ref, ids))
    torch.testing.assert_close(_logits(wide.load(out), ids), _logits(ref, ids))  # the routed kernels too


def test_unimportable_class_path_at_config_parse(plugin_dir, tmp_path, tiny_model_dir, tiny_corpus, capsys):
    cfg = recipe(tmp_path / "missing.yaml", "wide_plugin_missing.routers.MyRouter")
    rc, err = run_wide(fit_args(tmp_path, tiny_model_dir, tiny_corpus, recipe=cfg), capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 1 and lines == [
        "wide fit: error: router: class_path 'wide_plugin_missing.routers.MyRouter' cannot be imported "
        "(No module named 'wide_plugin_missing'); install its package or put it on PYTHONPATH"], err


def test_unimportable_class_path_at_checkpoint_load(trained, unimportable, tmp_path, tiny_model_dir, tiny_corpus,
                                                    capsys):
    name = f"{MODULE}.MyRouter"
    want = f"router: class_path '{name}' cannot be imported (No module named '{MODULE}')"
    with pytest.raises(ValueError, match="^" + re.escape(f"checkpoint: {trained}: {want}")):
        wide.io.read_metadata(trained)
    for argv in (["eval", "--checkpoint", str(trained), "--device", "cpu", "--limit", "1"],
                 ["export", "--checkpoint", str(trained), "--out", str(tmp_path / "o")]):
        rc, err = run_wide(argv, capsys)
        lines = [line for line in err.splitlines() if line.strip()]
        assert rc == 2 and len(lines) == 1 and lines[0].startswith(f"wide {argv[0]}: error: checkpoint: "), err
        assert want in lines[0]
    # stage 2 from this stage-1 checkpoint: `wide fit` stops with the same line
    rc, err = run_wide(fit_args(tmp_path, tiny_model_dir, tiny_corpus, "--model.init_args.router_checkpoint",
                                str(trained), recipe=LORA_RECIPE), capsys)
    lines = [line for line in err.splitlines() if line.startswith("wide fit: error: ")]
    assert rc == 1 and len(lines) == 1 and want in lines[0], err


def test_unimportable_class_path_in_an_exported_folder(trained, tmp_path, capsys, request):
    out = tmp_path / "exported"
    assert main(["export", "--checkpoint", str(trained), "--out", str(out)]) == 0
    request.getfixturevalue("unimportable")
    with pytest.raises(ValueError, match=f"router: class_path '{MODULE}.MyRouter' cannot be imported"):
        wide.load(out)
    rc, err = run_wide(["generate", str(out), "--prompt", "the cat", "--device", "cpu"], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1 and f"class_path '{MODULE}.MyRouter' cannot be imported" in lines[0], err

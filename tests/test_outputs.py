"""Every command checks its output paths before any compute: a file where a folder is expected, a folder it cannot
write into, results it would overwrite without --force; one line naming the flag."""

import pytest

from wide.cli import main


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "results.json"
    path.write_text("{}")
    return path


def _one_line(capsys, flag: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and flag in err, err
    return err


def test_eval_output_file_is_refused_before_loading(a_file, capsys, monkeypatch):
    monkeypatch.setattr("wide.io.loading.load_model", lambda *a, **k: pytest.fail("loaded a model"))
    assert main(["eval", "--output", str(a_file), "--device", "cpu"]) == 2
    assert "takes a folder" in _one_line(capsys, "--output")


def test_eval_output_with_results_needs_force(tmp_path, capsys):
    out = tmp_path / "ev"
    out.mkdir()
    (out / "results.json").write_text("{}")
    assert main(["eval", "--output", str(out), "--tasks", "piqa"]) == 2
    assert "pass --force" in _one_line(capsys, "--output")
    # with --force the folder passes; the next check (a bad task) answers instead, still before any model loads
    assert main(["eval", "--output", str(out), "--force", "--tasks", "nosuch"]) == 2
    err = capsys.readouterr().err
    assert "--output" not in err and "nosuch" in err


def test_eval_output_under_a_file_or_unwritable(a_file, tmp_path, capsys, monkeypatch):
    assert main(["eval", "--output", str(a_file / "sub")]) == 2
    assert "is a file" in _one_line(capsys, "--output")
    monkeypatch.setattr("wide.outputs.os.access", lambda path, mode: False)  # tests run as root: fake the refusal
    assert main(["eval", "--output", str(tmp_path / "new" / "ev")]) == 2
    assert "cannot write into" in _one_line(capsys, "--output")


def test_export_out(a_file, tmp_path, capsys):
    assert main(["export", "--checkpoint", "nowhere.safetensors", "--out", str(a_file)]) == 2
    assert "takes a folder" in _one_line(capsys, "--out")
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    assert main(["export", "--checkpoint", "nowhere.safetensors", "--out", str(full)]) == 2
    assert "pass --force" in _one_line(capsys, "--out")


def test_generate_json_folder(tmp_path, capsys):
    assert main(["generate", str(tmp_path), "--prompt", "hi", "--json", str(tmp_path)]) == 2
    assert "takes a file name" in _one_line(capsys, "--json")


def test_bench_json_folder(tmp_path):
    with pytest.raises(SystemExit, match="--json: .* is a folder"):
        main(["bench", "--json", str(tmp_path), "--device", "cpu"])


def test_data_generate_out_file(a_file, capsys):
    assert main(["data", "generate", "--out", str(a_file)]) == 2
    assert "takes a folder" in _one_line(capsys, "--out")


def test_grid_output_file(a_file, tmp_path, tiny_model_dir, tiny_corpus, capsys):
    from tests.grid.grids import write_grid

    grid = write_grid(tmp_path / "g.yaml", tiny_model_dir, tiny_corpus,
                      axes=[{"name": "sparsity", "key": "model.init_args.routing.sparsity", "values": [0.5]}])
    assert main(["grid", str(grid), "--output", str(a_file)]) == 2
    assert "takes a folder" in _one_line(capsys, "--output")


def test_assets_cache_file(a_file, capsys, monkeypatch):
    monkeypatch.setenv("WIDE_CACHE", str(a_file))
    assert main(["assets", "fetch", "smollm2-135m"]) == 1
    assert "takes a folder" in _one_line(capsys, "$WIDE_CACHE")
    assert main(["assets", "fetch", "smollm2-135m", "smolm2"]) == 1  # every name checked before any download
    assert "Did you mean" in _one_line(capsys, "smolm2")

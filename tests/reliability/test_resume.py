"""A run killed mid-training resumes with ``--ckpt_path last`` and ends bit-identical to an uninterrupted one.

Three things make that exact on CPU: ``last.ckpt`` restores the optimizer, LR schedule and loop counters;
the training loader's position is in ``last.ckpt`` (``wide.data.resumable``), so the resumed run sees
the same next batches; and the Gumbel noise / dropout RNG is re-seeded per batch from (seed, epoch,
batch, rank) (``WideTask.on_train_batch_start``), because Lightning does not restore RNG state.
"""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.reliability.conftest import fit_args, run_wide, run_wide_subprocess
from wide.io.checkpoint import read_metadata

# 200 training tokens = 6 rows of 32 = 3 batches per epoch: 8 steps cross two epoch boundaries
RUN = ["--trainer.max_steps", "8", "--data.max_train_tokens", "200", "--wide_checkpoint.every_n_steps", "2",
       "--trainer.val_check_interval", "3", "--trainer.limit_val_batches", "1"]


def test_killed_run_resumes_bit_exact(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    full, crashed = tmp_path / "full", tmp_path / "crashed"
    assert run_wide(fit_args(full, tiny_model_dir, tiny_corpus, *RUN), capsys)[0] == 0

    kill = ["--trainer.callbacks", "tests.reliability.faults.HardExit", "--trainer.callbacks.at_step", "5"]
    proc = run_wide_subprocess(fit_args(crashed, tiny_model_dir, tiny_corpus, *RUN, *kill))
    assert proc.returncode == 137, proc.stderr[-3000:]
    assert read_metadata(crashed / "wide/routers.safetensors")["step"] == 4, "the last good files survive the kill"
    assert torch.load(crashed / "wide/last.ckpt", weights_only=True)["global_step"] == 4
    assert not list((crashed / "wide").glob("*.tmp")) and not list((crashed / "wide").glob(".*.tmp"))

    rc, err = run_wide(fit_args(crashed, tiny_model_dir, tiny_corpus, *RUN, "--ckpt_path", "last"), capsys)
    assert rc == 0, err[-3000:]
    a, b = load_file(full / "wide/routers.safetensors"), load_file(crashed / "wide/routers.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), "router tensors differ after resume"
    assert read_metadata(crashed / "wide/routers.safetensors")["step"] == 8
    ckpt = torch.load(crashed / "wide/last.ckpt", weights_only=True)
    ref = torch.load(full / "wide/last.ckpt", weights_only=True)
    assert ckpt["global_step"] == ref["global_step"] == 8 and ckpt["epoch"] == ref["epoch"]
    assert ckpt["wide"]["tau"] == ref["wide"]["tau"] == 0.5, "the temperature schedule ends at the same point"
    assert ckpt["lr_schedulers"][0]["last_epoch"] == ref["lr_schedulers"][0]["last_epoch"]
    for k, v in ref["optimizer_states"][0]["state"].items():
        assert torch.equal(v["exp_avg_sq"], ckpt["optimizer_states"][0]["state"][k]["exp_avg_sq"])


def test_resume_checkpoint_of_another_config_is_refused(tmp_path, tiny_model_dir, tiny_corpus, capsys):
    run = ["--trainer.max_steps", "2", "--wide_checkpoint.every_n_steps", "2", "--trainer.limit_val_batches", "0"]
    assert run_wide(fit_args(tmp_path, tiny_model_dir, tiny_corpus, *run), capsys)[0] == 0
    # the given config must match the checkpoint's, for `last` as for a file path (LightningCLI alone would
    # adopt a file's model hyperparameters and drop the overrides)
    other = fit_args(tmp_path / "b", tiny_model_dir, tiny_corpus, *run, "--ckpt_path", "last",
                     "--model.init_args.routing.sparsity", "0.25")
    other[other.index("--wide_checkpoint.dirpath") + 1] = str(tmp_path / "wide")
    rc, err = run_wide(other, capsys)
    assert rc == 1
    assert ("wide fit: error: ckpt_path: the checkpoint was trained with other settings, and a resume continues the "
            "same run; routing.sparsity: checkpoint 0.5 vs run 0.25") in err
    torch.save({"state_dict": {}}, tmp_path / "plain.ckpt")
    rc, err = run_wide(fit_args(tmp_path / "c", tiny_model_dir, tiny_corpus, *run, "--ckpt_path",
                                str(tmp_path / "plain.ckpt")), capsys)
    assert rc == 1 and "not a wide resume checkpoint (no 'wide' entry)" in err


def test_loader_order_is_a_function_of_seed_epoch_and_position():
    from wide.data.resumable import ResumableLoader

    data = torch.arange(20)

    def epoch(loader, e):
        loader.sampler.set_epoch(e)
        return [b.tolist() for b in loader]

    loader = ResumableLoader(data, batch_size=3, seed=17)
    first, second = epoch(loader, 0), epoch(loader, 1)
    assert first != second and sorted(sum(first, [])) == list(range(20))
    gen = torch.Generator().manual_seed(17)  # epoch 0 is what a RandomSampler seeded with 17 gives
    assert sum(first, []) == torch.randperm(20, generator=gen).tolist()

    it = iter(loader)
    loader.sampler.set_epoch(1)
    [next(it) for _ in range(4)]
    state = loader.state_dict()
    assert state == {"epoch": 1, "samples": 12, "seed": 17}
    resumed = ResumableLoader(data, batch_size=3, seed=17)
    resumed.load_state_dict(state)
    assert epoch(resumed, 1) == second[4:] and len(resumed) == 7
    assert epoch(resumed, 2) == epoch(ResumableLoader(data, batch_size=3, seed=17), 2), "skip applies once"

    ranks = [ResumableLoader(data, batch_size=2, seed=17, num_replicas=2, rank=r) for r in (0, 1)]
    halves = [epoch(r, 1) for r in ranks]  # rank r takes every other row: one global batch of 4 = 2 x 2
    assert sorted(halves[0][0] + halves[1][0]) == sorted(sum(second, [])[:4])
    with pytest.raises(ValueError, match="data.seed: the checkpoint was written with seed 17"):
        ResumableLoader(data, batch_size=3, seed=18).load_state_dict(state)


def test_sparse_adapter_resumes_with_its_support_and_refuses_another_adapter(tmp_path, tiny_model_dir, tiny_corpus,
                                                                              capsys, caplog):
    """Stage 2 with ``adapter: super``: the Wanda support is chosen once; a resumed run restores it from
    ``last.ckpt`` instead of measuring again, and a resume under another adapter is refused by name."""
    import logging

    from transformers import AutoModelForCausalLM

    import wide
    from tests.reliability.conftest import LORA_RECIPE
    from wide.io.checkpoint import save_trained

    cfg = wide.WideConfig(attn_group_size=2, ffn_group_size=32)
    stage1 = save_trained(wide.apply_wide(AutoModelForCausalLM.from_pretrained(tiny_model_dir), cfg),
                          tmp_path / "stage1.safetensors", config=cfg, stage="calibrate")
    caplog.set_level(logging.INFO)

    def run(steps, *extra):
        return run_wide(fit_args(tmp_path, tiny_model_dir, tiny_corpus, "--model.init_args.router_checkpoint",
                                 str(stage1), "--model.init_args.adapter", "super", "--trainer.max_steps", str(steps),
                                 "--wide_checkpoint.every_n_steps", "2", "--trainer.limit_val_batches", "0", *extra,
                                 recipe=LORA_RECIPE), capsys)

    assert run(2)[0] == 0 and "chosen by Wanda scores" in caplog.text
    first = {k: v for k, v in load_file(tmp_path / "wide/routers.safetensors").items() if ".shira_indices." in k}
    caplog.clear()
    rc, err = run(4, "--ckpt_path", "last")
    assert rc == 0, err[-3000:]
    assert "chosen by Wanda scores" not in caplog.text, "a resumed run keeps the support it saved"
    final = load_file(tmp_path / "wide/routers.safetensors")
    assert read_metadata(tmp_path / "wide/routers.safetensors")["step"] == 4
    assert first and all(torch.equal(final[k], first[k]) for k in first)
    rc, err = run(6, "--ckpt_path", "last", "--model.init_args.adapter", "supra")
    assert rc == 1 and "ckpt_path:" in err and "adapter: checkpoint 'super' vs run 'supra'" in err

"""``--optimizer adam_foreach``: fairseq's Adam and gradient clipping on lists of tensors, bitwise equal to
fairseq's own on CPU (unit level, fp32 and fp16 parameters) and through fairseq-train."""

import copy
import json

import pytest
import torch

from conftest import BIN, TINY_MODEL, USER_DIR, run


def stepped(optimizer_class, params, grads_per_step, **options):
    optimizer = optimizer_class(params, lr=3e-3, betas=(0.9, 0.98), eps=1e-6, **options)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone().to(p.dtype)
        optimizer.step()
    return optimizer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_adam_foreach_is_bitwise_fairseqs_adam(dtype):
    from fairseq.optim.adam import Adam

    from deepnet_fairseq.optim.adam_foreach import AdamForeach

    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 7, 2), (1,)]
    start = [torch.randn(s).to(dtype) for s in shapes]
    grads_per_step = [[torch.randn(s) for s in shapes] for _ in range(4)]
    ours, theirs = [p.clone() for p in start], [p.clone() for p in start]
    ours_opt = stepped(AdamForeach, ours, grads_per_step, weight_decay=0.01)
    theirs_opt = stepped(Adam, theirs, grads_per_step, weight_decay=0.01)
    for a, b, first in zip(ours, theirs, start):
        assert torch.equal(a, b) and not torch.equal(a, first)
    for a, b in zip(ours, theirs):
        sa, sb = ours_opt.state[a], theirs_opt.state[b]
        assert sa["step"] == sb["step"] == 4
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
    # the state loads into fairseq's Adam and back (same layout)
    Adam(copy.deepcopy(theirs), lr=1e-3).load_state_dict(ours_opt.state_dict())


def train(data, save_dir, optimizer):
    proc = run([BIN / "fairseq-train", data, "--user-dir", USER_DIR, "--arch", "deepnet_transformer_iwslt_de_en",
                "--encoder-layers", "2", "--decoder-layers", "2", *TINY_MODEL, "--optimizer", optimizer,
                "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01", "--clip-norm", "0.5", "--lr", "2e-3",
                "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4", "--criterion",
                "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--max-tokens", "600", "--max-update", "8",
                "--seed", "1", "--cpu", "--log-format", "json", "--log-interval", "1", "--num-workers", "0",
                "--no-save", "--save-dir", save_dir])
    return [json.loads(line[line.index("{"):]) for line in (proc.stdout + proc.stderr).splitlines()
            if "| train_inner |" in line]


@pytest.mark.slow  # ~30 s of fairseq-train; make test keeps the bitwise test
def test_fairseq_train_with_adam_foreach_logs_adams_losses_and_gradient_norms(multi30k_bin, tmp_path):
    ours, theirs = train(multi30k_bin, tmp_path / "a", "adam_foreach"), train(multi30k_bin, tmp_path / "b", "adam")
    assert len(ours) == len(theirs) == 8
    keys = ("loss", "nll_loss", "gnorm", "clip")
    assert [{k: r[k] for k in keys} for r in ours] == [{k: r[k] for k in keys} for r in theirs]
    assert float(ours[-1]["loss"]) < float(ours[0]["loss"]) and float(ours[0]["clip"]) == 100  # clipping ran


@pytest.mark.slow  # ~12 s; the bitwise test stays in make test
def test_gpu_checks_optimizer_stage_runs_on_cpu_and_sees_the_same_losses(tmp_path):
    """`STAGES=optim SMOKE=1 benchmarks/gpu_check.sh`: both models take the same steps from the same weights."""
    from conftest import ROOT

    run(["bash", ROOT / "benchmarks" / "gpu_check.sh", tmp_path], cwd=ROOT, env={"STAGES": "optim", "SMOKE": "1"})
    result = json.loads((tmp_path / "gpu_optim_smoke.json").read_text())["shapes"]["tiny"]
    assert result["labels"] == ["adam", "adam_foreach"]
    assert result["last_loss"]["adam"] == result["last_loss"]["adam_foreach"]  # bitwise-equal updates on CPU
    assert result["first_step"]["adam"]["loss"] == result["first_step"]["adam_foreach"]["loss"]

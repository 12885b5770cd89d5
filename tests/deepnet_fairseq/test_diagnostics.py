"""Stability diagnostics: the numbers behind the papers' claims on a tiny model, hook correctness,
and the criterion end to end through fairseq-train (loss unchanged, --update-freq, divergence guard)."""

import json
import math
import re

import pytest
import torch

from conftest import BIN, TINY_MODEL, USER_DIR, run

POST_LN, PRE_LN, DEEPNET = "transformer_iwslt_de_en", "preln_transformer_iwslt_de_en", "deepnet_transformer_iwslt_de_en"


def build(data, arch, depth, *extra, with_cfg=False):
    """fairseq's own build path (as fairseq-train): task, model, diagnostic criterion, first batches."""
    from fairseq import options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [
        str(data), "--user-dir", USER_DIR, "--arch", arch, "--encoder-layers", str(depth),
        "--decoder-layers", str(depth), *TINY_MODEL, "--dropout", "0.0", "--cpu", "--seed", "1",
        "--criterion", "diagnostic_label_smoothed_cross_entropy", "--label-smoothing", "0.1", *extra])
    cfg = convert_namespace_to_omegaconf(args)
    utils.set_torch_seed(1)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    batches = task.get_batch_iterator(task.dataset("train"), max_tokens=800, seed=1).next_epoch_itr(shuffle=False)
    samples = [next(batches) for _ in range(3)]
    return (model, criterion, samples, cfg) if with_cfg else (model, criterion, samples)


def grads_at_init(data, arch, depth):
    from deepnet_fairseq.instrumentation.monitors import GradNormMonitor

    torch.set_num_threads(1)
    model, criterion, samples = build(data, arch, depth)
    seen = {}
    monitor = GradNormMonitor(model, lambda norms, total: seen.update(norms, total=total))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    loss, sample_size, _ = criterion(model, samples[0])
    (loss / sample_size).backward()
    optimizer.step()
    monitor.remove()
    direct = torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]).norm().item()
    return seen, direct


def test_grad_norm_by_layer_grows_toward_the_top_for_postln_and_is_flat_for_preln(multi30k_bin):
    depth = 6
    post, post_direct = grads_at_init(multi30k_bin, POST_LN, depth)
    pre, _ = grads_at_init(multi30k_bin, PRE_LN, depth)
    assert post["total"] == pytest.approx(post_direct, rel=1e-5)  # the hook sees the gradient torch computed
    post_dec = [post[f"dec{i}_ffn"] for i in range(depth)]
    pre_dec = [pre[f"dec{i}_ffn"] for i in range(depth)]
    pre_enc = [pre[f"enc{i}_ffn"] for i in range(depth)]
    print("Post-LN decoder FFN", post_dec, "\nPre-LN decoder FFN", pre_dec, "\nPre-LN encoder FFN", pre_enc)
    # Post-LN (Xiong et al. Fig. 3): larger toward the output, mostly monotone
    assert post_dec[-1] / post_dec[0] > 3
    assert sum(b > a for a, b in zip(post_dec, post_dec[1:])) >= depth - 2
    # Pre-LN: flat within a bound, and not growing toward the top
    assert max(pre_dec) / min(pre_dec) < 2.5
    assert pre_dec[-1] / pre_dec[0] < 1.5 and pre_enc[-1] / pre_enc[0] < 1.5


def update_norm_after(data, arch, depth, steps=1, lr=2e-4):
    from deepnet_fairseq.instrumentation.monitors import UpdateNormProbe

    torch.set_num_threads(1)
    model, criterion, samples = build(data, arch, depth)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, betas=(0.9, 0.98))
    probe = UpdateNormProbe()
    assert probe.measure(model, samples[0]) == 0.0
    for sample in samples[:steps]:
        optimizer.zero_grad()
        loss, sample_size, _ = criterion(model, sample)
        (loss / sample_size).backward()
        optimizer.step()
    return probe.measure(model, samples[1])  # the probe batch stays the first one


def test_update_norm_grows_with_depth_more_for_postln_than_deepnet(multi30k_bin):
    # one small Adam step: the LayerNorm-bounded output does not saturate yet (it does after a few at 1e-3)
    ratio = {}
    for arch in (POST_LN, DEEPNET):
        shallow, deep = update_norm_after(multi30k_bin, arch, 2), update_norm_after(multi30k_bin, arch, 8)
        ratio[arch] = deep / shallow
        print(arch, "update norm after 1 update: 2L", shallow, "8L", deep)
    assert ratio[POST_LN] > 1.5 * ratio[DEEPNET]


def test_logging_outputs_are_averaged_over_microbatches_and_workers(multi30k_bin):
    """Two micro-batches of one update: the probe runs once; LayerNorm inputs average, never sum."""
    from fairseq import metrics

    model, criterion, samples = build(multi30k_bin, POST_LN, 2, "--diag-update-norm-interval", "1", "--diag-ln-inputs")
    model.train()
    outputs = [criterion(model, s)[2] for s in samples[:2]]  # same update number: first micro-batch probes
    assert [o["update_norm_n"] for o in outputs] == [1, 0]
    assert outputs[0]["update_norm_sum"] == 0.0  # theta_t == theta_0 at update 0
    worker2 = [dict(o, update_norm_sum=o["update_norm_sum"] + 4.0 * o["update_norm_n"]) for o in outputs]
    with metrics.aggregate(new_root=True) as agg:
        type(criterion).reduce_metrics(outputs + worker2)  # what fairseq hands over after its all-reduce
        values = agg.get_smoothed_values()
    assert values["update_norm"] == pytest.approx(2.0, abs=1e-3)  # (0 + 4) / 2 probes
    expected = sum(o["lnin_dec1_ffn"] for o in outputs) / 2
    assert values["lnin_dec1_ffn"] == pytest.approx(expected, rel=1e-3)
    assert 1.0 < values["lnin_dec1_ffn"] < 100.0


def test_fp16_master_copy_and_step_scale_are_undone():
    """fp16 optimizers hold one flat fp32 copy of all grads and may pass the unscale factor to step()."""
    from deepnet_fairseq.instrumentation.monitors import GradNormMonitor

    class FlatOptimizer(torch.optim.Optimizer):
        def __init__(self, params):
            super().__init__(params, {})

        def step(self, closure=None, scale=1.0):
            return None

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(3, 4), torch.nn.Linear(4, 2)

    model = Model()
    grads = [torch.randn_like(p) for p in model.parameters()]
    flat = torch.nn.Parameter(torch.zeros(sum(g.numel() for g in grads)))
    flat.grad = torch.cat([g.reshape(-1) for g in grads]) * 8.0  # still multiplied by 8
    seen = {}
    monitor = GradNormMonitor(model, lambda norms, total: seen.update(total=total))
    FlatOptimizer([flat]).step(scale=8.0)
    monitor.remove()
    assert seen["total"] == pytest.approx(torch.cat([g.reshape(-1) for g in grads]).norm().item(), rel=1e-5)


def test_fp16_divergence_guard_names_where_the_gradient_overflow_starts(multi30k_bin, caplog):
    """fairseq's FP16Optimizer and loss scaler on a half-precision model (CPU): an overflowing step is
    skipped before any optimizer step, so the guard reads it from the scaler; at the minimum scale it stops."""
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    from deepnet_fairseq.instrumentation.monitors import DivergenceError

    torch.set_num_threads(1)
    model, criterion, samples, cfg = build(multi30k_bin, POST_LN, 2, "--divergence-guard", "--fp16",
                                           "--fp16-init-scale", str(2 ** 24), "--min-loss-scale", str(2 ** 22),
                                           "--fp16-no-flatten-grads", "--optimizer", "adam", "--lr", "1e-3",
                                           with_cfg=True)  # (the flat fp32 copy is built on a CUDA device)
    model, criterion = model.half(), criterion.half()
    model.train()
    optimizer = FP16Optimizer.build_optimizer(cfg, [p for p in model.parameters() if p.requires_grad])

    def overflowing_step():  # fairseq's trainer: backward, then clip_grad_norm checks the scaler
        optimizer.zero_grad()
        loss, _, _ = criterion(model, samples[0])
        optimizer.backward(loss)  # loss x 2**24: the output layer's gradient exceeds fp16's 65504
        optimizer.clip_grad_norm(0.0)

    with caplog.at_level("INFO", logger="deepnet_fairseq"), pytest.raises(OverflowError):  # the trainer skips it
        overflowing_step()
    messages = [r.getMessage() for r in caplog.records if "divergence guard" in r.getMessage()]
    assert len(messages) == 1 and re.fullmatch(
        r"divergence guard: update \d+: fp16 gradient overflow, non-finite gradient in \d+ of 10 sublayers, "
        r"starting at sublayer dec1_ffn; step skipped, loss scale now 8\.38861e\+06", messages[0]), messages
    # the top sublayer is where the backward pass meets the overflow first
    assert optimizer.scaler.loss_scale == 2 ** 23
    with pytest.raises(DivergenceError, match=r"^training diverged at update \d+: the fp16 gradient still overflows "
                       r"at the minimum loss scale \(--min-loss-scale 4\.1943e\+06\), non-finite gradient in \d+ "
                       r"of 10 sublayers, starting at sublayer dec1_ffn\. The last saved checkpoint is untouched\.$"):
        overflowing_step()  # 2**23 / 2 reaches --min-loss-scale: fairseq would raise FloatingPointError


def test_skip_batch_drops_a_bad_microbatch(multi30k_bin):
    model, criterion, samples = build(multi30k_bin, POST_LN, 1, "--divergence-guard",
                                      "--divergence-loss-bound", "0.5", "--divergence-skip-batch")
    model.train()
    loss, _, logging_output = criterion(model, samples[0])  # every loss is > 0.5 bits at init
    loss.backward()
    assert logging_output["skipped_batches"] == 1 and loss.item() == 0.0
    assert all(float(p.grad.abs().max()) == 0.0 for p in model.parameters() if p.grad is not None)


def train_log(data, save_dir, *extra, check=True):
    proc = run([BIN / "fairseq-train", data, "--user-dir", USER_DIR, "--arch", POST_LN, "--encoder-layers", "2",
                "--decoder-layers", "2", *TINY_MODEL, "--optimizer", "adam", "--lr", "1e-3",
                "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "4", "--label-smoothing", "0.1",
                "--max-tokens", "500", "--seed", "1", "--cpu", "--log-format", "json", "--log-interval", "1",
                "--num-workers", "0", "--save-dir", save_dir, *extra], check=check)
    records = [json.loads(line[line.index("{"):]) for line in (proc.stdout + proc.stderr).splitlines()
               if "| train_inner |" in line]
    return proc, records


@pytest.mark.slow  # four fairseq-train runs (~25 s)
def test_hooks_leave_the_loss_unchanged_and_see_the_summed_gradient_with_update_freq(multi30k_bin, tmp_path):
    common = ["--max-update", "3", "--update-freq", "2", "--no-save", "--dropout", "0.1"]
    _, plain = train_log(multi30k_bin, tmp_path / "plain", "--criterion", "label_smoothed_cross_entropy", *common)
    _, diag = train_log(multi30k_bin, tmp_path / "diag", "--criterion", "diagnostic_label_smoothed_cross_entropy",
                        "--diag-grad-norms", "--diag-ln-inputs", "--diag-update-norm-interval", "1",
                        "--diag-source-dependence-interval", "1", "--divergence-guard", *common)
    assert len(plain) == len(diag) == 3
    for a, b in zip(plain, diag):
        assert (a["loss"], a["nll_loss"], a["gnorm"]) == (b["loss"], b["nll_loss"], b["gnorm"])
        # the monitor reads the gradient fairseq steps with: summed over both micro-batches, normalised
        assert float(b["gnorm_total"]) == pytest.approx(float(b["gnorm"]), rel=2e-3)
        sublayers = [float(v) for k, v in b.items() if k.startswith("gnorm_") and k != "gnorm_total"]
        assert len(sublayers) == 2 * 2 + 2 * 3
        assert math.sqrt(sum(v * v for v in sublayers)) < float(b["gnorm_total"])
    assert float(diag[0]["update_norm"]) == 0.0 and float(diag[2]["update_norm"]) > 0.0
    assert all("src_dep" in r and {f"xattn_{i}" for i in range(2)} <= set(r) for r in diag)


def test_source_dependence_is_the_nll_gain_of_the_true_sources_and_zero_without_cross_attention(multi30k_bin):
    from deepnet_fairseq.instrumentation.monitors import source_dependence

    torch.set_num_threads(1)
    model, _, samples = build(multi30k_bin, DEEPNET, 3)
    sample = samples[0]
    target = sample["target"]
    mask = target.ne(model.decoder.dictionary.pad())

    def nll(src_tokens, src_lengths):
        net_output = model(src_tokens, src_lengths, sample["net_input"]["prev_output_tokens"])
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        return -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1)[mask].mean().item() / math.log(2)

    src, lengths = sample["net_input"]["src_tokens"], sample["net_input"]["src_lengths"]
    model.eval()
    with torch.no_grad():
        expected = nll(src.roll(1, 0), lengths.roll(1, 0)) - nll(src, lengths)
    model.train()
    src_dep, cross_ratio = source_dependence(model, sample)
    assert src_dep == pytest.approx(expected, abs=1e-5) and abs(src_dep) > 1e-4
    assert model.training  # the probe restores the training mode
    assert sorted(cross_ratio) == [0, 1, 2] and all(0 < r < 10 for r in cross_ratio.values())

    with torch.no_grad():  # a decoder that cannot see its source: no gain, no cross-attention output
        for layer in model.decoder.layers:
            layer.encoder_attn.out_proj.weight.zero_()
            layer.encoder_attn.out_proj.bias.zero_()
    src_dep, cross_ratio = source_dependence(model, sample)
    assert abs(src_dep) < 1e-5 and all(r == 0 for r in cross_ratio.values())
    assert source_dependence(model, {**sample, "net_input": {k: v[:1] for k, v in sample["net_input"].items()},
                                     "target": target[:1]}) is None


def test_divergence_guard_stops_a_postln_run_with_a_huge_lr_and_keeps_the_last_checkpoint(multi30k_bin, tmp_path):
    from fairseq import checkpoint_utils

    import deepnet_fairseq  # noqa: F401  (allow-lists fairseq's checkpoint classes)

    save = tmp_path / "ckpt"
    proc, records = train_log(multi30k_bin, save, "--criterion", "diagnostic_label_smoothed_cross_entropy",
                              "--lr", "3", "--warmup-updates", "1", "--max-update", "40",
                              "--save-interval-updates", "2", "--no-epoch-checkpoints",
                              "--divergence-guard", "--divergence-grad-bound", "50", "--divergence-loss-bound", "30",
                              check=False)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    match = re.search(r"DivergenceError: training diverged at update (\d+): .* sublayer (enc|dec)\d+_(attn|cross|ffn)",
                      output)
    assert match, output[-3000:]
    print(output[match.start():].splitlines()[0])
    bad_update = int(match.group(1))
    assert len(records) == bad_update - 1
    state = checkpoint_utils.load_checkpoint_to_cpu(str(save / "checkpoint_last.pt"))
    saved_update = state["optimizer_history"][-1]["num_updates"]
    assert 2 <= saved_update < bad_update and saved_update % 2 == 0
    assert all(torch.isfinite(v).all() for v in state["model"].values() if v.is_floating_point())


def test_depth_sweep_script_rejects_bad_input(tmp_path):
    proc = run(["bash", "scripts/depth_sweep.sh", "--help"], cwd=USER_DIR + "/..")
    assert "--archs" in proc.stdout and "--depths" in proc.stdout
    proc = run(["bash", "scripts/depth_sweep.sh", "--depths", "6,x", "--out", tmp_path], cwd=USER_DIR + "/..",
               check=False)
    assert proc.returncode != 0 and "--depths must be a comma-separated list of ints" in proc.stderr
    proc = run(["bash", "scripts/depth_sweep.sh", "--data", tmp_path, "--out", tmp_path / "o"], cwd=USER_DIR + "/..",
               check=False)
    assert proc.returncode != 0 and "not a binarised fairseq data dir" in proc.stderr


def test_committed_sweep_csvs_back_the_documented_claims_and_replot(tmp_path):
    """docs/figures: the numbers quoted in docs/diagnostics.md, and the figures regenerate from the CSVs."""
    from pathlib import Path

    from deepnet_experiments.plots import load_curves, load_runs, plot_all

    figures = Path(USER_DIR).parent / "docs" / "figures"
    curves = load_curves(figures / "curves.csv")
    runs = load_runs(figures / "runs.csv")
    assert len(runs) == 12 and {r["diverged"] for r in runs} == {"no"}
    for seed in (1, 2):
        post = curves[(POST_LN, 12, seed)]
        deepnet = curves[(DEEPNET, 12, seed)]
        assert post["update_norm"][3] > 4 * deepnet["update_norm"][3]  # Post-LN's early update explodes
        assert post["gnorm_dec11_ffn"][1] > 10 * post["gnorm_dec0_ffn"][1]  # grows toward the top at init
    written = plot_all(figures / "runs.csv", figures / "curves.csv", tmp_path, warmup=4)
    assert [p.name for p in written] == ["update_norm.png", "grad_norm_by_layer.png", "loss_vs_depth.png"]
    assert all(p.stat().st_size > 10_000 for p in written)


@pytest.mark.slow  # six fairseq-train processes, about 30 s of CPU; the committed figures' CSVs are replotted above
def test_figures_command_tiny_setting_writes_the_papers_figures(tmp_path):
    """scripts/figures.sh --tiny: the same code as the committed figures, 2L/3L and 6 updates."""
    import csv
    from pathlib import Path

    root = Path(USER_DIR).parent
    assert "DeepNet Fig. 5" in run(["bash", "scripts/figures.sh", "--help"], cwd=root).stdout
    proc = run(["bash", "scripts/figures.sh", "--tiny", "--out", tmp_path / "runs", "--figures", tmp_path / "fig"],
               cwd=root)
    with open(tmp_path / "fig" / "fig5_update_norm.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == ["arch", "layers", "update", "update_norm"]
    assert {(r["arch"], r["layers"]) for r in rows} == {(a, d) for a in ("postln", "deepnet") for d in ("2", "3")}
    assert all(math.isfinite(float(r["update_norm"])) and float(r["update_norm"]) > 0 for r in rows)
    for depth in (2, 3):
        assert re.search(rf"\| {depth}L-{depth}L \| DeepNet, paper init \| [0-9.]+ \([0-9.]+x\) \|", proc.stdout)
    assert (tmp_path / "fig" / "fig5_summary.md").read_text() in proc.stdout
    for name in ("fig5_update_norm.png", "fig3_18L.png", "preln_fig3_grad_norm_init.png"):
        assert (tmp_path / "fig" / name).stat().st_size > 10_000
    with open(tmp_path / "fig" / "fig3_18L.csv", newline="") as f:
        fig3 = list(csv.DictReader(f))
    assert {r["run"] for r in fig3} == {"postln_warmup", "postln_nowarmup", "deepnet_warmup"}
    assert {r["metric"] for r in fig3} >= {"update_norm", "lnin_dec_ffn", "gnorm_dec_ffn"}

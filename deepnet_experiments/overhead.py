"""Measure the criterion's overhead: CPU seconds per update (forward + backward + Adam step, one thread)
with each diagnostic off and on, on the same batches. CPU time of this process (not wall time), so
other work on a shared machine does not count; rounds are interleaved and the median taken.

    python -m deepnet_experiments.overhead BIN_DIR [--arch A] [--depth 6] [--updates 8] [--rounds 3]
"""

import argparse
import statistics
import time

import torch

from deepnet_setups import runner

from .sweep import ALL_DIAGNOSTICS

SETTINGS = {  # the criterion's diagnostic options of each measured setting
    "off": {},
    "grad norms": {"diag_grad_norms": True},
    "LN inputs": {"diag_ln_inputs": True},
    "update norm (K=1)": {"diag_update_norm_interval": 1},
    "divergence guard": {"divergence_guard": True},
    "all on": ALL_DIAGNOSTICS,
}


def build(data, arch, depth, diagnostics, max_tokens):
    from fairseq import options as fairseq_options, tasks, utils
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = fairseq_options.get_training_parser()
    args = fairseq_options.parse_args_and_arch(parser, runner.fairseq_args(data, {
        "arch": arch, "encoder_layers": depth, "decoder_layers": depth, **runner.SHAPES["tiny"], "cpu": True,
        "seed": 1, "label_smoothing": 0.1, "criterion": "diagnostic_label_smoothed_cross_entropy", **diagnostics}))
    cfg = convert_namespace_to_omegaconf(args)
    utils.set_torch_seed(1)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    model, criterion = task.build_model(cfg.model), task.build_criterion(cfg.criterion)
    itr = task.get_batch_iterator(task.dataset("train"), max_tokens=max_tokens, seed=1).next_epoch_itr(shuffle=False)
    return model, criterion, itr


def seconds_per_update(data, arch, depth, diagnostics, updates, max_tokens):
    from fairseq import metrics

    model, criterion, itr = build(data, arch, depth, diagnostics, max_tokens)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    model.train()
    samples = [next(itr) for _ in range(updates + 1)]
    with metrics.aggregate():  # "default" stays active: the criterion reads num_updates there
        for step, sample in enumerate(samples):
            if step == 1:
                start = time.process_time()  # the first update attaches the hooks: not timed
            metrics.log_scalar("num_updates", step, weight=0)  # as fairseq's trainer does
            optimizer.zero_grad()
            loss, sample_size, _ = criterion(model, sample)
            (loss / sample_size).backward()
            optimizer.step()
    elapsed = (time.process_time() - start) / updates
    monitor = getattr(criterion, "_grad_monitor", None)
    if monitor is not None:
        monitor.remove()
    return elapsed


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="binarised fairseq data dir")
    p.add_argument("--arch", default="transformer_iwslt_de_en")
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--updates", type=int, default=8)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=1000)
    args = p.parse_args()
    torch.set_num_threads(1)
    times = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name, diagnostics in SETTINGS.items():
            times[name].append(seconds_per_update(args.data, args.arch, args.depth, diagnostics, args.updates,
                                                  args.max_tokens))
    base = statistics.median(times["off"])
    width = runner.SHAPES["tiny"]["encoder_embed_dim"]
    print(f"{args.arch} {args.depth}L-{args.depth}L d{width}, max-tokens {args.max_tokens}, "
          f"median of {args.rounds} rounds x {args.updates} updates, 1 thread")
    print("| setting | CPU s/update | overhead |\n|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| {name} | {median:.3f} | {100 * (median / base - 1):+.1f}% |")


if __name__ == "__main__":
    main()

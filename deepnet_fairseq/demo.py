"""``make demo``: Post-LN, Pre-LN and DeepNet at equal depth, side by side.

Trains the three normalisation schemes at the same depth, learning rate, warm-up and seed on a small
task (by default the package's own deterministic reverse-and-map task; ``--raw-dir`` takes real
parallel text such as ../shared/data/multi30k_de_en), through the real ``fairseq-train`` with the
plugin's diagnostic criterion, and shows each model's loss trajectory and how far its output moved
from its initial output, ||F(x, theta_t) - F(x, theta_0)||, as a table and a PNG.
The training itself is the depth sweep's (deepnet_fairseq.diagnostics.sweep), at a single depth.
"""

import argparse
import csv
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

from .synthetic import write_reverse_map_task

ARCHS = {"transformer": "Post-LN", "preln_transformer": "Pre-LN", "deepnet_transformer": "DeepNet"}
BIN = Path(sys.executable).parent


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m deepnet_fairseq.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw-dir", help="real parallel text instead of the embedded task: DIR/train.SRC, DIR/train.TGT, "
                                     "DIR/valid.SRC, DIR/valid.TGT (e.g. ../shared/data/multi30k_de_en)")
    p.add_argument("--src", default="de", help="source language suffix with --raw-dir (default: %(default)s)")
    p.add_argument("--tgt", default="en", help="target language suffix with --raw-dir (default: %(default)s)")
    p.add_argument("--train-pairs", type=int, default=4000, help="training pairs used (default: %(default)s)")
    p.add_argument("--layers", type=int, default=18, help="encoder and decoder layers, N = M (default: %(default)s)")
    p.add_argument("--updates", type=int, default=120, help="updates per model (default: %(default)s)")
    p.add_argument("--lr", type=float, default=5e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=4, help="warm-up updates (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=2, help="models trained in parallel, one thread each (default: %(default)s)")
    p.add_argument("--out", default="demo_out", help="output folder (default: %(default)s)")
    args = p.parse_args(argv)
    for name in ("train_pairs", "layers", "updates", "jobs"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    return args


def prepare_text(args, out):
    """Plain-text train/valid files under out/text (src/tgt suffixes)."""
    text = out / "text"
    if args.raw_dir is None:
        write_reverse_map_task(text, train=args.train_pairs)
        return text, "src", "tgt"
    raw = Path(args.raw_dir)
    text.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", args.train_pairs), ("valid", 300)):
        sides = {}
        for lang in (args.src, args.tgt):
            path = raw / f"{split}.{lang}"
            if not path.is_file():
                raise SystemExit(f"demo: missing {path} (--raw-dir needs train/valid .{args.src} and .{args.tgt} files)")
            sides[lang] = path.read_text(encoding="utf-8").splitlines()
        if len(sides[args.src]) != len(sides[args.tgt]):
            raise SystemExit(f"demo: {raw}/{split}.{args.src} and .{args.tgt} have different line counts")
        for lang, lines in sides.items():
            (text / f"{split}.{lang}").write_text("\n".join(lines[:count]) + "\n", encoding="utf-8")
    return text, args.src, args.tgt


def binarise(text, src, tgt, out):
    dest = out / "bin"
    if (dest / ".done").exists():
        return dest
    subprocess.run([BIN / "fairseq-preprocess", "-s", src, "-t", tgt, "--trainpref", text / "train",
                    "--validpref", text / "valid", "--destdir", dest, "--joined-dictionary", "--workers", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    (dest / ".done").touch()
    return dest


def read_curves(path):
    curves = defaultdict(dict)  # (arch, metric) -> {update: value}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            curves[row["arch"], row["metric"]][int(row["update"])] = float(row["value"])
    return curves


def read_runs(path):
    with open(path, newline="") as f:
        return {row["arch"]: row for row in csv.DictReader(f)}


def at(series, update):
    """The value logged at the last update <= `update` (runs that stopped early keep their last value)."""
    keys = [u for u in series if u <= update]
    return series[max(keys)] if keys else float("nan")


def table(curves, runs, updates):
    # the update norm separates the methods in the first updates (DeepNet Fig. 4); later it saturates
    marks = sorted({u for u in (2, 3, 5, 10, updates // 2) if 1 <= u < updates} | {updates})
    head = f"{'model':8} {'metric':22}" + "".join(f"{'@' + str(u):>10}" for u in marks) + "   outcome"
    lines = [head, "-" * len(head)]
    for arch, label in ARCHS.items():
        run = runs.get(arch, {})
        outcome = f"diverged ({run.get('reason')})" if run.get("diverged") == "yes" else f"trained {run.get('updates')} updates"
        for metric, name in (("loss", "train loss (bits)"), ("update_norm", "||F(x,t)-F(x,0)||")):
            series = curves.get((arch, metric), {})
            cells = "".join(f"{at(series, u):10.3f}" for u in marks)
            lines.append(f"{label:8} {name:22}{cells}   {outcome if metric == 'loss' else ''}")
    return "\n".join(lines)


def plot(curves, runs, layers, out_png, title):
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for arch, label in ARCHS.items():
        for ax, metric in zip(axes, ("loss", "update_norm")):
            series = curves.get((arch, metric), {})
            if series:
                xs = sorted(series)
                suffix = " (diverged)" if runs.get(arch, {}).get("diverged") == "yes" else ""
                ax.plot(xs, [series[x] for x in xs], label=label + suffix)
    axes[0].set(title="training loss", xlabel="update", ylabel="loss (bits/token)")
    # log-scaled updates: the methods differ in the first few updates, then the norm saturates
    axes[1].set(title="model update ||F(x,θ_t) − F(x,θ_0)||", xlabel="update (log scale)",
                ylabel="norm on a fixed probe batch", xscale="log")
    for ax in axes:
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: {layers}L-{layers}L, same lr / warm-up / seed")
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    text, src, tgt = prepare_text(args, out)
    data = binarise(text, src, tgt, out)
    sweep_out = out / f"sweep_L{args.layers}_u{args.updates}_lr{args.lr:g}_w{args.warmup}_s{args.seed}"
    subprocess.run([sys.executable, "-m", "deepnet_fairseq.diagnostics.sweep", "--data", data,
                    "--archs", ",".join(ARCHS), "--depths", str(args.layers), "--seeds", str(args.seed),
                    "--updates", str(args.updates), "--lr", str(args.lr), "--warmup", str(args.warmup),
                    "--jobs", str(args.jobs), "--out", sweep_out], check=True)
    curves, runs = read_curves(sweep_out / "curves.csv"), read_runs(sweep_out / "runs.csv")
    title = f"real text ({Path(args.raw_dir).name})" if args.raw_dir else "embedded reverse-and-map task"
    report = table(curves, runs, args.updates)
    print(f"\n{title}, {args.layers}L-{args.layers}L d64, lr {args.lr:g}, warm-up {args.warmup}, seed {args.seed}\n")
    print(report)
    (out / "comparison.txt").write_text(report + "\n", encoding="utf-8")
    plot(curves, runs, args.layers, out / "comparison.png", title)
    print(f"\nwrote {out / 'comparison.txt'} and {out / 'comparison.png'} in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()

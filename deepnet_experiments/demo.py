"""``make demo``: at one depth, Post-LN stalls where DeepNet trains.

Trains Post-LN (fairseq's ``transformer``), Pre-LN, and DeepNet with the paper's init and with the init the README
recommends (``--deepnorm-init source``) at the same depth, learning rate,
warm-up and seed through the real ``fairseq-train``, on the package's reverse-and-map task
(``deepnet_experiments/synthetic.py``: reverse a sentence of 3-10 words and translate every word through
a fixed 16-word lexicon) or, with ``--raw-dir``, on real parallel text. It prints one line per model
and a table, and writes ``OUT/comparison.{txt,png}`` and ``OUT/summary.json``: the final training
loss (bits per token as fairseq logs it, mean of the last 10 updates), whether training diverged, and the held-out score
(token accuracy on the task's held-out split, teacher-forced, from fairseq's validation).
"""

import argparse
import json
import math
import subprocess
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import deepnet_methods
from deepnet_setups import runner
from .synthetic import write_reverse_map_task

INITS = ("paper", "source")  # DeepNet's: the paper's and the one the README recommends
# label -> (fairseq arch, more fairseq-train options): the paper's three methods, one taking inits at each of INITS
MODELS = {deepnet_methods.label(f"{m.name}_{init}") if init else m.label:
          (m.arch(), {"deepnorm_init": init} if init else {})
          for m in deepnet_methods.methods(zoo=False) for init in (INITS if m.inits else (None,))}
LABEL_WIDTH = max(map(len, MODELS))
SHAPE = runner.SHAPES["tiny"]
WIDTH = f"d{SHAPE['encoder_embed_dim']}"
TASK_VOCAB, TASK_LENGTHS = 16, (3, 10)


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m deepnet_experiments.demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--raw-dir", help="real parallel text instead of the embedded task: DIR/train.SRC, DIR/train.TGT, "
                                     "DIR/valid.SRC, DIR/valid.TGT (e.g. ../shared/data/multi30k_de_en)")
    p.add_argument("--src", default="de", help="source language suffix with --raw-dir (default: %(default)s)")
    p.add_argument("--tgt", default="en", help="target language suffix with --raw-dir (default: %(default)s)")
    p.add_argument("--train-pairs", type=int, default=4000, help="training pairs used (default: %(default)s)")
    p.add_argument("--layers", type=int, default=18, help="encoder and decoder layers, N = M (default: %(default)s)")
    p.add_argument("--updates", type=int, default=400, help="updates per model (default: %(default)s)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak learning rate (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=100, help="warm-up updates, inverse-sqrt after (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=4, help="models trained at once, one thread each (default: %(default)s)")
    p.add_argument("--out", default="demo_out", help="output folder (default: %(default)s)")
    args = p.parse_args(argv)
    for name in ("train_pairs", "layers", "updates", "jobs", "warmup"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not args.lr > 0:
        p.error("--lr must be > 0")
    return args


def prepare_text(args, out):
    """Plain-text train/valid files under out/text (src/tgt suffixes)."""
    text = out / "text"
    if args.raw_dir is None:
        write_reverse_map_task(text, train=args.train_pairs, vocab=TASK_VOCAB, lengths=TASK_LENGTHS)
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


def unigram_entropy(path):
    """Bits per token of the best model that ignores the source: target word frequencies (with EOS)."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    counts = Counter(word for line in lines for word in line.split())
    counts["</s>"] = len(lines)
    total = sum(counts.values())
    return -sum(c / total * math.log2(c / total) for c in counts.values())


def binarise(text, src, tgt, out):
    dest = out / f"bin_{src}_{tgt}"
    if (dest / ".done").exists():
        return dest
    subprocess.run([runner.program("fairseq-preprocess"), "-s", src, "-t", tgt, "--trainpref", text / "train",
                    "--validpref", text / "valid", "--destdir", dest, "--joined-dictionary", "--workers", "1"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (dest / ".done").touch()
    return dest


def train(args, data, arch, extra, run_dir):
    """One fairseq-train run (skipped if ``run_dir`` holds a finished one); returns its per-update records,
    the held-out record and a divergence reason."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / ".done").exists():
        return read_log((run_dir / "train.log").read_text(errors="replace"))
    options = {"task": "translation", "arch": arch, "encoder_layers": args.layers, "decoder_layers": args.layers,
               **SHAPE, "share_all_embeddings": True, **runner.ADAM, "lr": args.lr, **runner.schedule(args.warmup),
               "dropout": 0.0, "criterion": "diagnostic_label_smoothed_cross_entropy", "label_smoothing": 0.0,
               "report_accuracy": True, "diag_update_norm_interval": 10, "divergence_guard": True,
               "max_tokens": 1000, "max_update": args.updates, "seed": args.seed, **runner.CPU_LOG_EVERY_UPDATE,
               "validate_interval": 100000, "no_save": True,
               "save_dir": run_dir / "checkpoints", **extra}  # fairseq probes its save dir even with --no-save
    cmd = runner.fairseq_command("fairseq-train", data, options)
    (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    rc = runner.run_quiet(cmd, run_dir / "train.log")
    text = (run_dir / "train.log").read_text(errors="replace")
    if rc != 0 and "DivergenceError" not in text:
        raise SystemExit(f"demo: fairseq-train failed for {arch}, see {run_dir / 'train.log'}")
    (run_dir / ".done").touch()
    return read_log(text, rc)


def read_log(text, rc=0):
    """(per-update records, held-out record, divergence reason) from a fairseq-train JSON log."""
    inner, valid = runner.parse_log(text)
    return inner, valid, runner.diverged_reason(text, inner, rc)


def series(records, key, shift=0):
    return {int(float(r["num_updates"])) + shift: float(r[key]) for r in records if r.get(key) not in (None, "")}


def at(values, update):
    """The value logged at the last update <= ``update``."""
    keys = [u for u in values if u <= update]
    return values[max(keys)] if keys else float("nan")


def table(results, updates, entropy):
    marks = sorted({u for u in (10, updates // 4, updates // 2, 3 * updates // 4) if 10 <= u < updates} | {updates})
    head = f"{'model':{LABEL_WIDTH}} {'metric':26}" + "".join(f"{'@' + str(u):>8}" for u in marks) + "   held-out accuracy"
    lines = [head, "-" * len(head)]
    for label, r in results.items():
        held = "diverged" if r["diverged"] else f"{r['heldout']:.1f}%"
        for key, name in (("loss", "train loss (bits/token)"), ("update_norm", "||F(x,t)-F(x,0)||")):
            cells = "".join(f"{at(r['curves'][key], u):8.3f}" for u in marks)
            lines.append(f"{label:{LABEL_WIDTH}} {name:26}{cells}   {held if key == 'loss' else ''}")
    lines.append(f"(a model that ignores the source scores {entropy:.2f} bits/token: the targets' unigram entropy)")
    return "\n".join(lines)


def plot(results, args, entropy, out_png, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for label, r in results.items():
        for ax, key in zip(axes, ("loss", "update_norm")):
            values = r["curves"][key]
            xs = sorted(values)
            suffix = " (diverged)" if r["diverged"] else ("" if key != "loss" else f", held-out acc {r['heldout']:.0f}%")
            ax.plot(xs, [values[x] for x in xs], label=label + suffix)
    axes[0].axhline(entropy, color="grey", ls=":", lw=1)
    axes[0].text(0, entropy, " ignores the source (unigram entropy)", va="bottom", fontsize=7, color="grey")
    axes[0].set(title="training loss", xlabel="update", ylabel="loss (bits/token)")
    axes[1].set(title="model update ||F(x,θ_t) − F(x,θ_0)||", xlabel="update", ylabel="norm on a fixed probe batch")
    for ax in axes:
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
    fig.suptitle(f"{title}: {args.layers}L-{args.layers}L {WIDTH}, lr {args.lr:g}, {args.warmup} warm-up updates, "
                 f"seed {args.seed}", fontsize=10)
    fig.tight_layout()
    fig.savefig(out_png, dpi=110)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    start = time.time()
    text, src, tgt = prepare_text(args, out)
    data = binarise(text, src, tgt, out)
    entropy = unigram_entropy(text / f"train.{tgt}")
    title = f"real text ({Path(args.raw_dir).name})" if args.raw_dir else "reverse-and-map task (16 words)"
    depth = f"{args.layers}L-{args.layers}L"
    print(f"demo: {title}; {' / '.join(MODELS)} at {depth} {WIDTH}, {args.updates} updates each, "
          f"lr {args.lr:g}, {args.warmup} warm-up updates, seed {args.seed}", flush=True)

    def one(label):
        t0 = time.time()
        arch, extra = MODELS[label]
        init = f"_{extra['deepnorm_init']}" if "deepnorm_init" in extra else ""
        name = f"{arch}{init}_L{args.layers}_u{args.updates}_lr{args.lr:g}_w{args.warmup}_s{args.seed}"
        inner, valid, reason = train(args, data, arch, extra, out / "runs" / name)
        # the probe runs before an update's forward: the value logged at update u is the model after u - 1
        r = {"curves": {"loss": series(inner, "loss"), "update_norm": series(inner, "update_norm", shift=-1)},
             "diverged": bool(reason),
             "heldout": float(valid["valid_accuracy"]) if valid and not reason else None}
        tail = [v for u, v in sorted(r["curves"]["loss"].items())[-10:]]
        r["final_loss"] = None if reason or not tail else round(sum(tail) / len(tail), 4)
        outcome = f"diverged: {reason}" if reason else (
            f"final loss {r['final_loss']:.3f} bits/token, held-out accuracy {r['heldout']:.1f}%")
        print(f"  {label:{LABEL_WIDTH}} {depth}: {outcome} ({time.time() - t0:.0f} s)", flush=True)
        return r

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = dict(zip(MODELS, pool.map(one, MODELS)))
    report = table(results, args.updates, entropy)
    print("\n" + report)
    (out / "comparison.txt").write_text(report + "\n", encoding="utf-8")
    plot(results, args, entropy, out / "comparison.png", title)
    summary = {"depth": depth, "heldout_metric": "token accuracy (%, teacher-forced) on the held-out split",
               "unigram_entropy_bits": round(entropy, 4),
               "settings": {"updates": args.updates, "lr": args.lr, "warmup": args.warmup, "seed": args.seed,
                            "task": title},
               "models": {label: {"final_loss": r["final_loss"], "diverged": r["diverged"], "heldout": r["heldout"]}
                          for label, r in results.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(f"\nwrote {out / 'comparison.txt'}, {out / 'comparison.png'} and {out / 'summary.json'} "
          f"in {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()

"""Depth sweep: train architectures at several depths (N = M) and seeds, collect the stability
diagnostics, write ``runs.csv`` / ``curves.csv`` and the papers' figures. Called by scripts/depth_sweep.sh.

Each run trains with ``diagnostic_label_smoothed_cross_entropy`` (grad norms, LayerNorm inputs and
the update norm every update, divergence guard on) and logs JSON every update. Finished runs
(``RUN/.done``) are skipped, so an interrupted sweep resumes where it stopped.
"""

import argparse
import csv
import json
import os
import re
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import deepnet_methods
from deepnet_setups import runner

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RAW = ROOT.parent / "shared" / "data" / "multi30k_de_en"
SIZE = "iwslt_de_en"  # the size variant of the drivers' archs (--tiny, their default, sets the width)
RUN_FIELDS = ["arch", "depth", "seed", "updates", "final_train_loss", "valid_loss", "bleu", "diverged", "reason",
              "wall_s"]
HOOKS = {"diag_grad_norms": True, "diag_ln_inputs": True}  # per-sublayer gradient norms and LayerNorm inputs
# every diagnostic, every update; a caller may pass leaner options as ``args.diag``
ALL_DIAGNOSTICS = {**HOOKS, "diag_update_norm_interval": 1, "divergence_guard": True}
CURVE_METRICS = ("loss", "nll_loss", "gnorm", "update_norm", "src_dep")  # and every gnorm_/lnin_/xattn_ metric


def parse_list(text, kind, option):
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SystemExit(f"depth_sweep: {option} must be a comma-separated list of {kind.__name__}s, got {text!r}")
    if not values:
        raise SystemExit(f"depth_sweep: {option} is empty")
    return values


def parse_args(argv):
    extra = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(
        prog="depth_sweep.sh",
        description="Train architectures at several depths (N=M) and seeds; write runs.csv, curves.csv and plots. "
                    "Extra fairseq-train arguments go after `--` (they override the defaults).")
    p.add_argument("--data", help="binarised fairseq data dir (default: build a small Multi30k de-en set in OUT/data)")
    p.add_argument("--archs", default=",".join(m.arch(SIZE) for m in deepnet_methods.methods(zoo=False)),
                   help="comma-separated fairseq archs: the families "
                        f"{', '.join(m.family for m in deepnet_methods.methods())} at a size variant, or any other "
                        "registered arch (default: %(default)s)")
    p.add_argument("--depths", default="6,18", help="comma-separated depths, N=M (default: %(default)s)")
    p.add_argument("--updates", type=int, default=100, help="updates per run (default: %(default)s)")
    p.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak learning rate, inverse_sqrt schedule (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=10, help="warm-up updates (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=1000, help="tokens per batch (default: %(default)s)")
    p.add_argument("--train-pairs", type=int, default=3000, help="pairs in the default data set (default: %(default)s)")
    p.add_argument("--bleu", action="store_true", help="also compute test BLEU (greedy) for every run that trained")
    p.add_argument("--tiny", dest="tiny", action="store_true", default=True,
                   help="use the CPU-sized d=64 shape (default; pass shape options after -- to change it)")
    p.add_argument("--arch-shape", dest="tiny", action="store_false", help="use the arch's own shape instead")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel, one thread each (default: %(default)s)")
    p.add_argument("--out", required=True, help="output directory")
    args = p.parse_args(argv)
    args.archs = parse_list(args.archs, str, "--archs")
    args.depths = parse_list(args.depths, int, "--depths")
    args.seeds = parse_list(args.seeds, int, "--seeds")
    if any(d < 1 for d in args.depths):
        raise SystemExit(f"depth_sweep: --depths must be positive, got {args.depths}")
    for option in ("updates", "jobs", "max_tokens", "train_pairs"):
        if getattr(args, option) < 1:
            raise SystemExit(f"depth_sweep: --{option.replace('_', '-')} must be >= 1")
    if args.warmup < 0 or not args.lr > 0:
        raise SystemExit("depth_sweep: --lr must be > 0 and --warmup >= 0")
    args.extra = extra
    return args


def build_default_data(out, pairs):
    """First `pairs` Multi30k de-en training pairs, 200 valid, 200 test; joined dictionary."""
    dest = out / "data"
    if (dest / ".done").exists():
        return dest / "bin"
    if not (DEFAULT_RAW / "train.de").exists():
        raise SystemExit(f"depth_sweep: no --data given and the default raw data is missing: {DEFAULT_RAW}")
    tmp = out / "data.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for split, src, n in (("train", "train", pairs), ("valid", "valid", 200), ("test", "test2016", 200)):
        for lang in ("de", "en"):
            lines = (DEFAULT_RAW / f"{src}.{lang}").read_text(encoding="utf-8").splitlines()[:n]
            (tmp / f"{split}.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rc = runner.run_quiet([runner.program("fairseq-preprocess"), "-s", "de", "-t", "en", "--trainpref",
                           tmp / "train", "--validpref", tmp / "valid", "--testpref", tmp / "test", "--destdir",
                           tmp / "bin", "--joined-dictionary", "--workers", "1"], tmp / "preprocess.log")
    if rc != 0:
        raise SystemExit(f"depth_sweep: fairseq-preprocess failed, see {tmp / 'preprocess.log'}")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)
    (dest / ".done").touch()
    return dest / "bin"


def train_options(args, arch, depth, seed, run_dir):
    """One run's fairseq-train options: ``args`` as the CLI parses them, a caller's ``args.diag`` (the
    diagnostics, default all of them) and ``args.options`` (more options, e.g. an init) if given."""
    return {"task": "translation", "arch": arch, "encoder_layers": depth, "decoder_layers": depth,
            **(runner.SHAPES["tiny"] if args.tiny else {}), "share_decoder_input_output_embed": True,
            **runner.ADAM, "clip_norm": 0.0, "lr": args.lr, **runner.schedule(args.warmup), "dropout": 0.1,
            "criterion": "diagnostic_label_smoothed_cross_entropy", "label_smoothing": 0.1,
            **getattr(args, "diag", ALL_DIAGNOSTICS), "max_tokens": args.max_tokens, "max_update": args.updates,
            "seed": seed, **runner.CPU_LOG_EVERY_UPDATE, "save_dir": run_dir / "checkpoints",
            "no_epoch_checkpoints": True, "no_last_checkpoints": True, "no_save": not args.bleu,
            **getattr(args, "options", {})}


def train_one(args, data, arch, depth, seed, name=None):
    run_dir = Path(args.out) / "runs" / (name or f"{arch}_L{depth}_s{seed}")
    if (run_dir / ".done").exists():
        return json.loads((run_dir / "result.json").read_text())
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    # anything after `--` (args.extra) comes last on the command line and wins
    cmd = runner.fairseq_command("fairseq-train", data, train_options(args, arch, depth, seed, run_dir), args.extra)
    (run_dir / "command.txt").write_text(" ".join(cmd) + "\n")
    start = time.time()
    rc = runner.run_quiet(cmd, run_dir / "train.log")
    wall = time.time() - start
    text = (run_dir / "train.log").read_text(errors="replace")
    inner, valid = runner.parse_log(text)
    reason = runner.diverged_reason(text, inner, rc)
    if rc != 0 and not reason.startswith(("training diverged", "non-finite")):
        raise SystemExit(f"depth_sweep: run failed (not a divergence), see {run_dir / 'train.log'}: {reason}")
    tail = [float(r["loss"]) for r in inner[-10:] if "loss" in r]
    result = {
        "arch": arch, "depth": depth, "seed": seed,
        "updates": int(float(inner[-1]["num_updates"])) if inner else 0,
        "final_train_loss": round(sum(tail) / len(tail), 4) if tail else "",
        "valid_loss": float(valid["valid_loss"]) if valid and not reason else "",
        "bleu": "", "diverged": "yes" if reason else "no", "reason": reason, "wall_s": round(wall, 1),
    }
    if args.bleu and not reason:
        result["bleu"] = bleu(run_dir, data)
    with open(run_dir / "curves.tmp", "w", newline="") as f:
        w = csv.writer(f)
        for r in inner:
            for key, value in r.items():
                if key in CURVE_METRICS or key.startswith(("gnorm_", "lnin_", "xattn_")):
                    w.writerow([arch, depth, seed, int(float(r["num_updates"])), key, value])
    os.replace(run_dir / "curves.tmp", run_dir / "curves.csv")
    (run_dir / "result.json").write_text(json.dumps(result))
    (run_dir / ".done").touch()
    return result


def bleu(run_dir, data):
    gen_log = run_dir / "generate.log"
    options = {"path": run_dir / "checkpoints" / "checkpoint_best.pt", "gen_subset": "test", "beam": 1,
               "max_tokens": 4000, "cpu": True, "scoring": "sacrebleu"}
    rc = runner.run_quiet(runner.fairseq_command("fairseq-generate", data, options), gen_log)
    m = re.search(r"BLEU = ([0-9.]+)", gen_log.read_text(errors="replace")) if rc == 0 else None
    return float(m.group(1)) if m else ""


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.data:
        data = Path(args.data)
        if not (data / "dict.de.txt").exists() and not list(data.glob("dict.*.txt")):
            raise SystemExit(f"depth_sweep: --data {data} is not a binarised fairseq data dir (no dict.*.txt)")
    else:
        data = build_default_data(out, args.train_pairs)
    grid = [(a, d, s) for a in args.archs for d in args.depths for s in args.seeds]
    start = time.time()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda job: train_one(args, data, *job), grid))
    for r in results:
        print(f"{r['arch']:40s} L{r['depth']:<4d} seed {r['seed']}: updates {r['updates']}, "
              f"train loss {r['final_train_loss']}, valid loss {r['valid_loss']}, diverged {r['diverged']} "
              f"{r['reason']}", flush=True)
    write_csv(out / "runs.csv", RUN_FIELDS, [[r[k] for k in RUN_FIELDS] for r in results])
    rows = []
    for a, d, s in grid:
        with open(out / "runs" / f"{a}_L{d}_s{s}" / "curves.csv", newline="") as f:
            rows.extend(csv.reader(f))
    write_csv(out / "curves.csv", ["arch", "depth", "seed", "update", "metric", "value"], rows)
    from .plots import plot_all  # matplotlib: only once there is something to plot
    for path in plot_all(out / "runs.csv", out / "curves.csv", out, args.warmup):
        print(f"wrote {path}")
    print(f"depth_sweep: {len(grid)} runs in {time.time() - start:.0f} s; wrote {out / 'runs.csv'}, {out / 'curves.csv'}")


def write_csv(path, header, rows):
    tmp = Path(str(path) + ".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    os.replace(tmp, path)


if __name__ == "__main__":
    main()

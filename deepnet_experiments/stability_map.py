"""Where each method trains: Post-LN, Pre-LN and DeepNet over depth x peak learning rate (and a
warm-up axis at one depth), each cell classified as trains / stalls / diverges
(``scripts/stability_map.sh``).

Every cell is one ``fairseq-train`` run of the depth sweep's runner (``sweep.train_one``: same seed,
same batches, the diagnostic criterion with the divergence guard) on the shipped IWSLT-14 pipeline's
binarised Multi30k de-en (``scripts/prepare_iwslt14.sh`` + ``binarize.sh``), 64-128-2 models
(DeepNet Fig. 5's shape), inverse-sqrt schedule. Finished cells are kept (``OUT/runs/*/.done``), so an
interrupted map resumes, and later calls with other methods or cells add to the same CSV.

A cell
- **diverges** when the guard stops it (non-finite loss or gradient) or its final validation NLL is
  above the uniform distribution's entropy log2(V) (a loss blow-up);
- **stalls** when its final validation NLL is within ``--stall-margin`` bits of the target's unigram
  entropy (it has learnt word frequencies and nothing else), or when the source-dependence measure
  ``src_dep`` (NLL with the batch's sources shuffled minus with the true ones, the diagnostic
  criterion's ``--diag-source-dependence-interval``) is below ``--min-src-dep`` bits per token at the
  end (the decoder ignores its source: a target-side language model);
- **trains** otherwise.
"""

import argparse
import csv
import json
import math
import subprocess
import sys
import threading
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import deepnet_methods
from deepnet_setups import runner

from . import sweep
from .figures import read_curves
from .plots import save_figure

ROOT = sweep.ROOT
FIELDS = ["method", "depth", "lr", "warmup", "updates", "status", "valid_nll", "final_train_loss", "src_dep",
          "unigram_entropy", "uniform_entropy", "reason", "wall_s"]
PIPELINE_DATA = ["data.layout=plain", "data.train=[train]", "data.valid=[valid]", "data.test=[test2016]"]


def method_names():
    """What --methods takes: every method and init variant, and the older names of the variants, which the committed
    map's cells keep (deepnet_source_init)."""
    return deepnet_methods.names(variants=True, aliases=True)


def parse_methods(parser, text):
    """--methods as a list of names method_names() knows (else the parser's error)."""
    methods = sweep.parse_list(text, str, "--methods")
    unknown = [m for m in methods if m not in method_names()]
    if unknown:
        parser.error(f"unknown method(s) {unknown}; known: {', '.join(method_names())}")
    return methods


def method_arch(name):
    """(fairseq arch, more fairseq-train options) of a method or init variant's cell."""
    method, init = deepnet_methods.resolve(name)
    return method.arch(sweep.SIZE), {"deepnorm_init": init} if init else {}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/stability_map.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="work folder: runs/, map.csv (finished cells are skipped)")
    p.add_argument("--data", help="binarised data (default: build Multi30k de-en through the shipped IWSLT-14 "
                                  "pipeline into OUT/work from --raw-dir)")
    p.add_argument("--raw-dir", default=str(sweep.DEFAULT_RAW), help="raw Multi30k de-en (default: %(default)s)")
    p.add_argument("--methods", default=",".join(deepnet_methods.names(zoo=False)),
                   help=f"of {','.join(method_names())} (default: %(default)s)")
    p.add_argument("--depths", default="6,18,50", help="N = M layers (default: %(default)s)")
    p.add_argument("--lrs", default="2.5e-4,5e-4,1e-3,2e-3,4e-3", help="peak learning rates (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=100, help="warm-up updates for the lr axis (default: %(default)s)")
    p.add_argument("--warmup-axis", default="", help="extra warm-ups, run at --warmup-depth for every lr, e.g. 25,400")
    p.add_argument("--warmup-depth", type=int, default=18, help="depth of the warm-up axis (default: %(default)s)")
    p.add_argument("--updates", type=int, default=200, help="updates per cell (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=1000, help="tokens per batch (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--probe-every", type=int, default=20, help="src_dep and update norm every K updates")
    p.add_argument("--stall-margin", type=float, default=0.25,
                   help="valid NLL above the unigram entropy minus this many bits = stalled (default: %(default)s)")
    p.add_argument("--min-src-dep", type=float, default=0.05,
                   help="src_dep below this many bits per token = source ignored (default: %(default)s; a model "
                        "that ignores its source measures |src_dep| < 0.005 here)")
    p.add_argument("--jobs", type=int, default=1, help="cells in parallel, one thread each (default: %(default)s)")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: classify the finished cells in OUT/runs and write the CSV and figures")
    p.add_argument("--csv", help="also write the CSV here (e.g. docs/figures/stability_map.csv), keeping the cells "
                                 "it holds and OUT has not run; a cell it holds is not trained again")
    p.add_argument("--figures", help="write one heatmap per method here (e.g. docs/figures)")
    args = p.parse_args(argv)
    args.methods = parse_methods(p, args.methods)
    args.depths = sweep.parse_list(args.depths, int, "--depths")
    args.lrs = sweep.parse_list(args.lrs, float, "--lrs")
    args.warmup_axis = sweep.parse_list(args.warmup_axis, int, "--warmup-axis") if args.warmup_axis else []
    if args.jobs < 1 or args.updates < 1 or args.probe_every < 1:
        p.error("--jobs, --updates and --probe-every must be >= 1")
    return args


def build_data(args):
    """The shipped pipeline's prepare and binarise stages on all Multi30k de-en pairs (skipped when done)."""
    work = Path(args.out) / "work"
    overrides = [*PIPELINE_DATA, f"paths.work={work}", f"paths.runs={Path(args.out) / 'pipeline'}",
                 f"paths.results={Path(args.out) / 'pipeline' / 'results.jsonl'}"]
    config = ROOT / "configs" / "iwslt14_de_en.yaml"
    for cmd in ([ROOT / "scripts" / "prepare_iwslt14.sh", "--raw-dir", args.raw_dir, "--workers", "2", *overrides],
                [ROOT / "scripts" / "binarize.sh", "--config", config, "--workers", "2", *overrides]):
        if subprocess.run([str(c) for c in cmd], env=runner.child_env(**runner.ONE_THREAD)).returncode != 0:
            raise SystemExit(f"stability_map: the pipeline stage failed: {' '.join(map(str, cmd[:1]))}")
    return work / "bin"


def target_entropies(data):
    """(unigram entropy, uniform entropy) of the training targets in bits, EOS included."""
    import deepnet_fairseq  # noqa: F401  (imports fairseq with the root logger kept at INFO)
    from fairseq.data import Dictionary, data_utils

    dicts = sorted(Path(data).glob("dict.*.txt"))
    prefixes = sorted(Path(data).glob("train.*-*.*.idx"))
    if not dicts or not prefixes:
        raise SystemExit(f"stability_map: {data} is not a binarised fairseq data dir (no dict.*.txt / train.*.idx)")
    src, tgt = prefixes[0].name.split(".")[1].split("-")
    dictionary = Dictionary.load(str(Path(data) / f"dict.{tgt}.txt"))
    dataset = data_utils.load_indexed_dataset(str(Path(data) / f"train.{src}-{tgt}.{tgt}"), dictionary)
    counts = np.bincount(np.concatenate([dataset[i].numpy() for i in range(len(dataset))]),
                         minlength=len(dictionary)).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum()), math.log2(len(dictionary) - dictionary.nspecial + 1)


def cells(args):
    """Shallow cells first, every method at a depth before the next depth (a partial map is a useful one)."""
    grid = [(m, d, lr, args.warmup) for d in sorted(args.depths) for lr in args.lrs for m in args.methods]
    grid += [(m, args.warmup_depth, lr, w) for w in args.warmup_axis for lr in args.lrs for m in args.methods]
    return list(dict.fromkeys(grid))


def run_cell(args, data, method, depth, lr, warmup):
    """One cell through ``sweep.train_one``. Besides the CLI's ``args``, a caller may give ``extra_diag`` (more
    diagnostic options), ``options`` (more fairseq options, after the method's) and ``extra_fairseq``
    (verbatim fairseq arguments, last)."""
    arch, options = method_arch(method)
    run = Namespace(out=args.out, tiny=True, bleu=False, max_tokens=args.max_tokens, updates=args.updates, lr=lr,
                    warmup=warmup, options={**options, **getattr(args, "options", {})},
                    extra=getattr(args, "extra_fairseq", []),
                    diag={"divergence_guard": True, "diag_update_norm_interval": args.probe_every,
                          "diag_source_dependence_interval": args.probe_every, **getattr(args, "extra_diag", {})})
    name = f"{method}_L{depth}_lr{lr:g}_w{warmup}_s{args.seed}"
    result = sweep.train_one(run, data, arch, depth, args.seed, name=name)
    curves = read_curves(Path(args.out) / "runs" / name)
    return name, result, curves


def classify(result, curves, valid_nll, unigram, uniform, args):
    src_dep = curves.get("src_dep", {})
    last_src_dep = src_dep[max(src_dep)] if src_dep else math.nan
    if result["diverged"] == "yes":
        return "diverges", result["reason"], last_src_dep
    if not math.isfinite(valid_nll) or valid_nll > uniform:
        return "diverges", f"valid NLL {valid_nll:.2f} bits > uniform {uniform:.2f}", last_src_dep
    if valid_nll > unigram - args.stall_margin:
        return "stalls", f"valid NLL {valid_nll:.2f} bits, not {args.stall_margin} below unigram {unigram:.2f}", \
            last_src_dep
    if not last_src_dep >= args.min_src_dep:
        return "stalls", f"source ignored: src_dep {last_src_dep:.3f} < {args.min_src_dep} bits", last_src_dep
    return "trains", "", last_src_dep


def cell_key(method, depth, lr, warmup):
    """A cell's identity in the map: method (older aliases as their variant), depth, lr, warm-up."""
    return deepnet_methods.canonical(method), int(depth), float(lr), int(warmup)


def row_key(row):
    return cell_key(row["method"], row["depth"], row["lr"], row["warmup"])


def committed_cells(path):
    """{cell_key: row} of a map CSV written before (--csv; {} where there is none): what a machine without
    OUT/runs knows was run."""
    if not path or not Path(path).exists():
        return {}
    def value(field, text):  # as main() builds a row: integers, floats, and text ('' where a run had none)
        if field in ("depth", "warmup", "updates"):
            return int(text)
        if field in ("method", "status", "reason") or text == "":
            return text
        return float(text)

    with open(path, newline="") as f:
        return {row_key(r): {k: value(k, v) for k, v in r.items()} for r in csv.DictReader(f)}


def collect_rows(out, committed, unigram, uniform, args):
    """The map's rows: every finished cell in OUT/runs (this call's and earlier ones), classified, then the cells
    the committed CSV holds and OUT has not run."""
    rows = []
    for run_dir in sorted((out / "runs").glob("*/.done")):
        name = run_dir.parent.name
        method, depth, lr, warmup, _ = name.rsplit("_", 4)
        result = json.loads((run_dir.parent / "result.json").read_text())
        curves = read_curves(run_dir.parent)
        valid_nll = valid_nll_of(run_dir.parent)
        status, reason, src_dep = classify(result, curves, valid_nll, unigram, uniform, args)
        rows.append({"method": method, "depth": int(depth[1:]), "lr": float(lr[2:]), "warmup": int(warmup[1:]),
                     "updates": result["updates"], "status": status, "valid_nll": round(valid_nll, 4),
                     "final_train_loss": result["final_train_loss"], "src_dep": round(src_dep, 4),
                     "unigram_entropy": round(unigram, 4), "uniform_entropy": round(uniform, 4),
                     "reason": reason, "wall_s": result["wall_s"]})
    ran = {row_key(r) for r in rows}
    rows += [r for key, r in committed.items() if key not in ran]
    rows.sort(key=lambda r: (deepnet_methods.order(r["method"]), r["warmup"], r["depth"], r["lr"]))
    return rows


def write_map(args, rows):
    """OUT/map.csv, and --csv where given."""
    for path in [Path(args.out) / "map.csv"] + ([Path(args.csv)] if args.csv else []):
        sweep.write_csv(path, FIELDS, [[r[k] for k in FIELDS] for r in rows])


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = Path(args.data) if args.data else build_data(args)
    unigram, uniform = target_entropies(data)
    committed = committed_cells(args.csv)
    grid = [] if args.report_only else [cell for cell in cells(args) if cell_key(*cell) not in committed]
    start = time.time()
    written = threading.Lock()

    def cell_then_write(cell):  # the CSVs hold every cell as it finishes: a lane stopped mid-map loses one cell
        run_cell(args, data, *cell)
        with written:
            write_map(args, collect_rows(out, committed, unigram, uniform, args))

    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        list(pool.map(cell_then_write, grid))
    rows = collect_rows(out, committed, unigram, uniform, args)
    write_map(args, rows)
    for r in rows:
        label = deepnet_methods.label(r["method"])
        print(f"{label:28s} {r['depth']:3d}L lr {r['lr']:<8g} warm-up {r['warmup']:<5d} {r['status']:9s} "
              f"valid NLL {r['valid_nll']:<7} src_dep {r['src_dep']:<7} {r['reason']}", flush=True)
    if args.figures:
        for path in heatmaps(rows, Path(args.figures), args.warmup):
            print(f"wrote {path}")
    cell_hours = sum(float(r["wall_s"]) for r in rows) / 3600
    print(f"stability_map: {len(grid)} cells in this call, {time.time() - start:.0f} s wall; "
          f"{len(rows)} cells in {out / 'map.csv'} ({cell_hours:.2f} hours of training summed over the cells, "
          "one thread each)")


def valid_nll_of(run_dir):
    _, valid = runner.parse_log((run_dir / "train.log").read_text(errors="replace"))
    return float(valid["valid_nll_loss"]) if valid and "valid_nll_loss" in valid else math.nan


STATUS_CODE = {"trains": 0, "stalls": 1, "diverges": 2}
LEGEND = "green trains, yellow stalls, red diverges; text: valid NLL (bits) / src_dep (bits per token)"


def draw_panel(ax, rows, title):
    """One depth x lr grid: colour = status, text = valid NLL / src_dep."""
    from matplotlib.colors import ListedColormap

    depths = sorted({r["depth"] for r in rows})
    lrs = sorted({r["lr"] for r in rows})
    grid = np.full((len(depths), len(lrs)), np.nan)
    for r in rows:
        i, j = depths.index(r["depth"]), lrs.index(r["lr"])
        grid[i, j] = STATUS_CODE[r["status"]]
        ax.text(j, i, f"{r['valid_nll']:.2f}\n{round(r['src_dep'], 2) + 0.0:.2f}", ha="center", va="center", fontsize=7)
    ax.imshow(grid, cmap=ListedColormap(["#8fd18f", "#f2d16b", "#e88080"]), vmin=0, vmax=2, aspect="auto")
    ax.set_xticks(range(len(lrs)), [f"{lr:g}" for lr in lrs], fontsize=7)
    ax.set_yticks(range(len(depths)), [f"{d}L-{d}L" for d in depths], fontsize=8)
    ax.set_xlabel("peak learning rate", fontsize=8)
    ax.set_title(title, fontsize=9)


def heatmaps(rows, folder, warmup=None):
    """``stability_map_<method>.png`` (a panel per warm-up) for every method, and ``stability_map.png``
    (a panel per method at the lr axis' warm-up ``warmup``, default: the most common one)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    folder.mkdir(parents=True, exist_ok=True)
    written = []

    def figure(panels, path):
        fig, axes = plt.subplots(1, len(panels), figsize=(3.9 * len(panels) + 0.6, 3.4), squeeze=False)
        for ax, (title, panel) in zip(axes[0], panels):
            draw_panel(ax, panel, title)
        fig.text(0.01, 0.01, LEGEND, fontsize=7)
        fig.tight_layout(rect=(0, 0.05, 1, 1))
        save_figure(fig, path)
        plt.close(fig)
        written.append(path)

    methods = list(dict.fromkeys(r["method"] for r in rows))
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        figure([(f"{deepnet_methods.label(method)}, warm-up {w}", [r for r in mine if r["warmup"] == w])
                for w in sorted({r["warmup"] for r in mine})], folder / f"stability_map_{method}.png")
    if warmup is None:
        warmups = [r["warmup"] for r in rows]
        warmup = max(set(warmups), key=warmups.count)
    figure([(f"{deepnet_methods.label(m)}, warm-up {warmup}",
             [r for r in rows if r["method"] == m and r["warmup"] == warmup])
            for m in methods if any(r["method"] == m and r["warmup"] == warmup for r in rows)],
           folder / "stability_map.png")
    return written


if __name__ == "__main__":
    main()

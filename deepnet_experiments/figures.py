"""The papers' stability figures at their own scale, from one command (``scripts/figures.sh``).

- DeepNet Fig. 5 (``fig5_update_norm.{csv,png}``): the model update ||F(x,θ_t) − F(x,θ_0)|| in the
  early stage of training, Post-LN vs DeepNet, 64-128-2 models (d64, FFN 128, 2 heads) at 6L-6L,
  18L-18L, 50L-50L and 100L-100L, IWSLT-14's schedule (lr 5e-4, inverse-sqrt, 4,000 warm-up updates
  from 1e-7). The probe F is the top decoder layer's output (``features_only``) on a fixed batch,
  in eval mode. That output is LayerNorm-ed, so the norm cannot exceed about sqrt(2d) ≈ 11.3 for
  uncorrelated outputs; during the first updates of the warm-up the learning rate is small
  (1e-7 -> 2.5e-5 over the 200 updates shown) and DeepNet stays far below that cap, so the figure shows the
  paper's contrast without saturating by construction. Where Post-LN reaches the cap, its update has
  exploded: its output no longer resembles its initial output.
- DeepNet Fig. 3 (``fig3_18L.{csv,png}``): 18L-18L Post-LN with and without warm-up, and DeepNet:
  model update over the early stage, LayerNorm-input norm by layer and gradient norm by layer at its
  end ("no warm-up" = a constant lr 5e-4 from the first update).
- Pre-LN paper Fig. 3 (``preln_fig3_grad_norm_init.png``): FFN gradient norm by layer at
  initialisation (update 1), Post-LN vs Pre-LN, 18L-18L.

Training is the depth sweep's (``sweep.train_one``) on the first 3,000 Multi30k de-en pairs; every
finished run is kept (``OUT/runs/*/.done``), so an interrupted command resumes. ``--tiny`` runs the
same code in seconds (the tests use it).
"""

import argparse
import csv
import math
import sys
import time
from argparse import Namespace
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import deepnet_methods
from deepnet_setups import runner

from . import sweep
from .plots import save_figure

PAPER_SCHEDULE = dict(lr=5e-4, warmup=4000)  # IWSLT-14 (fairseq's recipe; DeepNet Section 5)
FULL = dict(depths=(6, 18, 50, 100), updates=200, probe_every=5, fig3_depth=18, pairs=3000)
TINY = dict(depths=(2, 3), updates=6, probe_every=2, fig3_depth=2, pairs=200)
FIG3_RUNS = (  # name, arch, warm-up updates, label
    ("postln_warmup", "transformer_iwslt_de_en", PAPER_SCHEDULE["warmup"], "Post-LN, 4k warm-up"),
    ("postln_nowarmup", "transformer_iwslt_de_en", 0, "Post-LN, no warm-up"),
    ("deepnet_warmup", "deepnet_transformer_iwslt_de_en", PAPER_SCHEDULE["warmup"], "DeepNet, 4k warm-up"),
)
PRELN = "preln_transformer_iwslt_de_en"
SHAPE = runner.SHAPES["tiny"]  # sweep.train_one's with tiny=True
CAP = math.sqrt(2 * SHAPE["decoder_embed_dim"])  # the LayerNorm-ed probe's norm for uncorrelated outputs
FIG5 = ("postln", "deepnet")  # method-list: chosen (DeepNet's Fig. 5 sets these two side by side)
FAMILY = {deepnet_methods.METHODS[name].arch(sweep.SIZE): name for name in FIG5}  # Fig. 5's arch -> its method


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/figures.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="figures_out", help="work folder for the runs (default: %(default)s)")
    p.add_argument("--figures", default="docs/figures", help="where the CSVs and PNGs go (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel, one thread each (default: %(default)s)")
    p.add_argument("--tiny", action="store_true", help="2L/3L, 6 updates: checks the code in seconds")
    args = p.parse_args(argv)
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    return args


def run_args(out, setting, warmup, hooks=False):
    """The sweep's per-run options for one of our runs: the update norm every ``probe_every`` updates, and
    with ``hooks`` the per-sublayer gradient norms and LayerNorm inputs as well."""
    return Namespace(out=out, tiny=True, bleu=False, max_tokens=1000, updates=setting["updates"],
                     lr=PAPER_SCHEDULE["lr"], warmup=warmup, extra=[],
                     diag={**(sweep.HOOKS if hooks else {}), "diag_update_norm_interval": setting["probe_every"]})


def read_curves(run_dir):
    """{metric: {update: value}} of one finished run."""
    curves = {}
    with open(Path(run_dir) / "curves.csv", newline="") as f:
        for arch, depth, seed, update, metric, value in csv.reader(f):
            if value != "":  # fairseq leaves a metric out of an update's log line as ''
                curves.setdefault(metric, {})[int(update)] = float(value)
    return curves


def update_norms(curves):
    """{updates taken: update norm}. The probe runs before an update's forward pass, so the value logged
    with update u measures the model after u - 1 updates; the initial model (0 updates) is left out."""
    return {u - 1: v for u, v in curves.get("update_norm", {}).items() if u > 1}


def ratio(a, b):
    return a / b if b > 0 else math.nan


def by_layer(curves, prefix, suffix, layers, update):
    """Per-layer values of ``<prefix><i><suffix>`` at the last logged update <= ``update``."""
    values = []
    for i in range(layers):
        series = curves.get(f"{prefix}{i}{suffix}", {})
        keys = [u for u in series if u <= update]
        values.append(series[max(keys)] if keys else math.nan)
    return values


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    setting = TINY if args.tiny else FULL
    out, figures = Path(args.out), Path(args.figures)
    out.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    start = time.time()
    data = sweep.build_default_data(out, setting["pairs"])
    lean = run_args(out, setting, PAPER_SCHEDULE["warmup"])
    d3 = setting["fig3_depth"]
    # Fig. 5 at Fig. 3's depth is Fig. 3's warm-up run: same training, more diagnostics (which leave it unchanged)
    jobs = [(lean, arch, depth, 1, None) for arch in FAMILY for depth in setting["depths"] if depth != d3]
    for name, arch, warmup, _ in FIG3_RUNS:
        jobs.append((run_args(out, setting, warmup, hooks=True), arch, d3, 1, f"fig3_{name}_L{d3}"))
    jobs.append((run_args(out, dict(setting, updates=1), PAPER_SCHEDULE["warmup"], hooks=True), PRELN, d3, 1,
                 f"fig3_preln_L{d3}"))
    jobs.sort(key=lambda job: -job[2])  # deepest first: the longest runs start first
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda job: (job, sweep.train_one(job[0], data, *job[1:])), jobs))
    for (_, arch, depth, _, name), r in results:
        print(f"{name or arch:40s} {depth:>3d}L: {r['updates']} updates in {r['wall_s']} s"
              + (f", diverged: {r['reason']}" if r["diverged"] == "yes" else ""), flush=True)

    run_dir = {(job[1], job[2], job[4]): out / "runs" / (job[4] or f"{job[1]}_L{job[2]}_s1") for job, _ in results}
    for name, arch, warmup, _ in FIG3_RUNS:
        if warmup == PAPER_SCHEDULE["warmup"]:
            run_dir[arch, d3, None] = run_dir[arch, d3, f"fig3_{name}_L{d3}"]
    fig5 = [(FAMILY[arch], depth, update_norms(read_curves(run_dir[arch, depth, None])))
            for arch in FAMILY for depth in setting["depths"]]
    fig3 = {name: read_curves(run_dir[arch, d3, f"fig3_{name}_L{d3}"]) for name, arch, _, _ in FIG3_RUNS}
    fig3["preln"] = read_curves(run_dir[PRELN, d3, f"fig3_preln_L{d3}"])
    marks = sorted({u for u in (setting["updates"] // 8, setting["updates"] // 4, setting["updates"] // 2) if u > 1}
                   | {setting["updates"]})
    summary = ["DeepNet Fig. 5: the largest model update ||F(x,θ_t) − F(x,θ_0)|| up to update u, Post-LN / DeepNet "
               f"(the LayerNorm-ed probe caps it near sqrt(2d) = {CAP:.1f})",
               "  depth    " + "".join(f"{'u<=' + str(u):>26}" for u in marks)]
    for depth in setting["depths"]:
        cells = []
        for u in marks:
            peak = {family: max([v for k, v in series.items() if k <= u], default=math.nan)
                    for family, d, series in fig5 if d == depth}
            cells.append(f"{peak['postln']:.3f} / {peak['deepnet']:.3f} = {ratio(peak['postln'], peak['deepnet']):4.1f}x")
        summary.append(f"  {depth:>3d}L-{depth}L" + "".join(f"{c:>26}" for c in cells))
    print("\n".join(summary))
    for path in write_outputs(figures, fig5, fig3, setting):
        print(f"wrote {path}")
    (figures / "figures_summary.txt").write_text("\n".join(summary) + "\n", encoding="utf-8")
    print(f"figures: {len(jobs)} runs in {time.time() - start:.0f} s")


def write_outputs(figures, fig5, fig3, setting):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    with open(figures / "fig5_update_norm.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arch", "layers", "update", "update_norm"])
        for family, depth, series in fig5:
            w.writerows([family, depth, u, v] for u, v in sorted(series.items()))
    written.append(figures / "fig5_update_norm.csv")

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    cmap = plt.get_cmap("viridis")
    for ax, family in zip(axes, FIG5):
        for i, depth in enumerate(setting["depths"]):
            series = next(s for f_, d, s in fig5 if f_ == family and d == depth)
            xs = sorted(series)
            ax.plot(xs, [series[u] for u in xs], color=cmap(i / max(len(setting["depths"]) - 1, 1)),
                    label=f"{depth}L-{depth}L")
        ax.axhline(CAP, color="grey", ls=":", lw=1)
        ax.text(0, CAP, " sqrt(2d): uncorrelated outputs", va="bottom", fontsize=7, color="grey")
        ax.set(title=deepnet_methods.label(family), xlabel="update", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("||F(x,θ_t) − F(x,θ_0)||")
    fig.suptitle(f"Model update in the early stage of training, {runner.shape_name(SHAPE)} models, lr 5e-4 "
                 "with 4k warm-up (DeepNet Fig. 5)", fontsize=10)
    fig.tight_layout()
    written.append(save_figure(fig, figures / "fig5_update_norm.png"))

    d3, last = setting["fig3_depth"], setting["updates"]
    with open(figures / "fig3_18L.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "metric", "layer", "update", "value"])
        for name, _, _, _ in FIG3_RUNS:
            for u, v in sorted(update_norms(fig3[name]).items()):
                w.writerow([name, "update_norm", "", u, v])
            for metric, (prefix, suffix) in (("lnin_dec_ffn", ("lnin_dec", "_ffn")), ("gnorm_dec_ffn", ("gnorm_dec", "_ffn")),
                                             ("lnin_enc_ffn", ("lnin_enc", "_ffn")), ("gnorm_enc_ffn", ("gnorm_enc", "_ffn"))):
                for layer, v in enumerate(by_layer(fig3[name], prefix, suffix, d3, last)):
                    w.writerow([name, metric, layer + 1, last, v])
    written.append(figures / "fig3_18L.csv")
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for name, _, _, label in FIG3_RUNS:
        series = update_norms(fig3[name])
        xs = sorted(series)
        axes[0].plot(xs, [series[u] for u in xs], label=label)
        layers = range(1, d3 + 1)
        axes[1].plot(layers, by_layer(fig3[name], "lnin_dec", "_ffn", d3, last), marker="o", ms=3, label=label)
        axes[2].plot(layers, by_layer(fig3[name], "gnorm_dec", "_ffn", d3, last), marker="o", ms=3, label=label)
    axes[0].set(title="model update", xlabel="update", ylabel="||F(x,θ_t) − F(x,θ_0)||")
    axes[1].set(title=f"decoder FFN LayerNorm input, update {last}", xlabel="layer", ylabel="mean norm", yscale="log")
    axes[2].set(title=f"decoder FFN gradient norm, update {last}", xlabel="layer", ylabel="norm", yscale="log")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"{d3}L-{d3}L, {runner.shape_name(SHAPE)}, early training (DeepNet Fig. 3)", fontsize=10)
    fig.tight_layout()
    written.append(save_figure(fig, figures / "fig3_18L.png"))

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharey=True)
    for ax, stack, title in zip(axes, ("enc", "dec"), ("encoder", "decoder")):
        for name, label in (("postln_warmup", "Post-LN"), ("preln", "Pre-LN")):
            ax.plot(range(1, d3 + 1), by_layer(fig3[name], f"gnorm_{stack}", "_ffn", d3, 1), marker="o", ms=3, label=label)
        ax.set(title=f"{title} FFN, at initialisation (update 1)", xlabel="layer", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    axes[0].set_ylabel("gradient norm")
    fig.suptitle(f"{d3}L-{d3}L, {runner.shape_name(SHAPE)} (Pre-LN paper Fig. 3)", fontsize=10)
    fig.tight_layout()
    written.append(save_figure(fig, figures / "preln_fig3_grad_norm_init.png"))
    return written



if __name__ == "__main__":
    main()

"""The papers' stability figures at their own scale, from one command (``scripts/figures.sh``).

- DeepNet Fig. 5 (``fig5_update_norm.{csv,png}``): the model update ||F(x,θ_t) − F(x,θ_0)|| in the
  early stage of training, Post-LN vs DeepNet (``--fig5-methods``: any methods and init variants), 64-128-2
  models (d64, FFN 128, 2 heads) at 6L-6L, 18L-18L, 50L-50L and 100L-100L (``--depths``), IWSLT-14's
  schedule (lr 5e-4, inverse-sqrt, 4,000 warm-up updates from 1e-7). The probe F is the top decoder layer's
  output (``features_only``) on a fixed batch, in eval mode. That output is LayerNorm-ed, so the norm cannot
  exceed about sqrt(2d) ≈ 11.3 for uncorrelated outputs; during the first updates of the warm-up the learning rate is small
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
same code in seconds (the tests use it). The Fig. 5 CSV gains rows: a call's (method, depth) rows replace the
ones it finds and the others stay, so ``--fig5-only`` adds methods or depths to the committed figure, e.g.

    scripts/figures.sh --fig5-only --fig5-methods postln,preln,deepnet,deepnet_source --depths 250,500 \
        --updates 50 --checkpoint-activations
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
from deepnet_setups import report, runner

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
# method -> Fig. 3's run with the paper's warm-up, which is that method's Fig. 5 run at Fig. 3's depth
FIG3_WARMUP_RUN = {deepnet_methods.of_arch(arch).name: name for name, arch, warmup, _ in FIG3_RUNS
                   if warmup == PAPER_SCHEDULE["warmup"]}


def parse_args(argv):
    p = argparse.ArgumentParser(prog="scripts/figures.sh", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="figures_out", help="work folder for the runs (default: %(default)s)")
    p.add_argument("--figures", default="docs/figures", help="where the CSVs and PNGs go (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=2, help="runs in parallel, one thread each (default: %(default)s)")
    p.add_argument("--tiny", action="store_true", help="2L/3L, 6 updates: checks the code in seconds")
    p.add_argument("--fig5-methods", default=",".join(FIG5),
                   help="Fig. 5's methods or init variants, comma-separated, of: "
                        f"{', '.join(deepnet_methods.names(variants=True))} (default: %(default)s)")
    p.add_argument("--depths", help="Fig. 5's depths N (NL-NL), comma-separated (default: 6,18,50,100; --tiny 2,3)")
    p.add_argument("--updates", type=int, help="Fig. 5's updates per run (default: 200; --tiny 6)")
    p.add_argument("--fig5-only", action="store_true",
                   help="only Fig. 5's runs (no Fig. 3 runs), and only those whose rows the Fig. 5 CSV lacks")
    p.add_argument("--summary-only", action="store_true",
                   help="train nothing: rewrite fig5_summary.md and the Fig. 5 plot from the Fig. 5 CSV in --figures")
    p.add_argument("--checkpoint-activations", action="store_true",
                   help="fairseq's --checkpoint-activations in Fig. 5's runs (same numbers, less memory: 250L and up)")
    args = p.parse_args(argv)
    args.fig5_methods = args.fig5_methods.split(",")
    unknown = [m for m in args.fig5_methods if m not in deepnet_methods.names(variants=True)]
    if unknown:
        p.error(f"--fig5-methods: unknown {', '.join(unknown)}")
    try:
        args.depths = [int(d) for d in args.depths.split(",")] if args.depths else None
    except ValueError:
        p.error(f"--depths '{args.depths}': expected numbers, e.g. 250,500")
    if (args.updates is not None and args.updates < 2) or min(args.depths or [1]) < 1:
        p.error("--updates must be >= 2 and --depths >= 1")
    if args.jobs < 1:
        p.error("--jobs must be >= 1")
    return args


def run_args(out, setting, warmup, hooks=False, options=None):
    """The sweep's per-run options for one of our runs: the update norm every ``probe_every`` updates, and
    with ``hooks`` the per-sublayer gradient norms and LayerNorm inputs as well; ``options``: more fairseq options."""
    return Namespace(out=out, tiny=True, bleu=False, max_tokens=1000, updates=setting["updates"],
                     lr=PAPER_SCHEDULE["lr"], warmup=warmup, extra=[], options=options or {},
                     diag={**(sweep.HOOKS if hooks else {}), "diag_update_norm_interval": setting["probe_every"]})


def fig5_job(out, setting, name, depth, checkpoint_activations):
    """The sweep job of Fig. 5's run of method or init variant ``name`` at NL-NL."""
    method, init = deepnet_methods.resolve(name)
    options = {**({"deepnorm_init": init} if init else {}),
               **({"checkpoint_activations": True} if checkpoint_activations else {})}
    run_name = f"fig5_{name}_L{depth}_u{setting['updates']}"
    run = run_args(out, setting, PAPER_SCHEDULE["warmup"], options=options)
    return run, method.arch(sweep.SIZE), depth, 1, run_name


def read_fig5(path):
    """{(method, depth): {updates taken: update norm}} of a Fig. 5 CSV ({} where there is none)."""
    rows = {}
    if Path(path).exists():
        with open(path, newline="") as f:
            for r in csv.DictReader(f):
                rows.setdefault((r["arch"], int(r["layers"])), {})[int(r["update"])] = float(r["update_norm"])
    return rows


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
    fig5_setting = dict(setting, updates=args.updates or setting["updates"])
    out, figures = Path(args.out), Path(args.figures)
    if args.summary_only:
        fig5 = read_fig5(figures / "fig5_update_norm.csv")
        if not fig5:
            raise SystemExit(f"figures: no Fig. 5 rows in {figures / 'fig5_update_norm.csv'}")
        report.write_atomic(figures / "fig5_summary.md", fig5_summary(fig5))
        write_fig5(figures, fig5)
        print(f"wrote {figures / 'fig5_summary.md'} and the Fig. 5 plot from {figures / 'fig5_update_norm.csv'}")
        return
    out.mkdir(parents=True, exist_ok=True)
    figures.mkdir(parents=True, exist_ok=True)
    start = time.time()
    data = sweep.build_default_data(out, setting["pairs"])
    d3 = setting["fig3_depth"]
    jobs = []
    if not args.fig5_only:
        for name, arch, warmup, _ in FIG3_RUNS:
            jobs.append((run_args(out, setting, warmup, hooks=True), arch, d3, 1, f"fig3_{name}_L{d3}"))
        jobs.append((run_args(out, dict(setting, updates=1), PAPER_SCHEDULE["warmup"], hooks=True), PRELN, d3, 1,
                     f"fig3_preln_L{d3}"))
    fig5 = read_fig5(figures / "fig5_update_norm.csv")  # the rows of methods and depths not run here stay
    fig5_runs = {}  # (method, depth) -> its run folder's name
    for name in args.fig5_methods:
        for depth in args.depths or setting["depths"]:
            if args.fig5_only and (name, depth) in fig5:
                continue  # the CSV holds this run (a machine without OUT/runs goes on from the committed figure)
            if jobs and name in FIG3_WARMUP_RUN and depth == d3 and fig5_setting["updates"] == setting["updates"]:
                # Fig. 3's warm-up run is this one: the same training, more diagnostics (which leave it unchanged)
                fig5_runs[name, depth] = f"fig3_{FIG3_WARMUP_RUN[name]}_L{d3}"
            else:
                jobs.append(fig5_job(out, fig5_setting, name, depth, args.checkpoint_activations))
                fig5_runs[name, depth] = jobs[-1][4]
    jobs.sort(key=lambda job: -job[2])  # deepest first: the longest runs start first
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda job: (job, sweep.train_one(job[0], data, *job[1:])), jobs))
    for (_, arch, depth, _, name), r in results:
        print(f"{name:40s} {depth:>3d}L: {r['updates']} updates in {r['wall_s']} s"
              + (f", diverged: {r['reason']}" if r["diverged"] == "yes" else ""), flush=True)

    fig5 = read_fig5(figures / "fig5_update_norm.csv")  # again: another call may have added rows meanwhile
    fig5.update({key: update_norms(read_curves(out / "runs" / run)) for key, run in fig5_runs.items()})
    summary = fig5_summary(fig5)
    print(summary)
    report.write_atomic(figures / "fig5_summary.md", summary)
    written = [figures / "fig5_summary.md", *write_fig5(figures, fig5)]
    if not args.fig5_only:
        fig3 = {name: read_curves(out / "runs" / f"fig3_{name}_L{d3}") for name, _, _, _ in FIG3_RUNS}
        fig3["preln"] = read_curves(out / "runs" / f"fig3_preln_L{d3}")
        written += write_fig3(figures, fig3, setting)
    for path in written:
        print(f"wrote {path}")
    print(f"figures: {len(jobs)} runs in {time.time() - start:.0f} s")


def run_length(series):
    """The updates of a Fig. 5 run: its last probe plus the probe interval (the probe is not taken at the end)."""
    probed = sorted(series)
    return probed[-1] + (probed[-1] - probed[-2] if len(probed) > 1 else 1)


def fig5_summary(fig5):
    """fig5_summary.md: per depth and method, the largest update up to u (u = 1/8, 1/4, 1/2 and all of the depth's
    updates) and, in parentheses, Post-LN's over it."""
    marks = {}
    for depth in sorted({d for _, d in fig5}):
        updates = max(run_length(series) for (_, d), series in fig5.items() if d == depth)
        marks[depth] = sorted({u for u in (updates // 8, updates // 4, updates // 2) if u > 1} | {updates})
    columns = sorted(set().union(*marks.values()))
    body = []
    for depth, taken in marks.items():
        post = fig5.get(("postln", depth))
        for method in sorted({m for m, d in fig5 if d == depth}, key=deepnet_methods.order):
            cells = []
            for u in columns:
                peak = max([v for k, v in fig5[method, depth].items() if k <= u], default=math.nan)
                post_peak = max([v for k, v in post.items() if k <= u], default=math.nan) if post else math.nan
                cells.append("" if u not in taken else f"{peak:.3f}" if method == "postln" or not post
                             else f"{peak:.3f} ({ratio(post_peak, peak):.1f}x)")
            body.append([f"{depth}L-{depth}L", deepnet_methods.label(method, init_named=True), *cells])
    return report.markdown(["depth", "method", *(f"u<={u}" for u in columns)], body) + (
        "\n\nThe largest model update ||F(x,θ_t) − F(x,θ_0)|| up to update u; in parentheses Post-LN's over it. The "
        f"LayerNorm-ed probe caps it near sqrt(2d) = {CAP:.1f}.\n")


def write_fig5(figures, fig5):
    """fig5_update_norm.{csv,png}: rows in method and depth order; a panel per method, a line per depth."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = sorted(fig5, key=lambda key: (deepnet_methods.order(key[0]), key[1]))
    with open(figures / "fig5_update_norm.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["arch", "layers", "update", "update_norm"])
        for method, depth in keys:
            w.writerows([method, depth, u, v] for u, v in sorted(fig5[method, depth].items()))
    methods = list(dict.fromkeys(method for method, _ in keys))
    depths = sorted({depth for _, depth in keys})
    columns = min(len(methods), 4)
    rows = -(-len(methods) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns + 1, 3.6 * rows), sharey=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, method in zip(axes.flat, methods):
        for i, depth in enumerate(depths):
            series = fig5.get((method, depth))
            if series:
                xs = sorted(series)
                ax.plot(xs, [series[u] for u in xs], color=cmap(i / max(len(depths) - 1, 1)),
                        label=f"{depth}L-{depth}L")
        ax.axhline(CAP, color="grey", ls=":", lw=1)
        ax.text(0, CAP, " sqrt(2d): uncorrelated outputs", va="bottom", fontsize=7, color="grey")
        ax.set(title=deepnet_methods.label(method, init_named=True), xlabel="update", yscale="log")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes.flat[len(methods):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("||F(x,θ_t) − F(x,θ_0)||")
    fig.suptitle(f"Model update in the early stage of training, {runner.shape_name(SHAPE)} models, lr 5e-4 "
                 "with 4k warm-up (DeepNet Fig. 5)", fontsize=10)
    fig.tight_layout()
    return [figures / "fig5_update_norm.csv", save_figure(fig, figures / "fig5_update_norm.png")]


def write_fig3(figures, fig3, setting):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
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

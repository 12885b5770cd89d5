"""What keeps a model on the source-ignoring plateau: a few stability-map cells rerun with every hook.

    python -m deepnet_experiments.plateau --data BIN --out DIR [--methods deepnet,preln]
        [--depth 6] [--lrs 1e-3,4e-3] [--warmup 100] [--updates 400] [--figure docs/figures/plateau.png]

Each run is the stability map's cell (``stability_map.run_cell``: same data, shape, seed and batches)
with the per-sublayer gradient norms and LayerNorm inputs on as well, and ``src_dep`` / ``xattn_<i>``
and the update norm every ``--probe-every`` updates. The figure and the printed table show, per run,
over updates: the training loss, ``src_dep`` (bits per target token the true source saves), the
decoder's cross-attention output against the residual stream it joins (mean over layers of
``xattn_<i>``), the share of the gradient that reaches the cross-attention sublayers
(``sum_i gnorm_dec<i>_cross^2 / gnorm_total^2``) and the encoder's sublayers, and the update norm.
"""

import argparse
import math
import sys
from pathlib import Path

import deepnet_methods
from deepnet_setups import runner

from . import stability_map, sweep
from .figures import read_curves
from .plots import save_figure

def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m deepnet_experiments.plateau", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", required=True, help="binarised data (the stability map's)")
    p.add_argument("--out", required=True, help="work folder (finished runs are kept and skipped)")
    p.add_argument("--methods", default="deepnet,preln",  # method-list: chosen (the plateau's pair)
                   help=f"stability-map cells, of {','.join(stability_map.method_names())} (default: %(default)s)")
    p.add_argument("--depth", type=int, default=6)
    p.add_argument("--lrs", default="1e-3,4e-3")
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--updates", type=int, default=400)
    p.add_argument("--max-tokens", type=int, default=1000)
    p.add_argument("--probe-every", type=int, default=10)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=1)
    p.add_argument("--fairseq-args", default="", help="extra fairseq-train arguments for every run (an ablation; "
                                                       "use its own --out), e.g. '--deepnorm-decoder-beta 1'")
    p.add_argument("--figure", help="write the figure here (PNG)")
    p.add_argument("--csv", help="write the plotted series here (run, quantity, update, value)")
    args = p.parse_args(argv)
    args.methods = stability_map.parse_methods(p, args.methods)
    args.lrs = sweep.parse_list(args.lrs, float, "--lrs")
    return args


def series(curves):
    """{name: {update: value}} of the four quantities the figure shows."""
    cross = {}
    for key, values in curves.items():
        if key.startswith("xattn_"):
            for u, v in values.items():
                cross.setdefault(u, []).append(v)
    def gradient_share(belongs):
        """Squared share of the total gradient norm held by the sublayers ``belongs`` picks."""
        share = {}
        for u, t in curves.get("gnorm_total", {}).items():
            parts = [v[u] for k, v in curves.items() if k.startswith("gnorm_") and belongs(k[6:]) and u in v]
            if parts and t > 0:
                share[u] = sum(x * x for x in parts) / (t * t)
        return share

    return {"train loss (bits)": curves.get("loss", {}), "src_dep (bits/token)": curves.get("src_dep", {}),
            "cross-attention / residual": {u: sum(v) / len(v) for u, v in cross.items()},
            "gradient share of cross-attention": gradient_share(lambda name: name.endswith("_cross")),
            "gradient share of the encoder": gradient_share(lambda name: name.startswith("enc")),
            "update norm": curves.get("update_norm", {})}


def at(values, update):
    keys = [u for u in values if u <= update]
    return values[max(keys)] if keys else math.nan


def main(argv=None):
    from concurrent.futures import ThreadPoolExecutor

    args = parse_args(sys.argv[1:] if argv is None else argv)
    cell_args = argparse.Namespace(out=args.out, max_tokens=args.max_tokens, updates=args.updates,
                                   probe_every=args.probe_every, seed=args.seed, extra_diag=sweep.HOOKS,
                                   extra_fairseq=args.fairseq_args.split())
    cells = [(m, args.depth, lr, args.warmup) for lr in args.lrs for m in args.methods]
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        done = list(pool.map(lambda cell: stability_map.run_cell(cell_args, Path(args.data), *cell), cells))
    runs = {f"{deepnet_methods.label(m)}, lr {lr:g}": series(read_curves(Path(args.out) / "runs" / name))
            for (m, _, lr, _), (name, _, _) in zip(cells, done)}
    marks = sorted({u for u in (args.updates // 8, args.updates // 4, args.updates // 2) if u > 0} | {args.updates})
    print(f"{args.depth}L-{args.depth}L, warm-up {args.warmup}: value at (or last logged before) update u")
    for quantity in next(iter(runs.values())):
        print(f"  {quantity}")
        for label, values in runs.items():
            print(f"    {label:28s}" + "".join(f"  u={u}: {at(values[quantity], u):8.4f}" for u in marks))
    if args.figure:
        print(f"wrote {figure(runs, args, Path(args.figure))}")
    if args.csv:
        sweep.write_csv(Path(args.csv), ["run", "quantity", "update", "value"],
                        [[label, quantity, u, round(v, 6)] for label, values in runs.items()
                         for quantity, series_ in values.items() for u, v in sorted(series_.items())])
        print(f"wrote {args.csv}")


def figure(runs, args, path):
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    quantities = list(next(iter(runs.values())))
    rows = (len(quantities) + 2) // 3
    fig, axes = plt.subplots(rows, 3, figsize=(11, 3.2 * rows), squeeze=False)
    axes = axes.ravel()
    for ax in axes[len(quantities):]:
        ax.set_visible(False)
    for ax, quantity in zip(axes, quantities):
        for label, values in runs.items():
            xs = sorted(values[quantity])
            ax.plot(xs, [values[quantity][u] for u in xs], label=label, lw=1.2)
        ax.set_title(quantity, fontsize=9)
        ax.set_xlabel("update")
        ax.grid(alpha=0.3)
        if quantity not in ("src_dep (bits/token)", "train loss (bits)"):
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{args.depth}L-{args.depth}L {runner.shape_name(runner.SHAPES['tiny'])}, warm-up {args.warmup}: "
                 "a run that stalls against one that trains", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)
    plt.close(fig)
    return path


if __name__ == "__main__":
    main()

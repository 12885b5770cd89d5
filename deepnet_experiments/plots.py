"""The papers' figures from a depth sweep's runs.csv and curves.csv (matplotlib, no display needed).

- update_norm.png:        ||F(x,theta_t) - F(x,theta_0)|| vs update, one panel per arch, a line per depth
                          (mean over seeds, band = min..max) - DeepNet Fig. 5
- grad_norm_by_layer.png: FFN gradient norm by layer at initialisation (update 1) and after warm-up,
                          encoder and decoder, deepest depth, mean over seeds - Pre-LN paper Fig. 3
- loss_vs_depth.png:      final train loss (or BLEU) vs depth, one point per seed; diverged runs marked
"""

import csv
import math
from collections import defaultdict
from pathlib import Path

import deepnet_methods


def label(arch):
    """'DeepNet (deepnet_transformer_iwslt_de_en)' for an arch of a method of deepnet_methods; another arch as it is."""
    method = deepnet_methods.of_arch(arch)
    return f"{method.label} ({arch})" if method else arch


def _float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def load_curves(path):
    """{(arch, depth, seed): {metric: {update: value}}}"""
    curves = defaultdict(lambda: defaultdict(dict))
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            key = (row["arch"], int(row["depth"]), int(row["seed"]))
            curves[key][row["metric"]][int(row["update"])] = _float(row["value"])
    return curves


def load_runs(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def plot_all(runs_csv, curves_csv, out_dir, warmup):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, curves = load_runs(runs_csv), load_curves(curves_csv)
    out_dir = Path(out_dir)
    archs = list(dict.fromkeys(r["arch"] for r in runs))
    depths = sorted({int(r["depth"]) for r in runs})
    written = []

    # (1) update norm vs update
    fig, axes = plt.subplots(1, len(archs), figsize=(4.2 * len(archs), 3.4), sharey=True, squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, arch in zip(axes[0], archs):
        for i, depth in enumerate(depths):
            series = [c["update_norm"] for (a, d, s), c in curves.items() if a == arch and d == depth]
            updates = sorted(set().union(*[set(s) for s in series])) if series else []
            if not updates:
                continue
            values = [[s[u] for s in series if u in s and math.isfinite(s[u])] for u in updates]
            mean = [sum(v) / len(v) if v else math.nan for v in values]
            color = cmap(i / max(len(depths) - 1, 1))
            ax.plot(updates, mean, color=color, label=f"{depth}L-{depth}L")
            ax.fill_between(updates, [min(v) if v else math.nan for v in values],
                            [max(v) if v else math.nan for v in values], color=color, alpha=0.2)
        ax.set_title(label(arch), fontsize=9)
        ax.set_xlabel("update")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("||F(x,θ_t) − F(x,θ_0)||")
    fig.tight_layout()
    written.append(save_figure(fig, out_dir / "update_norm.png"))

    # (2) gradient norm by layer, at init and after warm-up, deepest depth
    deepest = depths[-1]
    fig, axes = plt.subplots(2, 2, figsize=(9, 6.5), squeeze=False)
    for col, (title, pick) in enumerate((("at initialisation (update 1)", lambda us: min(us)),
                                         (f"after warm-up (update {warmup + 1} or last)",
                                          lambda us: max([u for u in us if u <= warmup + 1] or [max(us)])))):
        for row, stack in enumerate(("enc", "dec")):
            ax = axes[row][col]
            for arch in archs:
                seeds = [c for (a, d, s), c in curves.items() if a == arch and d == deepest]
                per_layer = []
                for layer in range(deepest):
                    key = f"gnorm_{stack}{layer}_ffn"
                    vals = []
                    for c in seeds:
                        if c.get(key):
                            vals.append(c[key][pick(list(c[key]))])
                    per_layer.append(sum(vals) / len(vals) if vals else math.nan)
                ax.plot(range(1, deepest + 1), per_layer, marker="o", ms=3, label=label(arch))
            ax.set_yscale("log")
            ax.set_title(f"{'encoder' if stack == 'enc' else 'decoder'} FFN, {title}", fontsize=9)
            ax.set_xlabel("layer")
            ax.set_ylabel("gradient norm")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{deepest}L-{deepest}L, mean over seeds", fontsize=10)
    fig.tight_layout()
    written.append(save_figure(fig, out_dir / "grad_norm_by_layer.png"))

    # (3) final loss (or BLEU) vs depth; diverged runs marked, not dropped
    use_bleu = any(_float(r.get("bleu")) == _float(r.get("bleu")) for r in runs)
    metric = "bleu" if use_bleu else "final_train_loss"
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    finite = [_float(r[metric]) for r in runs if math.isfinite(_float(r[metric]))]
    top = max(finite) * 1.05 if finite else 1.0
    for i, arch in enumerate(archs):
        offset = (i - (len(archs) - 1) / 2) * 0.15 * (depths[1] - depths[0] if len(depths) > 1 else 1)
        ok = [r for r in runs if r["arch"] == arch and r["diverged"] == "no"]
        bad = [r for r in runs if r["arch"] == arch and r["diverged"] != "no"]
        line = ax.plot([int(r["depth"]) + offset for r in ok], [_float(r[metric]) for r in ok], "o", label=label(arch))
        if bad:
            ys = [_float(r[metric]) if math.isfinite(_float(r[metric])) else top for r in bad]
            ax.plot([int(r["depth"]) + offset for r in bad], ys, "x", ms=9, mew=2, color=line[0].get_color(),
                    label=f"{label(arch)}: diverged")
    ax.set_xticks(depths)
    ax.set_xlabel("depth N = M")
    ax.set_ylabel("test BLEU" if use_bleu else "final train loss (mean of last 10 updates, base 2)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    written.append(save_figure(fig, out_dir / "loss_vs_depth.png"))
    return written


def save_figure(fig, path):
    """Write ``fig`` to ``path`` atomically (temporary name, then rename) and close it."""
    import matplotlib.pyplot as plt
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path

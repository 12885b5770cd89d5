"""BLEU and valid loss over seeds: one row per method, depth and update count, with the mean and the spread.

    python -m deepnet_experiments.seeds_table RESULTS.jsonl [...] --out DIR [--unrecorded seed=1,lr=0.002,warmup_updates=100]

Reads the launcher's records (``paths.results``): each evaluation is joined to the training record of the same
run folder and stage (its valid loss) and counts the updates of the last checkpoint it averaged; its seed, lr and
warm-up are the record's ``run`` block, and only runs with the same lr and warm-up, device, width and precision
share a row. Records whose run does not say these are refused unless ``--unrecorded`` gives what they were trained
with; the table marks those seeds with ``*``.
Writes ``seeds.md`` and ``seeds.csv`` into DIR, and for each schedule and update count evaluated at two depths or
more, ``depth_<lr>_<warm-up>_<updates>.png``: BLEU and valid loss against depth per method (DeepNet Fig. 6's
shape), the mean over seeds with the min-max range.
"""

import argparse
import csv
import io
import statistics
import sys
from pathlib import Path

import deepnet_methods
from deepnet_setups import report

SETTINGS = ("seed", "lr", "warmup_updates", "device", "width", "precision")  # the run keys a row needs
FIELDS = ["method", "depth", "updates", "lr", "warmup_updates", "device", "width", "precision", "seeds", "bleu_mean", "bleu_min", "bleu_max",
          "bleu_stdev", "valid_loss_mean", "per_seed"]


def runs(records, unrecorded=None):
    """[{method, depth, updates, seed, lr, warmup_updates, recorded, bleu, valid_loss, run_dir}] for every
    bilingual evaluation; raises ValueError naming a record without settings when ``unrecorded`` is None."""
    # a training record belongs to the stage it was launched for (its max_update; older records: its updates), so a
    # run stopped early by --stop-time-hours still meets its evaluation
    valid_loss = {(r["run_dir"], ((r.get("config") or {}).get("train") or {}).get("max_update") or r.get("updates")):
                  r.get("valid_loss") for r in records if r.get("kind") == "train"}
    out = []
    for r in records:
        if r.get("kind") != "eval" or r.get("bleu") is None or r.get("encoder_layers") is None or "directions" in r:
            continue  # a multilingual evaluation's BLEU is a mean over directions: the zero-shot study's tables
        run = r.get("run") or {}
        missing = [key for key in SETTINGS if run.get(key) is None]
        if missing and (unrecorded is None or any(key not in unrecorded for key in missing)):
            raise ValueError(f"the evaluation of {r['run_dir']} records no {', '.join(missing)}: pass --unrecorded "
                             "with what it was trained with")
        name = report.model_name(r)
        # an older record's alias for an init variant (deepnet_source_init) is that variant's row
        out.append({"method": deepnet_methods.canonical(name), "depth": report.depth(r),
                    "updates": r.get("updates") or r["max_update"],  # a run stopped early: the updates it had
                    **{key: unrecorded[key] if key in missing else run[key] for key in SETTINGS},
                    "recorded": not missing, "bleu": r["bleu"],
                    "valid_loss": valid_loss.get((r["run_dir"], r["max_update"])), "run_dir": r["run_dir"]})
    return out


def table(rows):
    """One summary per (method, depth, updates, lr, warm-up), never pooling devices, widths or precisions (a row
    each); the latest evaluation of a seed wins."""
    latest = {}
    for row in rows:
        latest[(row["method"], row["depth"], row["updates"], row["lr"], row["warmup_updates"],
                tuple(row[key] for key in SETTINGS[3:]), row["seed"])] = row
    groups = {}
    for key, row in latest.items():
        groups.setdefault(key[:-1], []).append(row)
    out = []
    for (method, depth, updates, lr, warmup, pool), group in sorted(groups.items(), key=lambda kv: (
            kv[0][3], kv[0][4], str(kv[0][5]), int(kv[0][1].split("L")[0]), kv[0][2],
            deepnet_methods.order(kv[0][0]))):
        group.sort(key=lambda row: row["seed"])
        bleu = [row["bleu"] for row in group]
        losses = [row["valid_loss"] for row in group if row["valid_loss"] is not None]
        out.append({"method": method, "depth": depth, "updates": updates, "lr": lr, "warmup_updates": warmup,
                    **dict(zip(SETTINGS[3:], pool)), "seeds": len(group),
                    "bleu_mean": round(statistics.mean(bleu), 2), "bleu_min": min(bleu), "bleu_max": max(bleu),
                    "bleu_stdev": round(statistics.stdev(bleu), 2) if len(bleu) > 1 else None,
                    "valid_loss_mean": round(statistics.mean(losses), 3) if losses else None,
                    "per_seed": " ".join(f"{row['seed']}{'' if row['recorded'] else '*'}:{row['bleu']}"
                                         for row in group)})
    return out


def markdown(summary):
    header = ["method", "depth", "updates", "lr", "warm-up", "seeds", "BLEU mean", "min-max", "stdev",
              "valid loss (mean)", "BLEU by seed", "run on"]
    rows = [[deepnet_methods.label(s["method"]), s["depth"], str(s["updates"]), f"{s['lr']:g}",
             str(s["warmup_updates"]), str(s["seeds"]),
             f"{s['bleu_mean']:.2f}", f"{s['bleu_min']:.2f}-{s['bleu_max']:.2f}",
             "" if s["bleu_stdev"] is None else f"{s['bleu_stdev']:.2f}",
             "" if s["valid_loss_mean"] is None else f"{s['valid_loss_mean']:.3f}", s["per_seed"],
             f"{s['device']}, d{s['width']}, {s['precision']}"] for s in summary]
    return report.markdown(header, rows)


UNRECORDED_KINDS = {"seed": int, "lr": float, "warmup_updates": int, "device": str, "width": int, "precision": str}


def unrecorded_settings(text):
    """'seed=1,lr=0.002,width=64' -> {"seed": 1, "lr": 0.002, "width": 64}: any of UNRECORDED_KINDS."""
    try:
        pairs = dict(item.split("=", 1) for item in text.split(","))
        return {key: UNRECORDED_KINDS[key](value) for key, value in pairs.items()}
    except KeyError as err:
        raise argparse.ArgumentTypeError(f"unknown key {err} (want {', '.join(UNRECORDED_KINDS)})") from None
    except ValueError:
        raise argparse.ArgumentTypeError(f"want key=value,... of {', '.join(UNRECORDED_KINDS)}, got {text!r}") from None


def depth_plots(summary, out):
    """One plot per (lr, warm-up, updates) with 2+ depths; returns the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = {}
    for s in summary:
        groups.setdefault((s["lr"], s["warmup_updates"], s["updates"]), []).append(s)
    written = []
    for (lr, warmup, updates), rows in sorted(groups.items()):
        if len({s["depth"] for s in rows}) < 2:
            continue
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
        for method in sorted({s["method"] for s in rows}, key=deepnet_methods.order):
            points = sorted((int(s["depth"].split("L-")[0]), s) for s in rows if s["method"] == method)
            layers = [n for n, _ in points]
            means = [s["bleu_mean"] for _, s in points]
            spread = [[m - s["bleu_min"] for m, (_, s) in zip(means, points)],
                      [s["bleu_max"] - m for m, (_, s) in zip(means, points)]]
            label = deepnet_methods.label(method)
            left.errorbar(layers, means, yerr=spread, marker="o", capsize=3, label=label)
            losses = [(n, s["valid_loss_mean"]) for n, s in points if s["valid_loss_mean"] is not None]
            right.plot([n for n, _ in losses], [v for _, v in losses], marker="o", label=label)
        title = f"lr {lr:g}, warm-up {warmup}, {updates} updates"
        left.set(xlabel="encoder = decoder layers", ylabel="test BLEU (mean, min-max over seeds)", title=title)
        right.set(xlabel="encoder = decoder layers", ylabel="valid loss (bits, mean)", title=title)
        depths = sorted({int(s["depth"].split("L-")[0]) for s in rows})
        for ax in (left, right):
            ax.set_xscale("log")
            ax.set_xticks(depths, [str(n) for n in depths])
            ax.minorticks_off()
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        fig.tight_layout()
        path = out / f"depth_{lr:g}_{warmup}_{updates}.png"
        tmp = path.with_name(f".{path.name}.tmp.png")
        fig.savefig(tmp, dpi=120)
        plt.close(fig)
        tmp.rename(path)
        written.append(path)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+", help="results.jsonl files (the launcher's paths.results)")
    parser.add_argument("--out", required=True, help="folder for seeds.md and seeds.csv")
    parser.add_argument("--unrecorded", type=unrecorded_settings, default=None, metavar="seed=S,lr=LR,...",
                        help="what records whose run does not say it were trained with (" + ", ".join(UNRECORDED_KINDS) + ")")
    args = parser.parse_args(argv)
    try:
        summary = table(runs(report.read_records(args.records), args.unrecorded))
    except (OSError, ValueError) as err:
        print(f"seeds_table: {err}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    note = "\n\n`*`: a run whose record carries no settings (seed, lr, warm-up from `--unrecorded`).\n" if any(
        "*" in s["per_seed"] for s in summary) else "\n"
    report.write_atomic(out / "seeds.md", markdown(summary) + note)
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=FIELDS)
    writer.writeheader()
    writer.writerows(summary)
    report.write_atomic(out / "seeds.csv", text.getvalue())
    print(markdown(summary))
    for path in depth_plots(summary, out):
        print(f"[seeds_table] {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

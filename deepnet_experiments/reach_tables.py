"""The tables of docs/results/reach: DeepNet to 1,000 layers, and each method at its own best rate by width.

    python -m deepnet_experiments.reach_tables REACH.jsonl [TABLE.jsonl ...] --out DIR

Reads the launcher's records (``paths.results``); the further files are other studies' runs at the width table's
settings, which fill its cells for the methods the width lane trains: the schemes table's (d64, each method at its
best map rate) and the small Table 1's seed-1 records (d64, lr 2e-3), whose run block does not give their width, lr
and warm-up: the table fills those from what that study ran (``TABLE_RUN``) and marks them ``*``. Writes into DIR:
  width.md / width.csv   18L-18L, 1,500 updates, warm-up 100: BLEU and valid loss per width, method and lr, with
                         each method's best rate at each width (by BLEU) and the width's best cell; a run below
                         STALLED_BLEU stayed on the unigram plateau and is neither
  width.png              BLEU at each method's best rate against width (x: a method that stalled at every rate)
  which.md               per width: each method at its best rate (or "none: stalled"), its BLEU below the width's
                         best cell, the rates it ran (docs/setups.md's "Which to use" shows it)
  deep.md / deep.csv     the deep lane: BLEU, valid loss, s/update and peak memory per depth, method and updates
"""

import argparse
import csv
import io
import sys
from pathlib import Path

import deepnet_methods
from deepnet_setups import report

from . import seeds_table

WIDTH_RUNS = "/reach/"  # the study's run folders (CPU and GPU): the methods it trains are the width table's
STALLED_BLEU = 1.0  # test BLEU below it: the run stayed on the unigram plateau (no best rate; the lane tries lower)
TABLE_RUN = {"seed": 1, "lr": 0.002, "warmup_updates": 100, "width": 64}  # docs/results/multi30k_table/README.md
WIDTH_FIELDS = ["width", "device", "precision", "method", "lr", "bleu", "valid_loss", "s_per_update", "best_rate",
                "best_of_width", "stalled", "run_dir"]
DEEP_FIELDS = ["depth", "method", "lr", "updates", "bleu", "valid_loss", "s_per_update", "processes", "peak_rss_mib",
               "run_dir"]
COSTS = ("s_per_update", "peak_rss_mib", "processes")  # what train_costs gives per stage
NO_COSTS = (None,) * len(COSTS)  # a stage that trained nothing, or none recorded


def train_costs(records):
    """(run_dir, updates) -> (s/update of the stage that ended there, peak RSS MiB, its training processes): a resumed
    stage is charged only its own updates (from its record's ``resumed_from``, or else the run's previous stage's end)."""
    stages = {}
    for r in records:
        if r.get("kind") == "train" and r.get("updates"):
            stages.setdefault(r["run_dir"], []).append(r)
    costs = {}
    for run_dir, trained in stages.items():
        trained.sort(key=lambda r: r["updates"])
        before = 0
        for r in trained:
            # resumed_from null: a fresh start (the folder was new); no such key: an older record, after its stage
            done = r["updates"] - ((r["resumed_from"] or 0) if "resumed_from" in r else before)
            # a stage that trained nothing (resumed at its end) measured neither the run's speed nor its memory
            costs[run_dir, r["updates"]] = (round(r["wall_time_s"] / done, 2), r.get("peak_rss_mib"),
                                            r.get("world_size")) if done > 0 else NO_COSTS
            before = r["updates"]
    return costs


def width_rows(records):
    """One row per (width, device, precision, method, lr) at 18L-18L, warm-up 100 (the latest evaluation wins): the CPU
    runs' 1,500 updates, a GPU run's as far as it got. Best rates and cells are picked within a width, device and
    precision, never across them."""
    costs, runs = train_costs(records), seeds_table.runs(records, TABLE_RUN)
    studied = {run["method"] for run in runs if WIDTH_RUNS in run["run_dir"]}
    latest = {}
    for run in runs:
        if (run["method"] in studied and run["depth"] == "18L-18L" and run["warmup_updates"] == 100
                and run["seed"] == 1
                and (run["updates"] == 1500 or run["device"] == "cuda")):
            latest[run["width"], run["device"], run["precision"], run["method"], run["lr"]] = run
    rows = [{"width": width, "device": device, "precision": precision, "method": method, "lr": lr,
             "updates": run["updates"], "bleu": run["bleu"], "valid_loss": run["valid_loss"],
             "s_per_update": (costs.get((run["run_dir"], run["updates"])) or (None,))[0], "recorded": run["recorded"],
             "run_dir": run["run_dir"]} for (width, device, precision, method, lr), run in latest.items()]
    for row in rows:
        row["stalled"] = row["bleu"] < STALLED_BLEU
    for row in rows:
        trained = [r for r in rows if not r["stalled"]
                   and (r["width"], r["device"], r["precision"]) == (row["width"], row["device"], row["precision"])]
        row["best_rate"] = not row["stalled"] and row["bleu"] == max(r["bleu"] for r in trained if r["method"] == row["method"])
        row["best_of_width"] = not row["stalled"] and row["bleu"] == max(r["bleu"] for r in trained)
    return sorted(rows, key=lambda r: (r["device"], r["width"], deepnet_methods.order(r["method"]), r["lr"]))


def which_markdown(rows):
    """Per width (device, precision): each method at its best rate, sorted best first, and how far below the width's
    best cell it is; a method that stalled at every rate it ran last, at its highest BLEU, with no best rate."""
    header = ["width", "run on", "method", "best rate", "BLEU", "below the best", "rates run"]
    body = []
    for width, device, precision in dict.fromkeys((r["width"], r["device"], r["precision"]) for r in rows):
        same = [r for r in rows if (r["width"], r["device"], r["precision"]) == (width, device, precision)]
        top = max((r["bleu"] for r in same if r["best_of_width"]), default=None)
        methods = {r["method"] for r in same}
        best = {m: max((r for r in same if r["method"] == m), key=lambda r: (r["best_rate"], r["bleu"])) for m in methods}
        for row in sorted(best.values(), key=lambda r: (not r["best_rate"], -r["bleu"])):
            rates = sorted(r["lr"] for r in same if r["method"] == row["method"])
            body.append([f"d{width}", f"{device}, {precision}", deepnet_methods.label(row["method"], init_named=True),
                         f"{row['lr']:g}" if row["best_rate"] else "none: stalled", cell(row["bleu"], 2),
                         cell(None if top is None else top - row["bleu"], 2), ", ".join(f"{lr:g}" for lr in rates)])
    return report.markdown(header, body)


def deep_rows(records, prefix="/reach/deep/"):
    """The deep lane's evaluations, and its stages trained but not evaluated (the rate probe) with BLEU None."""
    costs = train_costs(records)
    evaluated = {(r["run_dir"], r["max_update"]) for r in records if r.get("kind") == "eval"}
    rows = [{"depth": report.depth(r), "method": report.model_name(r), "lr": r["run"]["lr"], "updates": r["updates"],
             "bleu": None, "valid_loss": r.get("valid_loss"), **dict(zip(COSTS, costs[r["run_dir"], r["updates"]])),
             "run_dir": r["run_dir"]} for r in records
            if r.get("kind") == "train" and prefix in r["run_dir"] and r.get("updates")
            and r["updates"] == r["config"]["train"]["max_update"] and (r["run_dir"], r["updates"]) not in evaluated]
    for r in records:
        if r.get("kind") == "eval" and prefix in r["run_dir"]:
            rows.append({"depth": report.depth(r), "method": report.model_name(r), "lr": r["run"]["lr"],
                         "updates": r["updates"], "bleu": r["bleu"], "valid_loss": next(
                             (t.get("valid_loss") for t in records if t.get("kind") == "train"
                              and t["run_dir"] == r["run_dir"] and t["updates"] == r["max_update"]), None),
                         **dict(zip(COSTS, costs.get((r["run_dir"], r["max_update"]), NO_COSTS))),
                         "run_dir": r["run_dir"]})
    return sorted(rows, key=lambda r: (-int(r["depth"].split("L")[0]), deepnet_methods.order(r["method"]), r["updates"]))


def cell(value, digits):
    return "-" if value is None else f"{value:.{digits}f}"


def width_markdown(rows):
    header = ["width", "run on", "updates", "method", "lr", "BLEU", "valid loss", "s/update", "best rate of the method"]
    body = [[f"d{r['width']}", f"{r['device']}, {r['precision']}", str(r["updates"]), deepnet_methods.label(r["method"]), f"{r['lr']:g}",
             ("**" + cell(r["bleu"], 2) + "**" if r["best_of_width"] else cell(r["bleu"], 2)) + ("" if r["recorded"] else "*"),
             cell(r["valid_loss"], 3), cell(r["s_per_update"], 2), "yes" if r["best_rate"] else ""] for r in rows]
    return report.markdown(header, body)


def deep_markdown(rows):
    header = ["depth", "method", "lr", "updates", "BLEU", "valid loss", "s/update", "processes", "peak RSS MiB a process"]
    body = [[r["depth"], deepnet_methods.label(r["method"]), f"{r['lr']:g}", str(r["updates"]),
             cell(r["bleu"], 2) + r.get("mark", ""), cell(r["valid_loss"], 3), cell(r["s_per_update"], 1),
             str(r["processes"] or "-"), str(r["peak_rss_mib"] or "-")]
            for r in rows]
    return report.markdown(header, body)


def width_plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for method in sorted({r["method"] for r in rows}, key=deepnet_methods.order):
        for device, style in (("cpu", "-"), ("cuda", "--")):
            best = sorted((r["width"], r["bleu"], r["lr"]) for r in rows
                          if r["method"] == method and r["best_rate"] and r["device"] == device)
            if best:
                ax.plot([w for w, _, _ in best], [b for _, b, _ in best], style, marker="o",
                        label=f"{deepnet_methods.label(method)} ({device})")
            for width, bleu, lr in best:
                ax.annotate(f"{lr:g}", (width, bleu), textcoords="offset points", xytext=(4, 4), fontsize=7)
            stalled = {r["width"] for r in rows if r["method"] == method and r["device"] == device} - {w for w, _, _ in best}
            if stalled:  # every rate it ran there stayed on the plateau: an x at 0 in the method's colour
                ax.plot(sorted(stalled), [0] * len(stalled), "x", color=ax.lines[-1].get_color() if best else None,
                        label=f"{deepnet_methods.label(method)} ({device}): stalled at every rate run")
    widths = sorted({r["width"] for r in rows})
    ax.set_xscale("log")
    ax.set_xticks(widths, [f"d{w}" for w in widths])
    ax.minorticks_off()
    ax.set(xlabel="width (FFN 4x; 18L-18L; CPU fp32 1,500 updates, GPU fp16 as recorded)", ylabel="test BLEU at the best rate (label: lr)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=120)
    plt.close(fig)
    tmp.rename(path)


def write_csv(path, fields, rows):
    text = io.StringIO()
    writer = csv.DictWriter(text, fieldnames=fields, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    report.write_atomic(path, text.getvalue())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+",
                        help="results.jsonl files: the study's, then the schemes table's and the small Table 1's")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        records = report.read_records(args.records)
        widths, deep = width_rows(records), deep_rows(records)
    except (OSError, ValueError) as err:
        print(f"reach_tables: {err}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    note = ("\n\nBold: the best cell of its width. `*`: width, lr and warm-up from what the small Table 1 ran. "
            f"BLEU below {STALLED_BLEU:g}: stalled on the unigram plateau, never a best rate or cell.\n")
    report.write_atomic(out / "width.md", width_markdown(widths) + note)
    write_csv(out / "width.csv", WIDTH_FIELDS, widths)
    report.write_atomic(out / "which.md", which_markdown(widths) + "\n\nA method with fewer rates run than the "
                        "others may have a better one untried.\n")
    report.write_atomic(out / "deep.md", deep_markdown(deep) + "\n")
    write_csv(out / "deep.csv", DEEP_FIELDS, deep)
    if widths:
        width_plot(widths, out / "width.png")
    print(width_markdown(widths) + "\n\n" + deep_markdown(deep))
    return 0


if __name__ == "__main__":
    sys.exit(main())

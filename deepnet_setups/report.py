"""Turn run records (``paths.results``, one JSON object per line) into the paper's kind of tables.

    python -m deepnet_setups.report RESULTS.jsonl [...] [--out-dir DIR]

For every setup: a table of BLEU with one row per architecture and one column per depth (the
latest evaluation of each run; "diverged" where training diverged; multilingual evaluations add the
share of hypotheses in the target language, supervised and zero-shot), written as Markdown and CSV,
plus ``runs.csv`` listing every record. Where runs were evaluated at several update counts (a run
continued in stages, e.g. scripts/paper_protocol_multi30k.sh), also BLEU and valid loss by updates
for each depth: a table and a plot ``<setup>_<depth>_by_updates.{csv,png}``.
"""

import argparse
import csv
import io
import json
import sys
from pathlib import Path

import deepnet_methods

from .records import labelled, pool_key

RUN_FIELDS = ["kind", "setup", "arch", "deepnorm_init", "encoder_layers", "decoder_layers", "updates", "final_loss", "valid_loss",
              "bleu", "copy_source_bleu", "sacrebleu", "signature", "diverged", "wall_time_s", "run_dir", "time"]


def read_records(paths):
    records = []
    for path in paths:
        for number, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
            if line.strip():
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    raise ValueError(f"{path}:{number}: not a JSON record") from None
    return records


def depth(record):
    return f"{record['encoder_layers']}L-{record['decoder_layers']}L"


def mean(values):
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def on_target(directions):
    """' (on target S% / zero-shot Z%; zero-shot BLEU Q% of pivot P)': the mean share of hypotheses in the
    target language where the evaluation identified it (multilingual setups, issue 28), and the zero-shot
    directions' BLEU against translating through English with the same model; '' otherwise."""
    parts = []
    for label, zero_shot in (("", False), ("zero-shot ", True)):
        share = mean(d.get("target_lang_acc") for d in directions if d.get("zero_shot") == zero_shot)
        if share is not None:
            parts.append(f"{label}{share:.0f}%")
    pivoted = [d for d in directions if d.get("pivot_bleu") is not None]
    pivot = ""
    if pivoted:
        zero_shot, through_en = mean(d["bleu"] for d in pivoted), mean(d["pivot_bleu"] for d in pivoted)
        ratio = f"{100 * zero_shot / through_en:.0f}% of " if through_en else ""
        pivot = f"; zero-shot BLEU {ratio}pivot {through_en:.2f}"
    return f" (on target {' / '.join(parts)}{pivot})" if parts else ""


def model_name(record):
    """The row a record belongs to: its arch, and its DeepNorm init where that is not the default."""
    return deepnet_methods.row_name(record["arch"], record.get("deepnorm_init"))


def named(row):
    """A row's label: the method's name, and its pool where it has one ('deepnet_source [cuda, d256, fp16]')."""
    name, _, pool = row.partition(" [")
    return deepnet_methods.label(name) + (f" [{pool}" if pool else "")


def with_rate(row, lr):
    """A row's label with its learning rate inside its brackets: 'deepnet_source [cpu, d128, fp32, lr 0.002]'."""
    return f"{row[:-1]}, lr {lr:g}]" if row.endswith("]") else f"{row} [lr {lr:g}]"


def tables(records):
    """setup -> (depth columns, {arch: {depth: cell}}, signature). A row whose records ran at several learning rates
    is a row for each (a cell is one run's latest evaluation, never one rate's run standing for another's)."""
    out = {}
    tabled = [r for r in records if r.get("encoder_layers") is not None and r.get("arch") is not None]
    pools = {setup: [pool_key(r) for r in tabled if r["setup"] == setup] for setup in {r["setup"] for r in tabled}}
    rows = [(r, labelled(model_name(r), pool_key(r), pools[r["setup"]]), (r.get("run") or {}).get("lr")) for r in tabled]
    rates = {}
    for r, name, lr in rows:
        rates.setdefault((r["setup"], name), set()).add(lr)
    for r, name, lr in rows:
        setup = out.setdefault(r["setup"], {"cells": {}, "signatures": set()})
        if lr is not None and len(rates[r["setup"], name] - {None}) > 1:
            name = with_rate(name, lr)
        cell = setup["cells"].setdefault(name, {})
        key = depth(r)
        if r["kind"] == "train" and r.get("diverged"):
            cell[key] = "diverged"
        elif r["kind"] == "eval" and cell.get(key) != "diverged":
            cell[key] = f"{r['bleu']:.2f}" + on_target(r.get("directions", []))
            setup["signatures"].add(r.get("signature", ""))
    result = {}
    for name, setup in out.items():
        depths = sorted({d for cells in setup["cells"].values() for d in cells}, key=lambda d: int(d.split("L")[0]))
        archs = sorted(setup["cells"], key=lambda a: (deepnet_methods.order(a.split(" [")[0]), a))
        rows = [[named(a)] + [setup["cells"][a].get(d, "-") for d in depths] for a in archs]
        result[name] = (["model"] + depths, rows, sorted(s for s in setup["signatures"] if s))
    return result


def curves(records):
    """(setup, depth) -> {arch: {updates: (BLEU, valid loss)}} where some run was evaluated at 2+ update counts.
    An evaluation counts at the run's ``max_update`` (the stage it ended), also when its last update checkpoint
    is older (fairseq names a save at an epoch's end ``checkpoint<epoch>.pt``, which the average leaves out)."""
    out = {}
    for r in records:
        updates = r.get("max_update") or r.get("updates")
        if r.get("encoder_layers") is None or updates is None:
            continue
        point = out.setdefault((r["setup"], depth(r)), {}).setdefault(model_name(r), {}).setdefault(updates, [None, None])
        if r["kind"] == "eval":
            point[0] = r["bleu"]
        elif r["kind"] == "train":
            point[1] = r.get("valid_loss")
    return {key: {arch: {u: tuple(v) for u, v in sorted(points.items()) if v[0] is not None}
                  for arch, points in sorted(archs.items(), key=lambda a: (deepnet_methods.order(a[0]), a[0]))}
            for key, archs in out.items()
            if max(sum(v[0] is not None for v in points.values()) for points in archs.values()) >= 2}


def plot_curves(archs, title, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    for arch, points in archs.items():
        updates = sorted(points)
        left.plot(updates, [points[u][0] for u in updates], marker="o", label=deepnet_methods.label(arch))
        losses = [(u, points[u][1]) for u in updates if points[u][1] is not None]
        right.plot([u for u, _ in losses], [v for _, v in losses], marker="o", label=deepnet_methods.label(arch))
    left.set(xlabel="updates", ylabel="test BLEU", title=title)
    right.set(xlabel="updates", ylabel="valid loss (bits)", title=title)
    for ax in (left, right):
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path.with_name(f".{path.name}.tmp.png"), dpi=120)
    plt.close(fig)
    path.with_name(f".{path.name}.tmp.png").rename(path)


def markdown(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def write_atomic(path, text):
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.rename(path)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="scripts/report", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+", help="results files (JSON lines)")
    parser.add_argument("--out-dir", default="report", help="where the tables go (default: report/)")
    args = parser.parse_args(argv)
    try:
        for path in args.results:
            if not Path(path).is_file():
                raise ValueError(f"{path}: results file not found")
        records = read_records(args.results)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not records:
        print(f"error: {', '.join(args.results)}: no records", file=sys.stderr)
        return 2
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    sections = []
    for setup, (header, rows, signatures) in sorted(tables(records).items()):
        sections.append(f"## {setup}\n\nBLEU by depth (encoder-decoder layers)\n\n{markdown(header, rows)}\n")
        if signatures:
            sections[-1] += "\n" + "\n".join(f"sacreBLEU signature: `{s}`" for s in signatures) + "\n"
        buffer = io.StringIO()
        csv.writer(buffer).writerows([header] + rows)
        write_atomic(out / f"{setup}.csv", buffer.getvalue())
    for (setup, key), archs in sorted(curves(records).items()):
        updates = sorted({u for points in archs.values() for u in points})
        header = ["model"] + [str(u) for u in updates]
        rows = [[deepnet_methods.label(a)] + [(f"{p[u][0]:.2f}" + (f" ({p[u][1]:.3f})" if p[u][1] is not None else ""))
                                         if u in p else "-" for u in updates] for a, p in archs.items()]
        sections.append(f"## {setup}, {key}: by updates\n\nBLEU (valid loss) after each number of updates\n\n"
                        f"{markdown(header, rows)}\n")
        buffer = io.StringIO()
        csv.writer(buffer).writerows([["model", "updates", "bleu", "valid_loss"]] + [
            [deepnet_methods.label(a), u, p[u][0], "" if p[u][1] is None else p[u][1]]
            for a, p in archs.items() for u in p])
        write_atomic(out / f"{setup}_{key}_by_updates.csv", buffer.getvalue())
        plot_curves(archs, f"{setup}, {key}", out / f"{setup}_{key}_by_updates.png")
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=RUN_FIELDS, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(records)
    write_atomic(out / "runs.csv", buffer.getvalue())
    text = "# Results\n\n" + "\n".join(sections)
    write_atomic(out / "results.md", text)
    print(text)
    print(f"[report] {len(records)} records -> {out}/results.md, {out}/runs.csv, one CSV per setup"
          + (" and the by-updates tables and plots" if curves(records) else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The tables of docs/results/schemes: the normalisation schemes of 2024-2025 beside DeepNet on translation.

    python -m deepnet_experiments.schemes_tables [SCHEMES.jsonl] --map STABILITY_MAP.csv [--beside OTHER.jsonl ...]
                                                 --out DIR

Writes into DIR:
  map.md     the stability map (64-128-2, warm-up 100, 200 updates) per method and depth: each rate's valid NLL in
             bits where the cell trains, ``stalls`` where it does not; the method's best rate at that depth in bold
             (the rate the 18L-18L and 50L-50L runs take)
  table.md   Table 1's model (d64) at 18L-18L and 50L-50L, 1,500 updates, each method at its best map rate: BLEU,
             valid loss, s/update and peak memory (table.csv the same); a method the table lane trains but not at a
             depth of the table takes another study's run at the same settings and rate (``--beside``), marked †
"""

import argparse
import csv
import sys
from pathlib import Path

import deepnet_methods
from deepnet_setups import report

from . import reach_tables

WARMUP = "100"  # the map's cells the study compares (the committed map also holds warm-up 4,000 rows)
# the table's settings besides depth and rate (docs/results/schemes/commands.sh, the table lane)
TABLE_RUN = {"width": 64, "warmup_updates": 100, "seed": 1, "device": "cpu", "precision": "fp32"}
UPDATES = 1500
BESIDE = "†"


def read_map(path):
    """(method, depth) -> {lr: cell}: the map's warm-up 100 cells, method names canonical."""
    cells = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            if row["warmup"] == WARMUP:
                key = deepnet_methods.canonical(row["method"]), int(row["depth"])
                cells.setdefault(key, {})[float(row["lr"])] = row
    return cells


def best_rate(cells):
    """The rate of the training cell with the lowest valid NLL (None where no cell trains); the table lane's rule."""
    trains = {lr: float(c["valid_nll"]) for lr, c in cells.items() if c["status"] == "trains"}
    return min(trains, key=trains.get) if trains else None


def map_markdown(cells):
    rates = sorted({lr for by_rate in cells.values() for lr in by_rate})
    body = []
    for method, depth in sorted(cells, key=lambda k: (k[1], deepnet_methods.order(k[0]))):
        by_rate, best = cells[method, depth], best_rate(cells[method, depth])
        row = []
        for lr in rates:
            c = by_rate.get(lr)
            text = "" if c is None else f"{float(c['valid_nll']):.2f}" if c["status"] == "trains" else c["status"]
            row.append(f"**{text}**" if lr == best else text)
        body.append([f"{depth}L-{depth}L", deepnet_methods.label(method, init_named=True), *row])
    return report.markdown(["depth", "method", *(f"lr {lr:g}" for lr in rates)], body)


def table_rows(records, cells=None, beside=()):
    """The table lane's evaluations; with the map's ``cells``, the ``beside`` records' runs of a method the lane trains
    at a depth it trained others at, at the table's settings and the method's best map rate there, marked †."""
    rows = [r for r in reach_tables.deep_rows(records, prefix="/schemes/") if r["bleu"] is not None]
    have = {(r["method"], r["depth"]) for r in rows}
    methods, depths = {method for method, _ in have}, {depth for _, depth in have}
    evaluated = {(row["run_dir"], row["updates"]): row for row in reach_tables.deep_rows(beside, prefix="/")}
    for r in beside:
        run, key = r.get("run") or {}, (deepnet_methods.canonical(report.model_name(r)), report.depth(r))
        if (r.get("kind") == "eval" and r.get("max_update") == UPDATES and key[0] in methods and key[1] in depths
                and key not in have and all(run.get(k) == v for k, v in TABLE_RUN.items())
                and run.get("lr") == best_rate((cells or {}).get((key[0], int(key[1].split("L")[0])), {}))):
            rows.append(dict(evaluated[r["run_dir"], UPDATES], mark=BESIDE))
            have.add(key)
    return sorted(rows, key=lambda r: (int(r["depth"].split("L")[0]), -r["bleu"]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="?", help="the study's results.jsonl (none yet: an empty table)")
    parser.add_argument("--map", required=True, help="the stability map's CSV (docs/figures/stability_map.csv)")
    parser.add_argument("--beside", nargs="*", default=[], help="other studies' results.jsonl: runs at the table's "
                        "settings of a method the table lane trains, at a depth it has no run of its own (marked †)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        cells = read_map(args.map)
        rows = table_rows(report.read_records([args.records]) if args.records else [], cells,
                          report.read_records(args.beside) if args.beside else [])
    except (OSError, ValueError, KeyError) as err:
        print(f"schemes_tables: {err}", file=sys.stderr)
        return 1
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    report.write_atomic(out / "map.md", map_markdown(cells) + "\n\nValid NLL in bits after 200 updates where the "
                        "cell trains; bold: the method's best rate at that depth.\n")
    note = f"\n\n{BESIDE}: another study's run at the same settings and rate (its folder: table.csv).\n"
    report.write_atomic(out / "table.md", reach_tables.deep_markdown(rows) + (note if any("mark" in r for r in rows) else "\n"))
    reach_tables.write_csv(out / "table.csv", reach_tables.DEEP_FIELDS, rows)
    print(map_markdown(cells) + "\n\n" + reach_tables.deep_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

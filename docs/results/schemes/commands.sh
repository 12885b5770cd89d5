#!/usr/bin/env bash
# The runs behind docs/results/schemes/: the normalisation schemes of 2024-2025 (Peri-LN, Mix-LN, LayerNorm Scaling,
# DyT) on Multi30k de-en beside DeepNet and Pre-LN: their stability-map rows, DeepNet Fig. 5's early update, and
# Table 1's model at 18L-18L (and the best two at 50L-50L) at each method's best map rate. Every stage skips what its
# records (the committed ones on a machine without the run folders) say was done; a stopped run resumes.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: docs/results/schemes/commands.sh LANE [--runs DIR] [--raw-dir DIR]

  LANE     map     the stability map's cells for the new schemes: depths 6, 18, 50 x lr 5e-4, 1e-3, 2e-3, 4e-3, 8e-3
                   (64-128-2, warm-up 100, 200 updates), added to docs/figures/stability_map.csv
           fig5    DeepNet Fig. 5 for the new schemes, Pre-LN and DeepNet (source init) at 6L-6L to 100L-100L
                   (200 updates), added to docs/figures/fig5_update_norm.csv
           table   Table 1's model (d64, FFN 256, 4 heads, 2,000 tokens), warm-up 100, 1,500 updates, seed 1: each new
                   scheme, DeepNet (source init) and Pre-LN at 18L-18L at its best map rate at 18L; then the two new
                   schemes with the best 18L BLEU at 50L-50L at their best map rate at 50L
           tables  copy the records and figures here and to docs/figures, write the report, map.md and table.md
                   (its 50L-50L DeepNet and Pre-LN rows: the source-init study's runs at the same settings)
  --runs   run folders, prepared data and records (default: /work/runs)
  --raw-dir raw Multi30k de-en (default: ../shared/data/multi30k_de_en)
A method's best map rate at a depth: the rate of its cell that trains with the lowest valid NLL.
USAGE
}

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
runs=/work/runs raw=$root/../shared/data/multi30k_de_en lane=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --raw-dir) raw=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    map|fig5|table|tables) lane=$1; shift ;;
    *) echo "commands.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$lane" ] || { usage >&2; exit 2; }
records=$runs/schemes/results.jsonl committed=$here/results.jsonl tag=schemes
source "$root/scripts/lib/multi30k_study.sh"
schemes=$("$py" -m deepnet_methods list --zoo --since 2024)  # the schemes of 2024-2025 (the registry's years)
map_csv=$fig5_dir/stability_map.csv  # the map as the map lane adds to it (the committed one to start)
mkdir -p "$fig5_dir"
[ -f "$map_csv" ] || cp "$root/docs/figures/stability_map.csv" "$map_csv"

case "$lane" in
  tables)
    copy_fig5
    cp "$map_csv" "$root/docs/figures/stability_map.csv"
    cp "$fig5_dir"/stability_map*.png "$root/docs/figures/" 2>/dev/null || true
    if [ -f "$records" ]; then  # the table lane's records (the map and Fig. 5 lanes write figures only)
      cp "$records" "$committed"
      "$py" -m deepnet_setups.records migrate "$committed"
      "$root/scripts/report" "$committed" --out-dir "$here"
    fi
    mine=(); [ -f "$committed" ] && mine=("$committed")
    # the source-init study's 50L-50L runs (d64, warm-up 100, 1,500 updates) of DeepNet and Pre-LN at their best map rate
    "$py" -m deepnet_experiments.schemes_tables ${mine[@]+"${mine[@]}"} --map "$root/docs/figures/stability_map.csv" \
      --beside "$root/docs/results/source_init/results.jsonl" --out "$here"
    "$py" -m deepnet_experiments.pages sync "$here/README.md"
    exit 0 ;;
  fig5)
    fig5_lane schemes/fig5 "$schemes,preln,deepnet_source" 6,18,50,100 200
    exit 0 ;;
esac
prepare_multi30k
case "$lane" in
  map)
    "$root/scripts/stability_map.sh" --out "$runs/schemes/map" --data "$work/bin" --methods "$schemes" \
      --depths 6,18,50 --lrs 5e-4,1e-3,2e-3,4e-3,8e-3 --csv "$map_csv" --figures "$fig5_dir" ;;
  table)
    # best_map_rate METHOD DEPTH: the rate of METHOD's best training cell at DEPTH in the map ("" if none)
    best_map_rate() {
      "$py" - "$map_csv" "$1" "$2" <<'PY'
import sys
from deepnet_experiments.schemes_tables import best_rate, read_map
path, method, depth = sys.argv[1:]
rate = best_rate(read_map(path).get((method, int(depth)), {}))
print("" if rate is None else f"{rate:g}")
PY
    }
    # the two new schemes with the best 18L-18L test BLEU in the records
    best_two() {
      "$py" - "$records" "$runs/schemes" "$schemes" <<'PY'
import sys
from deepnet_setups.report import read_records
records, prefix, schemes = sys.argv[1:]
bleu = {}
for r in read_records([records]):
    parts = r.get("run_dir", "").removeprefix(prefix + "/").split("/")
    if r.get("kind") == "eval" and len(parts) == 4 and parts[1] in schemes.split(",") and parts[3] == "18L-18L":
        bleu[parts[1]] = max(bleu.get(parts[1], 0.0), r["bleu"])
print(",".join(sorted(bleu, key=bleu.get, reverse=True)[:2]))
PY
    }
    table_stage() {  # table_stage METHOD DEPTH
      local rate variant=$1; [ "$1" = deepnet_source ] && variant=source
      rate=$(best_map_rate "$1" "$2")
      [ -n "$rate" ] || { say "$1: no training cell at ${2}L in the map, skipped"; return 0; }
      stage "schemes/lr$rate" "$variant" 1 "$2,$2" 1500 "train.lr=$rate" train.warmup_updates=100
    }
    for method in ${schemes//,/ } deepnet_source preln; do table_stage "$method" 18; done
    best=$(best_two)
    [ -n "$best" ] || { echo "commands.sh: no 18L-18L eval records of the new schemes" >&2; exit 1; }
    for method in ${best//,/ }; do table_stage "$method" 50; done ;;
esac
say "lane $lane done: records in $records"

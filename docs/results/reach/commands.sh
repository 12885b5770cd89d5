#!/usr/bin/env bash
# The runs behind docs/results/reach/: DeepNet at 1,000 layers, and each method at its own best rate by width, on
# Multi30k de-en through the shipped scripts/train_iwslt.sh and scripts/evaluate.sh. Every run has its own folder,
# RUNS/reach/<study>/<variant>/seed1/<N>L-<M>L; a stage skips work its marker or an eval record says was done (the
# records start as the committed copy), and a stopped run resumes from its checkpoint_last.pt.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: docs/results/reach/commands.sh LANE [--widths LIST] [--runs DIR] [--raw-dir DIR]

  LANE      deep    d64 (FFN 256, 4 heads, 2,000 tokens), lr 2e-3, warm-up 100, source init: 500L-500L to 500 and
                    1,000 updates, then 100L-100L and 50L-50L likewise; Pre-LN and Post-LN at 500L-500L to 200
            width   18L-18L, warm-up 100, 1,500 updates: Pre-LN, paper init and source init at lr 5e-4, 1e-3, 2e-3
                    at d128 (FFN 512), then at d256 (FFN 1,024) each method's best d128 rate and the next lower
                    one, then d64 at 5e-4 and 1e-3 (its 2e-3 is the small Table 1's seed 1)
            prepare only prepare and binarise Multi30k
            tables  copy the records here and write the report, the width table and its plot
  --widths  the width lane's widths, in order (default 128,256,64)
  --runs    run folders, prepared data and records (default: /work/runs)
  --raw-dir raw Multi30k de-en (default: ../shared/data/multi30k_de_en)
The deep lane's rate is the stability map's deepest row: at 50L-50L the source init learns best at 2e-3
(docs/figures/stability_map.csv: valid NLL 6.30 bits after 200 updates, against 6.84 at 1e-3 and 7.30 at 4e-3).
USAGE
}

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
runs=/work/runs raw=$root/../shared/data/multi30k_de_en lane="" widths=128,256,64
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --raw-dir) raw=$2; shift 2 ;;
    --widths) widths=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    deep|width|prepare|tables) lane=$1; shift ;;
    *) echo "commands.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$lane" ] || { usage >&2; exit 2; }
records=$runs/reach/results.jsonl committed=$here/results.jsonl tag=reach
source "$root/scripts/lib/multi30k_study.sh"
if [ "$lane" = tables ]; then
  [ -f "$records" ] || { echo "commands.sh: no records at $records" >&2; exit 1; }
  cp "$records" "$committed"
  "$root/scripts/report" "$committed" --out-dir "$here"
  "$py" -m deepnet_experiments.reach_tables "$committed" "$root/docs/results/multi30k_table/results.jsonl" \
    "$root/docs/results/multi30k_table/results_source_init.jsonl" --out "$here"
  exit 0
fi
prepare_multi30k
[ "$lane" = prepare ] && exit 0

# the rates the width lane tries, lowest first
rates=(5e-4 1e-3 2e-3)
# width -> FFN: four times the width, as at d64
ffn() { echo $(($1 * 4)); }
# the rate with the best test BLEU of VARIANT at width W in the records ("" if none)
best_rate() {
  "$py" - "$records" "$runs/reach/width/d$2" "$1" <<'PY'
import sys
from deepnet_setups.report import read_records
records, prefix, variant = sys.argv[1:]
bleu = {r["run_dir"]: r["bleu"] for r in read_records([records]) if r.get("kind") == "eval"
        and r["run_dir"].startswith(prefix + "/") and r["run_dir"].split("/")[-3] == variant}
best = max(bleu, key=bleu.get, default="")
print(best.split("/")[-4].removeprefix("lr") if best else "")
PY
}
width_stage() {  # width_stage WIDTH RATE VARIANT
  stage "reach/width/d$1/lr$2" "$3" 1 18,18 1500 "model.embed_dim=$1" "model.ffn_dim=$(ffn "$1")" \
    "train.lr=$2" train.warmup_updates=100
}

case "$lane" in
  deep)
    for layers in 500,500 100,100 50,50; do for updates in 500 1000; do
      stage reach/deep source 1 "$layers" "$updates" "${short[@]}" train.validate_interval_updates=100
    done; done
    for variant in preln postln; do stage reach/deep "$variant" 1 500,500 200 "${short[@]}" train.validate_interval_updates=100; done ;;
  width)
    for width in ${widths//,/ }; do
      for variant in source preln paper; do
        case "$width" in
          64) chosen=(5e-4 1e-3) ;;
          128) chosen=("${rates[@]}") ;;
          *) best=$(best_rate "$variant" 128)
             [ -n "$best" ] || { say "d$width $variant: no d128 records yet, skipped"; continue; }
             case "$best" in 5e-4) chosen=(5e-4) ;; 1e-3) chosen=(1e-3 5e-4) ;; *) chosen=(2e-3 1e-3) ;; esac ;;
        esac
        for rate in "${chosen[@]}"; do width_stage "$width" "$rate" "$variant"; done
      done
    done ;;
esac
say "lane $lane done: records in $records"

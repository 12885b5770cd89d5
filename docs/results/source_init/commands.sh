#!/usr/bin/env bash
# The runs behind docs/results/source_init/ (issue 34): the small Table 1's 18L-18L seeds, the paper's
# protocol with the source init, and depth (6L/18L/50L) at the short schedule, through the shipped
# scripts/train_iwslt.sh and scripts/evaluate.sh, each run in an explicit folder
# RUNS/<study>/<variant>/seed<k>/<N>L-<M>L. Every step skips finished work (an evaluated_at_<S> marker
# or an eval record in RUNS/source_init/results.jsonl, which starts as a copy of the committed one), and a
# stopped run resumes from its checkpoint_last.pt, so rerunning a lane continues it, on a new machine too.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: docs/results/source_init/commands.sh LANE [--updates LIST] [--variants LIST] [--runs DIR] [--raw-dir DIR]

  LANE        seeds   18L-18L, lr 2e-3, warm-up 100: Pre-LN / paper init / source init, seeds 2 and 3,
                      at each of --updates (default 1500,3000)
              protocol the paper's protocol (peak 5e-4, 4,000 warm-up, 2,000-8,000 updates) with the
                      source init, 18L-18L, seed 1
              depth   lr 2e-3, warm-up 100, seed 1: 6L-6L source init; 50L-50L source init, paper init,
                      Pre-LN, Post-LN at 1,500 updates, then the two best of them at 50L-50L to 3,000
              prepare only prepare and binarise Multi30k
              tables  copy RUNS/source_init/results.jsonl here and write the report and the seeds table
                      (seeds.md/.csv: seed 1 from docs/results/multi30k_table, whose records predate settings)
  --variants  the seeds lane's models (default source,paper,preln): a second lane with another list trains
              beside the first (a run folder trains in one lane at a time: its lock refuses a second)
  --runs DIR  run folders, prepared data and results.jsonl (default: /work/runs)
  --raw-dir   raw Multi30k de-en (default: ../shared/data/multi30k_de_en)
USAGE
}

root=$(cd "$(dirname "$0")/../../.." && pwd)
runs=/work/runs raw=$root/../shared/data/multi30k_de_en lane="" seed_updates=1500,3000 variants=source,paper,preln
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --raw-dir) raw=$2; shift 2 ;;
    --updates) seed_updates=$2; shift 2 ;;
    --variants) variants=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    seeds|protocol|depth|prepare|tables) lane=$1; shift ;;
    *) echo "commands.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$lane" ] || { usage >&2; exit 2; }
here=$root/docs/results/source_init
records=$runs/source_init/results.jsonl committed=$here/results.jsonl tag=source_init
source "$root/scripts/lib/multi30k_study.sh"
if [ "$lane" = tables ]; then
  [ -f "$records" ] || { echo "commands.sh: no records at $records" >&2; exit 1; }
  cp "$records" "$here/results.jsonl"
  "$root/scripts/report" "$here/results.jsonl" --out-dir "$here"
  # seed 1 is the small Table 1 (docs/results/multi30k_table/README.md): lr 2e-3, warm-up 100, the launcher's seed 1
  "$py" -m deepnet_experiments.seeds_table "$root/docs/results/multi30k_table/results.jsonl" \
    "$root/docs/results/multi30k_table/results_source_init.jsonl" "$here/results.jsonl" --out "$here" \
    --unrecorded seed=1,lr=0.002,warmup_updates=100,width=64
  "$py" -m deepnet_experiments.pages tables && "$py" -m deepnet_experiments.pages sync "$here/README.md"
  exit 0
fi
prepare_multi30k
[ "$lane" = prepare ] && exit 0

case "$lane" in
  seeds)
    for updates in ${seed_updates//,/ }; do for seed in 2 3; do for variant in ${variants//,/ }; do
      stage table "$variant" "$seed" 18,18 "$updates" "${short[@]}"
    done; done; done ;;
  protocol)
    for updates in 2000 4000 6000 8000; do stage protocol source 1 18,18 "$updates"; done ;;
  depth)
    stage depth source 1 6,6 1500 "${short[@]}"
    for variant in source paper preln postln; do stage depth "$variant" 1 50,50 1500 "${short[@]}"; done
    # the two best at 50L-50L by their 1,500-update BLEU in the records go on to 3,000
    best=$("$py" - "$records" "$runs/depth" <<'PY'
import sys
from deepnet_setups.report import read_records
records, depth = sys.argv[1:]
bleu = {r["run_dir"].split("/")[-3]: r["bleu"] for r in read_records([records])
        if r.get("kind") == "eval" and r.get("updates") == 1500 and r["run_dir"].startswith(depth + "/")
        and r["run_dir"].endswith("/seed1/50L-50L")}
print(*sorted(bleu, key=bleu.get, reverse=True)[:2])
PY
)
    say "50L-50L on to 3,000 updates: $best"
    for variant in $best; do stage depth "$variant" 1 50,50 3000 "${short[@]}"; done ;;
esac
say "lane $lane done: records in $runs/source_init/results.jsonl"

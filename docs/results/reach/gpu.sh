#!/usr/bin/env bash
# The width table on a lent GPU: 18L-18L at the short schedule (warm-up 100), fp16, Pre-LN, DeepNet paper init and
# source init at lr 5e-4, 1e-3 and 2e-3, for each width of WIDTHS (FFN 4x, 4 heads): the three rates as three
# docs/results/source_init/gpu.sh processes at once, each training its three models side by side (nine runs on the
# GPU at once: a step at this size leaves it mostly idle), then evaluating them. Records: OUT/d<W>/lr<R>/results.jsonl;
# `commands.sh tables` reads them once copied into docs/results/reach/gpu/ (they name device cuda and fp16, so the
# width table keeps them apart from the CPU rows).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: docs/results/reach/gpu.sh OUT [--raw-dir DIR]

  OUT        run folders, prepared data, logs and records
  --raw-dir  raw Multi30k de-en (default: ../shared/data/multi30k_de_en; on the GPU machine, which gets only the
             checkout, a copy carried with it, e.g. .device/multi30k_de_en)
Environment:
  WIDTHS        widths in turn (default "256 512")
  RATES         (default "5e-4 1e-3 2e-3")
  UPDATES       updates per run (default 1000)
  TRAIN_MINUTES stop each run's training after this many minutes (default 7), so that its evaluation fits the call;
                the eval record's `updates` says how far each got
  SMOKE=1       the same steps on CPU, tiny (source_init/gpu.sh's SMOKE)
On the project's GPU machine, from the project root: source .device/setup.sh first (../shared/device/README.md).
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0 ;; "") usage >&2; exit 2 ;; esac
out=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
say() { echo "[reach gpu.sh $(date -u +%FT%TZ)] $*"; }
for width in ${WIDTHS:-256 512}; do
  pids=() rates=(${RATES:-5e-4 1e-3 2e-3})
  for rate in "${rates[@]}"; do
    dir=$out/d$width/lr$rate
    mkdir -p "$dir"
    say "d$width lr $rate: $dir (log: $dir.log)"
    LAYERS=18,18 TRAIN_MINUTES=${TRAIN_MINUTES:-7} "$root/docs/results/source_init/gpu.sh" "$dir" "$@" \
      "model.embed_dim=$width" "model.ffn_dim=$((width * 4))" "train.lr=$rate" > "$dir.log" 2>&1 &
    pids+=($!)
  done
  failed=0
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || { failed=1; say "d$width lr ${rates[$i]} failed: tail of its log:"; tail -n 20 "$out/d$width/lr${rates[$i]}.log"; }
  done
  [ "$failed" = 0 ] || exit 1
done
say "done: records in $out/d*/lr*/results.jsonl"

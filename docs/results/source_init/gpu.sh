#!/usr/bin/env bash
# Issue 34's GPU item, ready for a session that is lent one: 50L-50L d256 on Multi30k de-en, fp16, DeepNet with
# the paper init and with the source init, and Pre-LN, 1,000 updates each at the short schedule (lr 2e-3, warm-up
# 100), the three side by side on one GPU (a step at this size leaves the GPU mostly idle), then each evaluated
# (fairseq BLEU on test2016, last 5 checkpoints averaged). Records (BLEU, valid loss, lr, warm-up, init, seed)
# go to OUT/results.jsonl; `python -m deepnet_experiments.seeds_table OUT/results.jsonl --out DIR` tabulates them.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: docs/results/source_init/gpu.sh OUT [--raw-dir DIR]

  OUT         run folders, prepared data, logs and results.jsonl
  --raw-dir   raw Multi30k de-en: train/valid/test2016.{de,en} (default: ../shared/data/multi30k_de_en;
              on the GPU machine, which gets only the checkout, a copy carried with it, e.g. .device/multi30k_de_en)
Environment:
  UPDATES     updates per run (default 1000)
  SMOKE=1     the same steps on CPU: 2L-2L d64, 20 updates, 3,000 training lines (no GPU needed)
On the project's GPU machine: source .device/setup.sh first (../shared/device/README.md). About 8-10 minutes
on one H200 is the estimate, not a measurement: give the device call a timeout that leaves time for a rerun,
which resumes each run from its checkpoint_last.pt and skips an evaluated one.
USAGE
}

root=$(cd "$(dirname "$0")/../../.." && pwd)
raw=$root/../shared/data/multi30k_de_en out=""
while [ $# -gt 0 ]; do
  case "$1" in
    --raw-dir) raw=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "gpu.sh: one OUT only (see --help)" >&2; exit 2; }; out=$1; shift ;;
  esac
done
[ -n "$out" ] || { usage >&2; exit 2; }
[ -f "$raw/train.de" ] || { echo "gpu.sh: no raw Multi30k at $raw (--raw-dir)" >&2; exit 1; }
mkdir -p "$out" && out=$(cd "$out" && pwd)
config=$root/configs/iwslt14_de_en.yaml
data=(data.layout=plain "data.train=[train]" "data.valid=[valid]" "data.test=[test2016]"
      "paths.work=$out/work" "paths.results=$out/results.jsonl")
short=(train.lr=2e-3 train.warmup_updates=100 train.dropout=0.1 train.max_tokens=2000 train.batch_tokens=2000
       train.save_interval_updates=100 train.keep_interval_updates=5 eval.average_last=5 eval.max_len_a=1.2
       eval.max_len_b=10 "train.max_update=${UPDATES:-1000}")
if [ "${SMOKE:-0}" = 1 ]; then
  device=(--cpu) eval_device=(--cpu) layers=2,2 data+=(prep.max_train_lines=3000 prep.bpe_merges=1000)
  model=(model.embed_dim=64 model.ffn_dim=256 model.heads=4)
  short+=(train.max_update=20 train.save_interval_updates=5)
else
  device=(--gpus 1) eval_device=() layers=50,50  # fp16 is the setups' default on GPU; evaluate.sh uses the GPU
  model=(model.embed_dim=256 model.ffn_dim=1024 model.heads=4)
fi
say() { echo "[gpu.sh $(date -u +%FT%TZ)] $*"; }

if [ ! -e "$out/work/bin/.done" ]; then
  "$root/scripts/prepare_iwslt14.sh" --raw-dir "$raw" --workers 4 "${data[@]}"
  "$root/scripts/binarize.sh" --config "$config" --workers 4 "${data[@]}"
fi

variants=(paper source preln)
arch_of() { case "$1" in paper|source) echo deepnet ;; *) echo "$1" ;; esac; }
init_of() { case "$1" in source) echo source ;; *) echo paper ;; esac; }  # model.deepnorm_init; only DeepNet reads it
pids=()
for variant in "${variants[@]}"; do
  dir=$out/$variant/${layers/,/L-}L
  mkdir -p "$dir"
  say "train $variant in $dir (log: $dir.train.log)"
  "$root/scripts/train_iwslt.sh" --arch "$(arch_of "$variant")" --layers "$layers" "${device[@]}" --run-dir "$dir" \
    "${data[@]}" "${model[@]}" "${short[@]}" "model.deepnorm_init=$(init_of "$variant")" > "$dir.train.log" 2>&1 &
  pids+=($!)
done
failed=0
for i in "${!variants[@]}"; do
  wait "${pids[$i]}" || { failed=1; say "training ${variants[$i]} failed: tail of its log:"; tail -n 20 "$out/${variants[$i]}/${layers/,/L-}L.train.log"; }
done
[ "$failed" = 0 ] || exit 1
for variant in "${variants[@]}"; do
  dir=$out/$variant/${layers/,/L-}L
  say "evaluate $variant"
  "$root/scripts/evaluate.sh" --config "$config" --arch "$(arch_of "$variant")" --run-dir "$dir" "${eval_device[@]}" \
    "${data[@]}" "${model[@]}" "${short[@]}" "model.deepnorm_init=$(init_of "$variant")"
done
say "done: records in $out/results.jsonl"

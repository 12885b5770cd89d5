#!/usr/bin/env bash
# Issue 34's GPU item: 50L-50L d256 on Multi30k de-en, fp16, DeepNet with
# the paper init and with the source init, and Pre-LN, 1,000 updates each at the short schedule (lr 2e-3, warm-up
# 100), the three side by side on one GPU (a step at this size leaves the GPU mostly idle), then the three
# evaluated side by side (fairseq BLEU on test2016, last 5 checkpoints averaged). Records (BLEU, valid loss, lr,
# warm-up, init, seed) go to OUT/results.jsonl; `python -m deepnet_experiments.seeds_table OUT/results.jsonl
# --out DIR` tabulates them. Results: docs/results/source_init/README.md ("GPU").
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: docs/results/source_init/gpu.sh OUT [--raw-dir DIR] [KEY=VALUE ...]

  OUT         run folders, prepared data, logs and results.jsonl
  KEY=VALUE   config overrides for every run, after the short schedule's (e.g. train.lr=5e-4)
  --raw-dir   raw Multi30k de-en: train/valid/test2016.{de,en} (default: ../shared/data/multi30k_de_en;
              on the GPU machine, which gets only the checkout, a copy carried with it, e.g. .device/multi30k_de_en)
Environment:
  UPDATES     updates per run (default 1000)
  VARIANTS    which of paper, source, preln (default: all three)
  LAYERS      encoder,decoder layers (default 50,50)
  TRAIN_MINUTES  stop each run's training after this many minutes (fairseq's --stop-time-hours) if it has not
              reached UPDATES by then, so that the evaluation still fits the device call; the eval record's
              `updates` says how far each got (default: no limit)
  SMOKE=1     the same steps on CPU: 2L-2L d64, 20 updates, 3,000 training lines (no GPU needed)
On the project's GPU machine: source .device/setup.sh first (../shared/device/README.md). Measured on one H200
(the runs in gpu/): three 50L-50L runs side by side train at 1.4-2.1 updates/s each, so 1,000 updates take about 10
minutes, and the three evaluations about 1 minute; a rerun on a still-warm machine resumes each run from its
checkpoint_last.pt and skips an evaluated one. docs/results/source_init/README.md has the command as run.
USAGE
}

root=$(cd "$(dirname "$0")/../../.." && pwd)
raw=$root/../shared/data/multi30k_de_en out="" overrides=()
while [ $# -gt 0 ]; do
  case "$1" in
    --raw-dir) raw=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "gpu.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *=*) overrides+=("$1"); shift ;;
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
  device=(--gpus 1) eval_device=() layers=${LAYERS:-50,50}  # fp16 is the setups' default on GPU; evaluate.sh uses the GPU
  model=(model.embed_dim=256 model.ffn_dim=1024 model.heads=4)
fi
if [ -n "${TRAIN_MINUTES:-}" ]; then
  short+=("train.extra_args=[--stop-time-hours,$(python3 -c "print(round(${TRAIN_MINUTES} / 60, 4))")]")
fi
say() { echo "[gpu.sh $(date -u +%FT%TZ)] $*"; }

if [ ! -e "$out/work/bin/.done" ]; then
  "$root/scripts/prepare_iwslt14.sh" --raw-dir "$raw" --workers 4 "${data[@]}"
  "$root/scripts/binarize.sh" --config "$config" --workers 4 "${data[@]}"
fi

read -r -a variants <<< "${VARIANTS:-paper source preln}"
arch_of() { case "$1" in paper|source) echo deepnet ;; *) echo "$1" ;; esac; }
init_of() { case "$1" in source) echo source ;; *) echo paper ;; esac; }  # model.deepnorm_init; only DeepNet reads it
each() {  # each STEP (train | evaluate): the variants side by side (a step at this size leaves the GPU mostly idle)
  local step=$1 pids=() failed=0 variant dir cmd
  for variant in "${variants[@]}"; do
    dir=$out/$variant/${layers/,/L-}L
    mkdir -p "$dir"
    say "$step $variant in $dir (log: $dir.$step.log)"
    if [ "$step" = train ]; then cmd=("$root/scripts/train_iwslt.sh" --layers "$layers" "${device[@]}")
    else cmd=("$root/scripts/evaluate.sh" --config "$config" "${eval_device[@]}"); fi
    "${cmd[@]}" --arch "$(arch_of "$variant")" --run-dir "$dir" "${data[@]}" "${model[@]}" "${short[@]}" \
      ${overrides[@]+"${overrides[@]}"} "model.deepnorm_init=$(init_of "$variant")" > "$dir.$step.log" 2>&1 &
    pids+=($!)
  done
  for i in "${!variants[@]}"; do
    wait "${pids[$i]}" || { failed=1; say "$step ${variants[$i]} failed: tail of its log:"
                           tail -n 20 "$out/${variants[$i]}/${layers/,/L-}L.$step.log"; }
  done
  return "$failed"
}
each train
each evaluate
say "done: records in $out/results.jsonl"

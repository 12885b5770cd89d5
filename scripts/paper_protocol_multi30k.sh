#!/usr/bin/env bash
# The paper's IWSLT-14 protocol at CPU scale: Post-LN / Pre-LN / DeepNet on all Multi30k de-en pairs
# through the shipped IWSLT-14 scripts, the config's own schedule (peak lr 5e-4, 4,000 warm-up
# updates from 1e-7, inverse sqrt, label smoothing 0.1, 8,000 updates), evaluated at every stage.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/paper_protocol_multi30k.sh [--archs postln,preln,deepnet] [--layers 18,18]
                                          [--stages 2000,4000,6000,8000] [--work DIR] [--runs DIR]
                                          [--raw-dir DIR] [--dry-run]

For each stage S (in order) and each arch: train with scripts/train_iwslt.sh --cpu to S updates
(the run folder resumes from its last checkpoint, so each stage continues the previous one), then
scripts/evaluate.sh (average of the last 5 update checkpoints, tokenised BLEU on test2016, valid
loss in the train record). Records go to RUNS/results.jsonl. Every step skips finished work, so
rerunning the same command continues an interrupted protocol.

The only departures from configs/iwslt14_de_en.yaml (the table's CPU-sized model, as in
docs/setups.md "A small Table 1"): d64, FFN 256, 4 heads, dropout 0.1, 2,000 tokens per batch,
a checkpoint every 100 updates (for the last-5 average), Multi30k instead of IWSLT-14.

  --archs LIST     of postln, preln, deepnet (default: postln,preln,deepnet)
  --layers N,M     encoder,decoder layers (default: 18,18)
  --stages LIST    updates at which to stop and evaluate (default: 2000,4000,6000,8000)
  --work DIR       prepared + binarised Multi30k (default: work/multi30k_de_en; built if missing)
  --runs DIR       run folders and results.jsonl (default: runs/paper_protocol)
  --raw-dir DIR    raw Multi30k de-en (default: ../shared/data/multi30k_de_en)
  --dry-run        print the commands only
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd)
archs=postln,preln,deepnet layers=18,18 stages=2000,4000,6000,8000
work=work/multi30k_de_en runs=runs/paper_protocol raw=$root/../shared/data/multi30k_de_en dry=0
need() { [ $# -ge 2 ] || { echo "paper_protocol: option $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --archs) need "$@"; archs=$2; shift 2 ;;
    --layers) need "$@"; layers=$2; shift 2 ;;
    --stages) need "$@"; stages=$2; shift 2 ;;
    --work) need "$@"; work=$2; shift 2 ;;
    --runs) need "$@"; runs=$2; shift 2 ;;
    --raw-dir) need "$@"; raw=$2; shift 2 ;;
    --dry-run) dry=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "paper_protocol: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for arch in ${archs//,/ }; do
  case "$arch" in postln|preln|deepnet) ;; *) echo "paper_protocol: unknown arch '$arch' (postln, preln, deepnet)" >&2; exit 2 ;; esac
done
for stage in ${stages//,/ }; do
  [[ "$stage" =~ ^[1-9][0-9]*$ ]] || { echo "paper_protocol: --stages must be positive integers, got '$stage'" >&2; exit 2; }
done
[[ "$layers" =~ ^[1-9][0-9]*,[1-9][0-9]*$ ]] || { echo "paper_protocol: --layers must be N,M, got '$layers'" >&2; exit 2; }

config=$root/configs/iwslt14_de_en.yaml
data=(data.layout=plain "data.train=[train]" "data.valid=[valid]" "data.test=[test2016]"
      "paths.work=$work" "paths.runs=$runs" "paths.results=$runs/results.jsonl")
model=(model.embed_dim=64 model.ffn_dim=256 model.heads=4 train.dropout=0.1 train.max_tokens=2000
       train.batch_tokens=2000 train.save_interval_updates=100 eval.average_last=5 eval.max_len_a=1.2 eval.max_len_b=10)
say() { echo "[paper_protocol] $*"; }
step() {  # run (or print) one command
  if [ "$dry" = 1 ]; then printf '%q ' "$@"; echo; else "$@"; fi
}

if [ ! -e "$work/bin/.done" ]; then
  [ -f "$raw/train.de" ] || { echo "paper_protocol: no prepared data in $work and no raw Multi30k at $raw (--raw-dir)" >&2; exit 1; }
  step "$root/scripts/prepare_iwslt14.sh" --raw-dir "$raw" --workers 2 "${data[@]}"
  step "$root/scripts/binarize.sh" --config "$config" --workers 2 "${data[@]}"
fi
for stage in ${stages//,/ }; do
  for arch in ${archs//,/ }; do
    run_dir=$runs/iwslt14_de_en/$arch/${layers/,/L-}L
    marker=$run_dir/eval/evaluated_at_$stage
    if [ -e "$marker" ]; then say "$arch ${layers/,/L-}L: stage $stage already trained and evaluated"; continue; fi
    say "$arch ${layers/,/L-}L: train to $stage updates, then evaluate"
    step "$root/scripts/train_iwslt.sh" --arch "$arch" --layers "$layers" --cpu "${data[@]}" "${model[@]}" "train.max_update=$stage"
    step "$root/scripts/evaluate.sh" --config "$config" --arch "$arch" --layers "$layers" --cpu "${data[@]}" "${model[@]}" "train.max_update=$stage"
    [ "$dry" = 1 ] || { mkdir -p "$run_dir/eval" && date -u +%FT%TZ > "$marker"; }
  done
done
say "done: records in $runs/results.jsonl (scripts/report $runs/results.jsonl --out-dir DIR makes the tables)"

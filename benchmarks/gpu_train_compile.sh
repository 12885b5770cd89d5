#!/usr/bin/env bash
# fairseq-train on real batches (variable shapes), DeepNet 18L-18L IWSLT size: eager vs --compile-layers
# [--compile-layers-mode reduce-overhead], throughput from fairseq's own log. The fixed-shape step timings
# are benchmarks.compile_speed's (gpu_check.sh STAGES=compile); this is the check that they carry over.
set -uo pipefail
usage() {
  cat <<'USAGE'
usage: benchmarks/gpu_train_compile.sh DATA_BIN OUT_DIR UPDATES [fairseq-train options...]
  DATA_BIN  a binarised translation folder with a joined dictionary (e.g. the IWSLT-14 setup's work/bin)
  MODES     modes to run, in order (default: "eager default reduce-overhead")
  RUN_TIMEOUT  seconds per mode (default 110)
Example (GPU): MODES="eager reduce-overhead" benchmarks/gpu_train_compile.sh work/bin out 200 --fp16
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
[ "$#" -ge 3 ] || { usage >&2; exit 2; }
data=$1 out=$2 updates=$3; shift 3
ls "$data"/dict.*.txt >/dev/null 2>&1 || { echo "gpu_train_compile.sh: no fairseq dictionaries in $data" >&2; exit 1; }
mkdir -p "$out"
status=0
for mode in ${MODES:-eager default reduce-overhead}; do
  case $mode in
    eager) flags=() ;;
    default) flags=(--compile-layers) ;;
    reduce-overhead) flags=(--compile-layers --compile-layers-mode reduce-overhead) ;;
    *) echo "gpu_train_compile.sh: unknown mode '$mode'" >&2; exit 2 ;;
  esac
  start=$SECONDS
  timeout "${RUN_TIMEOUT:-110}" fairseq-train "$data" --user-dir deepnet_fairseq --arch deepnet_transformer_iwslt_de_en \
    --encoder-layers 18 --decoder-layers 18 --share-all-embeddings --optimizer adam --adam-betas '(0.9,0.98)' --lr 5e-4 \
    --lr-scheduler inverse_sqrt --warmup-updates 4000 --warmup-init-lr 1e-7 --criterion label_smoothed_cross_entropy \
    --label-smoothing 0.1 --dropout 0.3 --max-tokens 4096 --max-update "$updates" --seed 1 --no-save --disable-validation \
    --log-format json --log-interval 25 --num-workers 0 "${flags[@]}" "$@" > "$out/train_$mode.log" 2>&1
  rc=$?
  [ "$rc" = 0 ] || status=1
  echo "$mode: rc=$rc (124: stopped at RUN_TIMEOUT) wall=$((SECONDS - start)) s"
  grep -o '"num_updates": "[0-9]*"\|"ups": "[0-9.]*"\|"loss": "[0-9.]*"' "$out/train_$mode.log" | paste - - - | tail -n 4
  grep -E "done training" "$out/train_$mode.log" | tail -n 1
done
exit $status

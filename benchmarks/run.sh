#!/usr/bin/env bash
# Every CPU benchmark in one command; results (JSON, CSV, plot, logs) go to benchmarks/results.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/run.sh [STEP ...]

Runs the CPU benchmarks (one thread each, OMP_NUM_THREADS=1) and keeps their output in
benchmarks/results/. STEPs (default: all, in this order):
  throughput   deepnet/preln vs transformer, 6L-6L and 48L-48L d128, interleaved (~15 min busy, ~4 idle)
  profile      torch.profiler op counts/time per step at 6L-6L d128, incl. a fused-add variant
  depth        deepnet depth scaling 6..500 layers per stack, checkpointing off/on, CSV + plot
  inference    beam-search sentences/s, trained 12L-12L deepnet vs transformer checkpoints
  compile      --compile-layers vs eager: step time, aten ops/step (18L-18L d64 and IWSLT size), and
               fairseq-train with and without the flag for every architecture (60 updates each)
A step whose results/<step>.done exists is skipped; FORCE=1 reruns it.
Environment: PYTHON (default .venv/bin/python), FORCE=1.
USAGE
}

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || { echo "run.sh: no Python at $PYTHON (run 'make install' or set PYTHON)" >&2; exit 1; }
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
OUT=benchmarks/results
mkdir -p "$OUT"

steps=("$@")
[ "${#steps[@]}" -gt 0 ] || steps=(throughput profile depth inference compile)

run_step() {  # run_step NAME CMD...: log to $OUT/NAME.log, mark done only on success
  local name=$1; shift
  if [ -e "$OUT/$name.done" ] && [ "${FORCE:-0}" != 1 ]; then
    echo "run.sh: $name already done ($OUT/$name.done; FORCE=1 reruns)"; return
  fi
  echo "run.sh: $name: $*"
  "$@" > "$OUT/$name.log.tmp" 2>&1 || { echo "run.sh: $name failed; see $OUT/$name.log.tmp" >&2; exit 1; }
  mv "$OUT/$name.log.tmp" "$OUT/$name.log"
  touch "$OUT/$name.done"
  grep -E '^\||meets|MISSES|checkpointing|fits|largest' "$OUT/$name.log" || true
}

for step in "${steps[@]}"; do
  case "$step" in
    throughput) run_step throughput "$PYTHON" -m benchmarks.throughput --shapes cpu --rounds 7 --steps 2 --out "$OUT/throughput_cpu.json" ;;
    profile) run_step profile "$PYTHON" -m benchmarks.profile_ops --shape 6L-6L-d128 --repeats 5 --fused --out "$OUT/profile_ops_6L.json" ;;
    depth) run_step depth "$PYTHON" -m benchmarks.depth_scaling --timed-steps 1 --profile-max-layers 50 --out-dir "$OUT" ;;
    inference) run_step inference "$PYTHON" -m benchmarks.inference --layers 12 --max-update 40 --rounds 3 --out "$OUT/inference_cpu.json"
               # same checkpoints (training is skipped), plus the one-kernel residual candidate
               run_step inference_fused "$PYTHON" -m benchmarks.inference --layers 12 --max-update 40 --rounds 3 \
                 --modes fixed --fused --out "$OUT/inference_fused_cpu.json" ;;
    compile) run_step compile_layers_cpu "$PYTHON" -m benchmarks.compile_speed --shapes cpu --rounds 7 --steps 2 \
               --out "$OUT/compile_layers_cpu.json"
             run_step compile_archs "$PYTHON" -m benchmarks.compile_archs --out "$OUT/compile_archs.json" ;;
    *) echo "run.sh: unknown step '$step' (throughput, profile, depth, inference, compile; see --help)" >&2; exit 2 ;;
  esac
done

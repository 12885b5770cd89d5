#!/usr/bin/env bash
# GPU checks in one go (about 6 minutes on one H200 for the default stages): fp16/bf16 deepnet vs
# transformer training steps (ratio, tokens/s, TFLOP/s vs peak), apex on/off where installed, the
# largest depth that trains at d512 with --checkpoint-activations, then benchmarks/fp16_scaler_check.sh
# (fp16 loss scaler recovering at 50L-50L). The `compile` stage (--compile-layers vs eager at the
# IWSLT shape and at 100L-100L d512, fp16: words/s, GPU kernels per step, TFLOP/s vs peak) and the
# `optim` stage (--optimizer adam_foreach) are prepared but not in the default stages. Prints
# everything; writes JSON + logs to OUT_DIR.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/gpu_check.sh [OUT_DIR]

Runs the GPU checks on the first CUDA device and keeps their output in OUT_DIR
(default: benchmarks/results).
Stages (STAGES, space-separated, in this order):
  ab        python -m benchmarks.gpu: fp16/bf16 A/B at 100L-100L d512, TFLOP/s vs peak, apex on/off,
            depth search (gpu_check.json/.log)                                  ~4 min on an H200
  scaler    benchmarks/fp16_scaler_check.sh (fp16_scaler.log)                    ~1-2 min
  compile   python -m benchmarks.compile_speed --device cuda --shapes gpu --extra-args=--fp16:
            deepnet_transformer eager vs --compile-layers, 18L-18L IWSLT size at 4,096 target
            tokens and 100L-100L d512 at 8,192 (gpu_compile.json/.log), then the IWSLT shape with
            --compile-layers-mode reduce-overhead (CUDA graphs; gpu_compile_cudagraphs.json/.log)
                                                                             ~3 min on an H200
  optim     python -m benchmarks.compile_speed --device cuda --against adam_foreach_mefp16: fairseq's fp16
            Adam (fp32 master copy) vs --memory-efficient-fp16 --optimizer adam_foreach, 18L-18L IWSLT
            size (gpu_optim.json/.log)                                       ~1 min on an H200
Default STAGES="ab scaler"; the compile check alone: STAGES=compile benchmarks/gpu_check.sh OUT_DIR
On the project's GPU machine (no network), first: source .device/setup.sh (../shared/device/README.md).
Environment:
  PYTHON          interpreter (default: .venv/bin/python)
  SEARCH_BUDGET_S seconds for the depth search (default 120)
  ROUNDS/STEPS    interleaved rounds and steps per round of the A/B timings (default 3 and 2)
  SMOKE=1         run the same code on CPU with tiny fp32 shapes (no GPU needed)
USAGE
}

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
if [ "$#" -gt 1 ]; then echo "gpu_check.sh: at most one argument (OUT_DIR); see --help" >&2; exit 2; fi

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT_DIR="${1:-benchmarks/results}"
[ -x "$PYTHON" ] || { echo "gpu_check.sh: no Python at $PYTHON (run 'make install' or set PYTHON)" >&2; exit 1; }
mkdir -p "$OUT_DIR"

STAGES="${STAGES:-ab scaler}"
ROUNDS="${ROUNDS:-3}" STEPS="${STEPS:-2}"
smoke=()
if [ "${SMOKE:-0}" = 1 ]; then
  smoke=(--smoke); ROUNDS=2; STEPS=1
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
else
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || { echo "gpu_check.sh: torch sees no CUDA device (SMOKE=1 checks the code on CPU)" >&2; exit 1; }
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi

run_logged() {  # run_logged NAME CMD...: tee to OUT_DIR/NAME.log, renamed only after success (pipefail)
  local name=$1; shift
  local start=$SECONDS
  "$@" 2>&1 | tee "$OUT_DIR/$name.log.tmp"
  mv "$OUT_DIR/$name.log.tmp" "$OUT_DIR/$name.log"
  echo "gpu_check.sh: $name done in $((SECONDS - start)) s; wrote $OUT_DIR/$name.log"
}

for stage in $STAGES; do
  case "$stage" in
    ab)
      name=gpu_check; [ "${SMOKE:-0}" = 1 ] && name=gpu_check_smoke
      # the JSON is written atomically by the Python side
      run_logged "$name" "$PYTHON" -m benchmarks.gpu "${smoke[@]}" --rounds "$ROUNDS" --steps "$STEPS" \
        --search-budget-s "${SEARCH_BUDGET_S:-120}" --out "$OUT_DIR/$name.json" ;;
    scaler)
      # fp16 guard rail (issue: reliability): the loss scaler recovers from overflow at depth with DeepNorm
      if [ "${SMOKE:-0}" = 1 ]; then echo "gpu_check.sh: scaler needs fp16 on a GPU; skipped with SMOKE=1"; continue; fi
      PYTHON="$PYTHON" UPDATES="${UPDATES:-100}" benchmarks/fp16_scaler_check.sh "$OUT_DIR" ;;
    compile)
      if [ "${SMOKE:-0}" = 1 ]; then
        # --extra-args=--cpu (a no-op here) takes the GPU line's `=` form: argparse reads a separate
        # value that starts with '-' as an option and stops ("expected one argument")
        run_logged gpu_compile_smoke "$PYTHON" -m benchmarks.compile_speed --shapes tiny --rounds "$ROUNDS" \
          --steps "$STEPS" --warmup 1 --extra-args=--cpu --out "$OUT_DIR/gpu_compile_smoke.json"
      else
        run_logged gpu_compile "$PYTHON" -m benchmarks.compile_speed --device cuda --shapes gpu --extra-args=--fp16 \
          --rounds "$ROUNDS" --steps "$STEPS" --out "$OUT_DIR/gpu_compile.json"
        # CUDA graphs on top (one replay per layer instead of its kernel launches), IWSLT shape only
        run_logged gpu_compile_cudagraphs "$PYTHON" -m benchmarks.compile_speed --device cuda --shapes 18L-18L-iwslt-4096 \
          --extra-args="--fp16 --compile-layers-mode reduce-overhead" --rounds "$ROUNDS" --steps "$STEPS" \
          --out "$OUT_DIR/gpu_compile_cudagraphs.json"
      fi ;;
    optim)
      if [ "${SMOKE:-0}" = 1 ]; then
        run_logged gpu_optim_smoke "$PYTHON" -m benchmarks.compile_speed --shapes tiny --against adam_foreach \
          --rounds "$ROUNDS" --steps "$STEPS" --warmup 1 --extra-args=--cpu --out "$OUT_DIR/gpu_optim_smoke.json"
      else
        run_logged gpu_optim "$PYTHON" -m benchmarks.compile_speed --device cuda --shapes 18L-18L-iwslt-4096 \
          --against adam_foreach_mefp16 --extra-args=--fp16 --rounds "$ROUNDS" --steps "$STEPS" \
          --out "$OUT_DIR/gpu_optim.json"
      fi ;;
    *) echo "gpu_check.sh: unknown stage '$stage' (ab, scaler, compile, optim)" >&2; exit 2 ;;
  esac
done

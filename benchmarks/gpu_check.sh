#!/usr/bin/env bash
# GPU checks in one go (~10 minutes on one GPU): fp16/bf16 deepnet vs transformer training steps
# (ratio, tokens/s, TFLOP/s vs peak), apex on/off where installed, and the largest depth that
# trains at d512 with --checkpoint-activations, then benchmarks/fp16_scaler_check.sh (fp16 loss
# scaler recovering at 50L-50L). Prints everything; writes JSON + logs to OUT_DIR.
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/gpu_check.sh [OUT_DIR]

Runs `python -m benchmarks.gpu` on the first CUDA device and keeps its output.
  OUT_DIR   where gpu_check.json and gpu_check.log go (default: benchmarks/results)
Environment:
  PYTHON          interpreter (default: .venv/bin/python)
  SEARCH_BUDGET_S seconds for the depth search (default 240)
  SMOKE=1         run the same code on CPU with a tiny fp32 shape (no GPU needed)
USAGE
}

case "${1:-}" in -h|--help) usage; exit 0 ;; esac
if [ "$#" -gt 1 ]; then echo "gpu_check.sh: at most one argument (OUT_DIR); see --help" >&2; exit 2; fi

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
OUT_DIR="${1:-benchmarks/results}"
[ -x "$PYTHON" ] || { echo "gpu_check.sh: no Python at $PYTHON (run 'make install' or set PYTHON)" >&2; exit 1; }
mkdir -p "$OUT_DIR"

args=(--search-budget-s "${SEARCH_BUDGET_S:-240}")
name=gpu_check
if [ "${SMOKE:-0}" = 1 ]; then
  args+=(--smoke --rounds 2 --steps 1)
  name=gpu_check_smoke
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
else
  "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || { echo "gpu_check.sh: torch sees no CUDA device (SMOKE=1 checks the code on CPU)" >&2; exit 1; }
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
fi

log="$OUT_DIR/$name.log"
# the JSON is written atomically by the Python side; the log is renamed only after success (pipefail)
"$PYTHON" -m benchmarks.gpu "${args[@]}" --out "$OUT_DIR/$name.json" 2>&1 | tee "$log.tmp"
mv "$log.tmp" "$log"
echo "gpu_check.sh: wrote $OUT_DIR/$name.json and $log"
# fp16 guard rail (issue: reliability): the loss scaler recovers from overflow at depth with DeepNorm
if [ "${SMOKE:-0}" != 1 ]; then
  PYTHON="$PYTHON" benchmarks/fp16_scaler_check.sh "$OUT_DIR"
fi

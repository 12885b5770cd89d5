#!/usr/bin/env bash
# fp16 guard rail on GPU: a deep DeepNet trained with fairseq's --fp16 and a deliberately huge initial
# loss scale must overflow, let the dynamic loss scaler back off, and then train with finite,
# falling loss. Called by benchmarks/gpu_check.sh; needs a CUDA device (about 1-2 minutes).
set -euo pipefail

usage() {
  cat <<'USAGE'
usage: benchmarks/fp16_scaler_check.sh [OUT_DIR]

Trains deepnet_transformer 50L-50L d256 (--fp16 --fp16-init-scale 2^20) for 150 updates on the
package's synthetic task and checks, from fairseq's own log: at least one "gradient overflow"
note, a loss scale that settled below the initial one, and a final loss that is finite and lower
than the first logged one. Writes OUT_DIR/fp16_scaler.log (default OUT_DIR: benchmarks/results).
Environment: PYTHON (default .venv/bin/python), LAYERS (default 50), UPDATES (default 150).
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
[ -x "$PYTHON" ] || { echo "fp16_scaler_check.sh: no Python at $PYTHON (run 'make install' or set PYTHON)" >&2; exit 1; }
exec "$PYTHON" -m benchmarks.fp16_scaler_check "$@"  # the command and the check: benchmarks/fp16_scaler_check.py

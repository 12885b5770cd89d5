#!/usr/bin/env bash
# Depth sweep (Post-LN / Pre-LN / DeepNet or any registered arch): runs.csv, curves.csv and plots.
# Usage: scripts/depth_sweep.sh --out DIR [--data BIN] [--archs A,B] [--depths 6,18] [--updates K]
#        [--seeds 1,2,3] [--lr LR] [--warmup W] [--jobs J] [--bleu] [-- extra fairseq-train args]
# Run with --help for every option. Finished runs (DIR/runs/*/.done) are skipped.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${VENV:-$ROOT/.venv}/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "depth_sweep.sh: no virtual environment at ${VENV:-$ROOT/.venv}; run 'make install' first" >&2
  exit 1
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

exec "$PY" -m deepnet_experiments.sweep "$@"

#!/usr/bin/env bash
# Regenerate the papers' stability figures (DeepNet Figs. 3 and 5, Pre-LN Fig. 3) into docs/figures.
# Usage: scripts/figures.sh [--out DIR] [--figures DIR] [--jobs J] [--tiny]   (--help for details)
#        scripts/figures.sh --fig5-only --fig5-methods M1,M2 --depths 250,500 --updates 50   (adds Fig. 5 rows)
# About 35 minutes of CPU (one thread per run); finished runs in DIR/runs are kept and skipped.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${VENV:-$ROOT/.venv}/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "figures.sh: no virtual environment at ${VENV:-$ROOT/.venv}; run 'make install' first" >&2
  exit 1
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

cd "$ROOT"
exec "$PY" -m deepnet_experiments.figures "$@"

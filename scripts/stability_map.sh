#!/usr/bin/env bash
# Stability map: Post-LN / Pre-LN / DeepNet over depth x peak learning rate (and warm-up), each cell
# classified trains / stalls / diverges. Usage: scripts/stability_map.sh --out DIR [options] (--help).
# Finished cells (DIR/runs/*/.done) are skipped, so rerunning the same command resumes.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${VENV:-$ROOT/.venv}/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "stability_map.sh: no virtual environment at ${VENV:-$ROOT/.venv}; run 'make install' first" >&2
  exit 1
fi
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

exec "$PY" -m deepnet_experiments.stability_map "$@"

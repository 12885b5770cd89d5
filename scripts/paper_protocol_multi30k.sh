#!/usr/bin/env bash
# The paper's IWSLT-14 protocol at CPU scale: Post-LN / Pre-LN / DeepNet on all Multi30k de-en pairs
# through the shipped IWSLT-14 scripts, the config's own schedule (peak lr 5e-4, 4,000 warm-up
# updates from 1e-7, inverse sqrt, label smoothing 0.1, 8,000 updates), evaluated at every stage.
# The staging lives in deepnet_experiments/paper_protocol.py; --help lists the options.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${VENV:-$ROOT/.venv}/bin/python"
if [[ ! -x "$PY" ]]; then
  echo "paper_protocol_multi30k.sh: no virtual environment at ${VENV:-$ROOT/.venv}; run 'make install' first" >&2
  exit 1
fi

# --work and --runs are relative to the caller's folder, so no cd: the driver is found through PYTHONPATH
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" exec "$PY" -m deepnet_experiments.paper_protocol "$@"

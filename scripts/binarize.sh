#!/usr/bin/env bash
# Stage 2 of a paper setup: segmented text -> fairseq binary data (joined dictionary), in parallel.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/binarize.sh --config configs/<setup>.yaml [--workers N] [--dry-run] [key=value ...]

Runs fairseq-preprocess (--joined-dictionary; multilingual: the SentencePiece dictionary for every
language, one call per corpus) on the prepared text in paths.work into paths.work/bin. Skipped when
paths.work/bin/.done exists. --dry-run prints the commands.
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
config="" ; args=()
need() { [ $# -ge 2 ] || { echo "binarize: option $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need "$@"; config=$2; shift 2 ;;
    --workers) need "$@"; args+=(--workers "$2"); shift 2 ;;
    --work-dir) need "$@"; args+=("paths.work=$2"); shift 2 ;;
    --dry-run) args+=(--dry-run); shift ;;
    -h|--help) usage; exit 0 ;;
    *=*) args+=("$1"); shift ;;
    *) echo "binarize: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$config" ] || { echo "binarize: --config FILE is required (see --help)" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$py" -m deepnet_setups.prepare "$config" --stage binarize "${args[@]}"

#!/usr/bin/env bash
# Stage 1 of a paper setup: raw text -> cleaned, tokenised, segmented text (docs/setups.md).
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/prepare_setup.sh --config configs/<setup>.yaml [--raw-dir DIR] [--workers N] [key=value ...]
   (or scripts/prepare_{iwslt14,wmt17,opus100,m2m_102}.sh [options], which fill in --config)

Downloads the setup's corpora (URLs and checksums in the config) or reads them from --raw-dir DIR
(same layout as the downloads), then cleans, tokenises and segments them into paths.work
(bilingual: Moses + BPE with subword-nmt; multilingual: one joint SentencePiece model trained on
temperature-sampled text). Finished steps are skipped on a rerun. Next: scripts/binarize.sh.
  --config FILE    the setup's config
  --raw-dir DIR    local raw data instead of downloading
  --work-dir DIR   override paths.work
  --workers N      parallel workers (default: binarize.workers)
  key=value        override any config value, e.g. prep.bpe_merges=8000
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
config="" ; args=()
need() { [ $# -ge 2 ] || { echo "prepare: option $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need "$@"; config=$2; shift 2 ;;
    --raw-dir) need "$@"; args+=(--raw-dir "$2"); shift 2 ;;
    --workers) need "$@"; args+=(--workers "$2"); shift 2 ;;
    --work-dir) need "$@"; args+=("paths.work=$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *=*) args+=("$1"); shift ;;
    *) echo "prepare: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$config" ] || { echo "prepare: --config FILE is required (see --help)" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$py" -m deepnet_setups.prepare "$config" --stage text "${args[@]}"

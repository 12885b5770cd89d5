#!/usr/bin/env bash
# Stage 4 of a paper setup: average the last K checkpoints, translate the test set, score it.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/evaluate.sh --config configs/<setup>.yaml (--arch A [--layers N,M] | --run-dir DIR)
                           [--average-last K] [--cpu] [--engine fairseq|ctranslate2|ctranslate2_int8]
                           [key=value ...]

Averages the last K checkpoints of the run (eval.average_last), runs fairseq-generate on the test
set and scores it with the setup's metric (eval.metric): IWSLT-14 tokenised BLEU; WMT-17 compound-
split BLEU plus detokenised sacreBLEU; multilingual: detokenised sacreBLEU per direction, a CSV and
a heatmap, group averages, and per direction the share of hypotheses identified as the target
language (py3langid; the top wrong language; zero-shot directions marked). The copy-the-source
baseline is scored too. Writes <run>/eval/ and appends a record to paths.results.
--engine ctranslate2 (any setup) exports the averaged checkpoint to <run>/eval/ctranslate2/ and
decodes with CTranslate2 instead, in fairseq-generate's batches: the same hypotheses at float32;
ctranslate2_int8 with int8 weights (<run>/eval/ctranslate2_int8/; docs/deploy.md).
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
config="" ; args=()
need() { [ $# -ge 2 ] || { echo "evaluate: option $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --config) need "$@"; config=$2; shift 2 ;;
    --arch|--layers|--run-dir|--average-last|--engine) need "$@"; args+=("$1" "$2"); shift 2 ;;
    --cpu) args+=(--cpu); shift ;;
    -h|--help) usage; exit 0 ;;
    *=*) args+=("$1"); shift ;;
    *) echo "evaluate: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$config" ] || { echo "evaluate: --config FILE is required (see --help)" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$py" -m deepnet_setups.evaluate "$config" "${args[@]}"

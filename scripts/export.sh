#!/usr/bin/env bash
# Deploy a trained model: export it to plain fairseq (no plugin needed) or to a CTranslate2 translator.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/export.sh CHECKPOINT --to transformer OUT.pt [--average-last K]
       scripts/export.sh CHECKPOINT --to ctranslate2 OUTDIR [--quantization int8|int8_float16|float16]
                         [--average-last K] [--work DIR | --data DIR [--tokenizer moses]
                         [--bpe subword_nmt --bpe-codes FILE | --bpe sentencepiece --sentencepiece-model FILE]]

CHECKPOINT is a checkpoint file, or with --average-last K a run's checkpoints folder (the last K
update checkpoints are averaged first). deepnet_transformer is folded exactly into fairseq's
`transformer` (each residual branch's output projection divided by alpha), deepnet_transformer_lm
into `transformer_lm`, preln_/postln_transformer renamed; every other architecture is refused.
OUT.pt loads without the plugin (torch's weights-only default; fairseq-generate without --user-dir).
--to ctranslate2 writes a complete translator: the model (one LayerNorm eps, made exact for DeepNet),
its dictionaries, its text processing and languages (deploy.json). A setup's model (bilingual or
multilingual) gets the setup's tokenisation, found in --work DIR (default: the training data's parent
folder). Any other translation checkpoint: the dictionaries of --data DIR (default: the training data
folder), fairseq-interactive's --tokenizer/--bpe options, or none (tokens in, tokens out).
Translate with: python -m deepnet_fairseq.translate OUTDIR [--source-lang X --target-lang Y] < in > out
Details: docs/deploy.md.
USAGE
}

root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-$root/.venv/bin/python}
[ -x "$py" ] || py=python3
checkpoint="" ; args=()
need() { [ $# -ge 2 ] || { echo "export: option $1 needs a value (see --help)" >&2; exit 2; }; }
while [ $# -gt 0 ]; do
  case "$1" in
    --to) [ $# -ge 3 ] || { echo "export: --to needs a format and an output path (see --help)" >&2; exit 2; }
          args+=(--to "$2" "$3"); shift 3 ;;
    --average-last|--quantization|--work|--data|--tokenizer|--bpe|--bpe-codes|--sentencepiece-model)
      need "$@"; args+=("$1" "$2"); shift 2 ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "export: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) [ -z "$checkpoint" ] || { echo "export: one CHECKPOINT only, got '$checkpoint' and '$1'" >&2; exit 2; }
       checkpoint=$1; shift ;;
  esac
done
[ -n "$checkpoint" ] || { echo "export: CHECKPOINT is required (see --help)" >&2; exit 2; }
[ ${#args[@]} -gt 0 ] && [[ " ${args[*]} " == *" --to "* ]] || { echo "export: --to transformer|ctranslate2 OUT is required (see --help)" >&2; exit 2; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$py" -m deepnet_fairseq.export "$checkpoint" "${args[@]}"

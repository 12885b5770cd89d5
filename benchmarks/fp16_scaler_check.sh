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
OUT_DIR="${1:-benchmarks/results}"
LAYERS="${LAYERS:-50}"
UPDATES="${UPDATES:-150}"
bin_dir=$(dirname "$PYTHON")
[ -x "$PYTHON" ] || { echo "fp16_scaler_check.sh: no Python at $PYTHON (run 'make install' or set PYTHON)" >&2; exit 1; }
"$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { echo "fp16_scaler_check.sh: torch sees no CUDA device (fp16 training needs a GPU)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$OUT_DIR"
"$PYTHON" -c "from deepnet_experiments.synthetic import write_reverse_map_task as w; w('$work/text', train=20000)"
"$bin_dir/fairseq-preprocess" -s src -t tgt --trainpref "$work/text/train" --validpref "$work/text/valid" \
  --destdir "$work/bin" --joined-dictionary --workers 4 > "$work/preprocess.log" 2>&1 \
  || { echo "fp16_scaler_check.sh: fairseq-preprocess failed, see $work/preprocess.log" >&2; cat "$work/preprocess.log" >&2; exit 1; }

log="$OUT_DIR/fp16_scaler.log"
"$bin_dir/fairseq-train" "$work/bin" --user-dir deepnet_fairseq --arch deepnet_transformer \
  --encoder-layers "$LAYERS" --decoder-layers "$LAYERS" --encoder-embed-dim 256 --decoder-embed-dim 256 \
  --encoder-ffn-embed-dim 1024 --decoder-ffn-embed-dim 1024 --encoder-attention-heads 4 --decoder-attention-heads 4 \
  --share-all-embeddings --fp16 --fp16-init-scale 1048576 --optimizer adam --adam-betas '(0.9, 0.98)' \
  --lr 5e-4 --lr-scheduler inverse_sqrt --warmup-updates 50 --criterion label_smoothed_cross_entropy \
  --label-smoothing 0.1 --max-tokens 8192 --max-update "$UPDATES" --no-save --disable-validation \
  --log-format json --log-interval 10 --seed 1 2>&1 | tee "$log.tmp"
mv "$log.tmp" "$log"

"$PYTHON" - "$log" <<'PY'
import json, math, re, sys
text = open(sys.argv[1]).read()
overflows = len(re.findall(r"gradient overflow detected", text))
records = [json.loads(m) for m in re.findall(r"\| train_inner \| (\{.*\})", text)]
if not records:
    sys.exit("fp16_scaler_check: no train_inner records in the log")
losses = [float(r["loss"]) for r in records]
scales = [float(r.get("loss_scale", "nan")) for r in records]
print(f"fp16_scaler_check: {overflows} overflow notes; loss scale {scales[0]:g} -> {scales[-1]:g}; "
      f"loss {losses[0]:.3f} -> {losses[-1]:.3f} over {records[-1]['num_updates']} updates")
ok = overflows >= 1 and scales[-1] < 2**20 and math.isfinite(losses[-1]) and losses[-1] < losses[0]
print("fp16_scaler_check: " + ("PASS: the scaler backed off and training recovered" if ok else "FAIL"))
sys.exit(0 if ok else 1)
PY

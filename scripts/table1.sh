#!/usr/bin/env bash
# DeepNet's Table 1 on one fairseq: every method at every depth, BLEU or 'diverged'.
# Runs scripts/depth_sweep.sh (with --bleu) and writes OUT/table1.csv and OUT/table1.md
# (rows = methods in the paper's order, columns = depths N=M; mean BLEU over the seeds, 'diverged'
# when any seed diverged), plus the mean validation loss in the same layout (table1_valid_loss.csv
# and a second table in table1.md). Finished runs are skipped on a rerun.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${VENV:-$ROOT/.venv}/bin/python"

usage() {
  cat <<USAGE
Usage: scripts/table1.sh --out DIR [--data BIN_DIR] [--methods a,b,...] [--variant iwslt_de_en]
                         [--depths 2,8] [--updates 40] [--seeds 1] [--lr 5e-3] [--warmup 4]
                         [--max-tokens 600] [--jobs 1] [--full-shape] [--format-only]
                         [-- extra fairseq-train args]

  --out DIR       output folder (runs/, runs.csv, table1.csv, table1.md)
  --data BIN_DIR  binarised translation data (default: depth_sweep's small Multi30k de-en set
                  built from ../shared/data/multi30k_de_en)
  --methods LIST  model names (default: every method, in the paper's order:
                  python -m deepnet_methods list --field family --zoo)
  --variant V     size variant appended to each name (default: iwslt_de_en; '' for none)
  --depths LIST   depths N=M (default: 2,8)
  --updates K     updates per run (default: 40)
  --seeds LIST    seeds (default: 1)
  --lr X          peak learning rate, inverse_sqrt (default: 5e-3, high enough to show instability in few updates)
  --warmup W      warm-up updates (default: 4)
  --max-tokens T  tokens per batch (default: 600)
  --jobs J        runs in parallel, one thread each (default: 1)
  --full-shape    the variant's own width (default: depth_sweep's CPU-sized d=64 shape)
  --format-only   no training: rebuild table1.csv/.md from an existing OUT/runs.csv
Everything after -- goes to fairseq-train.
USAGE
}

OUT="" DATA="" METHODS="" VARIANT="iwslt_de_en" DEPTHS="2,8" UPDATES=40 SEEDS=1 LR=5e-3 WARMUP=4 MAX_TOKENS=600 JOBS=1
SHAPE="--tiny" FORMAT_ONLY=0
EXTRA=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --out|--data|--methods|--variant|--depths|--updates|--seeds|--lr|--warmup|--max-tokens|--jobs)
      [[ $# -ge 2 ]] || { echo "table1.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --out) OUT="$2" ;; --data) DATA="$2" ;; --methods) METHODS="$2" ;; --variant) VARIANT="$2" ;;
        --depths) DEPTHS="$2" ;; --updates) UPDATES="$2" ;; --seeds) SEEDS="$2" ;; --lr) LR="$2" ;;
        --warmup) WARMUP="$2" ;; --max-tokens) MAX_TOKENS="$2" ;; --jobs) JOBS="$2" ;;
      esac
      shift 2 ;;
    --full-shape) SHAPE="--arch-shape"; shift ;;
    --format-only) FORMAT_ONLY=1; shift ;;
    --) shift; EXTRA=("$@"); break ;;
    *) echo "table1.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -n "$OUT" ]] || { echo "table1.sh: --out DIR is required (see --help)" >&2; exit 2; }
[[ -x "$PY" ]] || { echo "table1.sh: no virtual environment at ${VENV:-$ROOT/.venv}; run 'make install' first" >&2; exit 1; }
# default: every method of the registry in the paper's order, by its plugin family (Post-LN: postln_transformer)
[[ -n "$METHODS" ]] || METHODS=$(cd "$ROOT" && "$PY" -m deepnet_methods list --field family --zoo)
[[ -x "$ROOT/scripts/depth_sweep.sh" ]] || { echo "table1.sh: missing $ROOT/scripts/depth_sweep.sh" >&2; exit 1; }
[[ -z "$DATA" || -d "$DATA" ]] || { echo "table1.sh: --data $DATA is not a directory" >&2; exit 1; }
[[ "$DEPTHS" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "table1.sh: --depths must look like 6,18, got '$DEPTHS'" >&2; exit 2; }

ARCHS=""
IFS=',' read -ra NAMES <<< "$METHODS"
for name in "${NAMES[@]}"; do
  ARCHS+="${ARCHS:+,}${name}${VARIANT:+_$VARIANT}"
done

export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
if [[ "$FORMAT_ONLY" == 1 ]]; then
  [[ -f "$OUT/runs.csv" ]] || { echo "table1.sh: --format-only needs $OUT/runs.csv" >&2; exit 1; }
else
  "$ROOT/scripts/depth_sweep.sh" --out "$OUT" ${DATA:+--data "$DATA"} --archs "$ARCHS" --depths "$DEPTHS" \
    --updates "$UPDATES" --seeds "$SEEDS" --lr "$LR" --warmup "$WARMUP" --max-tokens "$MAX_TOKENS" --jobs "$JOBS" "$SHAPE" --bleu \
    ${EXTRA[@]+-- "${EXTRA[@]}"}
fi

"$PY" - "$OUT" "$ARCHS" "$DEPTHS" <<'PY'
"""runs.csv -> Table 1 layout (methods x depths), CSV and Markdown, each written then renamed."""
import csv
import io
import os
import sys
from collections import defaultdict
from pathlib import Path

out, archs, depths = Path(sys.argv[1]), sys.argv[2].split(","), [int(d) for d in sys.argv[3].split(",")]
runs = defaultdict(list)
with open(out / "runs.csv", newline="") as f:
    for row in csv.DictReader(f):
        runs[row["arch"], int(row["depth"])].append(row)


def cell(rows, column, digits):
    if not rows:
        raise SystemExit(f"table1.sh: runs.csv lacks a run (have {sorted(runs)})")
    if any(r["diverged"] == "yes" for r in rows):
        return "diverged"
    values = [float(r[column]) for r in rows if r[column] != ""]
    if len(values) != len(rows):
        raise SystemExit(f"table1.sh: a run of {rows[0]['arch']} L{rows[0]['depth']} trained but has no {column}")
    return f"{sum(values) / len(values):.{digits}f}"


def write(path, text):
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def csv_text(rows):
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


def markdown(header, table):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in table]) + "\n"


header = ["method"] + [f"{d}L-{d}L" for d in depths]
bleu = [[a] + [cell(runs[a, d], "bleu", 2) for d in depths] for a in archs]
loss = [[a] + [cell(runs[a, d], "valid_loss", 3) for d in depths] for a in archs]
write(out / "table1.csv", csv_text([header] + bleu))
write(out / "table1_valid_loss.csv", csv_text([header] + loss))
md = ("Test BLEU (or 'diverged'):\n\n" + markdown(header, bleu)
      + "\nValidation loss (base 2, or 'diverged'):\n\n" + markdown(header, loss))
write(out / "table1.md", md)
print(md, end="")
print(f"table1.sh: wrote {out / 'table1.csv'}, {out / 'table1_valid_loss.csv'} and {out / 'table1.md'}")
PY

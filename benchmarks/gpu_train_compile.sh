#!/usr/bin/env bash
# fairseq-train on real batches (variable shapes), DeepNet 18L-18L IWSLT size: eager vs --compile-layers
# [--compile-layers-mode reduce-overhead], throughput from fairseq's own log. The fixed-shape step timings
# are benchmarks.compile_speed's (gpu_check.sh STAGES=compile); this is the check that they carry over.
# The runs: benchmarks/gpu_train_compile.py.
set -euo pipefail
usage() {
  cat <<'USAGE'
usage: benchmarks/gpu_train_compile.sh DATA_BIN OUT_DIR UPDATES [fairseq-train options...]
  DATA_BIN  a binarised translation folder with a joined dictionary (e.g. the IWSLT-14 setup's work/bin)
  MODES     modes to run, in order (default: "eager default reduce-overhead")
  RUN_TIMEOUT  seconds per mode (default 110)
  PYTHON    interpreter (default: .venv/bin/python)
Example (GPU): MODES="eager reduce-overhead" benchmarks/gpu_train_compile.sh work/bin out 200 --fp16
USAGE
}
case "${1:-}" in -h|--help) usage; exit 0 ;; esac
[ "$#" -ge 3 ] || { usage >&2; exit 2; }
PYTHON="${PYTHON:-$(dirname "$0")/../.venv/bin/python}"
[ -x "$PYTHON" ] || { echo "gpu_train_compile.sh: no Python at $PYTHON (run 'make install' or set PYTHON)" >&2; exit 1; }
# DATA_BIN and OUT_DIR are relative to the caller's folder, so no cd: the module is found through PYTHONPATH
PYTHONPATH="$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}" exec "$PYTHON" -m benchmarks.gpu_train_compile "$@"

#!/usr/bin/env bash
# Set up (or refresh) the project's virtual environment: torch, fairseq-fixed, pinned needs, plugin.
set -euo pipefail

usage() {
  cat <<'USAGE'
Usage: scripts/install.sh [--venv DIR] [--python PY] [--extras LIST]

Creates DIR (default .venv) and installs, in order:
  1. torch: an importable torch is kept (a GPU box keeps its own build; with --python pointing at an
     interpreter that has torch, the venv sees it through --system-site-packages); otherwise the
     tested CPU build torch==2.13.0;
  2. the pinned build and runtime needs in requirements.txt (no torchaudio, never PyPI's `apex`), then
     requirements.no-deps.txt with --no-deps (torchscale, the reference implementation in the tests);
  3. fairseq-fixed==0.12.3.1 built with --no-build-isolation --no-deps (imports as `fairseq`);
  4. this plugin, editable;
  5. optional extras, comma-separated, each from requirements-<extra>.txt:
       fsdp  fairscale, for --ddp-backend fully_sharded (train.ddp_backend: fully_sharded; needs CUDA)
Idempotent: when nothing changed since the last run it returns in about a second.
Environment: VENV, PYTHON, EXTRAS (as --extras; `make install EXTRAS=fsdp`), TORCH_SPEC (default torch==2.13.0).
USAGE
}

VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
EXTRAS=${EXTRAS:-}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
FAIRSEQ_SPEC=fairseq-fixed==0.12.3.1
while [ $# -gt 0 ]; do
  case "$1" in
    --venv) VENV=$2; shift 2 ;;
    --python) PYTHON=$2; shift 2 ;;
    --extras) EXTRAS=$2; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
extras=()
for extra in ${EXTRAS//,/ }; do
  [ -f "requirements-$extra.txt" ] || { echo "install.sh: unknown extra '$extra' (known: $(ls requirements-*.txt | sed 's/requirements-\(.*\)\.txt/\1/' | paste -sd' '))" >&2; exit 2; }
  extras+=("$extra")
done
command -v "$PYTHON" >/dev/null || { echo "install.sh: python interpreter '$PYTHON' not found" >&2; exit 1; }

stamp="$VENV/.deepnet_fairseq_installed"
want=$( (cat requirements*.txt setup.py scripts/install.sh; echo "extras: ${extras[*]:-}") | sha256sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "import torch, fairseq, deepnet_fairseq" 2>/dev/null; then
  echo "install.sh: $VENV is up to date"
  exit 0
fi

if [ ! -x "$VENV/bin/python" ]; then
  if "$PYTHON" -c "import torch" 2>/dev/null; then
    echo "install.sh: $PYTHON already has torch $("$PYTHON" -c 'import torch; print(torch.__version__)'); keeping it"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
  fi
fi
py="$VENV/bin/python"
pip=("$py" -m pip install --disable-pip-version-check)

if "$py" -c "import torch" 2>/dev/null; then
  echo "install.sh: using torch $("$py" -c 'import torch; print(torch.__version__)')"
else
  echo "install.sh: installing $TORCH_SPEC"
  "${pip[@]}" "$TORCH_SPEC"
fi
# Everything pinned, except torch which is kept as found.
"${pip[@]}" -r requirements.txt
"${pip[@]}" --no-deps -r requirements.no-deps.txt  # what these declare would pull in another torch
if ! "$py" -c "import fairseq" 2>/dev/null; then
  echo "install.sh: building $FAIRSEQ_SPEC (about 3 minutes the first time; pip caches the wheel)"
  "${pip[@]}" --no-build-isolation --no-deps "$FAIRSEQ_SPEC"
fi
"${pip[@]}" --no-build-isolation --no-deps -e .
for extra in "${extras[@]}"; do  # fairscale builds against the installed torch
  echo "install.sh: installing extra '$extra' (requirements-$extra.txt)"
  "${pip[@]}" --no-build-isolation -r "requirements-$extra.txt"
done
"$py" -c "import torch, fairseq, deepnet_fairseq; print('install.sh: torch', torch.__version__, '| fairseq', fairseq.__version__, '| deepnet_fairseq ok')"
echo "$want" > "$stamp"

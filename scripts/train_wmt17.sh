#!/usr/bin/env bash
# Train the wmt17_en_de setup: scripts/train_setup.sh with --config configs/wmt17_en_de.yaml (see its --help).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/train_setup.sh" --config "$here/../configs/wmt17_en_de.yaml" "$@"

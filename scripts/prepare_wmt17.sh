#!/usr/bin/env bash
# Prepare the wmt17_en_de setup: scripts/prepare_setup.sh with --config configs/wmt17_en_de.yaml (see its --help).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/prepare_setup.sh" --config "$here/../configs/wmt17_en_de.yaml" "$@"

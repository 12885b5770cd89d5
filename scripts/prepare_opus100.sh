#!/usr/bin/env bash
# Prepare the opus100 setup: scripts/prepare_setup.sh with --config configs/opus100.yaml (see its --help).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/prepare_setup.sh" --config "$here/../configs/opus100.yaml" "$@"

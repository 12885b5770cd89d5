#!/usr/bin/env bash
# Train the opus100 setup: scripts/train_setup.sh with --config configs/opus100.yaml (see its --help).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/train_setup.sh" --config "$here/../configs/opus100.yaml" "$@"

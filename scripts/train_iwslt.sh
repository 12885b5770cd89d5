#!/usr/bin/env bash
# Train the iwslt14_de_en setup: scripts/train_setup.sh with --config configs/iwslt14_de_en.yaml (see its --help).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/train_setup.sh" --config "$here/../configs/iwslt14_de_en.yaml" "$@"

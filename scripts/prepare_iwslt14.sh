#!/usr/bin/env bash
# Prepare the iwslt14_de_en setup: scripts/prepare_setup.sh with --config configs/iwslt14_de_en.yaml (see its --help).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/prepare_setup.sh" --config "$here/../configs/iwslt14_de_en.yaml" "$@"

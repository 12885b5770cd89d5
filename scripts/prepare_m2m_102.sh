#!/usr/bin/env bash
# Prepare the m2m_102 setup: scripts/prepare_setup.sh with --config configs/m2m_102.yaml (see its --help).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec "$here/prepare_setup.sh" --config "$here/../configs/m2m_102.yaml" "$@"

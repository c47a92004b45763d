#!/usr/bin/env bash
# The test command: the whole suite (store, real FUSE mounts, the real dsh harness).
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || bash scripts/setup.sh
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"

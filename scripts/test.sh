#!/usr/bin/env bash
# The test command: the whole suite — the dsh plugin's JS unit tests, then pytest
# (store, real FUSE mounts, restore, reliability, the real dsh harness end to end).
# Installs what is missing first (.venv, the pinned harness in .dsh/), so it works
# on a fresh machine.  Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || bash scripts/setup.sh
PREFIX=${REWINDFS_DSH_PREFIX:-$PWD/.dsh}
NODE_BIN=$(bash scripts/setup-dsh.sh "$PREFIX" | sed -n 's/^NODE_BIN=//p')
echo "== plugin/dsh unit tests (node $("$NODE_BIN" --version))"
"$NODE_BIN" --test plugin/dsh/test/*.test.js
echo "== pytest"
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"

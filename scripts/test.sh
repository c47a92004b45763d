#!/usr/bin/env bash
# The test command: the whole suite — the dsh plugin's JS unit tests, then pytest over
# tests/unit (no FUSE: store, capture, restore, protocol, client), tests/mount (real
# FUSE mounts, the reliability suite) and tests/e2e (the real dsh harness end to end).
# Installs what is missing first (.venv, the pinned harness in .dsh/), so it works
# on a fresh machine.  Extra arguments go to pytest, e.g. -m "not mount" for the tier
# that needs no /dev/fuse, or a directory such as tests/unit.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || bash scripts/setup.sh
PREFIX=${REWINDFS_DSH_PREFIX:-$PWD/.dsh}
NODE_BIN=$(bash scripts/setup-dsh.sh "$PREFIX" | sed -n 's/^NODE_BIN=//p')
echo "== plugin/dsh unit tests (node $("$NODE_BIN" --version))"
"$NODE_BIN" --test plugin/dsh/test/*.test.js
echo "== pytest"
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"

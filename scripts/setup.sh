#!/usr/bin/env bash
# Create .venv and install rewindfs with its test extras (idempotent).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! pkg-config --exists fuse3 2>/dev/null || ! command -v fusermount3 >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq && apt-get install -y -qq fuse3 libfuse3-dev pkg-config attr sqlite3 zstd >/dev/null
    else
        echo "rewindfs needs: fuse3 libfuse3-dev pkg-config (install them with apt-get as root)" >&2
        exit 2
    fi
fi
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null
.venv/bin/python -m pip install -q -e '.[test]'
echo "rewindfs installed in $(pwd)/.venv (run .venv/bin/rewindfs --help)"

#!/usr/bin/env bash
# The test command: the whole suite — the dsh plugin's JS unit tests, then pytest over
# tests/unit (no FUSE: store, capture, restore, protocol, client), tests/mount (real
# FUSE mounts, the reliability suite) and tests/e2e (the real dsh harness end to end).
# Installs what is missing first (.venv, the pinned harness in .dsh/), so it works
# on a fresh machine.  Extra arguments go to pytest, e.g. -m "not mount" for the tier
# that needs no /dev/fuse, or a directory such as tests/unit.  Without arguments, as
# root, every tier that mounts (tests/mount, tests/e2e) runs a second time on the
# libfuse session (the default is the kernel-direct one), so both session layers stay
# tested, and, where the fuse module has enable_uring, tests/mount a third time over
# FUSE-over-io_uring (REWINDFS_URING=1); tests/unit mounts nothing and runs once.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/pytest ] || bash scripts/setup.sh
PREFIX=${REWINDFS_DSH_PREFIX:-$PWD/.dsh}
NODE_BIN=$(bash scripts/setup-dsh.sh "$PREFIX" | sed -n 's/^NODE_BIN=//p')
echo "== plugin/dsh unit tests (node $("$NODE_BIN" --version))"
"$NODE_BIN" --test plugin/dsh/test/*.test.js
echo "== pytest"
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest -p no:cacheprovider "$@"
fi
# The whole suite on the default FUSE session (the kernel-direct one), then every tier
# that mounts once more on the other session layer, so both stay tested (issue 17).
.venv/bin/python -m pytest -p no:cacheprovider
if [ "$(id -u)" = 0 ]; then     # the mount tiers need root: as a user they skip
    echo "== pytest: the tiers that mount, on the libfuse session"
    .venv/bin/python -m pytest -p no:cacheprovider tests/mount tests/e2e \
        --fuse-session libfuse
    # A third pass where the fuse module can do FUSE over io_uring: tests/mount on the
    # kernel session with REWINDFS_URING=1 (the daemons inherit the environment).  The
    # module's enable_uring is Y for the pass and put back afterwards, also on failure.
    URING_PARAM=/sys/module/fuse/parameters/enable_uring
    if [ -w "$URING_PARAM" ]; then
        echo "== pytest: tests/mount on the kernel session over io_uring"
        URING_OLD=$(cat "$URING_PARAM")
        trap 'echo "$URING_OLD" > "$URING_PARAM"' EXIT
        echo Y > "$URING_PARAM"
        REWINDFS_URING=1 .venv/bin/python -m pytest -p no:cacheprovider tests/mount \
            --fuse-session kernel
    fi
fi

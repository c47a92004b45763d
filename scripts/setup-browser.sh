#!/usr/bin/env bash
# Install the browser driver the web-UI test uses into PREFIX, idempotently.
#
#   scripts/setup-browser.sh PREFIX
#
# The browser itself is Debian's chromium (installed with apt-get when missing, below);
# this installs only the npm driver, playwright-core, into PREFIX/node_modules (nothing
# outside PREFIX; the repo's default PREFIX, .browser/, is git-ignored).  playwright-core
# downloads no browser of its own: the test launches /usr/bin/chromium.
#
# Prints, on success, PLAYWRIGHT_CORE=<dir of the package> and CHROMIUM=<path>.
# Exit codes: 0 installed or already there, 2 could not install, 3 usage.
set -euo pipefail

DRIVER_SPEC='playwright-core@>=1.50.0 <2'
STAMP_PINS="playwright-core>=1.50<2 v1"

[ $# -eq 1 ] || { echo "usage: $0 PREFIX" >&2; exit 3; }
mkdir -p "$1"
PREFIX=$(cd "$1" && pwd)
DRIVER="$PREFIX/node_modules/playwright-core"
log() { echo "setup-browser: $*" >&2; }

print_paths() {
    echo "PLAYWRIGHT_CORE=$DRIVER"
    echo "CHROMIUM=$(command -v chromium || echo /usr/bin/chromium)"
}

# The browser: Debian's chromium, installed when missing (as scripts/setup.sh does for
# fuse3), so the test command works on a fresh machine without .ci/run.
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        log "installing chromium (apt-get)"
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >&2 \
            || { log "chromium install failed"; exit 2; }
    else
        log "no chromium: apt-get install chromium (as root)"
        exit 2
    fi
fi

if [ -f "$PREFIX/.stamp" ] && [ "$(cat "$PREFIX/.stamp")" = "$STAMP_PINS" ] && [ -f "$DRIVER/package.json" ]; then
    log "already installed in $PREFIX"
    print_paths
    exit 0
fi
rm -f "$PREFIX/.stamp"
[ -f "$PREFIX/package.json" ] || echo '{"private": true}' > "$PREFIX/package.json"
log "installing $DRIVER_SPEC"
# PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD: playwright-core never downloads one, but say so anyway
PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 npm install --prefix "$PREFIX" --no-audit --no-fund \
    --loglevel=error "$DRIVER_SPEC" >&2 || { log "driver install failed"; exit 2; }
[ -f "$DRIVER/package.json" ] || { log "no driver at $DRIVER"; exit 2; }
echo "$STAMP_PINS" > "$PREFIX/.stamp"
print_paths

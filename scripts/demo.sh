#!/usr/bin/env bash
# The main job: a demo session on a fresh machine.
#
# Sets up what is needed (Debian packages, .venv), mounts a temporary workspace
# through rewindfs, plays three scripted "agent turns" made of real shell commands,
# rewinds to the start of turn 2, shows the tree, redoes, shows it again, and
# unmounts.  Every step is printed.  Needs root (FUSE) on a Debian machine.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD

step() { printf '\n\033[1;36m== %s\033[0m\n' "$*"; }
run() { printf '\033[2m$ %s\033[0m\n' "$*"; "$@"; }

step "setting up (Debian packages and .venv; quick when already there)"
bash scripts/setup.sh
RW="$REPO/.venv/bin/rewindfs"

DEMO=$(mktemp -d /tmp/rewindfs-demo.XXXXXX)
WS="$DEMO/project"
export REWINDFS_HOME="$DEMO/store"
mkdir -p "$WS"
cleanup() {
    cd /
    if mountpoint -q "$WS"; then "$RW" unmount "$WS" || fusermount3 -uz "$WS"; fi
    rm -rf "$DEMO"
}
trap cleanup EXIT

show_tree() {
    ( cd "$WS" && find . -path ./.git -prune -o -print | LC_ALL=C sort | while read -r p; do
        if [ -L "$p" ]; then printf '  %-28s -> %s\n' "$p" "$(readlink "$p")"
        elif [ -d "$p" ]; then printf '  %-28s/\n' "$p"
        else printf '  %-28s %6s bytes  %s\n' "$p" "$(stat -c %s "$p")" "$(sha256sum "$p" | cut -c1-12)"; fi
    done )
}

step "a fresh workspace with one file, mounted through rewindfs (store: $REWINDFS_HOME)"
echo "# demo project" > "$WS/README.md"
printf 'build/\n' > "$WS/.gitignore"
run "$RW" mount "$WS"
cd "$WS"   # enter through the mount, so every write is seen

step "turn 1: the agent writes code and a binary asset"
run "$RW" turn begin --session demo --turn 1 --label "write a greeter"
run sh -c 'printf "def greet(name):\n    return f\"hello {name}\"\n" > greet.py'
run sh -c 'head -c 4096 /dev/urandom > logo.bin'
run mkdir -p src/util
run sh -c 'echo "VERSION = 1" > src/util/version.py'
run "$RW" turn end
show_tree

step "turn 2: the agent refactors — deletes, renames a directory, appends to the binary, builds"
run "$RW" turn begin --session demo --turn 2 --label "refactor and build"
run rm greet.py
run mv src/util src/lib
run sh -c 'head -c 1024 /dev/urandom >> logo.bin'
run mkdir -p build
run sh -c 'echo "compiled" > build/out.o'
run "$RW" turn end
show_tree
AFTER_TURN2=$(cd "$WS" && find . -type f -not -path './.git/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum)

step "turn 3: the agent goes wrong"
run "$RW" turn begin --session demo --turn 3 --label "oops"
run sh -c 'echo "garbage" > src/lib/version.py'
run rm -rf build
run "$RW" turn end
show_tree

step "the history"
run "$RW" log

step "rewind to the start of turn 2 (dry run first, then for real)"
run "$RW" rewind 2 --session demo --dry-run
run "$RW" rewind 2 --session demo
show_tree
test -f greet.py && test -f src/util/version.py && test ! -e build && test "$(stat -c %s logo.bin)" = 4096
echo "  ✓ the tree is as it stood before turn 2 (greet.py back, src/util back, no build/, logo.bin 4096 bytes)"

step "redo: undo that rewind"
run "$RW" redo --session demo
show_tree
test ! -e greet.py && grep -q garbage src/lib/version.py
echo "  ✓ back where turn 3 left it"

step "and any earlier point stays reachable: the end of turn 2 is the start of turn 3"
run "$RW" rewind 3 --session demo
NOW=$(cd "$WS" && find . -type f -not -path './.git/*' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum)
[ "$NOW" = "$AFTER_TURN2" ] && echo "  ✓ identical to the tree after turn 2"

step "the history as a tree: every row is a point (@ now, ↺ rewind, ↻ redo)"
run "$RW" log --tree

step "unmount"
cd /
run "$RW" unmount "$WS"
echo
echo "demo done."

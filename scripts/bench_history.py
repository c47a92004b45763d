#!/usr/bin/env python3
"""What a long history costs the questions a UI asks, and the files beside them.

The web UI's header asks the daemon ``redo.state`` on every new transcript row, and
``own.state`` too for a session whose files a rewind took away.  Both read the
workspace's epochs; at tens of thousands of turns that read is the daemon's CPU, on a
worker thread that competes with the FUSE handlers for the interpreter.  This script
makes a workspace with ``--turns`` turns (two sessions taking turns, as the plugin
marks them, no files changed), mounts it, and prints:

- ``redo.state`` and ``own.state``, and ``points`` (the web UI's tooltips, asked after
  every turn), ms per call (median of ``--calls``);
- ``--files`` small creates through the mount (written, closed; a fresh directory per
  run), bare, through the mount, and through the mount while another process asks
  both questions every ``--every`` ms (a transcript streaming rows; 0: as fast as the
  daemon answers) — the ratios against bare measured in the same run.

    .venv/bin/python scripts/bench_history.py DIR [--turns 20000] [--files 2000] [--every 100]

DIR: a fresh directory (the workspace, its store and the bare tree go inside).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rewindfs.overlay.control import client
from rewindfs.store import Store

REWINDFS = str(Path(sys.executable).with_name("rewindfs"))

# the header's two questions, over and over, from another process (so its
# interpreter does not share ours)
_POLLER = """
import sys, time
from rewindfs.overlay.control import client
sock, every = sys.argv[1], float(sys.argv[2]) / 1000
while True:
    client.call(sock, "redo.state", {"session": "a"})
    client.call(sock, "own.state", {"sessions": ["a", "b"]})
    time.sleep(every)
"""


def _rewindfs(*args) -> str:
    return subprocess.run([REWINDFS, *args], check=True, capture_output=True,
                          text=True).stdout


def _make_history(store: Path, ws: Path, turns: int) -> None:
    with Store.open(store) as s:
        wid = s.workspace(os.fsencode(os.path.realpath(ws)))
        for i in range(1, turns + 1):
            s.begin_turn(wid, "a" if i % 2 else "b", (i + 1) // 2, f"turn {i}", flush=False)
            s.end_turn(wid, flush=False)
        s.flush()


def _creates(base: Path, n: int) -> float:
    base.mkdir()
    t0 = time.perf_counter()
    for i in range(n):
        with open(base / f"f{i}.txt", "wb") as fh:
            fh.write(b"x" * 100)
    return time.perf_counter() - t0


def _ms_per_call(sock: str, method: str, params: dict, calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        client.call(sock, method, params)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--turns", type=int, default=20000)
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--calls", type=int, default=9)
    ap.add_argument("--every", type=float, default=100.0)
    args = ap.parse_args()
    ws, store, bare = args.dir / "ws", args.dir / "store", args.dir / "bare"
    ws.mkdir(parents=True)
    bare.mkdir()
    t0 = time.perf_counter()
    _make_history(store, ws, args.turns)
    print(f"history of {args.turns:,} turns made in {time.perf_counter() - t0:.1f} s")
    _rewindfs("--store", str(store), "mount", str(ws))
    poller = None
    try:
        import json
        sock = json.loads(_rewindfs("--json", "--store", str(store), "status", "-C",
                                    str(ws)))["socket"]
        redo = _ms_per_call(sock, "redo.state", {"session": "a"}, args.calls)
        own = _ms_per_call(sock, "own.state", {"sessions": ["a", "b"]}, args.calls)
        pts = _ms_per_call(sock, "points", {"session": "a"}, args.calls)
        print(f"redo.state {redo:.1f} ms, own.state {own:.1f} ms, points of a session "
              f"of {(args.turns + 1) // 2:,} turns {pts:.1f} ms per call (median of "
              f"{args.calls})")
        native = _creates(bare / "c", args.files)
        quiet = _creates(ws / "quiet", args.files)
        poller = subprocess.Popen([sys.executable, "-c", _POLLER, sock, str(args.every)])
        time.sleep(0.5)
        asked = _creates(ws / "asked", args.files)
        print(f"{args.files:,} small creates: bare {native:.3f} s; rewindfs "
              f"{quiet:.3f} s ({quiet / native:.2f}x); while the header asks "
              f"{asked:.3f} s ({asked / native:.2f}x, {asked / quiet:.2f}x of quiet; asked "
              f"every {args.every:g} ms)")
    finally:
        if poller is not None:
            poller.kill()
            poller.wait()
        _rewindfs("--store", str(store), "unmount", str(ws))


if __name__ == "__main__":
    main()

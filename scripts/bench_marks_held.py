#!/usr/bin/env python3
"""Turn-mark latency with a file held open for writing, on the writeback cache.

A writer (a dev server's log, a build's archive) keeps one file open and rewrites
``--size`` bytes of it in place before every mark; each ``turn.begin`` must push those
WRITEs to the daemon (``Daemon.flush_writes``) and capture the file again in the new
epoch.  Prints turn.begin p50 and min over ``--marks`` marks, and the store syncs and
disk syncs the daemon made meanwhile (``status``).  ``--busy`` keeps the disk busy
with a ``dd … conv=fsync`` loop beside it, as a build or ``npm install`` would.

    .venv/bin/python scripts/bench_marks_held.py DIR [--size 65536] [--marks 30] [--busy]

DIR: a fresh directory on the filesystem to measure (a journaled ext4 shows the cost
of a sync; this VM's root ext4 has no journal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rewindfs.overlay.control import client

REWINDFS = str(Path(sys.executable).with_name("rewindfs"))


def _rewindfs(*args) -> str:
    return subprocess.run([REWINDFS, *args], check=True, capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--size", type=int, default=65536)
    ap.add_argument("--marks", type=int, default=30)
    ap.add_argument("--busy", action="store_true")
    args = ap.parse_args()
    ws, store = args.dir / "ws", args.dir / "store"
    ws.mkdir(parents=True)
    os.environ.update(REWINDFS_WRITEBACK="1", REWINDFS_PASSTHROUGH="0")
    _rewindfs("--store", str(store), "mount", str(ws))
    load = None
    try:
        status = json.loads(_rewindfs("--json", "--store", str(store), "status", "-C", str(ws)))
        if args.busy:
            load = subprocess.Popen(["sh", "-c", f"while :; do dd if=/dev/zero "
                                     f"of={args.dir}/load bs=1M count=100 conv=fsync "
                                     f"status=none; done"], start_new_session=True)
            time.sleep(0.5)
        fd = os.open(ws / "held", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            times = []
            for turn in range(1, args.marks + 1):
                os.pwrite(fd, os.urandom(args.size), 0)
                t0 = time.perf_counter()
                client.call(status["socket"], "turn.begin",
                            {"session": "b", "turn": turn, "label": ""})
                times.append(time.perf_counter() - t0)
                client.call(status["socket"], "turn.end", {"session": "b"})
        finally:
            os.close(fd)
        fs = client.call(status["socket"], "status")["fs"]
        print(f"held writer, {args.size} B per turn{' (disk busy)' if args.busy else ''}: "
              f"turn.begin p50 {statistics.median(times) * 1e3:.2f} ms, "
              f"min {min(times) * 1e3:.2f} ms; store syncs {fs['store_syncs']}, "
              f"disk syncs {fs.get('disk_syncs')}")
    finally:
        if load is not None:
            os.killpg(load.pid, 15)
            load.wait()
        _rewindfs("--store", str(store), "unmount", str(ws))


if __name__ == "__main__":
    main()

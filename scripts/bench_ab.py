#!/usr/bin/env python3
"""A/B timing of suite workloads: bare, rewindfs from another checkout (A), this one (B).

    git archive <old-commit> | tar -x -C /tmp/rewindfs-a
    .venv/bin/python scripts/bench_ab.py --a /tmp/rewindfs-a --workload sqlite --workload saves

Each round runs every target once, in a rotating order, each workload in a fresh
directory with a fresh mount and a turn open, so the machine's load hits A and B alike
(on a shared VM, runs minutes apart differ by ±50 %).  Printed: per workload the
median time and ratio to bare of each target, and B/A per round; for B also how many
store syncs each run needed (``status`` → ``fs.store_syncs``).  Workload functions and
sizes are those of ``scripts/bench.py`` (full sizes).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import bench

B = bench.REPO
CTX = {"small_files": 5000, "seq_mib": 256, "sqlite_tx": 10000, "rand_mib": 64,
       "saves": 1000}


def _status_syncs(ctl) -> int | None:
    return ctl.call("status")["fs"].get("store_syncs")


def _run(target: str, code: Path | None, d: Path, store: Path, fn, turn: int):
    """Time one workload on ``target``; returns (seconds, store syncs or None)."""
    if code is None:
        os.sync()
        t0 = time.perf_counter()
        fn(d, CTX)
        return time.perf_counter() - t0, None
    proc = subprocess.Popen([bench.PY, "-m", "rewindfs.overlay.cli", "mount", str(d), "--foreground",
                             "--store", str(store)], cwd=code,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        bench._wait_mounted(d, proc)
        ctl = bench.Control(store, d)
        ctl.call("turn.begin", session="ab", turn=turn, label="ab")
        before = _status_syncs(ctl)
        os.sync()
        t0 = time.perf_counter()
        fn(d, CTX)
        bench._syncfs_at(d)
        took = time.perf_counter() - t0
        after = _status_syncs(ctl)
        syncs = None if before is None or after is None else after - before
    finally:
        bench._unmount(d, proc)
    return took, syncs


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, type=Path, help="the other checkout (A)")
    ap.add_argument("--workload", action="append", required=True, metavar="TEXT",
                    help="run the suite workloads whose name contains TEXT (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    CTX["tarball"], CTX["tar_files"] = bench.make_tarball(B / "bench-results" / "cache", 2500)
    chosen = [(n, fn) for n, fn in bench.workloads(CTX)
              if any(w in n for w in args.workload)]
    targets = {"bare": None, "A": args.a.resolve(), "B": B}
    times = {t: {n: [] for n, _ in chosen} for t in targets}
    syncs: dict[str, list] = {n: [] for n, _ in chosen}
    work = Path(tempfile.mkdtemp(prefix="rewindfs-ab-"))
    try:
        for r in range(args.rounds):
            order = list(targets)[r % 3:] + list(targets)[:r % 3]
            for t in order:
                for i, (n, fn) in enumerate(chosen):
                    d = work / f"{t}-{r}-{i}"
                    d.mkdir()
                    took, s = _run(t, targets[t], d, work / f"store-{t}", fn,
                                   1 + r * len(chosen) + i)
                    times[t][n].append(took)
                    if t == "B":
                        syncs[n].append(s)
            print(f"round {r + 1}/{args.rounds} done", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for n, _ in chosen:
        bare = times["bare"][n]
        print(f"{n}: bare median {statistics.median(bare):.3f} s")
        for t in ("A", "B"):
            rs = [x / y for x, y in zip(times[t][n], bare)]
            print(f"  {t}: median {statistics.median(times[t][n]):.3f} s, "
                  f"{statistics.median(rs):.2f}x bare ({min(rs):.2f}-{max(rs):.2f})")
        ba = [x / y for x, y in zip(times["B"][n], times["A"][n])]
        print(f"  B/A per round: median {statistics.median(ba):.2f}x "
              f"({min(ba):.2f}-{max(ba):.2f}); B's store syncs per run: {syncs[n]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

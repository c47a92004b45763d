#!/usr/bin/env python3
"""Per-operation cost on the bare directory, the floor targets and rewindfs.

The workload suite (scripts/bench.py) is made of a few primitive operations; this times
each one alone, many calls, median per call, on every target in the same run:

    stat (cached)      os.stat of a file the kernel has cached: no request expected
    open+close         OPEN (+ RELEASE, sent asynchronously) per call
    4 KiB pwrite       into the page cache (writeback); the kernel still sends a
                       GETXATTR security.capability per write
    getxattr           of a name the file has: one GETXATTR
    getxattr missing   one GETXATTR answered ENODATA: the null round trip
    statfs             one STATFS
    create+close       LOOKUP (negative) + CREATE (+ RELEASE); rewindfs captures
    unlink             UNLINK; rewindfs captures the (tiny) file first

Targets: bare, rewindfs (inside an open turn, as in the suite), floor-ours, floor-min
(scripts/bench_floor_fs.py) and any ``--external-target NAME=CMD``.  Each repetition
mounts every target afresh in rotated order; the figure is the median over all calls
of all repetitions, with the spread of the per-repetition medians.

    .venv/bin/python scripts/bench_roundtrip.py [--reps 3] [--calls 2000]
        [--targets bare rewindfs floor-ours floor-min] [--external-target NAME=CMD]
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench  # noqa: E402

_ns = time.perf_counter_ns
BLOCK = os.urandom(4096)


def _timed(fn, n: int) -> list[int]:
    out = []
    for i in range(n):
        t0 = _ns()
        fn(i)
        out.append(_ns() - t0)
    return out


def measure(d: Path, n: int) -> dict[str, list[int]]:
    """Per-call nanoseconds of each primitive in directory *d* (inside the target)."""
    f = os.fsencode(d / "f.txt")
    with open(f, "wb") as fh:
        fh.write(b"x" * 4096)
    os.setxattr(f, "user.floor", b"value")
    sub = os.fsencode(d / "c")
    os.mkdir(sub)
    os.stat(f)
    res = {}
    res["stat (cached)"] = _timed(lambda i: os.stat(f), n)

    def open_close(i):
        os.close(os.open(f, os.O_RDONLY))
    res["open+close"] = _timed(open_close, n)

    wfd = os.open(f, os.O_WRONLY)
    try:
        res["4 KiB pwrite"] = _timed(lambda i: os.pwrite(wfd, BLOCK, (i % 1024) * 4096), n)
        os.fsync(wfd)
    finally:
        os.close(wfd)
    res["getxattr"] = _timed(lambda i: os.getxattr(f, "user.floor"), n)

    def getxattr_missing(i):
        try:
            os.getxattr(f, "user.missing")
        except OSError as exc:
            if exc.errno != errno.ENODATA:
                raise
    res["getxattr missing (null)"] = _timed(getxattr_missing, n)
    res["statfs"] = _timed(lambda i: os.statvfs(f), n)
    names = [sub + b"/n%d" % i for i in range(n)]

    def create_close(i):
        os.close(os.open(names[i], os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    res["create+close"] = _timed(create_close, n)
    res["unlink"] = _timed(lambda i: os.unlink(names[i]), n)
    return res


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--targets", nargs="+", default=["bare", "rewindfs", "floor-ours", "floor-min"],
                    choices=["bare", "rewindfs", *bench.FLOOR_TARGETS])
    ap.add_argument("--external-target", action="append", default=[], metavar="NAME=CMD")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=str(bench.REPO / "bench-results" / "roundtrip.json"))
    args = ap.parse_args(argv)
    external = bench.parse_external(args.external_target)
    targets = list(args.targets) + list(external)
    work = Path(tempfile.mkdtemp(prefix="rewindfs-rt-", dir=args.workdir))
    calls: dict[str, dict[str, list[int]]] = {}
    rep_medians: dict[str, dict[str, list[float]]] = {}
    try:
        for rep in range(args.reps):
            for target in targets[rep % len(targets):] + targets[:rep % len(targets)]:
                rep_dir = work / f"{target}-{rep}"
                rep_dir.mkdir()
                cm = bench.target_cm(target, rep_dir, work / "store", f"rt{rep}", None, external)
                with cm as (d, _handle):
                    res = measure(d, args.calls)
                    if target != "bare":
                        bench._syncfs_mount(d)
                for op, ts in res.items():
                    calls.setdefault(target, {}).setdefault(op, []).extend(ts)
                    rep_medians.setdefault(target, {}).setdefault(op, []).append(
                        statistics.median(ts) / 1000)
                print(f"  rep {rep + 1}/{args.reps} {target}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    table = {t: {op: {"median_us": statistics.median(ts) / 1000,
                      "rep_min_us": min(rep_medians[t][op]),
                      "rep_max_us": max(rep_medians[t][op])}
                 for op, ts in per.items()} for t, per in calls.items()}
    print(render(table))
    out = {"machine": bench.machine_facts(Path(tempfile.gettempdir())), "calls": args.calls,
           "reps": args.reps, "external_targets": {n: " ".join(a) for n, a in external.items()},
           "ops": table}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2))
    print(f"results written to {args.out}")
    return 0


def render(table: dict) -> str:
    """Markdown: µs per call (median) and ratio to bare; spread of rep medians."""
    targets = list(table)
    ops = list(table[targets[0]])
    lines = ["| operation | " + " | ".join(targets) + " |", "|---" * (len(targets) + 1) + "|"]
    for op in ops:
        cells = []
        base = table["bare"][op]["median_us"] if "bare" in table else None
        for t in targets:
            r = table[t][op]
            cell = f"{r['median_us']:.1f} µs ({r['rep_min_us']:.1f}–{r['rep_max_us']:.1f})"
            if base and t != "bare":
                cell += f", {r['median_us'] / base:.1f}×"
            cells.append(cell)
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

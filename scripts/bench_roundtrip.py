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
(scripts/bench_floor_fs.py) and any ``--external-target NAME=CMD``.  Every target is
mounted once; each repetition visits them in rotated order (fresh subdirectory); the
figure is the median over all calls of all repetitions, with the spread (min–max) of
the per-repetition medians.

    .venv/bin/python scripts/bench_roundtrip.py [--reps 3] [--calls 2000]
        [--targets bare rewindfs floor-ours floor-min] [--external-target NAME=CMD]
    .venv/bin/python scripts/bench_roundtrip.py --count [--quick] --out counts.json

``--count`` instead counts, per workload of bench.py's suite, the requests that reach
floor-min (by handler): with the per-request cost above, the workload ratios follow.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import shutil
import signal
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
    return res


def measure_unlink(d: Path, n: int) -> dict[str, list[int]]:
    """Unlink the files ``measure`` created.  Run only after every create of the run:
    ext4 scans past inodes freed in the last 30 s when it allocates (recently_deleted),
    so creates right after mass unlinks would cost 100+ µs more on every target."""
    sub = os.fsencode(d / "c")
    return {"unlink": _timed(lambda i: os.unlink(sub + b"/n%d" % i), n)}


def _dump_counts(proc, path: Path) -> dict[str, int]:
    """Ask the counting floor daemon (SIGUSR1) for its request counts so far."""
    path.unlink(missing_ok=True)
    os.kill(proc.pid, signal.SIGUSR1)
    deadline = time.monotonic() + 10
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError("the floor daemon did not dump its counts")
        time.sleep(0.01)
    return json.loads(path.read_text())


def count_requests(work: Path, quick: bool) -> dict[str, dict[str, int]]:
    """Requests per workload of the suite reaching floor-min, by handler (the same
    workloads and sizes as bench.py; untimed)."""
    ctx = {"small_files": 500 if quick else 5000, "seq_mib": 16 if quick else 256,
           "sqlite_tx": 1000 if quick else 10000, "rand_mib": 8 if quick else 64}
    ctx["tarball"], ctx["tar_files"] = bench.make_tarball(bench.REPO / "bench-results" / "cache", 2500)
    dump = work / "counts.json"
    os.environ["FLOOR_COUNT_FILE"] = str(dump)
    out = {}
    try:
        with bench.mount_cmd_target(work, "floor-min", bench.FLOOR_TARGETS["floor-min"]) as (d, proc):
            for name, fn in bench.workloads(ctx):
                os.sync()
                before = _dump_counts(proc, dump)
                fn(d, ctx)
                bench._syncfs_at(d)
                after = _dump_counts(proc, dump)
                diff = {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}
                out[name] = dict(sorted(diff.items(), key=lambda kv: -kv[1]))
                print(f"  {name}: {sum(diff.values()):,} requests {out[name]}", flush=True)
    finally:
        del os.environ["FLOOR_COUNT_FILE"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--targets", nargs="+", default=["bare", "rewindfs", "floor-ours", "floor-min"],
                    choices=["bare", *bench.REWINDFS_TARGETS, *bench.FLOOR_TARGETS])
    ap.add_argument("--external-target", action="append", default=[], metavar="NAME=CMD")
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default=str(bench.REPO / "bench-results" / "roundtrip.json"))
    ap.add_argument("--count", action="store_true",
                    help="instead: count the requests each suite workload sends to floor-min")
    ap.add_argument("--quick", action="store_true", help="with --count: the --quick sizes")
    args = ap.parse_args(argv)
    if args.count:
        work = Path(tempfile.mkdtemp(prefix="rewindfs-count-", dir=args.workdir))
        try:
            counts = count_requests(work, args.quick)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"quick": args.quick, "requests": counts}, indent=2))
        print(f"results written to {args.out}")
        return 0
    external = bench.parse_external(args.external_target)
    targets = list(args.targets) + list(external)
    work = Path(tempfile.mkdtemp(prefix="rewindfs-rt-", dir=args.workdir))
    calls: dict[str, dict[str, list[int]]] = {}
    rep_medians: dict[str, dict[str, list[float]]] = {}

    def record(target, res):
        for op, ts in res.items():
            calls.setdefault(target, {}).setdefault(op, []).extend(ts)
            rep_medians.setdefault(target, {}).setdefault(op, []).append(
                statistics.median(ts) / 1000)

    try:
        # Every target stays mounted for the whole run (one daemon each); repetitions
        # work in fresh subdirectories, in rotated target order; all unlinks come last.
        with contextlib.ExitStack() as stack:
            dirs = {}
            for target in targets:
                tdir = work / target
                tdir.mkdir()
                dirs[target] = stack.enter_context(bench.target_cm(
                    target, tdir, work / "store", "rt", None, external))[0]
            for phase, fn in (("ops", measure), ("unlink", measure_unlink)):
                for rep in range(args.reps):
                    for target in targets[rep % len(targets):] + targets[:rep % len(targets)]:
                        d = dirs[target] / f"rep{rep}"
                        if phase == "ops":
                            d.mkdir()
                        record(target, fn(d, args.calls))
                        if target != "bare":
                            bench._syncfs_at(d)
                    print(f"  {phase} rep {rep + 1}/{args.reps}", flush=True)
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

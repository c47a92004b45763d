#!/usr/bin/env python3
"""rewindfs benchmark: the agent workload suite on the bare directory, through a
rewindfs mount inside an open turn, and through pyfuse3's passthrough example (the
naive reference), plus turn-mark latency, rewind speed, store size and daemon RSS.

Every figure is a ratio against the bare directory measured in the same run; each
workload runs ``--reps`` times per target, median and spread (min–max) printed.
Results are also written as JSON (``--out``).  Run as root (it mounts FUSE):

    .venv/bin/python scripts/bench.py [--reps 3] [--quick] [--out bench-results/bench.json]

The passthrough example is taken from pyfuse3's source distribution at run time
(``pip download --no-binary``) and never committed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
PY = sys.executable
MiB = 1 << 20


# --- workloads: each takes the working directory (inside the target) ---------------

def _sh(cmd: str, cwd: Path, check: bool = True) -> None:
    subprocess.run(cmd, shell=True, cwd=cwd, check=check,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def w_extract(d: Path, ctx) -> None:
    _sh(f"tar xf {ctx['tarball']}", d)


def w_git_commit(d: Path, ctx) -> None:
    _sh("git init -q && git add -A && git -c user.name=b -c user.email=b@b commit -qm x", d / "src")


def w_git_status(d: Path, ctx) -> None:
    _sh("git status --porcelain >/dev/null", d / "src")


def w_grep(d: Path, ctx) -> None:
    subprocess.run(["grep", "-r", "-c", "import", "src"], cwd=d, stdout=subprocess.DEVNULL)


def w_read_all(d: Path, ctx) -> None:
    for root, _dirs, files in os.walk(d / "src"):
        for f in files:
            p = os.path.join(root, f)
            if not os.path.islink(p):
                with open(p, "rb") as fh:
                    while fh.read(1 << 20):
                        pass


def w_compileall(d: Path, ctx) -> None:
    # The stdlib sample holds a few files with deliberate syntax errors (test data),
    # so compileall's exit status says nothing about the filesystem.
    _sh(f"{PY} -m compileall -q -j 1 src", d, check=False)


def w_rm_tree(d: Path, ctx) -> None:
    shutil.rmtree(d / "src")


def w_small_creates(d: Path, ctx) -> None:
    base = d / "small"
    base.mkdir()
    for i in range(ctx["small_files"]):
        if i % 500 == 0:
            sub = base / f"d{i // 500}"
            sub.mkdir()
        (sub / f"f{i}.txt").write_bytes(b"x" * 100)


def w_seq_write(d: Path, ctx) -> None:
    block = os.urandom(MiB)
    with open(d / "big.bin", "wb") as fh:
        for _ in range(ctx["seq_mib"]):
            fh.write(block)
        fh.flush()
        os.fsync(fh.fileno())


def w_seq_read(d: Path, ctx) -> None:
    with open(d / "big.bin", "rb") as fh:
        while fh.read(MiB):
            pass


def w_sqlite(d: Path, ctx) -> None:
    con = sqlite3.connect(d / "bench.db", isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    for i in range(ctx["sqlite_tx"]):
        con.execute("BEGIN")
        con.execute("INSERT INTO t (v) VALUES (?)", (f"value {i}",))
        con.execute("COMMIT")
    con.close()


def w_random_write(d: Path, ctx) -> None:
    size = ctx["rand_mib"] * MiB
    path = d / "rand.bin"
    with open(path, "wb") as fh:
        fh.truncate(size)
    rng = random.Random(7)
    block = os.urandom(4096)
    fd = os.open(path, os.O_WRONLY)
    try:
        for _ in range(size // 4096):
            os.pwrite(fd, block, rng.randrange(size // 4096) * 4096)
        os.fsync(fd)
    finally:
        os.close(fd)


WORKLOADS = [
    ("extract ~2.5k-file tarball", w_extract),
    ("git init+add+commit", w_git_commit),
    ("git status", w_git_status),
    ("grep -r", w_grep),
    ("read every file", w_read_all),
    ("python -m compileall", w_compileall),
    ("rm -rf tree", w_rm_tree),
    ("5,000 small creates", w_small_creates),
    ("256 MiB sequential write", w_seq_write),
    ("256 MiB sequential read", w_seq_read),
    ("sqlite 10k transactions", w_sqlite),
    ("4 KiB random writes, 64 MiB", w_random_write),
]


# --- targets -------------------------------------------------------------------------

def _wait_mounted(path: Path, proc: subprocess.Popen, timeout=30.0) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.ismount(path):
        if proc.poll() is not None:
            raise RuntimeError(f"mount process exited with {proc.returncode}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{path} did not become a mount point")
        time.sleep(0.05)


def _unmount(path: Path, proc: subprocess.Popen) -> None:
    if os.path.ismount(path):
        subprocess.run(["fusermount3", "-u", str(path)], stderr=subprocess.DEVNULL)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        subprocess.run(["fusermount3", "-uz", str(path)], stderr=subprocess.DEVNULL)
        proc.kill()
        proc.wait()


class Control:
    """A minimal newline-JSON client for the daemon's control socket."""

    def __init__(self, store: Path, workspace: Path):
        from overlay._paths import control_socket_path
        self.path = control_socket_path(os.fsencode(store), os.fsencode(os.path.realpath(workspace)))
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(os.fsdecode(self.path))
        self.file = self.sock.makefile("rwb")
        self.next_id = 0

    def call(self, method: str, **params):
        self.next_id += 1
        msg = {"v": 1, "id": self.next_id, "method": method, "params": params}
        self.file.write(json.dumps(msg).encode() + b"\n")
        self.file.flush()
        while True:
            reply = json.loads(self.file.readline())
            if "event" in reply:
                continue
            if not reply.get("ok"):
                raise RuntimeError(f"{method}: {reply.get('error')}")
            return reply["result"]

    def close(self):
        self.file.close()
        self.sock.close()


@contextmanager
def bare_target(work: Path):
    d = work / "bare"
    d.mkdir()
    yield d, None


@contextmanager
def rewindfs_target(work: Path, store: Path, session: str = "bench"):
    d = work / "rw"
    d.mkdir()
    proc = subprocess.Popen([PY, "-m", "overlay.cli", "mount", str(d), "--foreground",
                             "--store", str(store)], cwd=REPO)
    try:
        _wait_mounted(d, proc)
        ctl = Control(store, d)
        ctl.call("turn.begin", session=session, turn=1, label="benchmark")
        try:
            yield d, (proc, ctl)
        finally:
            ctl.close()
    finally:
        _unmount(d, proc)


@contextmanager
def naive_target(work: Path, example: Path):
    src = work / "naive-src"
    mnt = work / "naive"
    src.mkdir()
    mnt.mkdir()
    proc = subprocess.Popen([PY, str(example), str(src), str(mnt)])
    try:
        _wait_mounted(mnt, proc)
        yield mnt, proc
    finally:
        _unmount(mnt, proc)


def fetch_passthrough_example(cache: Path) -> Path:
    example = cache / "passthroughfs.py"
    if example.exists():
        return example
    cache.mkdir(parents=True, exist_ok=True)
    import pyfuse3
    version = pyfuse3.__version__ if hasattr(pyfuse3, "__version__") else "3.5.0"
    subprocess.run([PY, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                    f"pyfuse3=={version}", "-d", str(cache)], check=True)
    sdist = next(cache.glob("pyfuse3-*.tar.gz"))
    with tarfile.open(sdist) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("examples/passthroughfs.py"))
        example.write_bytes(tf.extractfile(member).read())
    return example


def make_tarball(cache: Path, nfiles: int) -> Path:
    """A source tarball of ~nfiles files taken from this Python's standard library."""
    tarball = cache / f"src-{nfiles}.tar"
    if tarball.exists():
        return tarball
    cache.mkdir(parents=True, exist_ok=True)
    stdlib = Path(os.__file__).parent
    files = []
    for root, dirs, names in os.walk(stdlib):
        dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "__pycache__"))
        for n in sorted(names):
            if n.endswith((".py", ".txt", ".cfg", ".json")):
                files.append(Path(root) / n)
        if len(files) >= nfiles:
            break
    with tarfile.open(tarball, "w") as tf:
        for f in files[:nfiles]:
            tf.add(f, arcname="src/" + str(f.relative_to(stdlib)))
    return tarball


# --- the suite ---------------------------------------------------------------------

def run_suite(target_cm, ctx) -> dict[str, float]:
    times = {}
    with target_cm as (d, _handle):
        for name, fn in WORKLOADS:
            t0 = time.perf_counter()
            fn(d, ctx)
            times[name] = time.perf_counter() - t0
    return times


def suite(args, work: Path, store: Path, example: Path | None, ctx) -> dict:
    results: dict[str, dict[str, list[float]]] = {}
    targets = [t for t in args.targets if t != "naive" or example]
    for rep in range(args.reps):
        for target in targets:
            rep_dir = work / f"{target}-{rep}"
            rep_dir.mkdir()
            cm = {"bare": lambda: bare_target(rep_dir),
                  "rewindfs": lambda: rewindfs_target(rep_dir, store, session=f"bench{rep}"),
                  "naive": lambda: naive_target(rep_dir, example)}[target]()
            times = run_suite(cm, ctx)
            for name, t in times.items():
                results.setdefault(target, {}).setdefault(name, []).append(t)
            shutil.rmtree(rep_dir, ignore_errors=True)
            print(f"  rep {rep + 1}/{args.reps} {target:9s} total {sum(times.values()):7.2f} s", flush=True)
    return results


def ratios(results: dict) -> dict:
    out = {}
    bare = results["bare"]
    for target, per in results.items():
        rows = {}
        for name, ts in per.items():
            rs = [t / b for t, b in zip(ts, bare[name])]
            rows[name] = {"median_s": statistics.median(ts), "ratio": statistics.median(rs),
                          "ratio_min": min(rs), "ratio_max": max(rs)}
        geo = statistics.geometric_mean([r["ratio"] for r in rows.values()])
        out[target] = {"workloads": rows, "geomean_ratio": geo,
                       "max_ratio": max(r["ratio"] for r in rows.values())}
    return out


def print_suite(table: dict) -> None:
    targets = list(table)
    names = list(table["bare"]["workloads"])
    head = f"{'workload':32s}" + "".join(f"{t:>24s}" for t in targets)
    print(head)
    for n in names:
        line = f"{n:32s}"
        for t in targets:
            r = table[t]["workloads"][n]
            line += f"{r['median_s']:8.3f}s {r['ratio']:5.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        print(line)
    line = f"{'geometric mean (ratio)':32s}" + "".join(f"{table[t]['geomean_ratio']:>23.2f}x" for t in targets)
    print(line)
    if "naive" in table and "rewindfs" in table:
        print(f"rewindfs vs naive reference (geomean): "
              f"{table['naive']['geomean_ratio'] / table['rewindfs']['geomean_ratio']:.2f}x faster")


# --- turn marks, rewind, store, RSS -----------------------------------------------

def make_tree(d: Path, nfiles: int) -> None:
    for i in range(nfiles):
        sub = d / f"d{i // 1000:03d}"
        if i % 1000 == 0:
            sub.mkdir(parents=True, exist_ok=True)
        (sub / f"f{i:05d}.txt").write_bytes(b"content %d\n" % i)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def daemon_pid(mount_proc: subprocess.Popen) -> int:
    return mount_proc.pid


def turn_marks(args, work: Path, sizes: list[int]) -> dict:
    out = {}
    for n in sizes:
        d = work / f"marks-{n}"
        d.mkdir()
        make_tree(d, n)
        store = work / f"store-marks-{n}"
        with rewindfs_target_existing(d, store) as (proc, ctl):
            lat = []
            for i in range(args.marks):
                t0 = time.perf_counter()
                ctl.call("turn.begin", session="m", turn=i + 1, label=f"turn {i + 1}")
                lat.append(time.perf_counter() - t0)
                (d / "d000" / "f00000.txt").write_bytes(b"changed %d\n" % i)
                ctl.call("turn.end")
            lat.sort()
            out[n] = {"p50_ms": 1000 * lat[len(lat) // 2], "p99_ms": 1000 * lat[int(len(lat) * 0.99) - 1]}
            if n == max(sizes):
                for root, _dirs, files in os.walk(d):
                    for f in files:
                        os.stat(os.path.join(root, f))
                out["rss_after_walk_mb"] = rss_kb(proc.pid) / 1024
        shutil.rmtree(d, ignore_errors=True)
        print(f"  turn marks on {n} files: p50 {out[n]['p50_ms']:.2f} ms, p99 {out[n]['p99_ms']:.2f} ms", flush=True)
    return out


@contextmanager
def rewindfs_target_existing(d: Path, store: Path):
    proc = subprocess.Popen([PY, "-m", "overlay.cli", "mount", str(d), "--foreground",
                             "--store", str(store)], cwd=REPO)
    try:
        _wait_mounted(d, proc)
        ctl = Control(store, d)
        try:
            yield proc, ctl
        finally:
            ctl.close()
    finally:
        _unmount(d, proc)


def dir_bytes(p: Path) -> int:
    total = 0
    for root, _dirs, files in os.walk(p):
        for f in files:
            total += os.lstat(os.path.join(root, f)).st_blocks * 512
    return total


def rewinds(args, work: Path) -> dict:
    out = {}
    # 10k changed small files
    d = work / "rewind-small"
    d.mkdir()
    n = args.rewind_files
    make_tree(d, n)
    store = work / "store-rewind-small"
    with rewindfs_target_existing(d, store) as (proc, ctl):
        before = dir_bytes(store)
        ctl.call("turn.begin", session="r", turn=1, label="change everything")
        unique = 0
        for i in range(n):
            data = b"changed content %d\n" % i
            (d / f"d{i // 1000:03d}" / f"f{i:05d}.txt").write_bytes(data)
            unique += len(b"content %d\n" % i)
        ctl.call("turn.end")
        stored = dir_bytes(store) - before
        t0 = time.perf_counter()
        res = ctl.call("rewind", to="t1", session="r")
        out["rewind_10k_small_s"] = time.perf_counter() - t0
        out["rewind_10k_written"] = res.get("written")
        out["store_bytes_small"] = stored
        out["unique_changed_bytes_small"] = unique
    shutil.rmtree(d, ignore_errors=True)
    print(f"  rewind of {n} small files: {out['rewind_10k_small_s']:.2f} s", flush=True)
    # one big changed file against cp
    d = work / "rewind-big"
    d.mkdir()
    big = d / "big.bin"
    with open(big, "wb") as fh:
        for _ in range(args.big_mib):
            fh.write(os.urandom(MiB))
    t0 = time.perf_counter()
    subprocess.run(["cp", str(big), str(work / "big-copy.bin")], check=True)
    os.sync()
    out["cp_big_s"] = time.perf_counter() - t0
    os.unlink(work / "big-copy.bin")
    store = work / "store-rewind-big"
    with rewindfs_target_existing(d, store) as (proc, ctl):
        before = dir_bytes(store)
        ctl.call("turn.begin", session="r", turn=1, label="change big file")
        with open(big, "r+b") as fh:
            fh.write(b"changed!")
        ctl.call("turn.end")
        out["store_bytes_big"] = dir_bytes(store) - before
        out["unique_changed_bytes_big"] = args.big_mib * MiB
        t0 = time.perf_counter()
        ctl.call("rewind", to="t1", session="r")
        os.sync()
        out["rewind_big_s"] = time.perf_counter() - t0
    out["rewind_big_vs_cp"] = out["rewind_big_s"] / out["cp_big_s"]
    shutil.rmtree(d, ignore_errors=True)
    print(f"  rewind of a {args.big_mib} MiB file: {out['rewind_big_s']:.2f} s "
          f"({out['rewind_big_vs_cp']:.2f}x cp at {out['cp_big_s']:.2f} s)", flush=True)
    return out


def machine_facts(work: Path) -> dict:
    fs = subprocess.run(["stat", "-f", "-c", "%T", str(work)], capture_output=True, text=True).stdout.strip()
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return {"cpu": cpu, "cores": os.cpu_count(), "kernel": platform.release(),
            "filesystem": fs, "python": platform.python_version()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive passthrough reference")
    ap.add_argument("--targets", nargs="+", default=["bare", "rewindfs", "naive"],
                    choices=["bare", "rewindfs", "naive"])
    ap.add_argument("--only", choices=["suite", "marks", "rewind"], action="append")
    ap.add_argument("--workdir", default=None, help="where to run (default: a temp dir under /tmp)")
    ap.add_argument("--out", default=str(REPO / "bench-results" / "bench.json"))
    args = ap.parse_args(argv)
    q = args.quick
    ctx = {"small_files": 500 if q else 5000, "seq_mib": 16 if q else 256,
           "sqlite_tx": 1000 if q else 10000, "rand_mib": 8 if q else 64}
    args.marks = 50 if q else 200
    args.rewind_files = 1000 if q else 10000
    args.big_mib = 64 if q else 1024
    sizes = [1000, 5000] if q else [1000, 10000, 50000]
    only = set(args.only or ["suite", "marks", "rewind"])

    cache = REPO / "bench-results" / "cache"
    work = Path(tempfile.mkdtemp(prefix="rewindfs-bench-", dir=args.workdir))
    report = {"machine": machine_facts(work), "params": ctx | {"reps": args.reps}}
    print("machine:", json.dumps(report["machine"]))
    try:
        if "suite" in only:
            ctx["tarball"] = make_tarball(cache, 2500)
            example = None if args.no_naive or "naive" not in args.targets else fetch_passthrough_example(cache)
            print("== agent workload suite (ratios against the bare directory)")
            raw = suite(args, work, work / "store-suite", example, ctx)
            table = ratios(raw)
            print_suite(table)
            report["suite"] = table
        if "marks" in only:
            print("== turn mark latency")
            report["turn_marks"] = turn_marks(args, work, sizes)
        if "rewind" in only:
            print("== rewind and store")
            report["rewind"] = rewinds(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

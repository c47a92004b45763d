#!/usr/bin/env python3
"""Benchmark the blob store against a plain file copy measured in the same run.

    .venv/bin/python scripts/bench_store.py [--dir DIR] [--large-mib 256] [--quick]

Prints, per workload, the store's throughput and its ratio to copying the same bytes
with a plain read/write loop (ratio = store time / copy time: 1.0x = as fast as a copy,
higher = slower), with and without an fsync of the copy.  Also measures the inline-vs-file threshold (per-blob put cost with the blob
inside LMDB and as its own fsynced file) and the cost of a ``record`` transaction with
``sync`` on and off.  The figures in docs/store.md come from this script.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import shutil
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

from rewindfs.store import PreImage, Store  # noqa: E402
from rewindfs.store import _blob  # noqa: E402

CHUNK = 1 << 20


def plain_copy(src: str, dst: str, fsync: bool) -> None:
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while chunk := fi.read(CHUNK):
            fo.write(chunk)
        if fsync:
            fo.flush()
            os.fsync(fo.fileno())


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def make_files(d: str, n: int, size: int) -> list[str]:
    paths = []
    for i in range(n):
        p = os.path.join(d, f"src-{size}-{i}")
        with open(p, "wb") as f:
            f.write(os.urandom(size))
        paths.append(p)
    return paths


def put_all(store: Store, paths: list[str]) -> list[bytes]:
    keys = []
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            keys.append(store.put_fd(fd)[0])
        finally:
            os.close(fd)
    return keys


def get_all(store: Store, keys: list[bytes], out: str) -> None:
    for i, k in enumerate(keys):
        fd = os.open(f"{out}-{i}", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            store.copy_blob_to_fd(k, fd)
        finally:
            os.close(fd)


def workload(root: str, name: str, n: int, size: int) -> None:
    src = os.path.join(root, "src")
    os.makedirs(src, exist_ok=True)
    paths = make_files(src, n, size)
    cp = os.path.join(root, "cp")
    os.makedirs(cp, exist_ok=True)
    for p in paths:                     # warm the page cache for both sides alike
        plain_copy(p, os.path.join(cp, os.path.basename(p)), fsync=False)
    t_copy = timed(lambda: [plain_copy(p, os.path.join(cp, os.path.basename(p)),
                                       fsync=False) for p in paths])
    t_sync = timed(lambda: [plain_copy(p, os.path.join(cp, os.path.basename(p)),
                                       fsync=True) for p in paths])
    with Store.open(os.path.join(root, f"store-{name}")) as s:
        t_put = timed(lambda: put_all(s, paths))
        keys = put_all(s, paths[:1])
        t_dedup = timed(lambda: put_all(s, paths))
        keys = put_all(s, paths)
        t_get = timed(lambda: get_all(s, keys, os.path.join(root, "out")))
    total = n * size / (1 << 20)
    print(f"{name:>14}: {n} x {size:>9} B  copy {total / t_copy:7.0f} MiB/s "
          f"(+fsync {total / t_sync:6.0f}) | put {total / t_put:7.0f} MiB/s = "
          f"{t_put / t_copy:5.2f}x copy, {t_put / t_sync:5.2f}x copy+fsync | "
          f"dedup put {t_dedup / t_copy:5.2f}x | get {total / t_get:7.0f} MiB/s = "
          f"{t_get / t_copy:5.2f}x copy")
    shutil.rmtree(src)
    shutil.rmtree(cp)
    del keys


def threshold(root: str, sizes: list[int], n: int) -> None:
    """Per-blob put cost: inside LMDB vs its own fsynced file."""
    print("\ninline-vs-file put cost per blob (new content, sync=False index):")
    saved = _blob.INLINE_MAX
    try:
        for size in sizes:
            row = []
            for mode in ("inline", "file"):
                _blob.INLINE_MAX = (1 << 40) if mode == "inline" else -1
                data = [os.urandom(size) for _ in range(n)]
                with Store.open(os.path.join(root, f"thr-{mode}-{size}")) as s:
                    t = timed(lambda: [s.put_bytes(d) for d in data])
                    keys = [s.put_bytes(d)[0] for d in data]
                    r = timed(lambda: [s.read_blob(k) for k in keys])
                row.append((t / n * 1e6, r / n * 1e6))
            (ti, ri), (tf, rf) = row
            print(f"  {size:>9} B: put inline {ti:9.0f} us  file {tf:9.0f} us | "
                  f"read inline {ri:7.0f} us  file {rf:7.0f} us")
    finally:
        _blob.INLINE_MAX = saved


def record_cost(root: str, n: int) -> None:
    print("\nrecord() transaction (one pre-image each):")
    for sync in (False, True):
        path = os.path.join(root, f"rec-{sync}")
        with Store.open(path, sync=sync) as s:
            ws = s.workspace(b"/nonexistent/bench-ws")
            e = s.current_epoch(ws)
            t = timed(lambda: [s.record(ws, e.id, [(b"p%d" % i, PreImage.ABSENT)])
                               for i in range(n)])
        print(f"  sync={sync!s:5}: {t / n * 1e6:8.0f} us per record")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", help="where to work (default: a temp dir under /tmp)")
    ap.add_argument("--large-mib", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="smaller counts")
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-store-", dir=args.dir)
    k = 4 if args.quick else 1
    try:
        print(f"inline threshold: {_blob.INLINE_MAX} B; working in {root}")
        workload(root, "small 4 KiB", 2000 // k, 4 << 10)
        workload(root, "medium 64 KiB", 500 // k, 64 << 10)
        workload(root, "1 MiB", 64 // k, 1 << 20)
        workload(root, "large", 1, (args.large_mib // k) << 20)
        threshold(root, [4 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 2 << 20, 4 << 20],
                  40 // k)
        record_cost(root, 400 // k)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()

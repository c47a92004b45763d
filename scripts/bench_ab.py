#!/usr/bin/env python3
"""A/B timing of suite workloads: bare, rewindfs from another checkout (A), this one (B).

    git archive <old-commit> | tar -x -C /tmp/rewindfs-a
    .venv/bin/python scripts/bench_ab.py --a /tmp/rewindfs-a --workload sqlite --workload saves
    .venv/bin/python scripts/bench_ab.py --a-env REWINDFS_SPIN_US=0 --workload creates

A's daemon imports A's code: it runs with ``PYTHONPATH`` at a directory whose
``rewindfs/`` links to A's ``store``/``overlay``/``plugin`` (the editable install would
otherwise give it this checkout's — which earlier versions of this script did, so
their A and B were the same code).  ``--a-env NAME=VALUE`` sets a variable for A's
daemon only; without ``--a``, A is this checkout with those variables (a lever's A/B).
Each workload runs in a fresh directory; one that reads what an earlier workload
leaves (grep and git read the extracted tree, sequential read the written file) gets
it first, untimed, through the same mount (``bench.PREPARE``).

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


def _run(target: str, code: Path | None, d: Path, store: Path, fn, turn: int, env=None):
    """Time one workload on ``target`` (its daemon with *env*, None: ours); returns
    (seconds, store syncs or None)."""
    if code is None:
        _prepare(fn, d)
        os.sync()
        t0 = time.perf_counter()
        fn(d, CTX)
        return time.perf_counter() - t0, None
    proc = subprocess.Popen([bench.PY, "-m", "rewindfs.overlay.cli", "mount", str(d), "--foreground",
                             "--store", str(store)], cwd=code,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        bench._wait_mounted(d, proc)
        ctl = bench.Control(store, d)
        ctl.call("turn.begin", session="ab", turn=turn, label="ab")
        _prepare(fn, d)
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


def _prepare(fn, d: Path) -> None:
    """What *fn* reads, made in *d* by the workloads that make it (untimed)."""
    for earlier in bench.PREPARE.get(fn, []):
        earlier(d, CTX)


def _a_env(code: Path, pairs: list[str], work: Path) -> dict:
    """The environment of A's daemon: its code first on the import path, *pairs* set."""
    env = dict(os.environ)
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise SystemExit(f"--a-env wants NAME=VALUE, got {pair!r}")
        env[name] = value
    if code != B:
        pkg = work / "a-code" / "rewindfs"
        pkg.mkdir(parents=True)
        for part in ("store", "overlay", "plugin"):
            (pkg / part).symlink_to(code / part)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(pkg.parent),
                                                          env.get("PYTHONPATH")]))
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", type=Path, help="the other checkout (A); default: this one")
    ap.add_argument("--a-env", action="append", default=[], metavar="NAME=VALUE",
                    help="an environment variable for A's daemon only (repeatable)")
    ap.add_argument("--workload", action="append", required=True, metavar="TEXT",
                    help="run the suite workloads whose name contains TEXT (repeatable)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    CTX["tarball"], CTX["tar_files"] = bench.make_tarball(B / "bench-results" / "cache", 2500)
    chosen = [(n, fn) for n, fn in bench.workloads(CTX)
              if any(w in n for w in args.workload)]
    if args.a is None and not args.a_env:
        ap.error("give --a (another checkout) or --a-env (a lever), or both")
    targets = {"bare": None, "A": (args.a or B).resolve(), "B": B}
    work = Path(tempfile.mkdtemp(prefix="rewindfs-ab-"))
    envs = {"bare": None, "B": None, "A": _a_env(targets["A"], args.a_env, work)}
    times = {t: {n: [] for n, _ in chosen} for t in targets}
    syncs: dict[str, list] = {n: [] for n, _ in chosen}
    try:
        for r in range(args.rounds):
            order = list(targets)[r % 3:] + list(targets)[:r % 3]
            for t in order:
                for i, (n, fn) in enumerate(chosen):
                    d = work / f"{t}-{r}-{i}"
                    d.mkdir()
                    took, s = _run(t, targets[t], d, work / f"store-{t}", fn,
                                   1 + r * len(chosen) + i, envs[t])
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

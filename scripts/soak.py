#!/usr/bin/env python3
"""Soak: many turns with small changes through a real rewindfs mount.

Each turn: ``turn.begin`` (timed), a few small edits through the mount (rewrite one to
three small files, now and then create or delete one), ``turn.end`` (timed).  Per
window of turns it prints the turn-mark latency (p50/p99 of begin and of end, over one
persistent control connection) and the store's growth per turn (bytes on disk of the
LMDB index and the blob files, measured at each window's end), so a reader can see
whether they stay flat as the history grows.  Figures, not assertions.

    .venv/bin/python scripts/soak.py                 # 10,000 turns, windows of 1,000
    .venv/bin/python scripts/soak.py --turns 2000 --window 250 [--json out.json]
    .venv/bin/python scripts/soak.py --gc-keep 1000  # then gc, then one more window

With ``--gc-keep N`` it finally runs ``gc`` keeping the newest N epochs (timed) and one
more window of turns, to show the freed space being reused (growth ~0).

``--stress SECONDS`` is the other mode: a separate process runs an fsstress-like load
through the mount (create, write, append, truncate, rename of files and directories,
unlink, mkdir, rmdir, hard links, now and then fdatasync) for the whole run while this
one marks a turn every ``--mark-every`` seconds, runs ``gc`` every ``--gc-every``
seconds and a rewind (a few turns back) every ``--rewind-every`` seconds.  Per window of
``--window-s`` seconds it prints the daemon's fd count and RSS, the turn-mark latency
(p50/p99 of ``turn.begin`` and of ``turn.end``) and the load's op rate:

    .venv/bin/python scripts/soak.py --stress 600            # 10 minutes, windows of 60 s

Run as root (it mounts FUSE).  Everything lives in a temporary directory that is
unmounted and removed at the end (``--keep`` keeps the store for inspection).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rewindfs.overlay.places import control_socket_path  # noqa: E402


def _is_mounted(path: Path) -> bool:
    real = os.path.realpath(path).encode()
    with open("/proc/self/mountinfo", "rb") as f:
        return any(line.split()[4] == real and b" - fuse.rewindfs " in line for line in f)


class Control:
    """One persistent control connection (requests are answered in order)."""

    def __init__(self, path: bytes):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""
        self.rid = 0

    def call(self, method: str, **params) -> dict:
        self.rid += 1
        self.sock.sendall(json.dumps({"v": 1, "id": self.rid, "method": method,
                                      "params": params}).encode() + b"\n")
        while True:
            while b"\n" not in self.buf:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise RuntimeError("daemon closed the control connection")
                self.buf += chunk
            line, self.buf = self.buf.split(b"\n", 1)
            msg = json.loads(line)
            if "event" in msg:
                continue
            if not msg.get("ok"):
                raise RuntimeError(f"{method}: {msg.get('error')}")
            return msg["result"]


def disk_bytes(store: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(store):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def edit(ws: Path, rng: random.Random, names: list[str], turn: int) -> None:
    """A turn's small changes, through the mount."""
    for name in rng.sample(names, rng.randint(1, 3)):
        (ws / name).write_text(f"turn {turn} {name}\n" + "x" * rng.randint(10, 2000))
    roll = rng.random()
    if roll < 0.1:
        new = f"new{turn}.txt"
        (ws / new).write_text(f"created in turn {turn}\n")
        names.append(new)
    elif roll < 0.15 and len(names) > 20:
        (ws / names.pop(rng.randrange(len(names)))).unlink()


class Turns:
    """Runs turns and collects one row of figures per window."""

    def __init__(self, ctl: Control, ws: Path, store: Path, seed: int, window: int):
        self.ctl, self.ws, self.store, self.window = ctl, ws, store, window
        self.rng = random.Random(seed)
        self.names = sorted(p.name for p in ws.iterdir())
        self.turn = 0
        self.last_size = disk_bytes(store)
        self.t0 = time.monotonic()

    def run(self, count: int) -> list[dict]:
        rows, begin_ms, end_ms = [], [], []
        for i in range(1, count + 1):
            self.turn += 1
            a = time.perf_counter()
            self.ctl.call("turn.begin", session="soak", turn=self.turn,
                          label=f"turn {self.turn}")
            b = time.perf_counter()
            edit(self.ws, self.rng, self.names, self.turn)
            c = time.perf_counter()
            self.ctl.call("turn.end")
            d = time.perf_counter()
            begin_ms.append((b - a) * 1e3)
            end_ms.append((d - c) * 1e3)
            if i % self.window == 0 or i == count:
                size = disk_bytes(self.store)
                rows.append({"turns": self.turn, "begin_p50_ms": pct(begin_ms, 50),
                             "begin_p99_ms": pct(begin_ms, 99), "end_p50_ms": pct(end_ms, 50),
                             "end_p99_ms": pct(end_ms, 99),
                             "growth_per_turn_bytes": (size - self.last_size) / len(begin_ms),
                             "store_bytes": size, "wall_s": time.monotonic() - self.t0})
                print_row(rows[-1])
                self.last_size, begin_ms, end_ms = size, [], []
        return rows


def retention(ctl: Control, turns: Turns, keep: int) -> dict:
    """``gc`` keeping the newest ``keep`` epochs (no grace: nothing is in flight between
    turns here), then one more window of turns: freed LMDB pages are reused, so the
    store should not grow again until the freed space is used up."""
    a = time.perf_counter()
    report = ctl.call("gc", keep_epochs=keep, grace_s=0)
    took = time.perf_counter() - a
    print(f"gc --keep-epochs {keep}: {took:.2f} s, {report['epochs_dropped']} epochs and "
          f"{report['blobs_removed']} blobs dropped; store stays "
          f"{disk_bytes(turns.store) / 1e6:.1f} MB on disk (LMDB reuses, never shrinks)")
    turns.last_size = disk_bytes(turns.store)
    after = turns.run(turns.window)
    return {"keep_epochs": keep, "seconds": took, "report": report, "after": after}


def _start_daemon(ws, store, log, env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "rewindfs.overlay.cli", "--store", str(store),
                             "mount", str(ws), "--foreground"], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT, env=env)


def _wait_mounted(proc, ws, top) -> None:
    deadline = time.monotonic() + 30
    while not _is_mounted(ws):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the daemon did not mount; see " + str(top / "daemon.log"))
        time.sleep(0.01)


def _cli(store, *args, env, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rewindfs.overlay.cli", "--store", str(store),
                           *args], cwd=REPO, capture_output=True, env=env, **kw)


def _stop_daemon(proc, ws, store, env) -> None:
    """``rewindfs unmount``; a daemon that does not exit within 60 s is detached
    (``fusermount3 -uz``, our own mount only) and killed."""
    _cli(store, "unmount", str(ws), env=env)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        subprocess.run(["fusermount3", "-uz", str(ws)], capture_output=True)
        proc.kill()
        proc.wait()


def _fsck(store, env) -> int:
    return _cli(store, "fsck", "--json", env=env, text=True).returncode


def soak(turns: int, window: int, seed: int, top: Path, gc_keep: int | None) -> dict:
    ws, store = top / "ws", top / "store"
    ws.mkdir()
    for i in range(40):
        (ws / f"f{i}.txt").write_text(f"f{i}.txt v0\n")
    log = open(top / "daemon.log", "w")
    proc = _start_daemon(ws, store, log, os.environ)
    try:
        _wait_mounted(proc, ws, top)
        ctl = Control(control_socket_path(store, ws))
        size0 = disk_bytes(store)
        runner = Turns(ctl, ws, store, seed, window)
        rows = runner.run(turns)
        status = ctl.call("status", usage=True)
        result = {"turns": turns, "window": window, "seed": seed, "windows": rows,
                  "store_bytes_start": size0, "usage": status.get("usage")}
        if gc_keep is not None:
            result["retention"] = retention(ctl, runner, gc_keep)
    finally:
        _stop_daemon(proc, ws, store, os.environ)
        log.close()
    result["fsck_exit"] = _fsck(store, os.environ)
    return result


# -- stress mode: fsstress-like load + turn marks, gc, rewinds ---------------------------

def _load(root: str, seed: int, ops, errors, stop) -> None:
    """The load process: random namespace and data operations in ``root`` (through the
    mount) until ``stop`` is set; failures (a name another op just moved) are counted."""
    rng = random.Random(seed)
    files: list[str] = []
    dirs = [root]
    blob = os.urandom(1 << 20)

    def size() -> int:
        r = rng.random()
        return rng.randint(0, 4096) if r < 0.64 else (
            rng.randint(4096, 65536) if r < 0.94 else rng.randint(65536, 1 << 20))

    def newname(prefix: str) -> str:
        return os.path.join(rng.choice(dirs), f"{prefix}{rng.randrange(1 << 30):x}")

    while not stop.is_set():
        roll = rng.random()
        try:
            if roll < 0.25 or not files:                        # create + write
                path = newname("f")
                with open(path, "wb") as f:
                    off = rng.randrange(len(blob) // 2)
                    f.write(blob[off:off + size()])
                files.append(path)
            elif roll < 0.45:                                   # overwrite in place
                path = rng.choice(files)
                with open(path, "r+b") as f:
                    f.seek(rng.randint(0, 65536))
                    f.write(blob[:size()])
                    if rng.random() < 0.02:
                        os.fdatasync(f.fileno())
            elif roll < 0.55:                                   # append
                with open(rng.choice(files), "ab") as f:
                    f.write(blob[:rng.randint(1, 8192)])
            elif roll < 0.62:                                   # truncate
                os.truncate(rng.choice(files), rng.randint(0, 32768))
            elif roll < 0.72:                                   # rename a file
                i = rng.randrange(len(files))
                new = newname("r")
                os.rename(files[i], new)
                files[i] = new
            elif roll < 0.80 and len(files) > 50:               # unlink
                os.unlink(files.pop(rng.randrange(len(files))))
            elif roll < 0.85:                                   # hard link
                new = newname("l")
                os.link(rng.choice(files), new)
                files.append(new)
            elif roll < 0.90 and len(dirs) < 40:                # mkdir
                path = newname("d")
                os.mkdir(path)
                dirs.append(path)
            elif roll < 0.93 and len(dirs) > 1:                 # rmdir (if empty)
                path = rng.choice(dirs[1:])
                if not os.listdir(path):
                    os.rmdir(path)
                    dirs.remove(path)
            elif roll < 0.95 and len(dirs) > 1:                 # rename a directory
                i = rng.randrange(1, len(dirs))
                old, new = dirs[i], os.path.join(root, f"m{rng.randrange(1 << 30):x}")
                os.rename(old, new)
                dirs[:] = [new + d[len(old):] if d == old or d.startswith(old + "/") else d
                           for d in dirs]
                files[:] = [new + f[len(old):] if f.startswith(old + "/") else f
                            for f in files]
            else:                                               # read back
                with open(rng.choice(files), "rb") as f:
                    f.read(65536)
            if len(files) > 400:
                os.unlink(files.pop(rng.randrange(len(files))))
        except OSError:
            with errors.get_lock():
                errors.value += 1
            # a rewind may have moved names under us: forget what no longer exists
            files[:] = [f for f in files if os.path.lexists(f)]
            dirs[:] = [d for d in dirs if os.path.isdir(d)] or [root]
        with ops.get_lock():
            ops.value += 1


def _proc_sample(pid: int) -> tuple[int, int, int]:
    """(open fds, RSS, anonymous RSS in KiB) of process *pid*; the rest of the RSS is
    file pages, mostly the store's LMDB map."""
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/status") as f:
        kv = dict(line.split(":", 1) for line in f if ":" in line)
    return fds, int(kv["VmRSS"].split()[0]), int(kv["RssAnon"].split()[0])


def stress(seconds: float, top: Path, seed: int, *, mark_every: float, window_s: float,
           gc_every: float, rewind_every: float, store_top: Path | None = None) -> dict:
    import multiprocessing
    ws, store = top / "ws", (store_top or top) / "store"
    ws.mkdir()
    (ws / "load").mkdir()
    for i in range(40):
        (ws / f"f{i}.txt").write_text(f"f{i}.txt v0\n")
    log = open(top / "daemon.log", "w")
    env = dict(os.environ)
    proc = _start_daemon(ws, store, log, env)
    mp = multiprocessing.get_context("fork")
    ops, errors, stop = mp.Value("q", 0), mp.Value("q", 0), mp.Event()
    load = None
    rows, rewinds, gcs = [], [], []
    try:
        _wait_mounted(proc, ws, top)
        ctl = Control(control_socket_path(store, ws))
        pid = ctl.call("status")["pid"]
        load = mp.Process(target=_load, args=(str(ws / "load"), seed, ops, errors, stop))
        load.start()
        t0 = time.monotonic()
        next_window, next_gc, next_rewind = t0 + window_s, t0 + gc_every, t0 + rewind_every
        begin_ms, end_ms, epochs, turn = [], [], [], 0
        last_ops, fds_max = 0, 0
        while time.monotonic() - t0 < seconds:
            turn += 1
            a = time.perf_counter()
            epochs.append(ctl.call("turn.begin", session="soak", turn=turn,
                                   label=f"turn {turn}")["epoch"])
            begin_ms.append((time.perf_counter() - a) * 1e3)
            time.sleep(mark_every)
            a = time.perf_counter()
            ctl.call("turn.end", session="soak")
            end_ms.append((time.perf_counter() - a) * 1e3)
            fds_max = max(fds_max, _proc_sample(pid)[0])
            now = time.monotonic()
            if now >= next_gc:
                a = time.perf_counter()
                rep = ctl.call("gc", keep_epochs=60, grace_s=10)
                gcs.append({"s": time.perf_counter() - a,
                            "epochs_dropped": rep["epochs_dropped"]})
                next_gc = now + gc_every
            if now >= next_rewind and len(epochs) > 5:
                a = time.perf_counter()
                try:
                    rep = ctl.call("rewind", to=f"e{epochs[-5]}")
                    code = rep["exit_code"]
                    why = sorted({f["code"] for f in rep.get("failed") or []})
                except RuntimeError as exc:
                    code, why = str(exc)[:80], []
                rewinds.append({"s": time.perf_counter() - a, "exit": code, "failed": why})
                next_rewind = now + rewind_every
            if now >= next_window:
                fds, rss, anon = _proc_sample(pid)
                n = ops.value
                rows.append({"t_s": now - t0, "turns": turn, "fds": fds,
                             "fds_max": max(fds_max, fds), "rss_mb": rss / 1024, "anon_mb": anon / 1024,
                             "begin_p50_ms": pct(begin_ms, 50),
                             "begin_p99_ms": pct(begin_ms, 99),
                             "end_p50_ms": pct(end_ms, 50), "end_p99_ms": pct(end_ms, 99),
                             "load_ops_s": (n - last_ops) / window_s,
                             "load_errors": errors.value,
                             "inodes": ctl.call("status")["fs"].get("inodes")})
                print_stress_row(rows[-1])
                begin_ms, end_ms, last_ops, fds_max = [], [], n, 0
                next_window = now + window_s
    finally:
        stop.set()
        if load is not None:
            load.join(30)
            if load.is_alive():
                load.kill()
        _stop_daemon(proc, ws, store, env)
        log.close()
    return {"seconds": seconds, "mark_every": mark_every, "windows": rows,
            "rewinds": rewinds, "gcs": gcs, "daemon_exit": proc.returncode,
            "fsck_exit": _fsck(store, env)}


def print_stress_row(r: dict) -> None:
    print(f"{r['t_s']:5.0f} s {r['turns']:>5} turns | fds {r['fds']:4d} (max {r['fds_max']:4d})"
          f" rss {r['rss_mb']:6.1f} MB (anon {r['anon_mb']:5.1f}) | begin p50 {r['begin_p50_ms']:7.2f} ms"
          f" p99 {r['begin_p99_ms']:7.2f} ms | end p50 {r['end_p50_ms']:7.2f} ms"
          f" p99 {r['end_p99_ms']:7.2f} ms | load {r['load_ops_s']:6.0f} op/s"
          f" ({r['load_errors']} errors) | {r['inodes']} inodes", flush=True)


def print_row(r: dict) -> None:
    print(f"{r['turns']:>7}  begin p50 {r['begin_p50_ms']:6.2f} ms"
          f"  p99 {r['begin_p99_ms']:6.2f} ms"
          f"  | end p50 {r['end_p50_ms']:6.2f} ms  p99 {r['end_p99_ms']:6.2f} ms"
          f"  | +{r['growth_per_turn_bytes']:8.0f} B/turn"
          f"  store {r['store_bytes'] / 1e6:7.1f} MB"
          f"  ({r['wall_s']:.0f} s)", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--turns", type=int, default=10_000)
    ap.add_argument("--window", type=int, default=None, help="turns per row (default "
                    "1000, or turns/10 if fewer)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", metavar="FILE", help="also write the figures as JSON")
    ap.add_argument("--keep", action="store_true", help="keep the temporary directory")
    ap.add_argument("--gc-keep", type=int, metavar="N", help="afterwards, gc keeping the "
                    "newest N epochs, then one more window of turns")
    ap.add_argument("--stress", type=float, metavar="SECONDS", help="the stress mode "
                    "(fsstress-like load, marks, gc, rewinds) for this long")
    ap.add_argument("--mark-every", type=float, default=2.0, help="stress: seconds a turn "
                    "stays open")
    ap.add_argument("--window-s", type=float, default=60.0, help="stress: seconds per row")
    ap.add_argument("--gc-every", type=float, default=60.0)
    ap.add_argument("--rewind-every", type=float, default=90.0)
    ap.add_argument("--store-in", metavar="DIR", help="stress: put the store in a new "
                    "directory under DIR (e.g. /dev/shm: no disk flush in the figures)")
    args = ap.parse_args(argv)
    if args.stress is not None:
        return main_stress(args)
    window = args.window or (1000 if args.turns >= 10_000 else max(1, args.turns // 10))
    top = Path(tempfile.mkdtemp(prefix="rewindfs-soak-"))
    try:
        result = soak(args.turns, window, args.seed, top, args.gc_keep)
    finally:
        if not args.keep and not _is_mounted(top / "ws"):
            shutil.rmtree(top, ignore_errors=True)
    w = result["windows"]
    flat = statistics.median(r["growth_per_turn_bytes"] for r in w)
    print(f"store: {result['store_bytes_start'] / 1e6:.1f} MB → "
          f"{w[-1]['store_bytes'] / 1e6:.1f} MB, median growth {flat:.0f} B/turn; "
          f"fsck exit {result['fsck_exit']}")
    ws_usage = (result.get("usage") or {}).get("workspaces") or [{}]
    if ws_usage[0].get("paths"):
        u = ws_usage[0]
        print(f"recorded: {u['paths']} pre-images, {u['bytes'] / args.turns:.0f} B of "
              f"pre-image content per turn (before dedup) over {u['epochs']} epochs")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["fsck_exit"] == 0 else 1


def main_stress(args) -> int:
    top = Path(tempfile.mkdtemp(prefix="rewindfs-soak-"))
    store_top = Path(tempfile.mkdtemp(prefix="rewindfs-soak-store-", dir=args.store_in)) \
        if args.store_in else None
    try:
        result = stress(args.stress, top, args.seed, mark_every=args.mark_every,
                        window_s=args.window_s, gc_every=args.gc_every,
                        rewind_every=args.rewind_every, store_top=store_top)
    finally:
        if not args.keep and not _is_mounted(top / "ws"):
            shutil.rmtree(top, ignore_errors=True)
            if store_top is not None:
                shutil.rmtree(store_top, ignore_errors=True)
    rw = result["rewinds"]
    why = sorted({c for r in rw for c in r.get("failed", [])})
    print(f"{len(rw)} rewinds (exit codes {sorted(set(str(r['exit']) for r in rw))}, "
          f"failure codes {why}, "
          f"median {statistics.median(r['s'] for r in rw) if rw else 0:.2f} s), "
          f"{len(result['gcs'])} gc runs; daemon exit {result['daemon_exit']}, "
          f"fsck exit {result['fsck_exit']}")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0 if result["fsck_exit"] == 0 and result["daemon_exit"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""A real-mount fixture other tests import.

``mounted(ws, store)`` starts ``python -m overlay.cli mount WS --foreground --store S``
as a subprocess, waits until WS is a ``fuse.rewindfs`` mount point, yields a ``Mount``,
and in ``finally`` unmounts with ``rewindfs unmount`` (falling back to ``fusermount3
-u``) and requires the daemon to exit cleanly with status 0.  Only as a last resort
(daemon hung) does it detach lazily and kill *its own* daemon by pid — and then the
test fails.  Waiting is bounded by generous deadlines, never asserted on.

    from mountkit import mounted
    with mounted(tmp_path / "ws", tmp_path / "store") as m:
        (m.ws / "f").write_text("x")
        m.call("turn.begin", session="s", turn=1, label="l")
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
PYTHON = sys.executable
_START_S = 30.0
_STOP_S = 30.0


def is_rewindfs_mount(path) -> bool:
    real = os.path.realpath(os.fsencode(path))
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            left, _, right = line.partition(b" - ")
            fields = left.split()
            mp = fields[4].replace(b"\\040", b" ") if len(fields) > 4 else b""
            if mp == real and right.startswith(b"fuse.rewindfs "):
                return True
    return False


def cli(*args, store=None, check=False, input=None, cwd=None, env=None, timeout=120):
    """Run ``python -m overlay.cli [--store S] ARGS`` and return the CompletedProcess."""
    cmd = [PYTHON, "-m", "rewindfs.overlay.cli"]
    if store is not None:
        cmd += ["--store", os.fspath(store)]
    cmd += [os.fspath(a) for a in args]
    full_env = dict(os.environ, PYTHONPATH=str(ROOT))
    full_env.update(env or {})
    return subprocess.run(cmd, capture_output=True, text=True, check=check, input=input,
                          cwd=cwd or ROOT, env=full_env, timeout=timeout)


class Mount:
    """A live mount: ``ws`` (path), ``store`` (path), ``proc`` (the daemon), ``call``."""

    def __init__(self, ws: pathlib.Path, store: pathlib.Path, proc):
        self.ws = ws
        self.store = store
        self.proc = proc

    @property
    def socket(self) -> bytes:
        from rewindfs.overlay.places import control_socket_path
        return control_socket_path(self.store, self.ws)

    def call(self, method: str, **params):
        from rewindfs.overlay.control.client import call
        return call(self.socket, method, params, timeout=60)

    def open_store(self):
        from rewindfs.store import Store
        return Store.open(self.store)


def _stop(ws, store, proc) -> list[str]:
    """Unmount and reap; returns a list of problems (empty = clean)."""
    problems = []
    if proc.poll() is None and is_rewindfs_mount(ws):
        res = cli("unmount", ws, store=store, timeout=_STOP_S + 10)
        if res.returncode != 0:
            problems.append(f"rewindfs unmount failed: {res.stderr.strip()}")
            subprocess.run(["fusermount3", "-u", os.fspath(ws)], capture_output=True)
    try:
        code = proc.wait(timeout=_STOP_S)
    except subprocess.TimeoutExpired:
        problems.append("daemon did not exit after unmount; killed")
        subprocess.run(["fusermount3", "-uz", os.fspath(ws)], capture_output=True)
        proc.kill()
        code = proc.wait()
    if code != 0:
        problems.append(f"daemon exited with {code}")
    if is_rewindfs_mount(ws):
        problems.append("still mounted after the daemon exited; detached lazily")
        subprocess.run(["fusermount3", "-uz", os.fspath(ws)], capture_output=True)
    return problems


@contextlib.contextmanager
def mounted(ws, store, *, extra=(), env=None, require_clean=True, preexec_fn=None):
    """Mount *ws* with store *store* for the duration of the block (see module doc);
    ``preexec_fn`` runs in the daemon's process before it starts (e.g. a low
    ``RLIMIT_NOFILE``)."""
    ws = pathlib.Path(ws)
    store = pathlib.Path(store)
    ws.mkdir(parents=True, exist_ok=True)
    log = open(store.parent / f".mountkit-{ws.name}-{os.getpid()}.log", "w+") \
        if store.parent.is_dir() else subprocess.DEVNULL
    cmd = [PYTHON, "-m", "rewindfs.overlay.cli", "--store", os.fspath(store), "mount", os.fspath(ws),
           "--foreground", *extra]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONPATH=str(ROOT), **(env or {})),
                            preexec_fn=preexec_fn)
    problems = []
    try:
        deadline = time.monotonic() + _START_S
        while not is_rewindfs_mount(ws):
            if proc.poll() is not None:
                raise RuntimeError(f"daemon exited with {proc.returncode}: {_tail(log)}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"not mounted after {_START_S}s: {_tail(log)}")
            time.sleep(0.01)
        yield Mount(ws, store, proc)
    finally:
        problems = _stop(ws, store, proc)
        if log is not subprocess.DEVNULL:
            log.close()
    if problems and require_clean:
        raise AssertionError("unclean unmount: " + "; ".join(problems))


def _tail(log) -> str:
    if log is subprocess.DEVNULL:
        return ""
    log.flush()
    log.seek(0)
    return log.read()[-2000:]


def rewind_then_redo(m: Mount, epoch: int, view, before, after, *, rewound=None) -> None:
    """Through the daemon of ``m``: ``rewind eEPOCH`` must give back exactly ``before``
    and ``redo`` exactly ``after`` (``treesnap.exact`` of ``view``, the tree under the
    mount), each with no failed path; ``rewound(view)`` checks more in between."""
    from treesnap import compare, exact
    res = m.call("rewind", to=f"e{epoch}")
    assert res["failed"] == [], res["failed"]
    diffs = compare(before, exact(view))
    assert diffs == [], "rewind:\n" + "\n".join(diffs[:30])
    if rewound is not None:
        rewound(view)
    res = m.call("redo")
    assert res["failed"] == [], res["failed"]
    diffs = compare(after, exact(view))
    assert diffs == [], "redo:\n" + "\n".join(diffs[:30])

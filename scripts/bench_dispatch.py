#!/usr/bin/env python3
"""CPU µs per request through the kernel session's dispatcher, without the kernel.

A datagram socket pair stands in for ``/dev/fuse`` (one request per read, one reply per
write), the handlers are the real ``RewindOperations`` over a scratch tree and store,
inside an open turn.  Each figure is the process CPU time per request (parse, handler,
reply, and the read of the reply on the other end), the minimum over ``--rounds``
rounds: the machine is shared, CPU time of the best round is what moves least.  What
the figures leave out is the kernel's side of a round trip (waking the caller and the
daemon), which no daemon change touches.

    .venv/bin/python scripts/bench_dispatch.py [--rounds 9] [--files 200]

(``PYTHONPATH=DIR`` with ``DIR/rewindfs`` an export of another commit measures that one.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from rewindfs.overlay.fs import session as fs_session
from rewindfs.overlay.fs.kernel import wire
from rewindfs.overlay.fs.kernel.dispatch import Dispatcher, readdir_reply
from rewindfs.overlay.fs.kernel.session import KernelSession
from rewindfs.overlay.fs.ops import RewindOperations
from rewindfs.store import Store

_SETATTR_TIMES = wire.SETATTR_IN.pack(wire.FATTR_ATIME | wire.FATTR_MTIME, 0, 0, 0, 0,
                                      1000, 2000, 0, 0, 0, 0, 0, 0, 0, 0, 0)
_SETATTR_OWNER = wire.SETATTR_IN.pack(wire.FATTR_UID | wire.FATTR_GID, *[0] * 15)


class Wire:
    """A dispatcher over real handlers, fed through a socket pair."""

    def __init__(self, root: Path, store: Store):
        ws = store.workspace(os.fsencode(os.path.realpath(root)))
        self.root_fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
        self.ops = RewindOperations(self.root_fd, store, ws, writeback=True)
        self.ops.set_epoch(store.begin_turn(ws, "bench", 1, "dispatch").id)
        self.ours, self.kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sess = KernelSession(self.ops, b"/nowhere", [])
        sess.fd = self.ours.fileno()
        sess.flags = wire.WRITEBACK_CACHE | wire.HANDLE_KILLPRIV_V2
        sess.offered = sess.flags | wire.NO_OPENDIR_SUPPORT
        fs_session.readdir_reply = readdir_reply
        self.buf = sess._buf
        self.disp = Dispatcher(sess)
        self.reply = bytearray(1 << 20)
        self.unique = 0

    def request(self, opcode: int, nodeid: int, body: bytes = b"") -> bytes:
        self.unique += 1
        return wire.IN_HEADER.pack(40 + len(body), opcode, self.unique, nodeid, 0, 0, 1,
                                   0, 0) + body

    def send(self, req: bytes) -> memoryview:
        self.buf[:len(req)] = req
        self.disp.handle(len(req))
        n = self.kernel.recv_into(self.reply)
        return memoryview(self.reply)[:n]

    def lookup(self, parent: int, name: bytes) -> int:
        out = self.send(self.request(wire.LOOKUP, parent, name + b"\0"))
        return wire.ENTRY_OUT.unpack_from(out, 16)[0]

    def close(self) -> None:
        self.ops.close()
        os.close(self.root_fd)
        self.ours.close()
        self.kernel.close()


def _per_request(w: Wire, requests: list[bytes], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(10):
            for req in requests:
                w.send(req)
        best = min(best, (time.process_time() - t0) / (10 * len(requests)))
    return best * 1e6


def _open_release(w: Wire, inos: list[int], rounds: int) -> float:
    best = float("inf")
    opens = [w.request(wire.OPEN, i, wire.U32_PAIR.pack(os.O_RDONLY, 0)) for i in inos]
    for _ in range(rounds):
        t0 = time.process_time()
        for req in opens:
            fh = wire.OPEN_OUT.unpack_from(w.send(req), 16)[0]
            w.send(w.request(wire.RELEASE, 0, wire.RELEASE_IN.pack(fh, 0, 0, 0)))
        best = min(best, (time.process_time() - t0) / (2 * len(opens)))
    return best * 1e6


def _create_release(w: Wire, d: int, rounds: int, files: int) -> float:
    """CREATE of a new name (its absence recorded: one store commit) and its RELEASE,
    per request; every round creates new names."""
    best = float("inf")
    for _ in range(rounds):
        creates = [w.request(wire.CREATE, d, wire.CREATE_IN.pack(
            os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o100644, 0o022, 0) + b"new%d\0" % w.unique)
            for _ in range(files)]
        t0 = time.process_time()
        for req in creates:
            fh = wire.OPEN_OUT.unpack_from(w.send(req), 16 + wire.ENTRY_OUT.size)[0]
            w.send(w.request(wire.RELEASE, 0, wire.RELEASE_IN.pack(fh, 0, 0, 0)))
        best = min(best, (time.process_time() - t0) / (2 * len(creates)))
    return best * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--files", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="rewindfs-dispatch-"))
    try:
        (tmp / "ws" / "d").mkdir(parents=True)
        for i in range(args.files):
            (tmp / "ws" / "d" / f"f{i}").write_bytes(b"x" * 100)
        store = Store.open(tmp / "store")
        w = Wire(tmp / "ws", store)
        try:
            d = w.lookup(1, b"d")
            names = [b"f%d" % i for i in range(args.files)]
            inos = [w.lookup(d, n) for n in names]
            cases = {
                "getattr": [w.request(wire.GETATTR, i, wire.GETATTR_IN.pack(0, 0, 0))
                            for i in inos],
                "lookup": [w.request(wire.LOOKUP, d, n + b"\0") for n in names],
                "lookup (negative)": [w.request(wire.LOOKUP, d, b"no" + n + b"\0")
                                      for n in names],
                "getxattr security.capability (absent)": [
                    w.request(wire.GETXATTR, i, wire.U32_PAIR.pack(0, 0)
                              + b"security.capability\0") for i in inos],
                "setattr (times)": [w.request(wire.SETATTR, i, _SETATTR_TIMES) for i in inos],
                "setattr (owner)": [w.request(wire.SETATTR, i, _SETATTR_OWNER) for i in inos],
                "ioctl (ENOTTY: the loop's floor)": [w.request(wire.IOCTL, inos[0], bytes(32))]
                * len(inos),
            }
            print(f"CPU µs per request, best of {args.rounds} rounds")
            for name, reqs in cases.items():
                print(f"  {name:40s} {_per_request(w, reqs, args.rounds):6.2f}")
            print(f"  {'open + release (per request)':40s} "
                  f"{_open_release(w, inos, args.rounds):6.2f}")
            print(f"  {'create + release (per request)':40s} "
                  f"{_create_release(w, d, args.rounds, args.files):6.2f}")
        finally:
            w.close()
            store.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The kernel-direct session's dispatcher against raw protocol bytes (no FUSE needed).

A datagram socket pair stands in for ``/dev/fuse`` (one request per read, one reply
per write, as the device does): every request gets exactly one reply or, for FORGET,
BATCH_FORGET and INTERRUPT, none — an opcode the session does not know gets ENOSYS,
a handler that fails unexpectedly EIO, never silence.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import sys

import pytest

from rewindfs.overlay.fs.kernel import wire
from rewindfs.overlay.fs.kernel.dispatch import Dispatcher
from rewindfs.overlay.fs.kernel.session import KernelSession


class _Broken:
    """Handlers that fail as a bug would (not with an errno)."""
    enable_writeback_cache = False

    async def getattr(self, inode, ctx):
        raise ZeroDivisionError("a bug")

    async def forget(self, items):
        raise ZeroDivisionError("a bug")


@pytest.fixture
def wire_pair():
    ours, kernel = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    kernel.setblocking(False)
    sess = KernelSession(_Broken(), b"/nowhere", [])
    sess.fd = ours.fileno()
    disp = Dispatcher(sess)

    def send(opcode: int, unique: int, body: bytes = b"", nodeid: int = 1):
        req = wire.IN_HEADER.pack(40 + len(body), opcode, unique, nodeid, 0, 0, 1, 0, 0) + body
        sess._buf[:len(req)] = req
        disp.handle(len(req))
        try:
            reply = kernel.recv(1 << 16)
        except BlockingIOError:
            return None
        length, error, got_unique = wire.OUT_HEADER.unpack_from(reply)
        assert length == len(reply) and got_unique == unique
        return error

    yield send
    ours.close()
    kernel.close()


@pytest.mark.parametrize("opcode", [wire.GETLK, wire.BMAP, wire.POLL, wire.LSEEK, wire.SYNCFS,
                                    wire.TMPFILE, wire.STATX, 48, 63, 64, 4096, 1 << 24])
def test_an_opcode_the_session_does_not_serve_gets_enosys(wire_pair, opcode):
    assert wire_pair(opcode, 7) == -errno.ENOSYS


def test_a_handler_bug_becomes_eio_not_silence(wire_pair):
    assert wire_pair(wire.GETATTR, 8, wire.GETATTR_IN.pack(0, 0, 0)) == -errno.EIO


def test_requests_without_a_reply_get_none_even_when_they_fail(wire_pair):
    assert wire_pair(wire.INTERRUPT, 9, wire.U64.pack(3)) is None
    assert wire_pair(wire.FORGET, 10, wire.U64.pack(1)) is None
    assert wire_pair(wire.BATCH_FORGET, 11, wire.U32_PAIR.pack(1, 0)
                     + wire.FORGET_ONE.pack(5, 1)) is None
    assert wire_pair(wire.IOCTL, 12, bytes(32)) == -errno.ENOTTY     # still serving


def test_struct_sizes_match_the_protocol():
    assert wire.IN_HEADER.size == 40 and wire.OUT_HEADER.size == 16
    assert wire.INIT_OUT.size == 64 and wire.ENTRY_OUT.size == 128
    assert wire.ATTR_OUT.size == 104 and wire.SETATTR_IN.size == 88
    assert wire.RW_IN.size == 40 and wire.STATFS_OUT.size == 80
    assert wire.OPEN_OUT.size == 16 and wire.BACKING_MAP.size == 16


# -- the loop's spin before it sleeps ---------------------------------------------------

def _spin_ns_in_child(cpus: set[int], env: dict) -> int:
    """``spin_ns()`` in a child process restricted to *cpus*, with *env* set."""
    code = ("import os, sys; os.sched_setaffinity(0, {%s}); "
            "from rewindfs.overlay.fs.kernel.session import spin_ns; print(spin_ns())"
            % ", ".join(map(str, cpus)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True)
    return int(out.stdout)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to differ")
def test_the_loop_spins_only_with_a_second_cpu_and_as_configured():
    two = set(sorted(os.sched_getaffinity(0))[:2])
    assert _spin_ns_in_child(two, {"REWINDFS_SPIN_US": "100"}) == 100_000
    assert _spin_ns_in_child(two, {"REWINDFS_SPIN_US": "0"}) == 0
    assert _spin_ns_in_child(two, {"REWINDFS_SPIN_US": "many"}) == 100_000   # the default
    # on one CPU the caller would wait for our spin to end: never spin
    assert _spin_ns_in_child({min(two)}, {"REWINDFS_SPIN_US": "100"}) == 0


def test_the_spin_stops_while_most_waits_are_long_and_comes_back_when_most_are_short():
    from rewindfs.overlay.fs.kernel.session import SpinBudget
    spin = SpinBudget(100_000)
    assert spin.ns == 100_000                   # a dense stream until shown otherwise
    for _ in range(3):
        spin.spun(False)
    assert spin.ns == 100_000                   # an occasional pause: keep spinning
    spin.spun(False)
    assert spin.ns == 0                         # 4 of 8 long: sleep at once
    for _ in range(20):                         # a quick RELEASE after each open, then
        spin.slept(20_000)                      # a pause: half short, half long
        spin.slept(2_000_000)
        assert spin.ns == 0
    spin.slept(20_000)
    spin.slept(20_000)
    assert spin.ns == 100_000                   # 5 of the last 8 short: spin again
    spin.spun(True)
    assert (spin.caught, spin.missed) == (1, 4)
    assert SpinBudget(0).ns == 0                # one CPU or REWINDFS_SPIN_US=0


def test_an_entry_names_our_node_and_shows_the_real_files_number(tmp_path):
    """``fuse_entry_out``: the node id is ours (the kernel's handle), the ``fuse_attr``
    number the one ``stat`` shows — the real file's on the workspace's device, our node
    id with the top bit set on any other (which no real number of that device equals:
    two files sharing one would look like hard links)."""
    from rewindfs.overlay.fs.attrs import StatAttr
    from rewindfs.overlay.fs.kernel.dispatch import pack_attr, pack_entry

    (tmp_path / "f").write_text("x")
    st = os.lstat(tmp_path / "f")
    home = StatAttr(7, st, 1.0, st.st_dev)
    fields = wire.ENTRY_OUT.unpack(pack_entry(home))
    assert (fields[0], fields[6]) == (7, st.st_ino)          # nodeid, attr.ino
    assert wire.ATTR_OUT.unpack(pack_attr(home))[3] == st.st_ino
    away = StatAttr(7, st, 1.0, st.st_dev + 1)
    assert wire.ENTRY_OUT.unpack(pack_entry(away))[6] == 7 | 1 << 63

"""fallocate and copy_file_range through the mount (issue 14's last point, issue 17).

The kernel-direct session answers FUSE_FALLOCATE (plain, ``KEEP_SIZE``, ``PUNCH_HOLE``,
``ZERO_RANGE``) and FUSE_COPY_FILE_RANGE with handlers that capture the file before it
changes, like ``write``: inside a turn they round-trip through ``rewind`` and ``redo``.
The libfuse session cannot (pyfuse3 has no fallocate operation): there the kernel
answers ``EOPNOTSUPP`` and the file's content is left as it was.
"""

from __future__ import annotations

import ctypes
import errno
import os

import pytest

from mountkit import mounted, rewind_then_redo
from treesnap import compare, exact, real_view

pytestmark = pytest.mark.mount

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
KEEP_SIZE, PUNCH_HOLE, ZERO_RANGE = 1, 2, 0x10
MiB = 1 << 20


def _fallocate(fd: int, mode: int, off: int, length: int) -> None:
    if _libc.fallocate(fd, mode, off, length) != 0:
        e = ctypes.get_errno()
        raise OSError(e, os.strerror(e))


def _tree(ws):
    """Three files of distinct bytes, made before the mount."""
    for name, byte in ((b"grow", b"g"), (b"holes", b"h"), (b"dst", b"d")):
        (ws / os.fsdecode(name)).write_bytes(byte * MiB)
    (ws / "src").write_bytes(os.urandom(300_000))


def _change_everything(ws) -> None:
    fd = os.open(ws / "grow", os.O_RDWR)
    try:
        _fallocate(fd, 0, MiB - 10, 2 * MiB)                 # plain: the size grows
        _fallocate(fd, KEEP_SIZE, 4 * MiB, MiB)              # blocks past EOF, same size
    finally:
        os.close(fd)
    fd = os.open(ws / "holes", os.O_RDWR)
    try:
        _fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 4096, 65536)
        _fallocate(fd, ZERO_RANGE, 200_000, 100_000)
        _fallocate(fd, ZERO_RANGE | KEEP_SIZE, MiB - 5000, 20_000)
    finally:
        os.close(fd)
    src = os.open(ws / "src", os.O_RDONLY)
    dst = os.open(ws / "dst", os.O_WRONLY)
    try:
        left = 300_000
        while left:
            n = os.copy_file_range(src, dst, left, 300_000 - left, 123_456 + 300_000 - left)
            assert n > 0
            left -= n
    finally:
        os.close(src)
        os.close(dst)


def test_fallocate_and_copy_file_range_round_trip_with_the_kernel_session(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    _tree(ws)
    with real_view(ws) as real, mounted(ws, store, extra=("--session", "kernel")) as m:
        before = exact(real)
        e1 = m.call("turn.begin", session="s", turn=1, label="fallocate")["epoch"]
        _change_everything(ws)
        m.call("turn.end")
        after = exact(real)
        # the changes happened, as on a plain ext4 file
        assert (ws / "grow").stat().st_size == 3 * MiB - 10
        holes = (ws / "holes").read_bytes()
        assert len(holes) == MiB
        assert holes[4096:4096 + 65536] == bytes(65536)
        assert holes[200_000:300_000] == bytes(100_000)
        assert holes[:4096] == b"h" * 4096
        assert (ws / "dst").read_bytes()[123_456:423_456] == (ws / "src").read_bytes()
        assert compare(before, after) != []
        rewind_then_redo(m, e1, real, before, after)


def test_fallocate_with_the_libfuse_session_is_eopnotsupp(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    _tree(ws)
    with mounted(ws, store, extra=("--session", "libfuse")):
        fd = os.open(ws / "holes", os.O_RDWR)
        try:
            with pytest.raises(OSError) as info:
                _fallocate(fd, PUNCH_HOLE | KEEP_SIZE, 0, 4096)
        finally:
            os.close(fd)
        assert info.value.errno == errno.EOPNOTSUPP
        # (the kernel itself moves mtime before it asks: file_modified; content stays)
        assert (ws / "holes").read_bytes() == b"h" * MiB

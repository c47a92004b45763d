"""The kernel's writeback cache (on by default) keeps write-ahead and fail-closed:

- a write buffered in the kernel during turn N reaches the real file, and is journaled,
  in turn N's epoch: turn.begin/turn.end push dirty pages to the daemon first;
- a file opened for writing is captured at open(), so a capture failure refuses the
  open itself with ENOSPC/EIO and the file stays unchanged;
- a file held open across a turn boundary is captured again in the new epoch, with
  the content it had when that epoch began.
"""

from __future__ import annotations

import errno
import os

import pytest

from tmpfskit import small_tmpfs
from mountkit import mounted
from treesnap import real_view

pytestmark = pytest.mark.mount

# the writeback cache (not passthrough, the default as root), pinned against the
# caller's environment
_WB = {"REWINDFS_WRITEBACK": "1", "REWINDFS_PASSTHROUGH": "0"}


def _real(ws_fd, name) -> bytes:
    """The bare file underneath the mount, read through a pre-mount fd (never the cache)."""
    fd = os.open(name, os.O_RDONLY, dir_fd=ws_fd)
    try:
        return os.read(fd, 64 << 20)
    finally:
        os.close(fd)


def _journal(m, epoch) -> dict:
    with m.open_store() as s:
        ws = s.workspace(os.fsencode(os.path.realpath(m.ws)))
        return dict(s.journal(ws, epoch))


def _content(m, image) -> bytes:
    with m.open_store() as s:
        return s.read_blob(image.blob)


def test_buffered_write_lands_in_its_turn(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_bytes(b"orig")
    ws_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with mounted(ws, tmp_path / "store", env=_WB) as m:
            assert m.call("status")["fs"]["writeback"] is True
            e1 = m.call("turn.begin", session="s", turn=1, label="one")["epoch"]
            fd = os.open(ws / "f", os.O_WRONLY)
            try:
                os.write(fd, b"AAAA")              # buffered in the kernel, no fsync
                idle = m.call("turn.end")["epoch"]
                # turn.end pushed the dirty page before switching epochs
                assert _real(ws_fd, "f") == b"AAAA"
                os.pwrite(fd, b"BB", 4)            # same handle, now in the idle epoch
                e2 = m.call("turn.begin", session="s", turn=2, label="two")["epoch"]
                assert _real(ws_fd, "f") == b"AAAABB"
            finally:
                os.close(fd)
            m.call("turn.end")
            j1, jidle, j2 = _journal(m, e1), _journal(m, idle), _journal(m, e2)
            assert _content(m, j1[b"f"]) == b"orig"        # captured at open, in turn 1
            assert _content(m, jidle[b"f"]) == b"AAAA"     # turn 1's write, complete
            assert b"f" not in j2                         # nothing crossed into turn 2
            with m.open_store() as s:
                assert s.fsck().ok
    finally:
        os.close(ws_fd)


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 2 MiB tmpfs for the store."""
    with small_tmpfs(tmp_path / "tiny", "2m") as mnt:
        yield mnt


@pytest.mark.parametrize("flags", [os.O_WRONLY, os.O_RDWR, os.O_WRONLY | os.O_APPEND])
def test_capture_failure_refuses_the_open(tmp_path, tiny_tmpfs, flags):
    ws = tmp_path / "ws"
    ws.mkdir()
    big = os.urandom(3 << 20)  # its pre-image cannot fit in the 2 MiB store
    (ws / "big").write_bytes(big)
    ws_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with mounted(ws, tiny_tmpfs / "store", env=_WB) as m:
            m.call("turn.begin", session="s", turn=1, label="full")
            with pytest.raises(OSError) as exc:
                os.open(ws / "big", flags)         # the open itself fails closed
            assert exc.value.errno in (errno.ENOSPC, errno.EIO)
            assert _real(ws_fd, "big") == big
            with open(ws / "big", "rb") as f:      # reading is still allowed
                assert f.read() == big
            assert m.call("status")["fs"]["capture_errors"] >= 1
            m.call("turn.end")
    finally:
        os.close(ws_fd)


def test_times_pushed_after_unlink_are_not_errors(tmp_path):
    """The kernel pushes the mtime of a written file lazily (SETATTR at writeback); when
    the file was unlinked in between there is nothing left to change, and the push must
    not turn into a writeback error that a later fsync/syncfs reports."""
    from rewindfs.overlay.tree.syscalls import syncfs
    ws = tmp_path / "ws"
    with mounted(ws, tmp_path / "store", env=_WB) as m:
        m.call("turn.begin", session="s", turn=1, label="t")
        root = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for i in range(20):
                fd = os.open(ws / f"j{i}", os.O_CREAT | os.O_RDWR, 0o644)
                os.write(fd, b"journal page" * 100)
                if i % 2:
                    os.close(fd)
                    os.unlink(ws / f"j{i}")
                else:
                    os.unlink(ws / f"j{i}")
                    os.write(fd, b"more")
                    os.close(fd)
            syncfs(root)  # raises if any writeback request failed
        finally:
            os.close(root)
        assert os.listdir(ws) == []
        m.call("turn.end")


def test_the_real_mtime_is_the_one_the_mount_showed(tmp_path):
    """With the writeback cache the kernel owns mtime and pushes it in a SETATTR that
    can overtake the WRITE of the same data (``copy_file_range`` through the mount falls
    back to the page cache; ``close`` sends the pages in the background and the times at
    once).  The real file must end with the mtime the mount showed: a pre-image records
    the real one, and a rewind or redo would otherwise give back times nobody saw."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with real_view(ws) as real, mounted(ws, tmp_path / "store", env=_WB):
        seen = []
        for i in range(5):
            src, dst = ws / f"src{i}", ws / f"dst{i}"
            src.write_bytes(b"s" * (5000 + i))
            dst.write_bytes(b"d" * 8192)
            a = os.open(src, os.O_RDONLY)
            b = os.open(dst, os.O_WRONLY)
            try:
                os.copy_file_range(a, b, 5000 + i, 0, 0)
            finally:
                os.close(a)
                os.close(b)
            seen.append((os.lstat(dst).st_mtime_ns,
                         os.lstat(os.path.join(real, f"dst{i}")).st_mtime_ns))
        assert [m for m, _ in seen] == [r for _, r in seen]


def test_a_turn_mark_waits_for_held_writes_but_not_for_the_disk(tmp_path):
    """A file held open for writing across turn marks (a dev server's log, a build
    writing an archive): each mark must push the file's WRITEs to the daemon — the
    kernel's fsync through the mount waits for them — but it promises nothing about
    the disk.  Before, the daemon's FSYNC handler also synced the store and the real
    file for the mark's own fsync (on a journaled ext4 with a busy disk, turn.begin
    p50 27-51 ms against 7-9 ms; scripts/bench_marks_held.py).  A person's own fsync
    still goes to the disk."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "log").write_bytes(b"")
    ws_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with mounted(ws, tmp_path / "store", env=_WB) as m:
            fd = os.open(ws / "log", os.O_WRONLY | os.O_APPEND)
            try:
                base = m.call("status")["fs"]["disk_syncs"]
                for turn in range(1, 4):
                    os.write(fd, b"turn %d\n" % turn)    # buffered in the kernel
                    m.call("turn.begin", session="s", turn=turn, label="t")
                    # the mark pushed the write (it is in the real file) ...
                    assert _real(ws_fd, "log").endswith(b"turn %d\n" % turn)
                    m.call("turn.end")
                # ... and synced nothing to the disk for it
                assert m.call("status")["fs"]["disk_syncs"] == base
                os.fdatasync(fd)                         # the writer's own: it does
                assert m.call("status")["fs"]["disk_syncs"] == base + 1
            finally:
                os.close(fd)
    finally:
        os.close(ws_fd)

"""Fail closed: when the store cannot take a pre-image, the change is refused with
ENOSPC/EIO, the real file stays as it was, and the mount keeps working."""

from __future__ import annotations

import errno
import os

import pytest

from tmpfskit import small_tmpfs
from mountkit import mounted

pytestmark = pytest.mark.mount


@pytest.fixture
def tiny_tmpfs(tmp_path):
    """A 2 MiB tmpfs for the store."""
    with small_tmpfs(tmp_path / "tiny", "2m") as mnt:
        yield mnt


def _write(path, data):
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


def _real(ws_fd, name) -> bytes:
    """Read a file of the bare directory underneath the mount (through a pre-mount fd)."""
    fd = os.open(name, os.O_RDONLY, dir_fd=ws_fd)
    try:
        return os.read(fd, 64 << 20)
    finally:
        os.close(fd)


def test_full_store_refuses_changes_and_leaves_files_alone(tmp_path, tiny_tmpfs):
    ws = tmp_path / "ws"
    ws.mkdir()
    big = os.urandom(3 << 20)  # larger than the whole store filesystem
    (ws / "big").write_bytes(big)
    (ws / "victim").write_bytes(os.urandom(3 << 20))
    (ws / "small").write_bytes(b"small")
    ws_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with mounted(ws, tiny_tmpfs / "store") as m:
            for change in (
                lambda: _write(ws / "big", b"X"),                        # data write
                lambda: os.truncate(ws / "big", 0),                      # truncate
                lambda: open(ws / "big", "wb").close(),                  # O_TRUNC
                lambda: os.unlink(ws / "big"),                           # unlink
                lambda: os.rename(ws / "big", ws / "moved"),             # rename
                lambda: os.rename(ws / "small", ws / "victim"),          # overwrite
                lambda: os.chmod(ws / "big", 0o600),                     # chmod
            ):
                with pytest.raises(OSError) as exc:
                    change()
                assert exc.value.errno in (errno.ENOSPC, errno.EIO)
                assert _real(ws_fd, "big") == big
                assert sorted(os.listdir(f"/proc/self/fd/{ws_fd}")) == ["big", "small",
                                                                       "victim"]
            status = m.call("status")
            assert status["fs"]["capture_errors"] >= 7
            # small changes still fit: the mount is usable
            with open(ws / "small", "ab") as f:
                f.write(b"+")
            (ws / "fresh").write_bytes(b"new file")
            assert _real(ws_fd, "small") == b"small+"
            assert (ws / "big").read_bytes() == big
            with m.open_store() as s:
                assert s.fsck().ok
    finally:
        os.close(ws_fd)


def test_store_error_is_eio_and_mount_survives(tmp_path):
    """A store error that is not "full" (here: the blob area replaced by a plain file,
    so a large blob cannot be written) gives EIO; afterwards capture works again."""
    ws = tmp_path / "ws"
    ws.mkdir()
    old = os.urandom(2 << 20)  # above the store's inline limit: needs the blob area
    (ws / "f").write_bytes(old)
    store = tmp_path / "store"
    with mounted(ws, store):
        blobs = store / "blobs"
        os.makedirs(blobs, exist_ok=True)
        saved = blobs.with_name("blobs.saved")
        os.rename(blobs, saved)
        blobs.write_bytes(b"not a directory")  # blob writes now fail
        try:
            with pytest.raises(OSError) as exc:
                with open(ws / "f", "r+b") as f:
                    f.write(b"X")
            assert exc.value.errno in (errno.EIO, errno.ENOSPC)
            assert (ws / "f").read_bytes() == old
        finally:
            os.unlink(blobs)
            os.rename(saved, blobs)
        with open(ws / "f", "r+b") as f:
            f.write(b"Y")
        assert (ws / "f").read_bytes()[:1] == b"Y"

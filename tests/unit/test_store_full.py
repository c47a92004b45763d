"""A full index map or a full disk is ``StoreFull`` (ENOSPC at the FUSE boundary), and
the failed call changes nothing."""

from __future__ import annotations

import errno
import os

import pytest

from tmpfskit import small_tmpfs

from rewindfs.store import PreImage, Store, StoreFull
from rewindfs.store import _schema as S
from store_fixtures import assert_sound
from test_store_badinput import dump


def test_map_full_is_store_full(tmp_path, monkeypatch):
    monkeypatch.setattr(S, "MAP_SIZE", 1 << 20)
    with Store.open(tmp_path / "store") as s:
        ws = s.workspace(os.fsencode(tmp_path / "ws"))
        e = s.current_epoch(ws)
        with pytest.raises(StoreFull) as info:
            for i in range(10_000):
                before = dump(s)
                s.record(ws, e.id, [(b"dir%d/file%d" % (i, j), PreImage.ABSENT)
                                    for j in range(50)])
        assert info.value.errno == errno.ENOSPC and info.value.code == "store-full"
        assert dump(s) == before
        assert_sound(s)


@pytest.fixture
def small_disk(tmp_path):
    """A real 4 MiB tmpfs (needs root, as the project's test machines have)."""
    with small_tmpfs(tmp_path / "small", "4m") as mnt:
        yield mnt


def test_disk_full_blob_is_store_full(small_disk):
    with Store.open(small_disk / "store") as s:
        before = dump(s)
        with pytest.raises(StoreFull):
            s.put_bytes(os.urandom(6 << 20))           # a blob file: the temp write fails
        big = small_disk / "big"
        big.write_bytes(os.urandom(5 << 20)[: 3 << 20])
        fd = os.open(big, os.O_RDONLY)
        try:
            with pytest.raises(StoreFull):
                s.put_fd(fd)                           # another 3 MiB does not fit
        finally:
            os.close(fd)
        assert dump(s) == before
        assert os.listdir(s.blobs.tmp_dir) == []
        assert_sound(s)


def test_disk_full_index_is_store_full(small_disk):
    with Store.open(small_disk / "store") as s:
        ws = s.workspace(b"/nonexistent/ws")
        e = s.current_epoch(ws)
        fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
        try:                                           # leave nothing free
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        with pytest.raises(StoreFull) as info:
            for i in range(1000):
                before = dump(s)
                s.record(ws, e.id, [(b"p%d-%d" % (i, j) + b"x" * 200, PreImage.ABSENT)
                                    for j in range(100)])
        assert "index" in info.value.message, info.value.message
        assert dump(s) == before
        os.unlink(small_disk / "filler")
        assert_sound(s)


def test_disk_full_in_a_batch_put_stores_none_of_it(small_disk, tmp_path):
    """``put_fds`` commits its small contents in one transaction: when the disk fills,
    StoreFull, and not even the contents that would have fitted are stored."""
    src = tmp_path / "src"
    src.mkdir()
    fds = []
    for i in range(300):                       # 300 distinct 20 KiB files > a 4 MiB disk
        (src / f"f{i}").write_bytes(os.urandom(20 << 10))
        fds.append(os.open(src / f"f{i}", os.O_RDONLY))
    try:
        with Store.open(small_disk / "store") as s:
            s.put_bytes(b"already there")
            before = dump(s)
            with pytest.raises(StoreFull):
                s.put_fds(fds)
            assert dump(s) == before
            assert s.put_fds(fds[:5])[0][1] == 20 << 10   # a batch that fits still goes in
            assert_sound(s)
    finally:
        for fd in fds:
            os.close(fd)

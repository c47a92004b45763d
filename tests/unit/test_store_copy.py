"""store/_copy.py: the kernel copy with a pipelined hash, and its buffered fallback."""

from __future__ import annotations

import errno
import os

import pytest
import xxhash

from rewindfs.store import _copy


def _open_pair(src_dir, dst_dir, data: bytes, *, dst_flags=os.O_RDWR):
    src_path = src_dir / "src"
    src_path.write_bytes(data)
    src = os.open(src_path, os.O_RDONLY)
    dst = os.open(dst_dir / "dst", dst_flags | os.O_CREAT | os.O_EXCL, 0o600)
    return src, dst


def _copied(tmp_path, data: bytes, *, dst_dir=None, dst_flags=os.O_RDWR):
    dst_dir = dst_dir or tmp_path
    src, dst = _open_pair(tmp_path, dst_dir, data, dst_flags=dst_flags)
    try:
        got = _copy.copy_hashed(src, dst)
        assert os.lseek(src, 0, os.SEEK_CUR) == 0      # offsets are not moved
        assert os.lseek(dst, 0, os.SEEK_CUR) == 0
    finally:
        os.close(src)
        os.close(dst)
    assert (dst_dir / "dst").read_bytes() == data
    return got


@pytest.fixture
def small_steps(monkeypatch):
    """Slices of 64 KiB so that a small file goes through many copy/hash rounds."""
    monkeypatch.setattr(_copy, "STEP", 64 << 10)
    monkeypatch.setattr(_copy, "CHUNK", 16 << 10)


@pytest.mark.parametrize("size", [0, 1, (64 << 10) - 1, 64 << 10, (64 << 10) + 1,
                                  10 * (64 << 10) + 17])
def test_kernel_copy_returns_the_key_of_the_bytes_written(tmp_path, small_steps, size):
    data = os.urandom(size)
    assert _copied(tmp_path, data) == (xxhash.xxh3_128(data).digest(), size)


def test_kernel_copy_really_is_used(tmp_path, small_steps, monkeypatch):
    calls = []
    real = os.copy_file_range
    monkeypatch.setattr(os, "copy_file_range", lambda *a: calls.append(a) or real(*a))
    data = os.urandom(5 * (64 << 10))
    assert _copied(tmp_path, data)[0] == xxhash.xxh3_128(data).digest()
    assert sum(c[2] for c in calls) >= len(data) and len(calls) >= 5


def test_writeback_of_every_slice_is_started_during_the_copy(tmp_path, small_steps,
                                                            monkeypatch):
    started = []
    monkeypatch.setattr(_copy, "_sync_file_range",
                        lambda fd, off, n, flags: started.append((off, n, flags)) or 0)
    data = os.urandom(4 * (64 << 10) + 100)
    _copied(tmp_path, data)
    assert all(flags == _copy._SYNC_FILE_RANGE_WRITE for _, _, flags in started)
    covered = sorted((off, off + n) for off, n, _ in started)
    assert covered[0][0] == 0 and covered[-1][1] == len(data)
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))


def test_write_only_destination_falls_back_to_the_buffered_copy(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "copy_file_range", _must_not_be_called)
    data = os.urandom(3 * _copy.CHUNK + 5)
    got = _copied(tmp_path, data, dst_flags=os.O_WRONLY)
    assert got == (xxhash.xxh3_128(data).digest(), len(data))


@pytest.mark.parametrize("code", [errno.EXDEV, errno.EINVAL, errno.EOPNOTSUPP,
                                  errno.ENOSYS])
def test_a_refused_kernel_copy_falls_back(tmp_path, monkeypatch, code):
    def refuse(*_a):
        raise OSError(code, os.strerror(code))
    monkeypatch.setattr(os, "copy_file_range", refuse)
    data = os.urandom(2 * _copy.CHUNK + 3)
    assert _copied(tmp_path, data) == (xxhash.xxh3_128(data).digest(), len(data))


def test_another_filesystem_is_copied_too(tmp_path, small_steps):
    """/dev/shm is tmpfs, tmp_path is not: the kernel may refuse (EXDEV) or copy."""
    shm = "/dev/shm"
    if os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        pytest.fail("the test needs /dev/shm on another filesystem than tmp_path")
    dst_dir = tmp_path.__class__(shm) / f"rewindfs-copy-{os.getpid()}"
    dst_dir.mkdir()
    try:
        data = os.urandom(3 * (64 << 10) + 9)
        assert _copied(tmp_path, data, dst_dir=dst_dir)[0] == xxhash.xxh3_128(data).digest()
    finally:
        for p in dst_dir.iterdir():
            p.unlink()
        dst_dir.rmdir()


def test_an_error_during_the_copy_is_raised_not_swallowed(tmp_path, small_steps,
                                                          monkeypatch):
    real, seen = os.copy_file_range, []

    def full_after_one_slice(*a):
        if seen:
            raise OSError(errno.ENOSPC, "No space left on device")
        seen.append(a)
        return real(*a)
    monkeypatch.setattr(os, "copy_file_range", full_after_one_slice)
    src, dst = _open_pair(tmp_path, tmp_path, os.urandom(4 * (64 << 10)))
    try:
        with pytest.raises(OSError) as info:
            _copy.copy_hashed(src, dst)
        assert info.value.errno == errno.ENOSPC
    finally:
        os.close(src)
        os.close(dst)


def test_hash_fd_is_the_key_of_the_content(tmp_path):
    data = os.urandom(2 * _copy.CHUNK + 1)
    (tmp_path / "f").write_bytes(data)
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        assert _copy.hash_fd(fd) == (xxhash.xxh3_128(data).digest(), len(data))
    finally:
        os.close(fd)


def _must_not_be_called(*_a):
    raise AssertionError("copy_file_range used on a write-only destination")


class _AppendAfterEmptySeek:
    """``_next_data`` as the copy sees it while another process appends to ``path``: a
    seek that finds no more data is followed at once by an append (once)."""

    def __init__(self, path, extra: bytes):
        self.path, self.extra, self.real, self.done = path, extra, _copy._next_data, False

    def __call__(self, fd, off):
        found = self.real(fd, off)
        if found is None and not self.done:
            self.done = True
            with open(self.path, "ab") as f:
                f.write(self.extra)
        return found


def test_bytes_appended_after_the_last_seek_are_not_copied_as_a_hole(tmp_path, small_steps,
                                                                     monkeypatch):
    """A log appended to while it is captured (a writer racing a turn mark, seen in
    tests/mount/test_rel_markrace.py): the copy is some state the file had — the bytes
    before the append, or with them — never the appended range as zeros."""
    data, extra = os.urandom(3 * (64 << 10) + 100), os.urandom(3000)
    src, dst = _open_pair(tmp_path, tmp_path, data)
    monkeypatch.setattr(_copy, "_next_data", _AppendAfterEmptySeek(tmp_path / "src", extra))
    try:
        key, size = _copy.copy_hashed(src, dst)
    finally:
        os.close(src)
        os.close(dst)
    copied = (tmp_path / "dst").read_bytes()
    assert copied in (data, data + extra), f"{len(copied)} bytes, {copied.count(0)} zeros"
    assert (key, size) == (xxhash.xxh3_128(copied).digest(), len(copied))


def test_hash_fd_does_not_hash_bytes_appended_after_the_last_seek_as_zeros(tmp_path,
                                                                         monkeypatch):
    data, extra = os.urandom(2 * _copy.CHUNK + 1), os.urandom(3000)
    (tmp_path / "f").write_bytes(data)
    monkeypatch.setattr(_copy, "_next_data", _AppendAfterEmptySeek(tmp_path / "f", extra))
    fd = os.open(tmp_path / "f", os.O_RDONLY)
    try:
        got = _copy.hash_fd(fd)
    finally:
        os.close(fd)
    assert got in [(xxhash.xxh3_128(d).digest(), len(d)) for d in (data, data + extra)]

"""Blobs: streaming put, dedup that verifies bytes, verified reads."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import xxhash

from store import BlobCollision, BlobCorrupt, BlobMissing, PreImage
from store import _blob
from store_fixtures import store, store_path, ws  # noqa: F401  (fixtures)


def _file(tmp_path, data: bytes, name="f"):
    p = tmp_path / name
    p.write_bytes(data)
    return os.open(p, os.O_RDONLY)


@pytest.mark.parametrize("size", [0, 1, _blob.INLINE_MAX, _blob.INLINE_MAX + 1,
                                  3 * _blob.CHUNK + 17])
def test_put_fd_round_trips_around_the_threshold(store, tmp_path, size):
    data = os.urandom(size)
    fd = _file(tmp_path, data)
    try:
        key, n = store.put_fd(fd)
    finally:
        os.close(fd)
    assert (key, n) == (xxhash.xxh3_128(data).digest(), size)
    assert store.read_blob(key) == data
    on_disk = os.path.exists(store.blobs.file_path(key))
    assert on_disk == (size > _blob.INLINE_MAX)


def test_put_fd_reads_from_offset_zero(store, tmp_path):
    fd = _file(tmp_path, b"0123456789")
    try:
        os.lseek(fd, 5, os.SEEK_SET)
        key, n = store.put_fd(fd)
        assert os.lseek(fd, 0, os.SEEK_CUR) == 5    # pread: the offset is untouched
    finally:
        os.close(fd)
    assert store.read_blob(key) == b"0123456789"


def test_put_bytes_and_put_fd_dedup(store, tmp_path):
    big = os.urandom(_blob.INLINE_MAX * 2)
    k1, _ = store.put_bytes(big)
    fd = _file(tmp_path, big)
    try:
        k2, _ = store.put_fd(fd)
    finally:
        os.close(fd)
    assert k1 == k2
    assert store.statistics()["entries"]["blobs"] == 1
    assert os.listdir(store.blobs.tmp_dir) == []


def test_copy_blob_to_fd(store, tmp_path):
    data = os.urandom(_blob.CHUNK * 2 + 5)
    key, _ = store.put_bytes(data)
    out = tmp_path / "out"
    fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        assert store.copy_blob_to_fd(key, fd) == len(data)
    finally:
        os.close(fd)
    assert out.read_bytes() == data


def _corrupt_file(store, key, how):
    path = store.blobs.file_path(key)
    with open(path, "r+b") as f:
        if how == "truncate":
            f.truncate(10)
        else:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 1]))


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_damaged_blob_file_is_blob_corrupt_and_fsck_names_paths(store, ws, how):
    data = os.urandom(_blob.INLINE_MAX + 500)
    key, n = store.put_bytes(data)
    e = store.current_epoch(ws)
    store.record(ws, e.id, [(b"src/x.py", PreImage("file", 0o644, size=n, blob=key))])
    _corrupt_file(store, key, how)
    with pytest.raises(BlobCorrupt) as info:
        store.read_blob(key)
    assert info.value.code == "blob-corrupt"
    report = store.fsck()
    assert [(p.code, p.paths) for p in report.errors] == [("blob-corrupt", (b"src/x.py",))]
    assert not report.ok
    # a fresh put of the right content repairs it (the fixture's fsck then passes)
    store.put_bytes(data)
    assert store.read_blob(key) == data


def test_corrupt_blob_is_repaired_by_a_fresh_put(store, tmp_path):
    data = os.urandom(_blob.INLINE_MAX + 500)
    key, _ = store.put_bytes(data)
    _corrupt_file(store, key, "flip")
    assert store.put_bytes(data) == (key, len(data))
    assert store.read_blob(key) == data


def test_missing_blob(store, tmp_path):
    with pytest.raises(BlobMissing):
        store.read_blob(b"\0" * 16)
    key, _ = store.put_bytes(os.urandom(_blob.INLINE_MAX + 1))
    os.unlink(store.blobs.file_path(key))
    with pytest.raises(BlobMissing):
        store.read_blob(key)
    report = store.fsck()
    assert [p.code for p in report.errors] == ["blob-missing"]
    store.put_bytes(b"")   # leave the fixture's fsck a sound store:
    store.gc(grace_s=0)    # the entry is unreferenced, gc drops it


def test_corrupt_inline_blob(store):
    key, _ = store.put_bytes(b"small content")
    fake = xxhash.xxh3_128(b"other").digest()
    # store the bytes under a wrong key: reading must notice
    from store import _schema as S
    with store._w() as txn:
        txn.put(fake, S.pack([13, S.INLINE, 0, b"small content"]), db=store._db["blobs"])
    with pytest.raises(BlobCorrupt):
        store.read_blob(fake)
    with store._w() as txn:
        txn.delete(fake, db=store._db["blobs"])


def test_key_hit_with_different_bytes_is_a_collision_and_changes_nothing(store, monkeypatch):
    """Force a collision by making every content hash to the same key."""
    key, _ = store.put_bytes(b"first")

    class Same:
        def __init__(self, *a):
            pass

        def update(self, _):
            pass

        def digest(self):
            return key

    monkeypatch.setattr(_blob.xxhash, "xxh3_128", Same)
    with pytest.raises(BlobCollision):
        store.put_bytes(b"secon")
    with pytest.raises(BlobCollision):
        store.put_bytes(b"longer content")
    monkeypatch.undo()
    assert store.read_blob(key) == b"first"


def test_large_put_streams_without_holding_the_file(tmp_path):
    """A 512 MiB sparse file goes in with bounded memory (measured in a child)."""
    script = textwrap.dedent(f"""
        import os, resource, sys
        sys.path.insert(0, {os.getcwd()!r})
        from store import Store
        p = {str(tmp_path / 'sparse')!r}
        with open(p, 'wb') as f:
            f.truncate(512 << 20)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        with Store.open({str(tmp_path / 'store')!r}) as s:
            fd = os.open(p, os.O_RDONLY)
            key, n = s.put_fd(fd)
            assert n == 512 << 20
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        print((after - before) // 1024)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True)
    grown_mib = int(out.stdout.strip())
    assert grown_mib < 64, f"put_fd of 512 MiB grew the process by {grown_mib} MiB"


# -- put_fds: many files, the small ones in one transaction ---------------------------

def _fds(tmp_path, contents):
    return [_file(tmp_path, data, name=f"f{i}") for i, data in enumerate(contents)]


def _close(fds):
    for fd in fds:
        os.close(fd)


def _count_writes(monkeypatch):
    """Count write transactions the blob area opens."""
    opened = []
    real = _blob._txn.write

    def counting(env):
        opened.append(1)
        return real(env)

    monkeypatch.setattr(_blob._txn, "write", counting)
    return opened


def test_put_fds_mixed_sizes_round_trip(store, tmp_path):
    contents = [b"", b"small", os.urandom(_blob.INLINE_MAX), os.urandom(_blob.INLINE_MAX + 1),
                b"small", os.urandom(3 * _blob.CHUNK + 17), os.urandom(100)]
    fds = _fds(tmp_path, contents)
    try:
        got = store.put_fds(fds)
    finally:
        _close(fds)
    assert got == [(xxhash.xxh3_128(c).digest(), len(c)) for c in contents]
    for (key, _), data in zip(got, contents):
        assert store.read_blob(key) == data
        assert os.path.exists(store.blobs.file_path(key)) == (len(data) > _blob.INLINE_MAX)


def test_put_fds_commits_the_small_contents_in_one_transaction(store, tmp_path, monkeypatch):
    contents = [b"content %d" % i for i in range(200)]
    fds = _fds(tmp_path, contents)
    opened = _count_writes(monkeypatch)
    try:
        got = store.put_fds(fds)
    finally:
        _close(fds)
    assert len(opened) == 1
    assert [store.read_blob(k) for k, _ in got] == contents


def test_put_fds_dedups_identical_contents_within_the_batch(store, tmp_path):
    contents = [b"same bytes", b"other", b"same bytes", b"same bytes"]
    fds = _fds(tmp_path, contents)
    try:
        got = store.put_fds(fds)
    finally:
        _close(fds)
    assert got[0] == got[2] == got[3] != got[1]
    with store._r() as txn:
        assert txn.stat(store.blobs.db)["entries"] == 2


def test_put_fds_collision_mid_batch_stores_none_of_it(store, tmp_path, monkeypatch):
    """Two different small contents of one batch share a key: BlobCollision, and the
    contents before it in the batch are not stored either (one transaction)."""
    from test_store_badinput import dump
    before = dump(store)
    key = b"k" * 16

    class Same:
        def __init__(self, *a):
            pass

        def update(self, _):
            pass

        def digest(self):
            return key

    fds = _fds(tmp_path, [b"first", b"secon"])
    monkeypatch.setattr(_blob.xxhash, "xxh3_128", Same)
    try:
        with pytest.raises(BlobCollision):
            store.put_fds(fds)
    finally:
        _close(fds)
    monkeypatch.undo()
    assert dump(store) == before

"""Blobs: streaming put, dedup that verifies bytes, verified reads."""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import sys
import textwrap

import pytest
import xxhash

from rewindfs.store import BlobCollision, BlobCorrupt, BlobMissing, PreImage
from rewindfs.store import _blob
from rewindfs.store import _schema as S
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


def _every_content_hashes_to(key: bytes, monkeypatch) -> None:
    """Force collisions: from now on every content the blob area hashes gets ``key``."""
    class Same:
        def __init__(self, *a):
            pass

        def update(self, _):
            pass

        def digest(self):
            return key

    monkeypatch.setattr(_blob.xxhash, "xxh3_128", Same)


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
    with store._w() as txn:
        txn.put(fake, S.pack([13, S.INLINE, 0, b"small content"]), db=store._db["blobs"])
    with pytest.raises(BlobCorrupt):
        store.read_blob(fake)
    with store._w() as txn:
        txn.delete(fake, db=store._db["blobs"])


def test_key_hit_with_different_bytes_is_a_collision_and_changes_nothing(store, monkeypatch):
    """Force a collision by making every content hash to the same key."""
    key, _ = store.put_bytes(b"first")

    _every_content_hashes_to(key, monkeypatch)
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
        from rewindfs.store import Store
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


# -- compressed inline payloads ----------------------------------------------------

def _text(size: int) -> bytes:
    """Compressible content of exactly ``size`` bytes (source-like lines)."""
    lines = b"".join(b"def f%d(x):\n    return x * %d\n" % (i, i) for i in range(size // 20 + 1))
    return lines[:size]


def _entry(store, key):
    return store.blobs.entry(key)


Z = _blob.ZSTD_MIN


@pytest.mark.parametrize("size", [Z - 1, Z, Z + 1, 4096, 3 * 4096 + 5, _blob.INLINE_MAX])
@pytest.mark.parametrize("content", ["text", "random"])
def test_inline_blobs_round_trip_compressed_only_when_it_pays(store, tmp_path, size, content):
    data = _text(size) if content == "text" else os.urandom(size)
    fd = _file(tmp_path, data)
    try:
        key, n = store.put_fd(fd)
    finally:
        os.close(fd)
    assert (key, n) == (xxhash.xxh3_128(data).digest(), size)   # of the uncompressed bytes
    assert store.read_blob(key) == data
    size_field, kind, _, payload = _entry(store, key)
    assert size_field == size
    if content == "text" and size > Z:
        assert kind == S.INLINE_ZSTD and len(payload) < size // 2
    else:   # small, or incompressible: kept as it is
        assert (kind, payload) == (S.INLINE, data)
    assert not os.path.exists(store.blobs.file_path(key))


def test_dedup_hit_against_a_compressed_entry(store, tmp_path):
    data = _text(20_000)
    key, _ = store.put_bytes(data)
    first = _entry(store, key)
    assert first[1] == S.INLINE_ZSTD
    fd = _file(tmp_path, data)
    try:
        assert store.put_fd(fd) == (key, len(data))
    finally:
        os.close(fd)
    again = _entry(store, key)
    assert store.statistics()["entries"]["blobs"] == 1
    assert again[1:4:2] == first[1:4:2]      # same kind and payload, only touched moved
    assert again[2] >= first[2]
    assert store.read_blob(key) == data


def test_collision_with_a_compressed_entry_changes_nothing(store, monkeypatch):
    first = _text(10_000)
    key, _ = store.put_bytes(first)
    entry = _entry(store, key)

    _every_content_hashes_to(key, monkeypatch)
    with pytest.raises(BlobCollision):     # same size, different bytes
        store.put_bytes(first[:-1] + b"!")
    monkeypatch.undo()
    assert _entry(store, key) == entry
    assert store.read_blob(key) == first


def _set_payload(store, key, payload=None, size=None):
    with store._w() as txn:
        entry = S.unpack(txn.get(key, db=store._db["blobs"]))
        if payload is not None:
            entry[3] = payload
        if size is not None:
            entry[0] = size
        txn.put(key, S.pack(entry), db=store._db["blobs"])


DAMAGED_ZSTD = {
    "flip": lambda p: p[:40] + bytes([p[40] ^ 0xFF]) + p[41:],
    "truncate": lambda p: p[: len(p) // 2],
    "garbage": lambda p: b"\xc0" * len(p),
    "tail": lambda p: p + b"\0" * 8,      # trailing bytes after the frame
}


@pytest.mark.parametrize("how", sorted(DAMAGED_ZSTD))
def test_damaged_compressed_payload_is_blob_corrupt_and_repaired(store, ws, how):
    data = _text(30_000)
    key, n = store.put_bytes(data)
    payload = _entry(store, key)[3]
    e = store.current_epoch(ws)
    store.record(ws, e.id, [(b"src/z.py", PreImage("file", 0o644, size=n, blob=key))])
    _set_payload(store, key, DAMAGED_ZSTD[how](payload))
    if how == "tail":   # the frame still decodes to the right bytes: tolerated
        assert store.read_blob(key) == data
        return
    with pytest.raises(BlobCorrupt) as info:
        store.read_blob(key)
    assert info.value.code == "blob-corrupt"
    report = store.fsck()
    assert [(p.code, p.paths) for p in report.errors] == [("blob-corrupt", (b"src/z.py",))]
    # a fresh put of the right content replaces the damaged entry
    assert store.put_bytes(data) == (key, n)
    assert _entry(store, key)[3] == payload
    assert store.read_blob(key) == data


def test_compressed_frame_naming_another_size_is_corrupt(store):
    """The frame header's size is checked before it is allocated."""
    data = _text(8000)
    key, _ = store.put_bytes(data)
    other = _blob._codec()[0].compress(_text(9000))
    _set_payload(store, key, other)
    with pytest.raises(BlobCorrupt, match="size field 9000"):
        store.read_blob(key)
    store.put_bytes(data)   # repair, for the fixture's fsck


def test_disk_full_put_is_not_fooled_by_a_damaged_compressed_entry(store, tmp_path):
    """``_known_despite_full`` compares decoded bytes; a damaged entry is no match."""
    data = _text(50_000)
    key, _ = store.put_bytes(data)
    _set_payload(store, key, b"\0" * 100)
    fd = _file(tmp_path, data)
    try:
        assert store.blobs._known_despite_full(fd) is None
    finally:
        os.close(fd)
    store.put_bytes(data)


def test_old_format_inline_entry_still_reads_and_dedups(store, ws):
    """An entry written before compression (raw INLINE above ZSTD_MIN) keeps working."""
    data = _text(12_000)
    key = xxhash.xxh3_128(data).digest()
    with store._w() as txn:
        txn.put(key, S.pack([len(data), S.INLINE, 0, data]), db=store._db["blobs"])
    assert store.read_blob(key) == data
    assert store.put_bytes(data) == (key, len(data))   # a dedup hit: no rewrite
    size, kind, touched, payload = _entry(store, key)
    assert (size, kind, payload) == (len(data), S.INLINE, data) and touched > 0
    e = store.current_epoch(ws)
    store.record(ws, e.id, [(b"old.py", PreImage("file", 0o644, size=size, blob=key))])
    assert store.fsck().ok


def test_compressed_blobs_from_several_threads(store):
    """Each thread has its own zstd objects (sharing one crashes the process): puts and
    reads of compressed blobs from four threads at once."""
    def work(t):
        mine = [_text(30_000 + 97 * i) + b"thread %d blob %d" % (t, i) for i in range(20)]
        keys = [store.put_bytes(data)[0] for data in mine]
        for _ in range(10):
            for key, data in zip(keys, mine):
                assert store.read_blob(key) == data
        return keys

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        keys = [k for r in pool.map(work, range(4)) for k in r]
    assert {_entry(store, k)[1] for k in keys} == {S.INLINE_ZSTD}


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
    fds = _fds(tmp_path, [b"first", b"secon"])
    _every_content_hashes_to(b"k" * 16, monkeypatch)
    try:
        with pytest.raises(BlobCollision):
            store.put_fds(fds)
    finally:
        _close(fds)
    monkeypatch.undo()
    assert dump(store) == before


def test_a_hint_naming_a_damaged_compressed_entry_falls_through_and_repairs(store, tmp_path):
    """``put_fd(fd, hint)``: the hinted dedup hit meets a payload that does not decode;
    the put goes on the ordinary way (and repairs the entry) instead of failing."""
    data = _text(30_000)
    key, _ = store.put_bytes(data)
    _set_payload(store, key, DAMAGED_ZSTD["garbage"](_entry(store, key)[3]))
    fd = _file(tmp_path, data)
    try:
        assert store.put_known(fd, key) is None
        assert store.put_fd(fd, key) == (key, len(data))
    finally:
        os.close(fd)
    assert store.read_blob(key) == data

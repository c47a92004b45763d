"""Content-addressed blobs: key = xxh3-128 of the content.

Contract:

- ``put_fd`` streams with ``pread`` from offset 0 in ``CHUNK`` pieces; at most
  ``INLINE_MAX`` bytes are ever buffered, so a 2 GiB file never sits in memory.
- Blobs up to ``INLINE_MAX`` bytes live inside LMDB (above ``ZSTD_MIN`` zstd-compressed
  when that saves at least an eighth, see ``_encode_inline``); larger ones are files
  ``blobs/ab/cdef…`` written to a unique temp name, fsynced, renamed and the shard
  directory fsynced — all *before* the index entry is committed, so an entry never
  names a file that is not durable.  (A crash in between leaves an orphan file; gc
  removes it after the grace period, fsck reports it.)
- A key that already exists is trusted only after its size and bytes match the new
  content (collision-safe dedup).  If the existing blob no longer matches its own key
  (corrupt) the new content repairs it; if it matches its key but differs from the new
  content (a real xxh3-128 collision) ``BlobCollision`` is raised and nothing changes.
- A full disk does not refuse content the store already holds: if writing a large
  blob's temp file fails with ``ENOSPC``, the rest of the content is hashed and a stored
  blob with that key and the same bytes is accepted (the dedup hit the temp file would
  have led to); only new content fails (``StoreFull``).
- ``put_fds`` puts many files at once: all contents up to ``INLINE_MAX`` in one write
  transaction (all or none), larger ones one by one through ``put_fd``.
- Every put (new or dedup hit) sets the entry's ``touched_ns``, which gc's grace period
  is measured from: a capture in flight (blob put, journal entry not yet recorded) is
  never collected.
- Key, size and every comparison are of the *uncompressed* content; compression is
  only how an inline payload is kept.  Reading verifies size and hash of the decoded
  bytes: ``BlobMissing`` / ``BlobCorrupt`` (a payload that does not decode is corrupt).

The rename of a new blob file and its index entry happen inside one write transaction,
and gc unlinks a file only while holding the write lock with the entry absent, so a put
and a gc of the same key can never interleave into a dangling entry.
"""

from __future__ import annotations

import errno
import itertools
import logging
import os
import threading
import time

import xxhash
import zstandard

from . import _schema as S
from . import _txn
from ._errors import BlobCorrupt, BlobMissing, StoreError

log = logging.getLogger(__name__)

CHUNK = 1 << 20
# Measured with scripts/bench_store.py (see docs/store.md): below this size a blob is
# cheaper inside LMDB than as its own fsynced file.
INLINE_MAX = 1 << 20
# Inline payloads above ZSTD_MIN are zstd-compressed: LMDB keeps a value over ~2 KiB
# in whole 4 KiB overflow pages, and source text shrinks to ~1/4 (the bench's source
# tree: 1.11x -> 0.34x of its unique bytes; ZSTD_MIN 2048 instead of 1024 gives 2 %
# more, 0 gives 1 % less).  Level 1, ~250-300 MiB/s, is paid on every capture of new
# content; level 3 is 4 % smaller for ~35 % more CPU.  Incompressible data costs
# ~5 GiB/s to try and stays raw (docs/store.md).
ZSTD_MIN = 1024
ZSTD_LEVEL = 1

_counter = itertools.count()


class BlobCollision(StoreError):
    """Two different contents share the blob key {key} (xxh3-128 collision); nothing was stored."""

    code = "blob-collision"


class BlobArea:
    """Blob payloads of one store: the ``blobs`` database plus the sharded directory."""

    def __init__(self, env, db, root: str):
        self.env, self.db, self.root = env, db, root
        self.tmp_dir = os.path.join(root, "tmp")
        # the store holds copies of the user's files: private to the user
        os.makedirs(root, mode=0o700, exist_ok=True)
        os.makedirs(self.tmp_dir, mode=0o700, exist_ok=True)

    # -- paths --------------------------------------------------------------------
    def file_path(self, key: bytes) -> str:
        h = key.hex()
        return os.path.join(self.root, h[:2], h[2:])

    def _temp_path(self) -> str:
        name = f"{os.getpid()}-{next(_counter)}-{os.urandom(4).hex()}.tmp"
        return os.path.join(self.tmp_dir, name)

    # -- writing ------------------------------------------------------------------
    def put_fd(self, fd: int) -> tuple[bytes, int]:
        """Store the content of ``fd`` (read from offset 0 to EOF); return (key, size)."""
        with _txn.translate():
            h = xxhash.xxh3_128()
            chunks: list[bytes] = []
            off, tmp_fd, tmp_path = 0, None, None
            try:
                while chunk := os.pread(fd, CHUNK, off):
                    h.update(chunk)
                    off += len(chunk)
                    if tmp_fd is None:
                        chunks.append(chunk)
                        if off > INLINE_MAX:
                            tmp_path = self._temp_path()
                            tmp_fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                            for c in chunks:
                                _write_all(tmp_fd, c)
                            chunks = []
                    else:
                        _write_all(tmp_fd, chunk)
                if tmp_fd is None:
                    return self._commit_inline(h.digest(), b"".join(chunks))
                os.fsync(tmp_fd)
            except OSError as exc:
                if tmp_path is not None:
                    _unlink_quiet(tmp_path)
                if exc.errno not in (errno.ENOSPC, errno.EDQUOT) or tmp_fd is None:
                    raise
                os.close(tmp_fd)   # an open unlinked temp file still holds the space
                tmp_fd = None
                known = self._known_despite_full(fd, h, off)
                if known is None:
                    raise
                return known
            except BaseException:
                if tmp_path is not None:
                    _unlink_quiet(tmp_path)
                raise
            finally:
                if tmp_fd is not None:
                    os.close(tmp_fd)
            return self._commit_file(h.digest(), off, tmp_path)

    def put_fds(self, fds) -> list[tuple[bytes, int]]:
        """``put_fd`` for many files: (key, size) of each fd, in order.

        Every content of at most ``INLINE_MAX`` bytes is committed in ONE write
        transaction — all of them or none: a full disk or map raises ``StoreFull`` with
        none of them stored (a batch of 10,000 small files costs one commit instead of
        10,000).  A larger content goes through ``put_fd`` on its own (own transaction,
        its full-disk dedup fallback) before that commit.  Identical contents within the
        batch are verified against each other like any dedup hit.  Each small content
        is held in memory until the commit: the caller bounds the batch."""
        out: list = [None] * len(fds)
        small: list[tuple[int, bytes]] = []
        with _txn.translate():
            for i, fd in enumerate(fds):
                data = _read_inline(fd)
                if data is None:
                    out[i] = self.put_fd(fd)
                else:
                    small.append((i, data))
            if small:
                with _txn.write(self.env) as txn:
                    for i, data in small:
                        out[i] = self._commit_inline_in(txn, xxhash.xxh3_128(data).digest(),
                                                        data)
        return out

    def _known_despite_full(self, fd: int, h, off: int) -> tuple[bytes, int] | None:
        """The disk filled while spooling ``fd``: finish hashing from ``off``; if the
        store already holds that exact content, touch it and return (key, size), else
        None.  Runs inside ``put_fd``'s ``translate()``: a failed touch is StoreFull."""
        while chunk := os.pread(fd, CHUNK, off):
            h.update(chunk)
            off += len(chunk)
        key = h.digest()
        with _txn.write(self.env) as txn:
            raw = txn.get(key, db=self.db)
            if raw is None:
                return None
            entry = S.unpack(raw)
            try:
                same = entry[0] == off and _streams_equal(self._iter_raw(key, entry),
                                                          _iter_fd(fd))
            except (BlobMissing, BlobCorrupt):
                same = False
            if not same:
                return None
            self._touch(txn, key, entry)
        log.debug("disk full, but blob %s is already stored", key.hex())
        return key, off

    def put_bytes(self, data: bytes) -> tuple[bytes, int]:
        """Store ``data``; return (key, size)."""
        data = bytes(data)
        key = xxhash.xxh3_128(data).digest()
        with _txn.translate():
            if len(data) <= INLINE_MAX:
                return self._commit_inline(key, data)
            tmp_path = self._temp_path()
            try:
                fd = os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                try:
                    _write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except BaseException:
                _unlink_quiet(tmp_path)
                raise
            return self._commit_file(key, len(data), tmp_path)

    def _commit_inline(self, key: bytes, data: bytes) -> tuple[bytes, int]:
        with _txn.write(self.env) as txn:
            return self._commit_inline_in(txn, key, data)

    def _commit_inline_in(self, txn, key: bytes, data: bytes) -> tuple[bytes, int]:
        """Store one inline blob inside the caller's write transaction ``txn`` (a key
        put earlier in the same transaction is seen, so a batch dedups within itself)."""
        raw = txn.get(key, db=self.db)
        old = None if raw is None else S.unpack(raw)
        if old is not None and self._accept_existing(key, old, len(data), data, None):
            self._touch(txn, key, old)
        else:
            if old is not None:
                self._drop_file(key, old)
            kind, payload = _encode_inline(data)
            txn.put(key, S.pack([len(data), kind, time.time_ns(), payload]), db=self.db)
        return key, len(data)

    def _commit_file(self, key: bytes, size: int, tmp_path: str) -> tuple[bytes, int]:
        try:
            with _txn.write(self.env) as txn:
                raw = txn.get(key, db=self.db)
                old = None if raw is None else S.unpack(raw)
                if old is not None and self._accept_existing(key, old, size, None, tmp_path):
                    self._touch(txn, key, old)
                    return key, size
                final = self.file_path(key)
                os.makedirs(os.path.dirname(final), exist_ok=True)
                os.rename(tmp_path, final)
                tmp_path = None
                _fsync_dir(os.path.dirname(final))
                txn.put(key, S.pack([size, S.FILE, time.time_ns(), None]), db=self.db)
            return key, size
        finally:
            if tmp_path is not None:
                _unlink_quiet(tmp_path)

    def _accept_existing(self, key, entry, size, data, path) -> bool:
        """True if the stored blob equals the new content; False if it is corrupt
        (then the new content replaces it); raise ``BlobCollision`` on a real collision."""
        if entry[0] == size and self._same_content(key, entry, data, path):
            return True
        try:
            self.check(key, entry)
        except (BlobCorrupt, BlobMissing):
            log.warning("blob %s was corrupt; replaced by a fresh copy", key.hex())
            return False
        raise BlobCollision(key=key.hex())

    def _same_content(self, key, entry, data, path) -> bool:
        new = _iter_bytes(data) if data is not None else _iter_file(path)
        try:
            old = self._iter_raw(key, entry)
            return _streams_equal(old, new)
        except (BlobMissing, BlobCorrupt):   # then _accept_existing's check tells which
            return False

    def _touch(self, txn, key, entry) -> None:
        entry[2] = time.time_ns()
        txn.put(key, S.pack(entry), db=self.db)

    def _drop_file(self, key, entry) -> None:
        if entry[1] == S.FILE:
            _unlink_quiet(self.file_path(key))

    # -- reading ------------------------------------------------------------------
    def entry(self, key: bytes):
        with _txn.read(self.env) as txn:
            raw = txn.get(key, db=self.db)
        if raw is None:
            raise BlobMissing(key=key.hex())
        return S.unpack(raw)

    def _iter_raw(self, key: bytes, entry):
        """The blob's content in chunks, inline payloads decoded; not verified."""
        if entry[1] != S.FILE:
            return _iter_bytes(_decode_inline(key, entry))
        path = self.file_path(key)
        try:
            return _iter_file(path)
        except FileNotFoundError:
            raise BlobMissing(key=key.hex()) from None

    def iter_verified(self, key: bytes, entry=None):
        """Yield the blob's chunks; after the last one, raise if size or hash is wrong.

        A consumer that writes chunks as they come must treat its output as invalid when
        this raises (the restore engine writes to a temp name, so nothing lands).
        """
        entry = entry if entry is not None else self.entry(key)
        h, n = xxhash.xxh3_128(), 0
        with _txn.translate():
            for chunk in self._iter_raw(key, entry):
                h.update(chunk)
                n += len(chunk)
                yield chunk
        if n != entry[0]:
            raise BlobCorrupt(key=key.hex(), reason=f"size {n}, expected {entry[0]}")
        if h.digest() != key:
            raise BlobCorrupt(key=key.hex(), reason="content does not match its hash")

    def read(self, key: bytes) -> bytes:
        return b"".join(self.iter_verified(key))

    def copy_to_fd(self, key: bytes, fd: int) -> int:
        n = 0
        with _txn.translate():
            for chunk in self.iter_verified(key):
                _write_all(fd, chunk)
                n += len(chunk)
        return n

    def check(self, key: bytes, entry=None) -> None:
        """Raise ``BlobMissing``/``BlobCorrupt`` unless the blob reads back intact."""
        for _ in self.iter_verified(key, entry):
            pass


_codecs = threading.local()


def _codec():
    """This thread's (compressor, decompressor): zstandard's objects must not be used
    by several threads at once, and captures run in the trio thread and in workers."""
    try:
        return _codecs.pair
    except AttributeError:
        # no frame checksum: the key (xxh3-128 of the decoded bytes) is checked on read
        _codecs.pair = (zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_checksum=False),
                        zstandard.ZstdDecompressor())
        return _codecs.pair


def _encode_inline(data: bytes) -> tuple[int, bytes]:
    """(kind, payload) of an inline entry: zstd when it saves at least an eighth."""
    if len(data) > ZSTD_MIN:
        packed = _codec()[0].compress(data)
        if len(packed) <= len(data) - len(data) // 8:
            return S.INLINE_ZSTD, packed
    return S.INLINE, data


def _decode_inline(key: bytes, entry) -> bytes:
    """The content of an inline entry; ``BlobCorrupt`` if its payload does not decode."""
    size, kind, _, payload = entry
    if kind == S.INLINE:
        return payload
    if kind != S.INLINE_ZSTD:
        raise BlobCorrupt(key=key.hex(), reason=f"unknown entry kind {kind!r}")
    try:
        # the frame header names the size it will allocate: check it before trusting it
        named = zstandard.frame_content_size(payload)
        if named != size:
            raise BlobCorrupt(key=key.hex(), reason=f"compressed size field {named}, "
                              f"expected {size}")
        return _codec()[1].decompress(payload)
    except zstandard.ZstdError as exc:
        raise BlobCorrupt(key=key.hex(), reason=f"compressed payload: {exc}") from None


def _write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _read_inline(fd: int) -> bytes | None:
    """The content of ``fd`` (from offset 0) if it is at most ``INLINE_MAX`` bytes, else
    None (after reading at most ``INLINE_MAX + 1`` bytes)."""
    chunks, off = [], 0
    while off <= INLINE_MAX and (chunk := os.pread(fd, INLINE_MAX + 1 - off, off)):
        chunks.append(chunk)
        off += len(chunk)
    return b"".join(chunks) if off <= INLINE_MAX else None


def _iter_bytes(data: bytes):
    for i in range(0, len(data), CHUNK):
        yield data[i:i + CHUNK]


def _iter_fd(fd: int):
    off = 0
    while chunk := os.pread(fd, CHUNK, off):
        off += len(chunk)
        yield chunk


def _iter_file(path: str):
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def gen():   # opened eagerly so a missing file raises here, not at first next()
        try:
            yield from _iter_fd(fd)
        finally:
            os.close(fd)
    return gen()


def _streams_equal(a, b) -> bool:
    """Compare two chunk streams byte for byte, whatever their chunking."""
    buf_a = buf_b = b""
    a, b = iter(a), iter(b)
    while True:
        if not buf_a:
            buf_a = next(a, b"")
        if not buf_b:
            buf_b = next(b, b"")
        if not buf_a or not buf_b:
            return not buf_a and not buf_b
        n = min(len(buf_a), len(buf_b))
        if buf_a[:n] != buf_b[:n]:
            return False
        buf_a, buf_b = buf_a[n:], buf_b[n:]


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quiet(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass

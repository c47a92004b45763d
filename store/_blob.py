"""Content-addressed blobs: key = xxh3-128 of the content.

Contract:

- ``put_fd`` streams with ``pread`` from offset 0 in ``CHUNK`` pieces; at most
  ``INLINE_MAX`` bytes are ever buffered, so a 2 GiB file never sits in memory.
- Blobs up to ``INLINE_MAX`` bytes live inside LMDB (above ``ZSTD_MIN`` zstd-compressed
  when that saves at least an eighth, see ``_encode_inline``); larger ones are files
  ``blobs/ab/cdef…`` written to a unique temp name, fsynced, renamed and the shard
  directory fsynced (a new shard directory's name too) — all *before* the index entry
  is committed, so an entry never names a file that is not durable.  (A crash in
  between leaves an orphan file; gc removes it after the grace period, fsck reports
  it.)
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
- Large content is copied by ``_copy.copy_hashed`` (the kernel copies, a helper
  thread hashes the copy read back), for a large ``put_fd`` and for ``copy_to_fd`` into
  an empty file: the key (or the verification) is the hash of exactly the bytes
  written.
- ``put_fd(fd, hint=key)``: a caller that believes the content is ``key`` (it hashed it
  earlier) lets the store try the dedup hit first: if ``key`` is stored, the stored
  bytes and ``fd`` are compared while ``fd`` is hashed, and nothing is written.  The
  hint is never trusted: a mismatch falls through to the ordinary put.
- ``put_adopted(path)``: a large file handed over as a hard link in the store's temp
  area becomes the blob file itself (no copy); see its docstring for what the caller
  must guarantee, and ``unshare`` for undoing a sharing that outlived its reason.

The rename of a new blob file and its index entry happen inside one write transaction,
and gc unlinks a file only while holding the write lock with the entry absent, so a put
and a gc of the same key can never interleave into a dangling entry.
"""

from __future__ import annotations

import itertools
import logging
import os
import stat
import threading
import time

import xxhash
import zstandard

from . import _schema as S
from . import _txn
from ._copy import CHUNK, copy_hashed, hash_fd
from ._errors import FULL_ERRNOS, BlobCollision, BlobCorrupt, BlobMissing, StoreError

log = logging.getLogger(__name__)

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
    def put_fd(self, fd: int, hint: bytes | None = None) -> tuple[bytes, int]:
        """Store the content of ``fd`` (read from offset 0 to EOF); return (key, size).
        ``hint``: the key the caller expects (tried first as a dedup hit, never trusted)."""
        if hint is not None:
            known = self.put_known(fd, hint)
            if known is not None:
                return known
        if _regular_size(fd) > INLINE_MAX:
            copied = self._put_copied(fd)
            if copied is not None:
                return copied
        return self._put_streamed(fd)

    def _put_streamed(self, fd: int) -> tuple[bytes, int]:
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
                if exc.errno not in FULL_ERRNOS or tmp_fd is None:
                    raise
                os.close(tmp_fd)   # an open unlinked temp file still holds the space
                tmp_fd = None
                known = self._known_despite_full(fd)
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

    def _put_copied(self, fd: int) -> tuple[bytes, int] | None:
        """``put_fd`` of a large file: one hashed copy into the temp file (no inline
        buffering, no bytes object per chunk).  None if the file shrank to inline size
        meanwhile (the caller streams it instead)."""
        with _txn.translate():
            try:
                tmp_path, key, size = self._spool_copy(fd)
            except OSError as exc:
                if exc.errno not in FULL_ERRNOS:
                    raise
                known = self._known_despite_full(fd)
                if known is None:
                    raise
                return known
            if size <= INLINE_MAX:
                _unlink_quiet(tmp_path)
                return None
            return self._commit_file(key, size, tmp_path)

    def _spool_copy(self, src: int) -> tuple[str, bytes, int]:
        """Copy ``src`` (from offset 0) into a new fsynced temp file in one hashed pass;
        return (temp path, key, size).  On any error the temp file is gone (closed
        first: an open unlinked file would still hold the space of a full disk)."""
        tmp_path = self._temp_path()
        # read and write: the copy is hashed as read back (store/_copy.py)
        tmp_fd = os.open(tmp_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            key, size = copy_hashed(src, tmp_fd)
            os.fsync(tmp_fd)
        except BaseException:
            os.close(tmp_fd)
            _unlink_quiet(tmp_path)
            raise
        os.close(tmp_fd)
        return tmp_path, key, size

    def put_known(self, fd: int, key: bytes) -> tuple[bytes, int] | None:
        """If ``key`` is stored and ``fd``'s content (from offset 0) is that blob, touch
        it and return (key, size) without writing anything; else None.  The content is
        hashed while compared, so the answer never rests on the caller's claim alone
        (nor on the stored bytes being intact: equal bytes that hash to ``key`` are the
        blob's content)."""
        try:
            entry = self.entry(key)
        except BlobMissing:
            return None
        h, n = xxhash.xxh3_128(), 0

        def hashed():
            nonlocal n
            for chunk in _iter_fd(fd):
                h.update(chunk)
                n += len(chunk)
                yield chunk
        with _txn.translate():
            if entry[0] != _regular_size(fd):
                return None
            try:
                same = _streams_equal(self._iter_raw(key, entry), hashed())
            except (BlobMissing, BlobCorrupt):   # the ordinary put repairs it
                return None
            if not same or n != entry[0] or h.digest() != key:
                return None
            with _txn.write(self.env) as txn:
                raw = txn.get(key, db=self.db)
                if raw is None:      # collected meanwhile: store it the ordinary way
                    return None
                entry = _entry_or_none(key, raw)
                if entry is None:    # damaged meanwhile: the ordinary put repairs it
                    return None
                self._touch(txn, key, entry)
        return key, n

    def differs(self, key: bytes, fd: int) -> bool:
        """True if a sample of ``fd`` (its size, first and last ``CHUNK``) proves its
        content is not blob ``key`` as stored; False when the sample matches or cannot be
        taken (unknown: the caller hashes).  Only blob files are sampled (their on-disk
        form is the raw content); a cheap early answer before a full hash of a large
        file.  A stored blob that is itself damaged may make a file that holds the
        blob's true content look different: landing it then fails verification."""
        try:
            entry = self.entry(key)
        except BlobMissing:
            return False
        if entry[1] != S.FILE:
            return False
        size = _regular_size(fd)
        if size != entry[0]:
            return True
        with _txn.translate():
            try:
                bfd = os.open(self.file_path(key), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return False
            try:
                return any(os.pread(fd, CHUNK, off) != os.pread(bfd, CHUNK, off)
                           for off in sorted({0, max(0, size - CHUNK)}))
            finally:
                os.close(bfd)

    # -- adopting a file instead of copying it ------------------------------------------
    def adoption_path(self) -> str:
        """A fresh name in the store's temp area, for a caller that hard-links a file it
        hands over to ``put_adopted`` (it must be on the store's filesystem)."""
        return self._temp_path()

    def put_adopted(self, path: str) -> tuple[bytes, int]:
        """Make the file at ``path`` (a name from ``adoption_path``) a blob without
        copying it: hash it there, fsync it, rename it into place (or drop the name on a
        dedup hit); return (key, size).  The name at ``path`` is consumed either way.

        The key is computed from the inode after it was linked here, so a change made
        before that point cannot be stored under a wrong key.  The caller guarantees
        what the store cannot see: from the moment it calls this, nothing writes to the
        inode through another name or an open fd, until every other name is gone (the
        blob file then is the inode's only name, as for a copied blob) — or it calls
        ``unshare(key)``, which gives the store a private copy.  The blob keeps the
        inode's owner, mode and xattrs; the blob area is 0700, which is what keeps
        other users out (the content is what the user's file held anyway)."""
        with _txn.translate():
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        raise StoreError(f"adopted {path} is not a regular file")
                    if st.st_size <= INLINE_MAX:       # shrank: an inline copy
                        known = self._put_streamed(fd)
                        _unlink_quiet(path)
                        return known
                    key, size = hash_fd(fd)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            except BaseException:
                _unlink_quiet(path)
                raise
            return self._commit_file(key, size, path)

    def unshare(self, key: bytes) -> bool:
        """If blob ``key``'s file has other names (an adopted inode whose workspace name
        survived), replace it by a private, verified copy; return True if it did.  A
        no-op (one ``stat``) otherwise.  ``BlobCorrupt`` if the shared inode no longer
        holds the blob's content (a caller broke ``put_adopted``'s contract)."""
        final = self.file_path(key)
        with _txn.translate():
            try:
                if os.stat(final).st_nlink <= 1:
                    return False
            except FileNotFoundError:
                return False
            src = os.open(final, os.O_RDONLY | os.O_CLOEXEC)
            try:
                tmp_path, got, _ = self._spool_copy(src)
            finally:
                os.close(src)
            try:
                if got != key:
                    raise BlobCorrupt(key=key.hex(), reason="shared file changed")
                with _txn.write(self.env) as txn:   # gc unlinks only under this lock
                    if txn.get(key, db=self.db) is not None:
                        os.rename(tmp_path, final)
                        _fsync_dir(os.path.dirname(final))
            finally:
                _unlink_quiet(tmp_path)
        log.info("blob %s was still shared with a workspace file; now a private copy",
                 key.hex())
        return True

    def _known_despite_full(self, fd: int) -> tuple[bytes, int] | None:
        """The disk filled while spooling ``fd``: if the store already holds exactly
        its content, touch it and return (key, size), else None (``put_known`` with the
        key of ``fd``; it verifies by bytes and hash).  Runs inside ``put_fd``'s
        ``translate()``: a failed touch is StoreFull."""
        known = self.put_known(fd, hash_fd(fd)[0])
        if known is not None:
            log.debug("disk full, but blob %s is already stored", known[0].hex())
        return known

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
        old = _entry_or_none(key, txn.get(key, db=self.db))
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
                old = _entry_or_none(key, txn.get(key, db=self.db))
                if old is not None and self._accept_existing(key, old, size, None, tmp_path):
                    self._touch(txn, key, old)
                    return key, size
                final = self.file_path(key)
                self._shard_dir(final)
                os.rename(tmp_path, final)
                tmp_path = None
                _fsync_dir(os.path.dirname(final))
                txn.put(key, S.pack([size, S.FILE, time.time_ns(), None]), db=self.db)
            return key, size
        finally:
            if tmp_path is not None:
                _unlink_quiet(tmp_path)

    def _shard_dir(self, final: str) -> None:
        """Make sure ``final``'s shard directory exists, and that a new one is durable
        (its name fsynced into the blob root) before a blob file is renamed into it."""
        shard = os.path.dirname(final)
        if not os.path.isdir(shard):
            os.makedirs(shard, exist_ok=True)
            _fsync_dir(self.root)

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
        return decode_entry(key, raw)

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
        """Write the blob at ``fd``'s offset (an empty file gets a blob file in one
        hashed pass, ``copy_hashed``; else it is streamed through ``iter_verified``).
        Raises ``BlobCorrupt`` after writing if the bytes do not verify: the caller
        discards ``fd``'s file then."""
        entry = self.entry(key)
        if entry[1] == S.FILE and _regular_size(fd) == 0:
            return self._copy_file_verified(key, entry, fd)
        n = 0
        with _txn.translate():
            for chunk in self.iter_verified(key, entry):
                _write_all(fd, chunk)
                n += len(chunk)
        return n

    def _copy_file_verified(self, key: bytes, entry, fd: int) -> int:
        with _txn.translate():
            try:
                src = os.open(self.file_path(key), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                raise BlobMissing(key=key.hex()) from None
            try:
                got, size = copy_hashed(src, fd)
            finally:
                os.close(src)
            os.lseek(fd, size, os.SEEK_SET)
        if size != entry[0]:
            raise BlobCorrupt(key=key.hex(), reason=f"size {size}, expected {entry[0]}")
        if got != key:
            raise BlobCorrupt(key=key.hex(), reason="content does not match its hash")
        return size

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


def decode_entry(key: bytes, raw) -> list:
    """``[size, where, touched_ns, data]`` of a blob entry; ``BlobCorrupt`` if it does not
    decode (blob entries are not sealed: the content hash verifies them on read)."""
    try:
        entry = S.unpack(raw)
        size, where, touched, data = entry
        if not all(type(n) is int for n in (size, where, touched)) \
                or where not in (S.INLINE, S.FILE, S.INLINE_ZSTD) \
                or (data is None) != (where == S.FILE) \
                or not (data is None or isinstance(data, bytes)):
            raise ValueError("malformed")
        return entry
    except S.DECODE_ERRORS as exc:
        raise BlobCorrupt(key=bytes(key).hex(),
                          reason=f"its index entry does not decode ({type(exc).__name__})"
                          ) from None


def _entry_or_none(key: bytes, raw) -> list | None:
    """The entry, or None if there is none or it is damaged (a put then replaces it)."""
    if raw is None:
        return None
    try:
        return decode_entry(key, raw)
    except BlobCorrupt:
        return None


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

def _regular_size(fd: int) -> int:
    """Size of a regular file, -1 for anything else (pipes, devices: streamed)."""
    st = os.fstat(fd)
    return st.st_size if stat.S_ISREG(st.st_mode) else -1


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

"""The whole LMDB schema, in one place.

Every named database, its key encoding and its value encoding is listed in the block
below; no other module invents a key layout.  Integers in keys are big-endian so that
LMDB's byte order is numeric order and a cursor ``set_range`` finds "the first entry
at or after N".  Values are msgpack (``use_bin_type``: bytes stay bytes, str stays str)
except the raw blob payloads.

Every value except ``meta/schema`` and ``blobs`` is **sealed**: the bytes listed below
followed by an 8-byte checksum, xxh3-64 of key + those bytes (``seal``/``load``; DESIGN
invariant 15).  Covering the key too makes a damaged key as visible as a damaged value.
``load``/``unseal`` verify on every read and raise ``IndexCorrupt`` naming the record
(path and epoch where the key has them, ``describe``) — never a raw msgpack, Type or
Attribute error.  ``blobs`` values are not sealed: what matters in them (size, kind,
payload or file) is verified against the key, the content hash, on every read
(``_blob``); only ``touched_ns`` is not, and it only times the collection of a blob no
journal entry references.  ``meta/schema`` stays a bare msgpack int so that every
version can read it and refuse a newer store.

Schema (``SCHEMA_VERSION`` = 6; 2 added ``INLINE_ZSTD``, 3 sealed every value, 4 added
the pre-image kinds socket/chardev/blockdev and a pre-image's ``rdev`` — no value
changes, a version-3 journal value decodes as before; 5 added the epoch kind ``redo``
— no value changes either; 6 added ``meta/epochs\\0<ws>``, renewed with every change
of a workspace's epochs but an append; an older store is upgraded in place when opened, see
``_upgrade``)::

    meta        key: ascii name                      value: msgpack
                  b"schema"      -> int  schema version that wrote the store (unsealed)
                  b"next_epoch"  -> int  next epoch id (allocated inside the write txn)
                  b"next_ws"     -> int  next workspace id
                  b"epochs\\0" + ws u32
                                 -> bytes  8 random bytes, new whenever the workspace's
                                           epoch list changes other than by an append
                                           or the open epoch's counters (what
                                           ``_epoch.all_of``'s memo is checked against;
                                           absent: no memo; written with the first epoch)
    workspaces  key: xxh3_128(real_path) (16 B)      value: [ws_id, real_path]
    ws_paths    key: ws u32                          value: real_path (bytes)
    epochs      key: epoch u64                       value: [ws, kind, session, turn, label,
                                                             started_ns, ended_ns, paths,
                                                             bytes, target]
    ws_epochs   key: ws u32 + epoch u64              value: b""   (a workspace's epochs in
                                                             order; the last one is open)
    journal     key: ws u32 + epoch u64 + pkey       value: [PreImage fields, full path
                                                             or None]  (see _preimage)
    touched     key: ws u32 + pkey + b"\\0" + epoch u64
                                                     value: full path if pkey is hashed,
                                                             else b""
                  -> "earliest epoch >= E that touched P" is one set_range on
                     ws + pkey(P) + b"\\0" + E.
    sessions    key: session (utf-8)                 value: [parent or None,
                                                             boundary_turn or None,
                                                             created_ns]
    turns       key: ws u32 + session + b"\\0" + turn u32
                                                     value: epoch u64 (the newest epoch
                                                             begun for that turn)
    blobs       key: xxh3_128(content) (16 B)        value: [size, where, touched_ns,
                                                             data or None]
                  where = INLINE       (``data`` is the content)
                        | INLINE_ZSTD  (``data`` is one zstd frame of the content)
                        | FILE         (content in blobs/ab/cdef..., ``data`` None)
                  key and size are always of the uncompressed content.
    intents     key: ws u32                          value: msgpack dict (rewind intent)
    remotes     key: ascii kind + b"\\0" + ...          value: msgpack (store.remote; no
                                                             secrets, docs/remote.md)
                  b"self"                     -> str   this store's id (random hex), the
                                                       holder name of its remote leases
                  b"remote\\0" + name          -> [url, endpoint, region, conditional,
                                                       added_ns]
                  b"bind\\0" + name + b"\\0" + ws u32
                                              -> str   the workspace's id on that remote
                  b"pushed\\0" + name + b"\\0" + ws u32
                                              -> [epoch, pushed_ns]  the newest epoch the
                                                       last successful push carried
                  (added without a schema bump: an older program never opens it, and a
                  store without it gets it, empty, when opened)

    (every value above but ``meta/schema`` and ``blobs``: + xxh3_64(key + value), 8 B)

``pkey`` is the path as a key: the path itself when it is at most ``PKEY_LIMIT`` bytes
(LMDB keys are at most 511 bytes), otherwise ``path[:PKEY_LIMIT] + b"\\xff" +
xxh3_128(path)``.  A short path never contains NUL and a hashed one is exactly
``PKEY_LIMIT + 17`` bytes long, so the two forms never collide; the hashed form keeps
the path's first ``PKEY_LIMIT`` bytes so a subtree is still one contiguous key range.
The full path of a hashed key is kept in the value.
"""

from __future__ import annotations

import os
import struct

import lmdb
import msgpack
import xxhash

from ._errors import IndexCorrupt, SchemaTooNew, StoreError, StoreForeign, StoreReadOnly

SCHEMA_VERSION = 6
SEALED_SINCE = 3
# 4: pre-images of special files (``_preimage.KINDS``).  Nothing to rewrite, but a
# version-3 program must refuse such a store: it would take a socket's or a device's
# journal entry for a damaged one.
# 5: the epoch kind ``redo`` (``_epoch.KINDS``).  Nothing to rewrite; a version-4
# program must refuse the store: it would take a redo epoch for a damaged record.
# 6: ``meta/epochs\0<ws>`` (``_epoch``).  Nothing to rewrite (absent: no memo until the
# workspace's next epoch); a version-5 program must refuse the store: it would change epochs
# without renewing it, and a memo checked against it would go stale.
CHECKSUM = 8                      # bytes of xxh3-64 after every sealed value
UNSEALED = (b"blobs",)            # and meta/schema (see the module docstring)

DATABASES = (
    b"meta", b"workspaces", b"ws_paths", b"epochs", b"ws_epochs", b"journal",
    b"touched", b"sessions", b"turns", b"blobs", b"intents", b"remotes",
)

# Sparse: LMDB reserves address space, not disk.  1 TiB is far beyond any store.
MAP_SIZE = 1 << 40
PKEY_LIMIT = 448
INLINE, FILE, INLINE_ZSTD = 0, 1, 2

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def u32(n: int) -> bytes:
    return _U32.pack(n)


def u64(n: int) -> bytes:
    return _U64.pack(n)


def read_u32(b: bytes, off: int = 0) -> int:
    return _U32.unpack_from(b, off)[0]


def read_u64(b: bytes, off: int = 0) -> int:
    return _U64.unpack_from(b, off)[0]


def pack(obj) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


def unpack(data) -> object:
    return msgpack.unpackb(data, raw=False)


# -- sealed values: the one codec every store module uses ------------------------------
# What decoding a damaged value can raise (a checksum that matches by chance, 1 in 2^64,
# or a shape a module does not expect); ``decoding`` turns each into ``IndexCorrupt``.
DECODE_ERRORS = (ValueError, TypeError, IndexError, KeyError, AttributeError,
                 OverflowError, struct.error, msgpack.UnpackException)


def _sum(key, payload) -> bytes:
    return xxhash.xxh3_64_digest(bytes(key) + payload)


def seal(key: bytes, payload: bytes) -> bytes:
    """``payload`` as stored under ``key``: followed by its checksum."""
    return payload + _sum(key, payload)


def is_sealed(key: bytes, raw) -> bool:
    raw = bytes(raw)
    return len(raw) >= CHECKSUM and _sum(key, raw[:-CHECKSUM]) == raw[-CHECKSUM:]


def unseal(db: str, key: bytes, raw) -> bytes:
    """The payload of a sealed value; ``IndexCorrupt`` naming the record if it (or its
    key) is damaged."""
    raw = bytes(raw)
    payload = raw[:-CHECKSUM]
    if len(raw) < CHECKSUM or _sum(key, payload) != raw[-CHECKSUM:]:
        raise corrupt(db, key, "checksum mismatch")
    return payload


def dump(key: bytes, obj) -> bytes:
    """``obj`` as msgpack, sealed under ``key``."""
    return seal(key, pack(obj))


def load(db: str, key: bytes, raw) -> object:
    """The msgpack value sealed under ``key`` in ``db``, verified (``IndexCorrupt``)."""
    payload = unseal(db, key, raw)
    try:
        return unpack(payload)
    except DECODE_ERRORS as exc:
        raise corrupt(db, key, f"undecodable ({type(exc).__name__})") from None


class decoding:
    """``with decoding(db, key):`` around turning a verified value into objects.
    Anything a malformed value can raise leaves as ``IndexCorrupt`` naming the record.
    (A class, not ``contextlib.contextmanager``: it runs once per record read.)"""

    __slots__ = ("db", "key")

    def __init__(self, db: str, key: bytes):
        self.db, self.key = db, key

    def __enter__(self):
        return self

    def __exit__(self, typ, exc, tb):
        if typ is not None and issubclass(typ, DECODE_ERRORS):
            raise corrupt(self.db, self.key, f"undecodable ({typ.__name__})") from None
        return False


def corrupt(db: str, key: bytes, reason: str) -> IndexCorrupt:
    """The error for a damaged record of ``db`` at ``key``."""
    what, path, epoch = describe(db, key)
    return IndexCorrupt(record=what, reason=reason, path=path, epoch=epoch, db=db)


def describe(db: str, key: bytes) -> tuple[str, bytes | None, int | None]:
    """(words, path, epoch) naming a record by its key; robust to a damaged key."""
    key = bytes(key)
    path = epoch = None
    try:
        if db == "journal" and len(key) >= 12:
            path, epoch = key[12:], read_u64(key, 4)
        elif db == "touched" and len(key) >= 13:
            path, epoch = key[4:-9], read_u64(key, len(key) - 8)
        elif db in ("epochs",) and len(key) == 8:
            epoch = read_u64(key)
        elif db == "ws_epochs" and len(key) == 12:
            epoch = read_u64(key, 4)
    except struct.error:
        pass
    if path is not None:
        return f"{db} entry of {path!r} (epoch {epoch})", path, epoch
    if epoch is not None:
        return f"{db} record of epoch {epoch}", None, epoch
    return f"{db} record {key!r}", None, None


def pkey(path: bytes) -> bytes:
    """A path as it appears inside a key (see the module docstring)."""
    if len(path) <= PKEY_LIMIT:
        return path
    return path[:PKEY_LIMIT] + b"\xff" + xxhash.xxh3_128(path).digest()


def is_hashed(pk: bytes) -> bool:
    return len(pk) > PKEY_LIMIT


def subtree_prefix(path: bytes) -> bytes:
    """A key prefix shared by the pkey of every path strictly under ``path``.

    Callers still filter on the full path: for long paths the prefix is truncated.
    """
    prefix = path + b"/" if path else b""
    return prefix[:PKEY_LIMIT]


def journal_key(ws: int, epoch: int, path: bytes) -> bytes:
    return _U32.pack(ws) + _U64.pack(epoch) + pkey(path)


def touched_key(ws: int, path: bytes, epoch: int) -> bytes:
    return _U32.pack(ws) + pkey(path) + b"\0" + _U64.pack(epoch)


def ws_epoch_key(ws: int, epoch: int) -> bytes:
    return _U32.pack(ws) + _U64.pack(epoch)


def epochs_token_key(ws: int) -> bytes:
    """``meta/epochs\\0<ws>``: the token of the workspace's epoch list."""
    return b"epochs\0" + _U32.pack(ws)


def turn_key(ws: int, session: str, turn: int) -> bytes:
    return _U32.pack(ws) + session.encode() + b"\0" + _U32.pack(turn)


class Handles(dict):
    """The named databases of one open environment (name → handle), and ``memo``: what
    a module keeps from one transaction of this environment to the next.  Each entry
    is its owner's, checked against the store in the transaction that uses it
    (``_epoch.all_of``): a memo is never a second source of truth."""
    __slots__ = ("memo",)

    def __init__(self, items=()):
        super().__init__(items)
        self.memo = {}


def open_env(index_dir: str, *, create: bool, sync: bool,
             readonly: bool = False) -> tuple[lmdb.Environment, Handles]:
    """Open the environment and every named database; check or write the schema version.

    Raises ``SchemaTooNew`` for a store written by a newer schema, ``StoreError`` when
    the store does not exist and ``create`` is false.  *readonly*: for a store that
    cannot be written (a read-only file system, no write permission): every write
    transaction is then refused (``StoreReadOnly``), and a store that needs a schema
    upgrade is refused at once.  On a read-only file system LMDB takes no reader lock:
    nothing can write through that mount.
    """
    try:
        env = lmdb.open(
            index_dir, map_size=MAP_SIZE, max_dbs=len(DATABASES) + 4, subdir=True,
            create=create and not readonly, sync=sync, metasync=sync, readahead=False,
            max_readers=254, mode=0o700, readonly=readonly,
        )
    except lmdb.Error as exc:
        _refuse_foreign(index_dir)
        raise StoreError(f"cannot open the index at {index_dir}: {exc}") from exc
    try:
        if readonly:
            dbs = Handles((name.decode(), _open_db_readonly(env, name, index_dir))
                          for name in DATABASES)
            _check_version_readonly(env, dbs, index_dir)
            return env, dbs
        # slots of readers whose process died would pin old pages and grow the file
        env.reader_check()
        dbs = Handles((name.decode(), env.open_db(name)) for name in DATABASES)
        _check_version(env, dbs, index_dir)
    except BaseException:
        env.close()
        raise
    return env, dbs


def store_of(index_dir: str) -> str:
    """The store directory of an index directory (``…/store/index`` → ``…/store``)."""
    return os.path.dirname(index_dir.rstrip("/"))


def _refuse_foreign(index_dir: str) -> None:
    """``StoreForeign`` if the index's lock file is there but not ours to write: even a
    reader must register in it (LMDB takes no lock only on a read-only file system)."""
    lock = os.path.join(index_dir, "lock.mdb")
    try:
        owner = os.stat(lock).st_uid
    except OSError:
        return
    if not os.access(lock, os.W_OK):
        raise StoreForeign(path=store_of(index_dir), owner=owner, lock=lock, uid=os.getuid())


def _open_db_readonly(env: lmdb.Environment, name: bytes, index_dir: str):
    try:
        return env.open_db(name, create=False)
    except lmdb.NotFoundError:    # made by an older rewindfs: it needs writing first
        raise _needs_upgrade(index_dir) from None


def _needs_upgrade(index_dir: str) -> StoreReadOnly:
    return StoreReadOnly(path=store_of(index_dir),
                         reason="and made by an older rewindfs: it is upgraded when "
                                "opened writable once")


def _check_version_readonly(env: lmdb.Environment, dbs: dict, index_dir: str) -> None:
    """``_check_version`` for a store that cannot be written: the version as it is."""
    with env.begin(db=dbs["meta"]) as txn:
        raw = txn.get(b"schema")
    if raw is None:
        raise StoreError(f"no store at {store_of(index_dir)} "
                         "(its index has no schema)")
    found = _version(raw)
    if found < SCHEMA_VERSION:
        raise _needs_upgrade(index_dir)
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(path=index_dir, found=found, supported=SCHEMA_VERSION)


def _check_version(env: lmdb.Environment, dbs: dict, index_dir: str) -> None:
    meta = dbs["meta"]
    with env.begin(write=True, db=meta) as txn:
        raw = txn.get(b"schema")
        if raw is None:
            txn.put(b"schema", pack(SCHEMA_VERSION))
            txn.put(b"next_epoch", dump(b"next_epoch", 1))
            txn.put(b"next_ws", dump(b"next_ws", 1))
            return
        found = _version(raw)
        if found < SCHEMA_VERSION:
            # an older program must now refuse the store: it would take a compressed
            # entry for a missing blob file (2), a sealed value for garbage (3), a
            # special file's pre-image (4) or a redo epoch (5) for a damaged one, or
            # change epochs behind a memo (6)
            if found < SEALED_SINCE:
                _upgrade(txn, dbs)
            txn.put(b"schema", pack(SCHEMA_VERSION))
            return
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(path=index_dir, found=found, supported=SCHEMA_VERSION)


def _version(raw) -> int:
    """The schema number stored under ``meta/schema`` (``IndexCorrupt`` if it is none)."""
    with decoding("meta", b"schema"):
        found = unpack(raw)
        if not isinstance(found, int) or isinstance(found, bool) or found < 1:
            raise ValueError(found)
    return found


def _upgrade(txn, dbs: dict) -> None:
    """Seal every value of a version-1/2 store, in the caller's one write transaction:
    the store is upgraded entirely or not at all.  A version-2 value is exactly a
    version-3 payload, so sealing appends the checksum and changes nothing else.  A
    value that already verifies is left alone: a ``schema`` number damaged into an
    older one must not seal values twice (a chance match is 1 in 2^64)."""
    for name, db in dbs.items():
        if name.encode() in UNSEALED:
            continue
        cur = txn.cursor(db=db)
        for key, raw in cur:
            if name == "meta" and key == b"schema" or is_sealed(key, raw):
                continue
            cur.put(key, seal(key, bytes(raw)))


def workspace_paths(txn, db) -> list[tuple[int, bytes]]:
    """(id, real path) of every workspace, each verified (``IndexCorrupt``)."""
    out = []
    for key, raw in txn.cursor(db=db["ws_paths"]):
        path = unseal("ws_paths", key, raw)
        with decoding("ws_paths", key):
            out.append((read_u32(key), path))
    return out

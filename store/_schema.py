"""The whole LMDB schema, in one place.

Every named database, its key encoding and its value encoding is listed in the block
below; no other module invents a key layout.  Integers in keys are big-endian so that
LMDB's byte order is numeric order and a cursor ``set_range`` finds "the first entry
at or after N".  Values are msgpack (``use_bin_type``: bytes stay bytes, str stays str)
except the raw blob payloads.

Schema (``SCHEMA_VERSION`` = 2; 2 added ``INLINE_ZSTD``, a version-1 store is read as
is and marked 2 when opened)::

    meta        key: ascii name                      value: msgpack
                  b"schema"      -> int  schema version that wrote the store
                  b"next_epoch"  -> int  next epoch id (allocated inside the write txn)
                  b"next_ws"     -> int  next workspace id
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

``pkey`` is the path as a key: the path itself when it is at most ``PKEY_LIMIT`` bytes
(LMDB keys are at most 511 bytes), otherwise ``path[:PKEY_LIMIT] + b"\\xff" +
xxh3_128(path)``.  A short path never contains NUL and a hashed one is exactly
``PKEY_LIMIT + 17`` bytes long, so the two forms never collide; the hashed form keeps
the path's first ``PKEY_LIMIT`` bytes so a subtree is still one contiguous key range.
The full path of a hashed key is kept in the value.
"""

from __future__ import annotations

import struct

import lmdb
import msgpack
import xxhash

from ._errors import SchemaTooNew, StoreError

SCHEMA_VERSION = 2

DATABASES = (
    b"meta", b"workspaces", b"ws_paths", b"epochs", b"ws_epochs", b"journal",
    b"touched", b"sessions", b"turns", b"blobs", b"intents",
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


def turn_key(ws: int, session: str, turn: int) -> bytes:
    return _U32.pack(ws) + session.encode() + b"\0" + _U32.pack(turn)


def open_env(index_dir: str, *, create: bool, sync: bool) -> tuple[lmdb.Environment, dict]:
    """Open the environment and every named database; check or write the schema version.

    Raises ``SchemaTooNew`` for a store written by a newer schema, ``StoreError`` when
    the store does not exist and ``create`` is false.
    """
    try:
        env = lmdb.open(
            index_dir, map_size=MAP_SIZE, max_dbs=len(DATABASES) + 4, subdir=True,
            create=create, sync=sync, metasync=sync, readahead=False, max_readers=254,
            mode=0o700,
        )
    except lmdb.Error as exc:
        raise StoreError(f"cannot open the index at {index_dir}: {exc}") from exc
    try:
        # slots of readers whose process died would pin old pages and grow the file
        env.reader_check()
        dbs = {name.decode(): env.open_db(name) for name in DATABASES}
        _check_version(env, dbs["meta"], index_dir)
    except BaseException:
        env.close()
        raise
    return env, dbs


def _check_version(env: lmdb.Environment, meta, index_dir: str) -> None:
    with env.begin(write=True, db=meta) as txn:
        raw = txn.get(b"schema")
        if raw is None:
            txn.put(b"schema", pack(SCHEMA_VERSION))
            txn.put(b"next_epoch", pack(1))
            txn.put(b"next_ws", pack(1))
            return
        found = unpack(raw)
        if found < SCHEMA_VERSION:
            # every older layout is still read; an older program must now refuse the
            # store instead of mistaking a compressed entry for a missing blob file
            txn.put(b"schema", pack(SCHEMA_VERSION))
            return
    if found > SCHEMA_VERSION:
        raise SchemaTooNew(path=index_dir, found=found, supported=SCHEMA_VERSION)

"""Fetch: bring a pushed workspace's blobs and history into a local store.

Contract:

- Every object is verified before use (``_objects``): a blob by its SHA-256 and size,
  and once stored locally its local key (xxh3-128, computed by the store from the
  bytes) must be the one the history names.  A pack whose own hash does not match is
  still read entry by entry, so one damaged blob costs only itself.
- A blob that is missing, corrupt or unreadable is not fatal: it is returned as a
  ``BlobProblem`` (the caller names the paths and points that need it), and the rest
  is fetched.
- Blobs the local store already has are not downloaded (verified dedup on put).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from dataclasses import dataclass

from .._errors import BlobMissing, RemoteObjectCorrupt, RemoteObjectMissing
from ._objects import PACK_LIMIT, RAW, blob_name, unpack_entry

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BlobProblem:
    key: bytes           # the local key (xxh3-128)
    object: str          # the remote object that should hold it
    code: str            # remote-object-missing | remote-object-corrupt
    reason: str


def wanted_blobs(history, head) -> set[bytes]:
    keys = {img.blob for _e, _p, img in history.journal if img.kind == "file"}
    keys |= {img.blob for _p, img in head if img.kind == "file"}
    return keys


def fetch_blobs(store, backend, remote, keys, *, progress=None) -> list[BlobProblem]:
    """Put every blob of ``keys`` into ``store`` from the remote workspace ``remote``
    (``_index.RemoteWorkspace``).  ``progress(done, total, nbytes)`` after each object."""
    problems: list[BlobProblem] = []
    todo = sorted(k for k in keys if not _has(store, k))
    by_object: dict[str, list] = {}
    for key in todo:
        place = remote.blobs.get(key)
        if place is None:
            problems.append(BlobProblem(key, "(none)", "remote-object-missing",
                                        "no pushed object holds it"))
            continue
        sha, size, where = place
        name = blob_name(sha) if where[0] == "b" else where[1]
        by_object.setdefault(name, []).append((key, sha, size, where))
    done = 0
    for name, rows in sorted(by_object.items()):
        if len(rows) == 1 and rows[0][3][0] == "b" and rows[0][2] >= PACK_LIMIT:
            problems += _fetch_file(store, backend, name, *rows[0][:3])
            done += 1
            if progress is not None:
                progress(done, len(todo), rows[0][2])
            continue
        try:
            body = backend.get(name)
        except (RemoteObjectMissing, RemoteObjectCorrupt) as exc:
            problems += [BlobProblem(k, name, exc.code, exc.message) for k, *_ in rows]
            continue
        for key, sha, size, where in rows:
            problems += _store_one(store, name, body, key, sha, size, where)
        done += len(rows)
        if progress is not None:
            progress(done, len(todo), len(body))
    return problems


def _fetch_file(store, backend, name: str, key, sha, size) -> list[BlobProblem]:
    """A large blob object streamed into the store's temp area, verified there, then
    adopted as the blob file (no second copy)."""
    tmp = store.adoption_path()
    try:
        backend.get_file(name, tmp)
        h, n = hashlib.sha256(), 0
        with open(tmp, "rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
                n += len(chunk)
        if n != size or h.digest() != sha:
            return [BlobProblem(key, name, "remote-object-corrupt",
                                f"Object {name} on the remote is corrupt: it does not "
                                "match its hash")]
        got, _n = store.put_adopted(tmp)     # consumes the name
        if got != key:
            return [BlobProblem(key, name, "remote-object-corrupt",
                                "its content is not the blob the history names")]
        return []
    except (RemoteObjectMissing, RemoteObjectCorrupt) as exc:
        return [BlobProblem(key, name, exc.code, exc.message)]
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _store_one(store, name: str, body: bytes, key, sha, size, where) -> list[BlobProblem]:
    offset, length, coding = (0, len(body), RAW) if where[0] == "b" else where[2:5]
    try:
        data = unpack_entry(name, body, offset, length, coding, size, sha)
    except RemoteObjectCorrupt as exc:
        return [BlobProblem(key, name, exc.code, exc.message)]
    got, _n = store.put_bytes(data)
    if got != key:
        return [BlobProblem(key, name, "remote-object-corrupt",
                            "its content is not the blob the history names")]
    return []


def _has(store, key: bytes) -> bool:
    try:
        store.blobs.entry(key)
    except BlobMissing:
        return False
    return True

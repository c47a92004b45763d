"""Store usage: what the store holds on disk, and what each workspace and session adds.

``usage(store, ws=None)`` reads only (one read transaction plus a stat of the index and
blob files) and costs one pass over the workspace's epochs and one ``stat`` per blob
file — it never reads blob content, so it stays cheap on a large store.  Per workspace
and per session the figures are the pre-image bytes recorded (``Epoch.bytes``, *before*
deduplication and compression: logical bytes, what retention by ``max_bytes`` counts)
and the journal entries; the store section gives the real footprint on disk (after
dedup and zstd of inline blobs), so ``disk_bytes`` can be well below the recorded
bytes.  Epochs without a session are ``idle`` (a person's edits between turns) or
rewinds not attributed to one; they are reported under ``"(none)"``.
"""

from __future__ import annotations

import os

from . import _epoch, _gc
from ._schema import workspace_paths

NO_SESSION = "(none)"


def _disk_bytes(path: str) -> int:
    try:
        return os.stat(path).st_blocks * 512
    except FileNotFoundError:
        return 0


def _store_section(store, txn) -> dict:
    blobs = txn.stat(store._db["blobs"])["entries"]
    n_files, files = 0, 0
    if os.path.isdir(store.blobs.root):
        for _k, p in _gc.blob_files(store.blobs.root):
            n_files += 1
            files += _disk_bytes(p)
    index = sum(_disk_bytes(os.path.join(store.path, "index", n))
                for n in ("data.mdb", "lock.mdb"))
    return {"path": str(store.path), "blobs": blobs, "blob_files": n_files,
            "index_disk_bytes": index, "blob_file_disk_bytes": files,
            "disk_bytes": index + files}


def _add(acc: dict, e) -> None:
    acc["epochs"] += 1
    acc["paths"] += e.paths
    acc["bytes"] += e.bytes
    if e.kind == "turn":
        acc["turns"] += 1


def _blank() -> dict:
    return {"epochs": 0, "turns": 0, "paths": 0, "bytes": 0}


def _workspace_section(txn, db, ws: int, path: bytes) -> dict:
    epochs = _epoch.all_of(txn, db, ws)
    total, sessions = _blank(), {}
    for e in epochs:
        _add(total, e)
        _add(sessions.setdefault(e.session if e.session is not None else NO_SESSION,
                                 _blank()), e)
    return {"workspace": ws, "path": os.fsdecode(path), **total,
            "oldest_ns": epochs[0].started_ns if epochs else None,
            "newest_epoch": epochs[-1].id if epochs else None,
            "sessions": dict(sorted(sessions.items()))}


def usage(store, ws: int | None = None) -> dict:
    db = store._db
    with store._r() as txn:
        out = {"store": _store_section(store, txn), "workspaces": []}
        for wid, path in workspace_paths(txn, db):
            if ws is None or wid == ws:
                out["workspaces"].append(_workspace_section(txn, db, wid, path))
    return out

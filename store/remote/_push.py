"""Push: put what a remote lacks of one workspace's history there.

Contract:

- Under the workspace's lease (``_lease``) for its whole duration, renewed from a
  thread, and never while a remote gc holds its lock (checked right after the lease is
  taken: ``_gc``).  No segment is written once the lease has lapsed (``LeaseLapsed``).
- Reads the remote's segments, then the local history in one read transaction
  (``Store.export_history``) — *after* the caller captured the tree (``head``), so
  every change the head shows has its pre-image in what is pushed (write-ahead).
- ``upto``: the epoch that was current when the capture *began*.  Only epochs up to it
  are pushed: a point that began during the walk cannot be rebuilt from this head (a
  path read before the point began may have changed since in an earlier epoch, whose
  pre-image says nothing about the point); the next push carries it, with its head.
- Uploads, in batches, every blob the new journal entries and the head reference that
  the remote's blob table lacks: small ones packed (``_objects.PackWriter``), large
  ones as their own objects (skipped when the object already exists).  After each
  batch's objects are written, a segment listing them is written: an interrupted push
  keeps what it uploaded, and the next one resumes from there.
- Then one segment with the epoch records that changed, the new journal entries, the
  sessions and turns that changed and, when it changed, the head.  A push with nothing
  new writes nothing (idempotent).
- A local history that lacks epochs the remote has (pushed from elsewhere) is refused
  (``RemoteDiverged``) before anything is written.
- A blob the local store cannot read (damaged) is not uploaded; its entries still are,
  and ``PushReport.unreadable`` names it (a restore names it as missing).
"""

from __future__ import annotations

import hashlib
import logging
import time
from dataclasses import dataclass, field

from .._errors import BlobCorrupt, BlobMissing, RemoteDiverged
from .._preimage import encode
from ._gc import refuse_if_gc_running
from ._index import epoch_record, head_digest, read_workspace
from ._lease import TTL_S, Lease
from ._objects import (PACK_LIMIT, PACK_TARGET, PackWriter, blob_name, encode_segment,
                       segment_name, sha256)

log = logging.getLogger(__name__)

BATCH_BYTES = 4 * PACK_TARGET


@dataclass
class PushReport:
    workspace: str
    objects: int = 0
    bytes: int = 0
    blobs: int = 0
    segments: int = 0
    epochs: int = 0
    entries: int = 0
    head: bool = False
    last_epoch: int | None = None       # the newest epoch of the history pushed
    unreadable: list = field(default_factory=list)   # local blob keys (hex)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def push_workspace(store, ws: int, backend, config, ws_id: str, head, *,
                   progress=None, batch_bytes: int = BATCH_BYTES,
                   lease_ttl_s: float = TTL_S, upto: int | None = None) -> PushReport:
    """Push workspace ``ws`` as ``ws_id``; ``head`` = [(path, PreImage)], the tree as
    the caller captured it just before.  ``progress(report, done_blobs, total_blobs)``
    after each object."""
    lease = Lease(backend, config.name, ws_id, store.store_id(),
                  conditional=bool(config.conditional), ttl_s=lease_ttl_s)
    with lease, lease.keep_alive():
        refuse_if_gc_running(lease)      # after our lease is written: docs/remote.md
        remote = read_workspace(backend, ws_id)
        hist = _upto(store.export_history(ws), upto)
        _check_extends(remote, hist, config.name, ws_id)
        run = _Run(store, backend, ws_id, remote, lease, progress, batch_bytes)
        run.root = store_root(store, ws)
        head_fields = [[path, encode(img)] for path, img in head]
        new_head = head_digest(head_fields) != remote.head_digest
        entries = [(eid, path, img) for eid, path, img in hist.journal
                   if (eid, path) not in remote.journal]
        wanted = [img.blob for _e, _p, img in entries if img.kind == "file"]
        if new_head:
            wanted += [img.blob for _p, img in head if img.kind == "file"]
        run.upload_blobs(wanted)
        final = {
            "epochs": [r for r in map(epoch_record, hist.epochs)
                       if remote.epochs.get(r[0]) != r],
            "journal": [[eid, path, encode(img)] for eid, path, img in entries],
            "sessions": [[n, *v] for n, v in sorted(hist.sessions.items())
                         if remote.sessions.get(n) != list(v)],
            "turns": [[s, t, e] for s, t, e in hist.turns if remote.turns.get((s, t)) != e],
            "head": head_fields if new_head else None,
        }
        run.report.epochs, run.report.entries = len(final["epochs"]), len(entries)
        run.report.head = new_head
        run.report.last_epoch = max((e.id for e in hist.epochs), default=None)
        if run.pending or any(v for v in final.values()):
            run.write_segment(**final)
        return run.report


def _upto(hist, upto: int | None):
    """``hist`` without the epochs after ``upto`` (their journal entries and turns)."""
    if upto is None:
        return hist
    hist.epochs = [e for e in hist.epochs if e.id <= upto]
    hist.journal = [j for j in hist.journal if j[0] <= upto]
    hist.turns = [t for t in hist.turns if t[2] <= upto]
    return hist


def store_root(store, ws: int) -> str:
    for wid, root in store.workspaces():
        if wid == ws:
            return root.decode("utf-8", "surrogateescape")
    return ""


def _check_extends(remote, hist, name: str, ws_id: str) -> None:
    """The remote's epochs must all be known here (older ones may have been dropped by
    local retention; those stay on the remote)."""
    if not remote.epochs:
        return
    local = {e.id: e for e in hist.epochs}
    oldest = min(local) if local else 0
    foreign = sorted(i for i, rec in remote.epochs.items()
                     if i >= oldest and (i not in local or _identity(local[i]) != _identity(rec)))
    if foreign:
        raise RemoteDiverged(remote=name, workspace=ws_id,
                             reason=f"epochs {', '.join(f'e{i}' for i in foreign[:5])}")


def _identity(e) -> tuple:
    """What never changes in an epoch's record once it exists: kind, owner, turn, start
    (an open epoch's end and counters do change)."""
    rec = epoch_record(e) if not isinstance(e, list) else e
    return rec[1], rec[2], rec[3], rec[5]


class _Run:
    def __init__(self, store, backend, ws_id, remote, lease, progress, batch_bytes):
        self.store, self.backend, self.ws_id = store, backend, ws_id
        self.remote, self.lease, self.progress = remote, lease, progress
        self.batch_bytes = batch_bytes
        self.report = PushReport(ws_id)
        self.pending: list = []          # blob table rows not yet in a segment
        self.pending_bytes = 0
        self.pack = PackWriter()
        self.in_pack: list = []          # rows waiting for the pack's name
        self.root = ""
        self.done = self.total = 0

    def upload_blobs(self, keys) -> None:
        todo = sorted({k for k in keys if k not in self.remote.blobs})
        self.total = len(todo)
        for key in todo:
            try:
                self._add(key)
            except (BlobMissing, BlobCorrupt) as exc:
                log.warning("blob %s not pushed: %s", key.hex(), exc)
                self.report.unreadable.append(key.hex())
                continue
            self.done += 1
            if self.pending_bytes >= self.batch_bytes:
                self.write_segment()
                self.lease.renew()
        self._flush_pack()

    def _add(self, key: bytes) -> None:
        path = self.store.blob_file(key)
        if path is not None and self.store.blobs.entry(key)[0] >= PACK_LIMIT:
            self._add_file(key, path)
            return
        data = self.store.read_blob(key)
        sha = sha256(data)
        if len(data) >= PACK_LIMIT:
            name = blob_name(sha)
            if self.backend.head(name) != len(data):
                self._put(name, data)
            self._listed(key, sha, len(data))
            return
        off, length, coding = self.pack.add(data)
        self.in_pack.append([key, sha, len(data), [off, length, coding]])
        if self.pack.size >= PACK_TARGET:
            self._flush_pack()

    def _add_file(self, key: bytes, path: str) -> None:
        """A large blob kept as a file: hashed through the store's verified read, then
        uploaded from its file (immutable once stored), streamed both times."""
        h, size = hashlib.sha256(), 0
        for chunk in self.store.iter_blob(key):     # BlobCorrupt after the last chunk
            h.update(chunk)
            size += len(chunk)
        sha = h.digest()
        name = blob_name(sha)
        if self.backend.head(name) != size:
            self.backend.put_file(name, path)
            self._count(size)
        self._listed(key, sha, size)

    def _listed(self, key: bytes, sha: bytes, size: int) -> None:
        self.pending.append([key, sha, size, ["b"]])
        self.pending_bytes += size

    def _flush_pack(self) -> None:
        if not len(self.pack):
            return
        name, body = self.pack.finish()
        self._put(name, body)
        for key, sha, size, (off, length, coding) in self.in_pack:
            self.pending.append([key, sha, size, ["p", name, off, length, coding]])
        self.pending_bytes += len(body)
        self.pack, self.in_pack = PackWriter(), []

    def _put(self, name: str, body: bytes) -> None:
        self.backend.put(name, body)
        self._count(len(body))

    def _count(self, nbytes: int) -> None:
        self.report.objects += 1
        self.report.bytes += nbytes
        if self.progress is not None:
            self.progress(self.report, self.done, self.total)

    def write_segment(self, **parts) -> None:
        """A segment with the blob rows written so far (their objects are all on the
        remote by now) and ``parts``."""
        value = {"v": 1, "store": self.store.store_id(), "ws": self.ws_id,
                 "root": self.root, "pushed_ns": time.time_ns(), "blobs": self.pending,
                 "epochs": [], "journal": [], "sessions": [], "turns": [], "head": None}
        value.update(parts)
        body = encode_segment(value)
        name = segment_name(self.ws_id, self.remote.next_seq, body)
        # a lapsed lease may have let a gc run: the objects this segment names could be
        # gone (a large one skipped as present may have been an old orphan)
        self.lease.check_live(f"segment {name}")
        self._put(name, body)
        for key, sha, size, where in self.pending:
            self.remote.blobs[key] = (sha, size, where)
        self.remote.next_seq += 1
        self.report.segments += 1
        self.report.blobs += len(self.pending)
        self.pending, self.pending_bytes = [], 0

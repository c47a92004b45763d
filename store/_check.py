"""fsck: the store's own consistency check.

Checks, each reported as a typed ``Problem(code, message, paths)``:

- every blob entry reads back with the right size and hash (``blob-corrupt``,
  ``blob-missing``; a compressed inline payload is decoded first, and one that does
  not decode is ``blob-corrupt``), naming the journal paths whose pre-images depend
  on it;
- every file pre-image names a blob that has an entry (``missing-blob-ref``);
- journal and per-path index agree entry for entry (``index-mismatch``), and every
  journal entry belongs to an existing epoch of its workspace (``dangling-journal``);
- every index record — journal and per-path index entries, epochs, sessions, turns,
  workspaces, intents, counters — verifies against its checksum and decodes
  (``index-corrupt``, naming the path and epoch where its key has them), and each
  epoch's entry count matches its journal (``index-mismatch``);
- each workspace has at most one open epoch, its newest (``epoch-state``), and the next
  epoch id is above every existing one (``epoch-counter``);
- a blob file has no other name (``shared-blob``: an adopted inode still also named in
  a workspace, so a write there would change the blob; ``BlobArea.unshare`` fixes it);
- orphans: blobs no journal entry references (``orphan-blob``) and blob files without an
  entry (``orphan-file``) are *warnings* — normal for a capture in flight or after a
  crash; gc collects them.

``FsckReport.ok`` is true when there is no error-severity problem.  fsck only reads.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from . import _epoch, _gc, _journal, _point, _session
from . import _schema as S
from ._blob import decode_entry
from ._errors import BlobCorrupt, BlobMissing, IndexCorrupt

WARNINGS = {"orphan-blob", "orphan-file"}


@dataclass(frozen=True)
class Problem:
    code: str
    message: str
    paths: tuple[bytes, ...] = ()

    @property
    def severity(self) -> str:
        return "warning" if self.code in WARNINGS else "error"

    def to_dict(self) -> dict:
        return {"code": self.code, "severity": self.severity, "message": self.message,
                "paths": [os.fsdecode(p) for p in self.paths]}


@dataclass
class FsckReport:
    problems: list[Problem] = field(default_factory=list)
    blobs_checked: int = 0
    entries_checked: int = 0

    @property
    def ok(self) -> bool:
        return not any(p.severity == "error" for p in self.problems)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    def to_dict(self) -> dict:
        return {"ok": self.ok, "blobs_checked": self.blobs_checked,
                "entries_checked": self.entries_checked,
                "problems": [p.to_dict() for p in self.problems]}


def check(store) -> FsckReport:
    report = FsckReport()
    db = store._db
    with store._r() as txn:
        refs = _gc.referenced_blobs(txn, db)
        blobs = {}
        for k, v in txn.cursor(db=db["blobs"]):
            try:
                blobs[bytes(k)] = decode_entry(k, v)
            except BlobCorrupt as exc:
                blobs[bytes(k)] = None
                report.problems.append(Problem("blob-corrupt", exc.message,
                                               tuple(refs.get(bytes(k), ()))))
        _check_records(txn, db, report)
        _check_journal(txn, db, report)
        _check_epochs(txn, db, report)
    _check_blobs(store, {k: e for k, e in blobs.items() if e is not None}, refs, report,
                 damaged=set(k for k, e in blobs.items() if e is None))
    return report


# How fsck reads each database's values (journal: ``_check_journal``; blobs: by hash).
_READERS = {
    "epochs": _epoch.decode, "turns": _session.turn_epoch,
    "touched": _point.touched_path, "ws_paths": lambda k, v: S.unseal("ws_paths", k, v),
    "ws_epochs": lambda k, v: S.unseal("ws_epochs", k, v),
}


def _check_records(txn, db, report) -> None:
    for name, handle in db.items():
        if name in ("journal", "blobs"):
            continue
        read = _READERS.get(name, lambda k, v, name=name: S.load(name, k, v))
        for key, raw in txn.cursor(db=handle):
            if name == "meta" and key == b"schema":
                continue
            try:
                read(key, raw)
            except IndexCorrupt as exc:
                path = exc.details.get("path")
                report.problems.append(Problem("index-corrupt", exc.message,
                                               (path,) if path is not None else ()))


def _check_blobs(store, blobs, refs, report, damaged=frozenset()) -> None:
    for key, entry in blobs.items():
        report.blobs_checked += 1
        paths = tuple(refs.get(key, ()))
        try:
            store.blobs.check(key, entry)
        except BlobCorrupt as exc:
            report.problems.append(Problem("blob-corrupt", exc.message, paths))
        except BlobMissing as exc:
            report.problems.append(Problem("blob-missing", exc.message, paths))
        if key not in refs:
            report.problems.append(Problem("orphan-blob", f"blob {key.hex()} is unreferenced"))
    for key, paths in refs.items():
        if key not in blobs and key not in damaged:
            report.problems.append(Problem(
                "missing-blob-ref", f"pre-images name blob {key.hex()}, which is not stored",
                tuple(paths)))
    for key, path in _gc.blob_files(store.blobs.root):
        if key in damaged:
            continue
        if key not in blobs or blobs[key][1] != S.FILE:
            report.problems.append(Problem("orphan-file", f"blob file {path} has no entry"))
        elif _nlink(path) > 1:
            # an adopted inode (put_adopted) whose other name survived: a write there
            # would change the blob
            report.problems.append(Problem(
                "shared-blob", f"blob file {path} has other names (hard links)",
                tuple(refs.get(key, ()))))


def _nlink(path: str) -> int:
    try:
        return os.lstat(path).st_nlink
    except FileNotFoundError:
        return 0


def _epoch_or_none(txn, db, eid: int):
    """The epoch, None if it is missing, ``False`` if its record is damaged (named by
    ``_check_records``)."""
    try:
        return _epoch.get(txn, db, eid)
    except IndexCorrupt:
        return False


def _check_journal(txn, db, report) -> None:
    epochs: dict[int, _epoch.Epoch | None] = {}
    counts: dict[int, int] = {}
    seen = set()
    for key, raw in txn.cursor(db=db["journal"]):
        report.entries_checked += 1
        if len(key) < 12:
            report.problems.append(Problem("index-corrupt", f"journal key {key!r}"))
            continue
        ws, eid = S.read_u32(key), S.read_u64(key, 4)
        counts[eid] = counts.get(eid, 0) + 1
        path, img = _journal.decode_value(key, raw)
        if img.kind == "damaged":
            report.problems.append(Problem(
                "index-corrupt", f"epoch {eid}: journal entry is damaged ({img.reason})",
                (path,)))
        if eid not in epochs:
            epochs[eid] = _epoch_or_none(txn, db, eid)
        e = epochs[eid]
        if e is False:
            pass
        elif e is None or e.workspace != ws:
            report.problems.append(Problem(
                "dangling-journal", f"journal entry for unknown epoch {eid}", (path,)))
        tkey = S.touched_key(ws, path, eid)
        seen.add(tkey)
        if txn.get(tkey, db=db["touched"]) is None:
            report.problems.append(Problem(
                "index-mismatch", f"epoch {eid}: journal entry missing from the path index",
                (path,)))
    for key in txn.cursor(db=db["touched"]).iternext(values=False):
        if bytes(key) not in seen:
            report.problems.append(Problem(
                "index-mismatch", "path index entry without a journal entry",
                (bytes(key[4:-9]),)))
    for eid, n in sorted(counts.items()):
        e = epochs.get(eid)
        if e and e.paths != n:
            report.problems.append(Problem(
                "index-mismatch", f"epoch {eid} lists {e.paths} pre-images, the journal "
                f"holds {n}"))
    for e in _epoch_records(txn, db):
        if e.paths and e.id not in counts:
            report.problems.append(Problem(
                "index-mismatch", f"epoch {e.id} lists {e.paths} pre-images, the journal "
                "holds none"))


def _epoch_records(txn, db):
    """Every epoch record that reads (damaged ones are named by ``_check_records``)."""
    for key, raw in txn.cursor(db=db["epochs"]):
        try:
            yield _epoch.decode(key, raw)
        except IndexCorrupt:
            pass


def _check_epochs(txn, db, report) -> None:
    try:
        next_id = _epoch.next_id(txn, db)
    except IndexCorrupt:
        next_id = 1 << 64          # named by _check_records
    for ws_key in txn.cursor(db=db["ws_paths"]).iternext(values=False):
        if len(ws_key) != 4:
            continue               # named by _check_records
        ws = S.read_u32(ws_key)
        epochs = []
        for eid in _ws_epoch_ids(txn, db, ws):
            e = _epoch_or_none(txn, db, eid)
            if e is False:
                continue
            if e is None:
                report.problems.append(Problem("epoch-state", f"workspace {ws}: missing epoch"))
                continue
            epochs.append(e)
            if e.id >= next_id:
                report.problems.append(Problem(
                    "epoch-counter", f"epoch {e.id} is not below the next id {next_id}"))
        listed = {e.id for e in epochs}
        for e in _epoch_records(txn, db):
            if e.workspace == ws and e.id not in listed:
                report.problems.append(Problem(
                    "epoch-state", f"workspace {ws}: epoch {e.id} is missing from its "
                    "list of epochs"))
        open_ = [e.id for e in epochs if e.ended_ns is None]
        if open_ and (len(open_) > 1 or open_[0] != epochs[-1].id):
            report.problems.append(Problem(
                "epoch-state", f"workspace {ws}: open epochs {open_}, newest {epochs[-1].id}"))


def _ws_epoch_ids(txn, db, ws: int):
    """The ids the workspace's list names (its damaged entries are named elsewhere)."""
    prefix = S.u32(ws)
    cur = txn.cursor(db=db["ws_epochs"])
    if cur.set_range(prefix):
        for key, raw in cur:
            if key[:4] != prefix:
                return
            if len(key) == 12 and S.is_sealed(key, raw):
                yield S.read_u64(key, 4)

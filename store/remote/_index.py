"""A workspace's history on a remote: its index segments, read and merged.

Segments are append-only and numbered; a later segment's record of an epoch, session
or turn replaces an earlier one (an epoch that was open when pushed is closed later),
journal entries and blob places only ever accumulate, and the newest ``head`` wins.
Ordering (docs/remote.md, "Consistency"): a push writes every blob object a segment
names before that segment, and the segment holding a ``head`` also holds every
journal entry read after that head was taken — so whatever set of segments a reader
lists, each reference in it resolves and each head agrees with its journal.

Segment value (msgpack, ``_objects.encode_segment``)::

    {"v": 1, "store": writer's store id, "ws": workspace id, "root": original path,
     "pushed_ns": int,
     "blobs":    [[xxh3 key, sha256, size, where]]   where = ["b"] | ["p", pack, off,
                                                                 len, coding]
     "epochs":   [[id, kind, session, turn, label, started_ns, ended_ns, paths, bytes,
                   target]]
     "journal":  [[epoch, path, pre-image fields (``_preimage.encode``)]]
     "sessions": [[name, parent, boundary_turn, created_ns]]
     "turns":    [[session, turn, epoch]]
     "head":     None | [[path, pre-image fields]]}   the tree when pushed
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field

import msgpack

from .._epoch import Epoch
from .._errors import BadPath, RemoteObjectCorrupt
from .._preimage import check_relpath
from .._preimage import decode as decode_image
from .._transfer import History
from ._objects import decode_segment, parse_segment_name


@dataclass
class RemoteWorkspace:
    ws_id: str
    root: str = ""
    store: str | None = None
    pushed_ns: int = 0
    next_seq: int = 1
    segments: int = 0
    blobs: dict = field(default_factory=dict)      # xxh3 key -> (sha256, size, where)
    epochs: dict = field(default_factory=dict)     # id -> list (segment form)
    journal: dict = field(default_factory=dict)    # (epoch, path) -> fields
    sessions: dict = field(default_factory=dict)   # name -> [parent, boundary, created]
    turns: dict = field(default_factory=dict)      # (session, turn) -> epoch
    head: list | None = None                       # [[path, fields]]
    head_digest: bytes | None = None

    def merge(self, seg: dict, key: str) -> None:
        """Add segment ``seg`` (read from ``key``).  Every path it names is checked
        first: anyone who can write the bucket can add a segment whose name matches
        its content, so a path out of the workspace is refused here, before a blob is
        fetched or anything written (``RemoteObjectCorrupt`` naming the segment)."""
        _check_paths(key, seg)
        self.segments += 1
        self.root = seg.get("root") or self.root
        self.store = seg.get("store") or self.store
        self.pushed_ns = max(self.pushed_ns, int(seg.get("pushed_ns") or 0))
        for key, sha, size, where in seg.get("blobs") or ():
            self.blobs[bytes(key)] = (bytes(sha), int(size), list(where))
        for rec in seg.get("epochs") or ():
            self.epochs[int(rec[0])] = list(rec)
        for eid, path, fields in seg.get("journal") or ():
            self.journal.setdefault((int(eid), bytes(path)), fields)
        for name, parent, boundary, created in seg.get("sessions") or ():
            self.sessions[name] = [parent, boundary, created]
        for session, turn, eid in seg.get("turns") or ():
            self.turns[(session, int(turn))] = int(eid)
        if seg.get("head") is not None:
            self.head = seg["head"]
            self.head_digest = head_digest(self.head)

    # -- as the store's types ----------------------------------------------------------
    def history(self) -> History:
        """The merged history (``_transfer.History``), every record decoded;
        ``RemoteObjectCorrupt`` for one that does not decode."""
        try:
            return History(
                epochs=[epoch_of(rec) for _id, rec in sorted(self.epochs.items())],
                journal=[(eid, path, decode_image(fields))
                         for (eid, path), fields in sorted(self.journal.items())],
                sessions={n: tuple(v) for n, v in self.sessions.items()},
                turns=[(s, t, e) for (s, t), e in sorted(self.turns.items())])
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise RemoteObjectCorrupt(key=f"ws/{self.ws_id}/seg/*",
                                      reason=f"a record does not decode ({exc})") from None

    def head_images(self) -> list:
        try:
            return [(bytes(path), decode_image(fields)) for path, fields in self.head or ()]
        except (ValueError, TypeError, IndexError, KeyError) as exc:
            raise RemoteObjectCorrupt(key=f"ws/{self.ws_id}/seg/*",
                                      reason=f"the pushed tree does not decode ({exc})") from None


def _check_paths(key: str, seg: dict) -> None:
    try:
        for rec in seg.get("journal") or ():
            check_relpath(bytes(rec[1]))
        for rec in seg.get("head") or ():
            check_relpath(bytes(rec[0]))
    except BadPath as exc:
        raise RemoteObjectCorrupt(
            key=key, reason=f"it names a path that is not inside a workspace: "
                            f"{os.fsdecode(exc.details['path'])!r}") from None
    except (TypeError, IndexError) as exc:
        raise RemoteObjectCorrupt(key=key, reason=f"a record does not decode ({exc})") \
            from None


def epoch_record(e: Epoch) -> list:
    return [e.id, e.kind, e.session, e.turn, e.label, e.started_ns, e.ended_ns, e.paths,
            e.bytes, e.target]


def epoch_of(rec: list) -> Epoch:
    eid, kind, session, turn, label, started, ended, paths, nbytes, target = rec
    return Epoch(int(eid), 0, kind, session, turn, label, started, ended, paths, nbytes,
                 target)


def head_digest(head) -> bytes:
    return hashlib.sha256(msgpack.packb(head, use_bin_type=True)).digest()


def segment_keys(backend, ws_id: str) -> list[tuple[int, str]]:
    """(seq, key) of every segment of the workspace, by seq."""
    out = []
    for key, _size in backend.list(f"ws/{ws_id}/seg/"):
        parsed = parse_segment_name(key)
        if parsed is not None:
            out.append((parsed[1], key))
    return sorted(out)


def read_workspace(backend, ws_id: str) -> RemoteWorkspace:
    """Every segment of ``ws_id``, verified and merged (no blob is read)."""
    state = RemoteWorkspace(ws_id)
    for seq, key in segment_keys(backend, ws_id):
        state.merge(decode_segment(key, backend.get(key)), key)
        state.next_seq = max(state.next_seq, seq + 1)
    return state


def workspace_ids(backend) -> list[str]:
    """The ids of the workspaces with at least one segment on the remote."""
    ids = set()
    for key, _size in backend.list("ws/"):
        parsed = parse_segment_name(key)
        if parsed is not None:
            ids.add(parsed[0])
    return sorted(ids)

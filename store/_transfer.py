"""A workspace's history as one value: read out of a store, and written into another.

``export`` reads, in **one read transaction**, every epoch of a workspace, every journal
entry, the sessions its turns belong to (with their fork ancestry) and its turn map —
so the epoch counters and the journal agree, and every journal entry of an epoch that
was open is as complete as its record says.  ``import_into`` writes such a value into a
workspace that has no history yet, in **one write transaction** (all or nothing):

- epoch ids are kept when none of them is below the store's next id (a fresh store:
  ``e12`` stays ``e12``), otherwise all are shifted by one offset (order and gaps kept;
  ``target`` fields follow);
- every imported epoch is closed; the counters are recounted from the journal;
- sessions are store-wide: one that exists keeps its record;
- then one ``idle`` epoch is opened and the given entries are recorded in it.

That last epoch is how a restore puts a pushed workspace back (docs/remote.md): its
entries are the pushed tree (the *head*), and the workspace directory starts empty, so
by the point rule point ``eH`` is the head and every earlier point is what it was.

Learning (``replace_empty``) imports into a workspace that already exists here but
holds nothing worth keeping: epochs with no journal entry and no turn (a mount opens
an ``idle`` epoch at once).  Those are dropped in the same transaction (their ids may
be taken by imported epochs when no epoch of the store lies at or above them:
``_offset``); any journal entry or turn refuses
(``LearnTargetHasHistory``) with nothing changed.  ``settle`` then closes the head
epoch and opens a fresh ``idle`` one, so the point at its start is the tree as it is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from . import _epoch, _journal, _session
from . import _schema as S
from ._errors import LearnTargetHasHistory, RestoreTargetInUse
from ._preimage import Damaged, PreImage, check_relpath, encode


@dataclass
class History:
    epochs: list = field(default_factory=list)           # [_epoch.Epoch], by id
    journal: list = field(default_factory=list)          # [(epoch, path, PreImage)]
    sessions: dict = field(default_factory=dict)         # name -> (parent, boundary, created)
    turns: list = field(default_factory=list)            # [(session, turn, epoch)]
    damaged: list = field(default_factory=list)          # [(epoch, path)] not exported


class Rollback(Exception):
    """Raised inside a write transaction to abort it on purpose, carrying a result."""

    def __init__(self, result):
        super().__init__("rolled back")
        self.result = result


def export(txn, db, ws: int) -> History:
    out = History(epochs=_epoch.all_of(txn, db, ws))
    for eid, path, img in _journal.entries_from(txn, db, ws, 0):
        if isinstance(img, Damaged):
            out.damaged.append((eid, path))
        else:
            out.journal.append((eid, path, img))
    names = {e.session for e in out.epochs if e.session is not None}
    out.turns = list(_turns(txn, db, ws))
    names |= {s for s, _t, _e in out.turns}
    for name in sorted(names):
        _with_ancestry(txn, db, name, out.sessions)
    return out


def _turns(txn, db, ws: int):
    prefix = S.u32(ws)
    cur = txn.cursor(db=db["turns"])
    if cur.set_range(prefix):
        for key, raw in cur:
            if key[:4] != prefix:
                return
            eid = _session.turn_epoch(key, raw)
            with S.decoding("turns", key):
                session = bytes(key[4:-5]).decode()
                yield session, S.read_u32(key, len(key) - 4), eid


def _with_ancestry(txn, db, name: str, into: dict) -> None:
    while name is not None and name not in into:
        rec = _session._record(txn, db, name)
        if rec is None:
            into[name] = (None, None, 0)
            return
        into[name] = tuple(rec)
        name = rec[0]


def import_into(txn, db, ws: int, hist: History, *, label: str, head,
                point=None, session=None, replace_empty: bool = False,
                settle: bool = False) -> tuple[int, _epoch.Epoch, int | None]:
    """Write ``hist`` into ``ws`` (which must have no epoch), then open the ``idle``
    epoch ``label`` holding ``head`` ([(path, PreImage)]).  Returns (id offset, that
    epoch, the epoch id ``point`` names or None).  ``RestoreTargetInUse`` if ``ws`` has
    history; a ``point`` that names nothing raises its error (``UnknownPoint``,
    ``BadPoint``, ``AmbiguousPoint``) and the caller's transaction imports nothing.
    ``replace_empty``: epochs without journal or turn are dropped first, others raise
    ``LearnTargetHasHistory``; ``settle``: a fresh ``idle`` epoch follows the head's."""
    if replace_empty:
        _drop_empty(txn, db, ws)
    elif _epoch.last(txn, db, ws) is not None:
        raise RestoreTargetInUse(path=_ws_path(txn, db, ws),
                                 reason="this store already has history for it")
    offset = _offset(txn, db, [e.id for e in hist.epochs], reuse_free=replace_empty)

    def moved(eid):
        return None if eid is None else eid + offset

    counts: dict[int, list[int]] = {}
    for eid, path, img in hist.journal:
        _put_entry(txn, db, ws, moved(eid), path, img)
        c = counts.setdefault(eid, [0, 0])
        c[0] += 1
        c[1] += img.size if img.kind == "file" else 0
    now = time.time_ns()
    for e in hist.epochs:
        paths, nbytes = counts.get(e.id, (0, 0))
        landed = replace(e, id=moved(e.id), workspace=ws, target=moved(e.target),
                         ended_ns=e.ended_ns or now, paths=paths, bytes=nbytes)
        _epoch.put(txn, db, landed)
        _epoch.add_to_index(txn, db, landed)
    for name, (parent, boundary, created) in hist.sessions.items():
        key = name.encode()
        if txn.get(key, db=db["sessions"]) is None:
            txn.put(key, S.dump(key, [parent, boundary, created]), db=db["sessions"])
    for owner, turn, eid in hist.turns:
        key = S.turn_key(ws, owner, turn)
        txn.put(key, S.seal(key, S.u64(moved(eid))), db=db["turns"])
    if hist.epochs:
        top = max(e.id for e in hist.epochs) + offset + 1
        if top > _epoch.next_id(txn, db):
            txn.put(b"next_epoch", S.dump(b"next_epoch", top), db=db["meta"])
    head_epoch = _epoch.open_new(txn, db, ws, "idle", label=label)
    _journal.record(txn, db, ws, head_epoch.id, head)
    if settle:
        _epoch.open_new(txn, db, ws, "idle")
    target = None if point is None else _session.resolve(txn, db, ws, point, session)
    return offset, head_epoch, target


def _drop_empty(txn, db, ws: int) -> None:
    """Drop every epoch of ``ws``; ``LearnTargetHasHistory`` (before any change) if one
    has a journal entry, a turn names one, or a rewind's intent is pending."""
    epochs = _epoch.all_of(txn, db, ws)
    path = _ws_path(txn, db, ws)
    if next(_journal.entries_from(txn, db, ws, 0), None) is not None:
        changed = sum(e.paths for e in epochs)
        raise LearnTargetHasHistory(path=path, reason=f"this store has history for it "
                                    f"({len(epochs)} epochs, {changed} recorded changes)")
    turns = list(_turns(txn, db, ws))
    if turns:
        raise LearnTargetHasHistory(path=path, reason=f"turns ran in it here "
                                    f"(session {turns[0][0]}, turn {turns[0][1]})")
    if txn.get(S.u32(ws), db=db["intents"]) is not None:
        raise LearnTargetHasHistory(path=path, reason="an interrupted rewind is pending")
    for e in epochs:
        _epoch.delete(txn, db, e)


def _offset(txn, db, ids: list[int], *, reuse_free: bool = False) -> int:
    """0 if every id is free and at or above the next id, else the shift that starts
    them at the next id.  ``reuse_free`` (learning, after its empty epochs were
    dropped): 0 also when no epoch of the store has an id at or above the lowest of
    ``ids`` — the imported epochs are then still above every epoch there is, and keeping
    the ids keeps the workspace bound to the remote's history (a push extends it)."""
    if not ids:
        return 0
    if reuse_free and not txn.cursor(db=db["epochs"]).set_range(S.u64(min(ids))):
        return 0
    nxt = _epoch.next_id(txn, db)
    return 0 if min(ids) >= nxt else nxt - min(ids)


def _put_entry(txn, db, ws: int, eid: int, path: bytes, img: PreImage) -> None:
    check_relpath(path)
    pk, key = S.pkey(path), S.journal_key(ws, eid, path)
    txn.put(key, S.dump(key, [encode(img), path if S.is_hashed(pk) else None]),
            db=db["journal"])
    tkey = S.touched_key(ws, path, eid)
    txn.put(tkey, S.seal(tkey, path if S.is_hashed(pk) else b""), db=db["touched"])


def _ws_path(txn, db, ws: int) -> str:
    raw = txn.get(S.u32(ws), db=db["ws_paths"])
    return "?" if raw is None else S.unseal("ws_paths", S.u32(ws), raw).decode(
        "utf-8", "backslashreplace")

"""Learning a remote history into a workspace that has none here yet (issue 18: a
session resumed on a new machine rewinds into points made elsewhere).

A restore (``remote.restore``) fills an *empty* directory; learning generalizes it to
a directory that already has files — a fresh checkout, mounted or not — and changes
none of them.  The pushed history is imported (``Store.import_history``, the path
restore uses), then one bridging ``idle`` epoch, *pushed tree, from remote NAME*, whose
pre-images are

- the pushed head for every path of the head, and
- ``absent`` for every path that exists here now but not in the head (ignored paths
  left out, DESIGN invariant 7; so a rewind may delete them: invariant 3),

and then a fresh ``idle`` epoch.  By the point rule every pushed point is what it was
on the pushing machine (a path nobody touched since is as the head has it), the start
of the bridging epoch is the pushed tree, and the start of the fresh one is this
directory as it is: ``rewind`` goes to any pushed point, ``redo`` comes back.

Refused (``LearnTargetHasHistory``, nothing changed) when the store has history for the
workspace: a journal entry, a turn, a pending rewind.  So learning twice is refused
too — the first learning left the bridging epoch's pre-images.

Three steps, so the daemon can run each where it belongs (``control.remote_methods``):

1. ``find_pushed`` + ``Pushed.fetch`` (network: segments, then every blob the history
   names, each verified by its hash and its local key) — no lock, nothing local
   changes but blobs in the store;
2. ``absent_paths`` — a walk of the real tree, under the exclusion a rewind uses;
3. ``commit`` — one store transaction; the daemon runs it on the trio thread with no
   await before it tells the filesystem the new epoch, as a turn mark does, so no
   capture can land in an epoch it drops.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from rewindfs.store._errors import (AmbiguousRemoteWorkspace, LearnTargetHasHistory,
                                    UnknownRemoteSession, UnknownRemoteWorkspace)
from rewindfs.store._preimage import PreImage
from rewindfs.store.remote import read_workspace, workspace_ids

from rewindfs.overlay.capture import subtree
from rewindfs.overlay.rewind.remote import Pushed, read_pushed
from rewindfs.overlay.tree.ignore import IgnoreRules

__all__ = ["Learned", "absent_paths", "check_learnable", "commit", "find_pushed",
           "learn_offline"]


def _sessions_of(remote) -> set[str]:
    """The sessions whose turns (or fork ancestry) the remote workspace holds."""
    return {s for s, _t in remote.turns} | set(remote.sessions)


def find_pushed(backend, config, *, workspace: str | None = None,
                session: str | None = None, lineage=()) -> Pushed:
    """The remote workspace ``workspace`` names, else the one where ``session`` ran
    turns — or, when none holds it, its nearest fork ancestor of ``lineage`` (a fork
    made here of a pushed session: ``Store.session_lineage``) — else the remote's only
    workspace.  None found: ``UnknownRemoteWorkspace`` / ``UnknownRemoteSession``;
    several: ``AmbiguousRemoteWorkspace`` listing them."""
    if workspace is not None:
        return read_pushed(backend, config, workspace)
    every = [r for r in (read_workspace(backend, i) for i in workspace_ids(backend))
             if r.segments]
    if session is None:
        return _only(config, every, "a history")
    for name in [session, *(s for s in lineage if s != session)]:
        found = [r for r in every if name in _sessions_of(r)]
        if found:
            return _only(config, found, f"session {name}")
    raise UnknownRemoteSession(remote=config.name, session=session)


def _only(config, found: list, what: str) -> Pushed:
    if not found:
        raise UnknownRemoteWorkspace(remote=config.name, workspace="(any)")
    if len(found) > 1:
        raise AmbiguousRemoteWorkspace(
            remote=config.name, what=what,
            listed=", ".join(f"{r.ws_id} ({r.root})" for r in found),
            choices=[{"workspace": r.ws_id, "root": r.root, "pushed_ns": r.pushed_ns}
                     for r in found])
    return Pushed.of(config, found[0])


def check_learnable(store, ws: int, root: bytes) -> None:
    """Refuse early (before any download) what ``commit`` would refuse: history here."""
    changed = [e for e in store.epochs(ws) if e.paths or e.kind == "turn"]
    if changed:
        raise LearnTargetHasHistory(
            path=os.fsdecode(root), reason=f"this store has history for it "
            f"({len(changed)} epochs with recorded changes or turns)")


def absent_paths(root_fd: int, pushed: Pushed, rules) -> list:
    """``[(path, absent)]`` of every path here now that the pushed head lacks (the
    root and ignored paths left out)."""
    in_head = {path for path, _img in pushed.head}
    return [(path, PreImage.ABSENT) for path, is_dir in subtree(root_fd, b"", True)
            if path and path not in in_head and not rules.ignored(path, is_dir)]


@dataclass
class Learned:
    workspace: int
    remote: str
    remote_workspace: str
    head_epoch: int                   # its start: the pushed tree
    epoch: int                        # the open epoch; its start: the tree as it is
    epochs: int                       # how many pushed epochs were imported
    offset: int                       # epoch ids shifted by (0: kept, and bound)
    absent: int                       # local paths the pushed tree lacks
    bound: bool
    problems: list = field(default_factory=list)   # named blob problems

    def to_dict(self) -> dict:
        return {"remote": self.remote, "remote_workspace": self.remote_workspace,
                "head_epoch": self.head_epoch, "epoch": self.epoch, "epochs": self.epochs,
                "offset": self.offset, "absent": self.absent, "bound": self.bound,
                "problems": self.problems}


def commit(store, ws: int, pushed: Pushed, absent: list, problems: list) -> Learned:
    """The import and the bridging epoch, one transaction (``_transfer``: the empty
    epochs of ``ws`` dropped, or ``LearnTargetHasHistory`` with nothing changed)."""
    offset, head_epoch, _ = store.import_history(
        ws, pushed.history, label=pushed.label, head=pushed.head + absent,
        replace_empty=True, settle=True)
    bound = pushed.bind(store, ws, offset)
    return Learned(ws, pushed.config.name, pushed.remote.ws_id, head_epoch.id,
                   store.current_epoch(ws).id, len(pushed.history.epochs), offset,
                   len(absent), bound, pushed.name_problems(problems, offset, head_epoch.id))


def learn_offline(store, backend, config, root: bytes, *, workspace=None, session=None,
                  progress=None) -> Learned:
    """Learn into the unmounted directory ``root`` (its real path)."""
    ws = store.workspace(root)
    check_learnable(store, ws, root)
    pushed = find_pushed(backend, config, workspace=workspace, session=session,
                         lineage=store.session_lineage(session) if session else ())
    problems = pushed.fetch(store, backend, progress)
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        absent = absent_paths(fd, pushed, IgnoreRules.load(fd))
    finally:
        os.close(fd)
    learned = commit(store, ws, pushed, absent, problems)
    store.flush()
    return learned

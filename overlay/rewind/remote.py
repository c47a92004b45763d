"""A workspace to and from a remote, on the tree side: capture the tree for a push, and
land a pushed point onto a new directory.

- ``capture_tree``: every path of the workspace (the root included; ignored paths and
  a rewind's temp names left out, DESIGN invariant 7) as a ``PreImage``, file contents
  put into the store.  A push takes it *before* it reads the history, so every change
  the tree shows has its pre-image in what is pushed (write-ahead order).
- ``push_tree``: capture, then push (``store.remote.push_workspace``), then remember in
  the store what was pushed (``Store.record_push``, what ``status`` compares with).  The
  CLI runs it on an unmounted workspace, the daemon in a worker thread (its root fd:
  never through the mount; ``control.autopush``).
- ``restore``: ``DIR`` (absent or empty) becomes the tree at the point.  The history is
  imported into the local store for ``DIR`` (``Store.import_history``): the pushed
  epochs, then an ``idle`` epoch whose pre-images are the pushed tree — ``DIR`` starts
  empty, so by the point rule that epoch's start is the pushed tree and every earlier
  point is what it was.  Then an ordinary rewind to the point lands it with the restore
  engine (``plan_rewind`` + ``apply_plan``: modes, owners, xattrs, symlinks, hard links,
  special files, atomic landings).  So ``log``, ``rewind`` and ``redo`` work on from
  there, and a later push of ``DIR`` extends the same remote history.
- A blob the remote cannot give (missing, corrupt) is named with the paths and points
  that need it; the paths of the restored point that need it fail (engine failures),
  the rest lands: exit 1.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import time
from dataclasses import dataclass, field

from rewindfs.store._errors import RestoreTargetInUse, UnknownRemoteWorkspace
from rewindfs.store.remote import (RemoteConfig, fetch_blobs, push_workspace, read_workspace,
                                   wanted_blobs)

from rewindfs.overlay.capture import snapshot, subtree
from rewindfs.overlay.errors import RefusedWorkspace, RemoteUnnamed
from rewindfs.overlay.places import check_place, find_rewindfs_mount
from rewindfs.overlay.rewind.engine import apply_plan, plan_rewind
from rewindfs.overlay.rewind.land import set_meta_fd
from rewindfs.overlay.tree.ignore import IgnoreRules

__all__ = ["Pushed", "RemoteRestore", "capture_tree", "default_remote", "done_record",
           "push_tree", "read_pushed", "remote_config", "restore"]


def remote_config(store, name: str) -> RemoteConfig:
    """The configuration of remote ``name`` (``UnknownRemote``)."""
    url, endpoint, region, conditional, _added = store.remote(name)
    return RemoteConfig(name, url, endpoint, region, conditional)


def default_remote(store, name: str | None) -> str:
    """``name`` if given (checked: ``UnknownRemote``), else the only remote of the store;
    ``RemoteUnnamed`` when there are none or several."""
    if name is not None:
        store.remote(name)
        return name
    names = sorted(store.remotes())
    if len(names) != 1:
        raise RemoteUnnamed(reason=f"this store has {len(names)} remotes ({', '.join(names)})"
                            if names else "this store has no remote yet (rewindfs remote "
                            "add NAME s3://BUCKET/PREFIX)")
    return names[0]


def done_record(remote: str, root: bytes, report) -> dict:
    """The ``push.done`` record: ``rewindfs push --json`` and the daemon's ``push``."""
    return {"remote": remote, "root": os.fsdecode(root), **report.as_dict()}


def capture_tree(root_fd: int, store, *, rules=None, check=None) -> list:
    """[(path, PreImage)] of the whole workspace under ``root_fd``, in walk order.
    ``rules``: the ignore rules to capture by (default: the workspace's file);
    ``check()`` is called before each path (it may raise to stop the walk)."""
    rules = IgnoreRules.load(root_fd) if rules is None else rules
    out = []
    for path, is_dir in subtree(root_fd, b"", True):
        if check is not None:
            check()
        if path and rules.ignored(path, is_dir):
            continue
        img = snapshot(root_fd, path, store)
        if img.exists:
            out.append((path, img))
    return out


def push_tree(store, ws: int, root_fd: int, backend, config, *, rules=None,
              progress=None, check=None):
    """Capture the tree under ``root_fd``, push workspace ``ws`` to ``config.name``,
    record the push in the store; the ``PushReport``.  The head is captured *before*
    ``push_workspace`` reads the history, and only epochs that began before the walk
    are pushed (docs/remote.md "Consistency"): the tree may change while it is walked.  The workspace
    is bound to a remote workspace id before anything is sent, so a retry resumes it."""
    ws_id = store.remote_binding(config.name, ws)
    if ws_id is None:
        ws_id = secrets.token_hex(6)
        store.bind_remote(config.name, ws, ws_id)
    # the epoch current as the walk begins bounds what this head can vouch for
    upto = store.current_epoch(ws).id
    head = capture_tree(root_fd, store, rules=rules, check=check)

    def objects(report, done, total):
        if check is not None:
            check()
        if progress is not None:
            progress(report, done, total)

    report = push_workspace(store, ws, backend, config, ws_id, head, progress=objects,
                            upto=upto)
    if report.last_epoch is not None:
        store.record_push(config.name, ws, report.last_epoch, time.time_ns())
    return report


@dataclass
class Pushed:
    """A pushed workspace read from a remote and decoded, ready to import: its history
    and its head without the root (the root is the directory the caller names: never
    planned, its metadata set by a restore at the end)."""

    config: object                                   # store.remote.RemoteConfig
    remote: object                                   # store.remote.RemoteWorkspace
    history: object                                  # store._transfer.History
    head: list                                       # [(path, PreImage)], root left out
    root_img: object = None                          # the root's PreImage, if pushed

    @classmethod
    def of(cls, config, remote) -> "Pushed":
        history, head = remote.history(), remote.head_images()
        root_img = next((img for path, img in head if path == b""), None)
        return cls(config, remote, history, [(p, img) for p, img in head if p], root_img)

    @property
    def label(self) -> str:
        return f"pushed tree, from remote {self.config.name}"

    def fetch(self, store, backend, progress=None) -> list:
        """Every blob the history and the head name, verified (``fetch_blobs``):
        the ``BlobProblem``s of those the remote cannot give."""
        return fetch_blobs(store, backend, self.remote, wanted_blobs(self.history, self.head),
                           progress=progress)

    def bind(self, store, ws: int, offset: int) -> bool:
        """Bind ``ws`` to the remote workspace when its epoch ids were kept (a later
        push extends that history); True if bound."""
        if offset != 0:
            return False
        store.bind_remote(self.config.name, ws, self.remote.ws_id)
        return True

    def name_problems(self, problems, offset: int, head_epoch: int) -> list[dict]:
        return [_name_problem(p, self.history, self.head, offset, head_epoch)
                for p in problems]


def read_pushed(backend, config, ws_id: str) -> Pushed:
    remote = read_workspace(backend, ws_id)
    if not remote.segments:
        raise UnknownRemoteWorkspace(remote=config.name, workspace=ws_id)
    return Pushed.of(config, remote)


@dataclass
class RemoteRestore:
    workspace: int
    target: int
    head_epoch: int
    result: object                                   # engine.RestoreResult
    problems: list = field(default_factory=list)     # [dict] blob problems, named

    @property
    def exit_code(self) -> int:
        return 1 if self.problems or self.result.exit_code else 0


def restore(store, backend, config, ws_id: str, point, dest, *, session=None,
            progress=None, landing=contextlib.nullcontext) -> RemoteRestore:
    """Make *dest* the tree at *point* of the remote workspace *ws_id*, with its history.

    *landing*: a context manager factory entered from the history's import on, the
    restore's first change; a caller defers Ctrl-C inside it (a restore never stops
    half-way: a half-landed one left a pending rewind that a second ``restore`` refused
    to touch).  Anything raised before it (KeyboardInterrupt too) leaves nothing:
    *dest* is removed again when this call made it."""
    _check_place(dest, store.path)
    _check_target(dest)
    pushed = read_pushed(backend, config, ws_id)
    # the point is checked (and the history's shape) before any blob is downloaded and
    # before DIR or its workspace exists: a refused restore leaves nothing behind
    store.check_import(os.path.realpath(os.fsencode(dest)), pushed.history, point=point,
                       session=session)
    real, made = _prepare(dest)
    try:
        ws = store.workspace(real)
        if store.epochs(ws):
            raise RestoreTargetInUse(path=os.fsdecode(real),
                                     reason="this store already has history for it")
        problems = pushed.fetch(store, backend, progress)
    except BaseException:
        if made:
            _remove_empty(real)
        raise
    with landing():
        offset, head_epoch, target = store.import_history(
            ws, pushed.history, label=pushed.label, head=pushed.head, point=point,
            session=session)
        pushed.bind(store, ws, offset)
        fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            plan = plan_rewind(fd, store, ws, f"e{target}")
            result = apply_plan(fd, store, ws, plan, session=None)
            if pushed.root_img is not None:
                set_meta_fd(fd, pushed.root_img)
        finally:
            os.close(fd)
    named = pushed.name_problems(problems, offset, head_epoch.id)
    return RemoteRestore(ws, target, head_epoch.id, result, named)


def _remove_empty(real: bytes) -> None:
    """A directory this restore made, removed again if nothing came into it."""
    try:
        os.rmdir(real)
    except OSError:
        pass            # not empty (someone put files there), or gone: left as it is


def _check_place(dest, store_path) -> None:
    """``RestoreTargetInUse`` where ``mount`` would refuse *dest* as a workspace
    (``places.check_place``): DIR becomes one.  Above all not at or inside a mounted
    workspace: the restore's temp names go through that mount, which keeps them for
    itself (every file failed with EPERM), and a second history would grow inside it."""
    real = os.path.realpath(os.fsencode(dest))
    if find_rewindfs_mount(real):       # check_place leaves this one to its caller
        raise RestoreTargetInUse(path=os.fsdecode(dest),
                                 reason=f"{os.fsdecode(real)} is a mounted workspace")
    try:
        check_place(real, store_path)
    except RefusedWorkspace as exc:
        raise RestoreTargetInUse(path=os.fsdecode(dest),
                                 reason=exc.details["reason"]) from None


def _check_target(dest) -> None:
    """``RestoreTargetInUse`` unless ``dest`` is an empty directory or a name that can
    be made (its parent a directory): checked before anything is downloaded or made."""
    dest = os.fsencode(dest)
    if os.path.lexists(dest):
        if not os.path.isdir(dest) or os.path.islink(dest):
            raise RestoreTargetInUse(path=os.fsdecode(dest), reason="not a directory")
        if os.listdir(dest):
            raise RestoreTargetInUse(path=os.fsdecode(dest), reason="not empty")
    elif not os.path.isdir(os.path.dirname(os.path.abspath(dest))):
        raise RestoreTargetInUse(path=os.fsdecode(dest),
                                 reason="its parent directory does not exist")


def _prepare(dest) -> tuple[bytes, bool]:
    """``dest`` (checked by ``_check_target``) made, mode 0700 until its own mode lands,
    or found empty: its real path, and whether this call made it."""
    dest = os.fsencode(dest)
    try:
        os.mkdir(dest, 0o700)
    except FileExistsError:
        _check_target(dest)     # made meanwhile: still fine if empty
        return os.path.realpath(dest), False
    except OSError as exc:
        raise RestoreTargetInUse(path=os.fsdecode(dest),
                                 reason=f"it cannot be made: {exc.strerror}") from None
    return os.path.realpath(dest), True


def _name_problem(problem, history, head, offset: int, head_epoch: int) -> dict:
    """A blob problem with the paths that need the blob and the epochs whose pre-images
    (or the pushed tree's epoch) name it: every point up to those needs it."""
    needs = sorted({(eid + offset, path) for eid, path, img in history.journal
                    if img.kind == "file" and img.blob == problem.key}
                   | {(head_epoch, path) for path, img in head
                      if img.kind == "file" and img.blob == problem.key})
    return {"code": problem.code, "object": problem.object, "blob": problem.key.hex(),
            "reason": problem.reason,
            "paths": sorted({os.fsdecode(p) for _e, p in needs}),
            "epochs": sorted({f"e{e}" for e, _p in needs})}

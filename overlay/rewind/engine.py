"""The restore engine: plan a rewind, apply it through the root dir fd, recover a crash.

Contracts (DESIGN invariants 3–6, 11):

- ``apply_plan`` refuses while a turn is open (``TurnOpen``) unless forced.  It opens a
  ``rewind`` epoch, then writes the **intent** (``store.put_intent``) before the first
  change, lands every action, fsyncs the directories it changed, closes the epoch and
  only then clears the intent.  A crash at any point leaves an intent whose replay
  (``recover``) finishes the job: a plan is a list of target states, so landing it
  again is idempotent, and re-planning the same point after a partial run yields the
  same targets (the rewind epoch only touches paths the plan already touched).
- Write-ahead: every path about to change — with its parent directory and the other
  names of a multiply-linked inode — is captured into the rewind epoch
  (``capture.capture_images``: paths and parents in one commit, those other names in
  a second) before the first change, so the epoch records the tree exactly as the
  rewind found it; every rewind is itself a point, and redo is "rewind to the start of
  the newest rewind epoch".  Those pre-images are made durable (``store.sync()``)
  before the first change too, and again before each ``syncfs``/directory ``fsync``
  for any captured late (invariant 12): a power cut never keeps a landed change
  without the state it replaced.  The images taken then also decide whether a plain file
  needs landing (no second look).
- Paths are resolved under ``root_fd`` only (``tree.walk.DirCache``: each directory
  opened once per run by an ``O_NOFOLLOW`` walk, forgotten when the run removes it): a
  symlinked component fails that path with ``path-escape``; nothing is written outside
  the workspace (invariant 4).  Except: a symlink standing where the plan puts a
  directory (a directory replaced by a symlink since the point) is itself replaced —
  unlinked, never followed — and the paths below it land in the same run
  (``_capture_parent``); the symlink's target is never touched.
- Deletions: only ``delete`` actions (recorded ``absent`` targets) remove anything, and
  a directory only when empty; ignored paths (``.rewindignore``) are never touched.
- A path that cannot be restored is named in ``RestoreResult.failed``; the others still
  land (``exit_code`` 1 = partial).  That includes a path whose history entry in the
  store is damaged (``Plan.damaged``, code ``index-corrupt``) or whose blob is corrupt.
- Unchanged paths are skipped (no capture, no write): a second identical rewind is a
  no-op, and the recovery after a crash only touches what is still wrong.
- No acknowledged write is lost (invariant 14): with a daemon's ``fence``
  (``fence_rewind``/``unfence_rewind``) every path of the plan is fenced before the
  precapture and until the run has landed — a change through the mount that the
  landing could overwrite is refused with ``EBUSY``, so the precapture records the last
  acknowledged state.  A path whose file is open for writing through the mount when the
  run begins is left alone (failure code ``busy``, exit 1).  Restore temp names
  (``.rewindfs~…``) that reached a journal are never planned or landed.
- Large files: with a daemon's write fence (``writers``) the pre-image of a large plain
  file the run replaces is the file's own inode, adopted by the store instead of copied
  (``rewind.adopt``: fenced against writers until its workspace name is gone; any
  adopted blob still named in the tree after the landings gets a private copy;
  ``recover`` does the same for an interrupted run).

Blocking and synchronous; the daemon runs it in a worker thread.  Test hook:
``REWINDFS_FAULT_AFTER=k`` SIGKILLs the process after its k-th change (see
``rewind.land``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import logging
import os
import stat
from dataclasses import dataclass, field

from rewindfs.store import INLINE_MAX, Plan, RedoStale, RewindfsError, TurnOpen
from rewindfs.store._errors import PathEscape
from rewindfs.store._preimage import check_relpath

from rewindfs.overlay import errors
from rewindfs.overlay.rewind import land as L
from rewindfs.overlay.tree import meta
from rewindfs.overlay.capture import capture, capture_images
from rewindfs.overlay.tree.fdbudget import dir_cache_size
from rewindfs.overlay.tree.ignore import IGNORE_FILE, IgnoreRules
from rewindfs.overlay.tree.walk import DirCache, split
from rewindfs.overlay.rewind.adopt import Adopter, unshare_epoch
from rewindfs.overlay.rewind.links import InodeIndex, parse_group
from rewindfs.overlay.tree.syscalls import syncfs

log = logging.getLogger(__name__)

__all__ = ["Failure", "PlannedAction", "RestoreResult", "RewindPlan", "apply_plan",
           "plan_redo", "plan_rewind", "recover", "redo_target"]

CHANGES = ("created", "written", "deleted", "meta", "unchanged", "ignored")


@dataclass(frozen=True)
class PlannedAction:
    action: object        # store.Action
    change: str           # one of CHANGES, as seen when planned


@dataclass
class RewindPlan:
    """A store ``Plan`` classified against the real tree, plus the foreign paths.

    ``foreign``: (path, epoch) of touched paths whose newest change came from an
    ``idle`` epoch (a person's edits between turns) or from another session's turn.
    """

    target: int
    plan: Plan
    items: list[PlannedAction]
    foreign: list[tuple[bytes, object]] = field(default_factory=list)
    requested: list[bytes] | None = None   # the ``paths`` filter, for the intent
    rules: IgnoreRules | None = None       # the rules it was classified under
    unrecorded: list[bytes] = field(default_factory=list)  # requested, no epoch knows
    kind: str = "rewind"                   # the epoch kind it lands as: rewind | redo
    owner: str | None = None               # a redo's owner (a rewind's is the caller's)
    undid: int | None = None               # a redo: the rewind epoch it undoes

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(CHANGES, 0)
        for it in self.items:
            if it.action.op != "meta" or it.change != "unchanged":
                out[it.change] += 1
        return out


@dataclass(frozen=True)
class Failure:
    path: bytes
    code: str
    message: str

    def to_dict(self) -> dict:
        return {"path": os.fsdecode(self.path), "code": self.code, "message": self.message}


@dataclass
class RestoreResult:
    epoch: int | None            # the rewind epoch (None for a dry run / no-op recovery)
    target: int
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CHANGES, 0))
    failed: list[Failure] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    def to_dict(self) -> dict:
        return {"epoch": self.epoch, "target": self.target,
                "written": self.counts["written"],
                "created": self.counts["created"], "deleted": self.counts["deleted"],
                "meta": self.counts["meta"], "unchanged": self.counts["unchanged"],
                "failed": [f.to_dict() for f in self.failed]}


# -- assessing one path -------------------------------------------------------------

class _Groups:
    """Hard-link groups seen in this run: link_group → (relpath, inode) of its first
    landed name, or inode None when that name is yet to be written (dry run)."""

    def __init__(self):
        self.first: dict[bytes, tuple[bytes, int | None]] = {}


def _assess(dir_fd: int, name: bytes, action, groups: _Groups, store) -> str:
    """How ``action`` would change the entry now: one of CHANGES (never "ignored").
    ``store`` lets a large file that visibly differs from its target skip the hash."""
    st = meta.lstat_at(dir_fd, name)
    cur, img = meta.kind_of(st), action.image
    if action.op == "delete":
        return "unchanged" if st is None else "deleted"
    if action.op == "meta":
        if cur != "dir":
            return "unchanged"      # the mkdir failed and was reported already
        return "unchanged" if meta.meta_equal(img, st, meta.xattrs_at(dir_fd, name)) else "meta"
    if cur == "absent":
        return "created"
    if not meta.same_node(img, st):     # another kind, or a device of another number
        return "written"
    if img.kind == "dir":
        return "unchanged"          # its metadata is the "meta" action's job
    if img.link_group is not None and img.link_group in groups.first:
        if st.st_ino != groups.first[img.link_group][1]:
            return "written"        # not (yet) a link of the group's landed name
    elif img.kind == "file" and not _same_file(dir_fd, name, st, img, store):
        return "written"
    elif img.kind == "symlink" and os.readlink(name, dir_fd=dir_fd) != img.target:
        return "written"
    return "unchanged" if meta.meta_equal(img, st, meta.xattrs_at(dir_fd, name)) else "meta"


def _same_file(dir_fd, name, st, img, store) -> bool:
    # A name outside the plan sharing this inode shared it at the point too (it was not
    # touched since), so an extra link is no reason to rewrite.
    if st.st_size != img.size:
        return False
    # a 1 GiB file changed at its start: a sample says so without a full read (only
    # blob files, the contents above the inline limit, are sampled)
    if st.st_size > INLINE_MAX and meta.differs_from_blob(dir_fd, name, img.blob, store):
        return False
    return meta.file_key(dir_fd, name) == img.blob


def _note_group(dir_fd, name, path, img, groups: _Groups, *, inode_known: bool) -> None:
    """Remember the first name of a hard-link group; later names link to it."""
    if img.link_group is None or img.link_group in groups.first:
        return
    st = meta.lstat_at(dir_fd, name) if inode_known else None
    groups.first[img.link_group] = (path, st.st_ino if st is not None else None)


def _is_ignored(rules: IgnoreRules, action) -> bool:
    return rules.ignored(action.path, action.image.kind == "dir")


def _restore_rules(store, plan, rules):
    """What a restore leaves alone: a path both *rules* (in force now) and the rules of
    the point the plan goes back to ignore — that point's ``.rewindignore``, when the
    plan puts another one back.  Why both: a turn that added ``*.txt`` and deleted
    ``a.txt`` captured the deletion (fs.ops captures by the rules its epoch began
    with), and its rewind must bring ``a.txt`` back though the rule now ignores it."""
    action = next((a for a in plan.actions if a.path == IGNORE_FILE), None)
    if action is None:
        return rules
    if action.image.kind != "file":     # absent then (or not a file): no rules
        return rules.both(IgnoreRules())
    try:
        data = b"".join(store.iter_blob(action.image.blob))
    except (RewindfsError, OSError):   # damaged: its own action fails and is named;
        return rules.both(IgnoreRules())   # the rest is restored by no rules of its own
    try:
        return rules.both(IgnoreRules.parse(data))
    except errors.BadIgnoreRules:     # the mount kept older rules then: restore by ours
        return rules


# -- planning -----------------------------------------------------------------------

def plan_rewind(root_fd: int, store, ws: int, to, *, paths=None,
                session: str | None = None, rules: IgnoreRules | None = None) -> RewindPlan:
    """Resolve ``to`` (absolute point; relative → ``BadPoint``), build the store plan
    and classify each action against the real tree under ``root_fd``.  Reads only
    (content is hashed, nothing is stored).  ``rules``: the ignore rules in force (a
    live mount's); else ``.rewindignore`` is read (``BadIgnoreRules`` if invalid)."""
    requested = None if paths is None else [check_relpath(p) for p in paths]
    target = store.resolve_point(ws, to, session)
    plan = _without_temps(store.plan(ws, target, requested))
    if rules is None:
        rules = IgnoreRules.load(root_fd)
    rules = _restore_rules(store, plan, rules)
    dirs = _dir_cache(root_fd)
    try:
        items = [PlannedAction(a, change) for a, change in _classified(dirs, store, plan, rules)]
    finally:
        dirs.close()
    return RewindPlan(target, plan, items, _foreign(store, ws, target, requested, session),
                      requested, rules, _unrecorded(requested, plan))


def _classified(dirs: DirCache, store, plan, rules):
    """``(action, change)`` for each action of *plan*, classified against the tree one
    at a time (a caller may stop early), through the caller's directory fds."""
    groups = _Groups()
    for action in plan:
        yield action, _classify(dirs, action, rules, groups, store)


def _unrecorded(requested: list[bytes] | None, plan: Plan) -> list[bytes]:
    """The requested paths no epoch since the point touched (neither they nor anything
    below them): the point knows nothing of them, so a rewind leaves them as they are."""
    if not requested:
        return []
    return [r for r in requested
            if r and not any(p == r or p.startswith(r + b"/") for p in plan.paths)]


def _without_temps(plan: Plan) -> Plan:
    """``plan`` without the restore temp names (``.rewindfs~…``) an older version could
    capture: they are never restored, deleted or counted."""
    if not any(meta.is_temp_path(p) for p in plan.paths):
        return plan
    return dataclasses.replace(
        plan, actions=[a for a in plan.actions if not meta.is_temp_path(a.path)],
        paths={p for p in plan.paths if not meta.is_temp_path(p)},
        damaged={p: r for p, r in plan.damaged.items() if not meta.is_temp_path(p)})


def _classify(dirs: DirCache, action, rules, groups, store) -> str:
    if _is_ignored(rules, action):
        return "ignored"
    try:
        dir_fd, name = dirs.parent(action.path)
    except (FileNotFoundError, NotADirectoryError):
        # No parent yet: an earlier action creates it (or its failure shows up then).
        return "created" if action.op not in ("delete", "meta") else "unchanged"
    except (OSError, RewindfsError):
        return "written"    # applying will name the failure (e.g. path-escape)
    change = _assess(dir_fd, name, action, groups, store)
    _note_group(dir_fd, name, action.path, action.image, groups,
                inode_known=change == "unchanged")
    if dirs.full:
        dirs.trim()
    return change


def _dir_cache(root_fd: int) -> DirCache:
    """A run's directory fds: at most a quarter of the fd limit, at most 4096."""
    return DirCache(root_fd, dir_cache_size())


def _foreign(store, ws, target, paths, session):
    """Paths that an ``idle`` epoch or another session's turn changed since the point,
    each with the newest such epoch — also when this session changed the path again
    afterwards (the rewind still undoes the other change)."""
    base = session if session is not None else store.epoch(target).session
    out = []
    for path, eps in store.touches_since(ws, target, paths):
        others = [ep for ep in eps if ep.kind == "idle" or (
            ep.kind == "turn" and base is not None and ep.session != base)]
        if others:
            out.append((path, others[-1]))
    return out


def plan_redo(root_fd: int, store, ws: int, *, session: str | None = None,
              rules: IgnoreRules | None = None, force: bool = False) -> RewindPlan:
    """Undo the newest rewind of owner ``session`` not yet undone (None: the manual
    owner; ``store._history``): plan a rewind to the point it left, as a ``redo``.
    ``NothingToRedo`` on an empty stack; ``RedoStale`` if the tree changed since that
    rewind (the redo would undo those changes too), unless ``force``."""
    rewind, stale = redo_target(root_fd, store, ws, session=session, rules=rules)
    if stale and not force:
        raise RedoStale.of(rewind, stale, store.paths_changed_by(ws, stale))
    plan = plan_rewind(root_fd, store, ws, f"e{rewind.id}", rules=rules)
    return dataclasses.replace(plan, kind="redo", owner=rewind.session, undid=rewind.id)


def redo_target(root_fd: int, store, ws: int, *, session: str | None = None,
                rules: IgnoreRules | None = None):
    """``Store.redo_target`` checked against the tree: (the rewind a redo of owner
    ``session`` undoes, the epochs since whose changes it would discard — none when the
    tree is as the rewind left it, all changes put back)."""
    rewind, stale = store.redo_target(ws, session)
    if stale:
        # the point the rewind left is the start of the epoch right after it (not
        # the first stale one: a rewind and its redo may come between)
        left = min(e.id for e in store.epochs(ws) if e.id > rewind.id)
        if not _changed_since(root_fd, store, ws, left, rules):
            stale = []
    return rewind, stale


def _changed_since(root_fd: int, store, ws: int, epoch_id: int, rules) -> bool:
    """True if the tree differs from point ``e<epoch_id>`` in more than modification
    times: the paths touched since were not all put back as they were (an edit saved
    back, a scratch file made and removed, a file held open for writing across marks
    and recaptured at each).  Only then would a redo discard a change.  Stops at the
    first path that differs."""
    plan = _without_temps(store.plan(ws, store.resolve_point(ws, f"e{epoch_id}"), None))
    if rules is None:
        rules = IgnoreRules.load(root_fd)
    dirs = _dir_cache(root_fd)
    try:
        for action, change in _classified(dirs, store, plan, rules):
            if change == "meta" and _only_times_differ(dirs, action):
                continue
            if change not in ("unchanged", "ignored"):
                return True
        return False
    finally:
        dirs.close()


def _only_times_differ(dirs: DirCache, action) -> bool:
    """The entry at ``action.path`` matches its image in all metadata but the mtime."""
    try:
        dir_fd, name = dirs.parent(action.path)
    except (OSError, RewindfsError):
        return False
    st = meta.lstat_at(dir_fd, name)
    if st is None:
        return False
    img = dataclasses.replace(action.image, mtime_ns=st.st_mtime_ns)
    return meta.meta_equal(img, st, meta.xattrs_at(dir_fd, name))


# -- applying -----------------------------------------------------------------------

@dataclass
class _Run:
    root_fd: int
    store: object
    ws: int
    epoch: int
    progress: object
    invalidate: object
    rules: IgnoreRules
    dirs: DirCache
    inodes: InodeIndex | None = None
    groups: _Groups = field(default_factory=_Groups)
    seen: dict = field(default_factory=dict)         # path → image the precapture took
    captured: set = field(default_factory=set)       # paths recorded before any change
    dirty: set = field(default_factory=set)
    uncaptured: dict = field(default_factory=dict)   # path → why its capture failed
    targets: dict = field(default_factory=dict)      # path → target image (this plan)
    staged: list = field(default_factory=list)       # _Staged files awaiting one syncfs
    staged_bytes: int = 0
    writers: object = None      # fence_writes/unfence_writes of a daemon: lets us adopt
    adopter: Adopter | None = None
    fence: object = None        # fence_rewind/unfence_rewind of a daemon (invariant 14)
    held: set = field(default_factory=set)   # unchanged paths open for writing: skipped
    # directories whose metadata the plan found as it should be: the run moves their
    # times (its renames into them) and sets them back, a net change of nothing
    settled: set = field(default_factory=set)


@dataclass
class _Staged:
    dir_fd: int           # borrowed from run.dirs (trimmed only after the batch lands)
    tmp: bytes
    name: bytes
    action: object
    change: str


# A batch of staged files lands after one syncfs instead of one fsync per file (10k
# small files: ~4 s of fsyncs → one sync); the bounds cap the temp space and the work
# a crash leaves for recovery (which sweeps temp names).  The file bound is high on
# purpose: every rename frees the replaced inode, and ext4 without a journal makes each
# later create scan past every inode freed in the last 30 s (``recently_deleted``), so
# creating batch k+1 after landing batch k grows quadratically (10k files in batches
# of 2,048: ~1 s of creates; in one batch: ~0.15 s).  A staged file costs ~200 bytes.
STAGE_MAX_FILES = 32768
STAGE_MAX_BYTES = 256 << 20


def _twins(run: _Run, path: bytes) -> list[bytes]:
    """Other names of ``path``'s inode, if it is a non-directory with more than one
    link."""
    img = run.seen.get(path)
    if img is not None:
        key = parse_group(img.link_group)   # only a non-directory has one
        return [] if key is None else [p for p in run.inodes.names(*key) if p != path]
    try:
        dir_fd, name = run.dirs.parent(path)
    except (OSError, RewindfsError):
        return []
    st = meta.lstat_at(dir_fd, name)
    if st is None or stat.S_ISDIR(st.st_mode) or st.st_nlink < 2:
        return []
    return [p for p in run.inodes.names(st.st_dev, st.st_ino) if p != path]


def _adopt_group(run: _Run, img) -> None:
    """No name of ``img``'s link group landed yet: if a surviving name of that inode
    still holds the target content, make it the group's first name (we link to it).

    Only a name the plan leaves alone (untouched since the point, so it named this very
    inode then) or one whose own target is in the same group qualifies: inode numbers
    are reused, and a file now carrying the group's old number — with equal content,
    e.g. empty — may be another group's file."""
    key = parse_group(img.link_group)
    if key is None or img.link_group in run.groups.first:
        return
    for other in run.inodes.names(*key):
        mine = run.targets.get(other, img)
        if mine is None or mine.link_group != img.link_group:
            continue
        try:
            dir_fd, name = run.dirs.parent(other)
        except (OSError, RewindfsError):
            continue
        st = meta.lstat_at(dir_fd, name)
        if st is not None and (st.st_dev, st.st_ino) == key and _holds(dir_fd, name, st, img):
            run.groups.first[img.link_group] = (other, st.st_ino)
            return


def _holds(dir_fd: int, name: bytes, st, img) -> bool:
    """True if the entry is ``img``'s kind with its content: a file's bytes, a
    symlink's target, a device's number."""
    if not meta.same_node(img, st):
        return False
    if img.kind == "file":
        return st.st_size == img.size and meta.file_key(dir_fd, name) == img.blob
    if img.kind == "symlink":
        return os.readlink(name, dir_fd=dir_fd) == img.target
    return True


def _new_run(root_fd, store, ws, epoch_id, progress, invalidate, rules: IgnoreRules,
             writers=None, fence=None) -> _Run:
    return _Run(root_fd, store, ws, epoch_id, progress, invalidate, rules,
                _dir_cache(root_fd), InodeIndex(root_fd, rules), writers=writers,
                fence=fence)


def _precapture(run: _Run, paths: list[bytes]) -> None:
    """Capture every path about to change, and its parent directory, before the first
    change: the rewind epoch then holds one consistent picture of the tree as it was
    (a name's link count or a directory's mtime changes when a *neighbour* lands, so
    capturing each path just before its own landing would record a half-done state).
    A path whose capture fails is kept out of the landing (fail closed).

    The images taken here (``run.seen``) also tell the landing what each path holds
    now, so it need not look again; the other names of a multiply-linked file follow in
    a second commit, still before the first change."""
    todo = sorted({q for p in paths for q in (split(p)[0], p) if q})
    _capture_all(run, todo)
    twins = {t for p in paths if p not in run.uncaptured for t in _twins(run, p)}
    _capture_all(run, sorted(twins - run.captured))


def _capture_parent(run: _Run, relpath: bytes) -> tuple[int, bytes]:
    """``run.dirs.parent`` for the precapture, except below a symlink that stands where
    the plan puts a directory (``npm link``, pnpm: a directory replaced by a symlink
    since the point).  Such a path has no entry in the workspace — its name resolves
    into the symlink's target, which is not ours — so it is recorded ``absent``
    (``ENOTDIR``, as for a file in the way) instead of failing with ``path-escape``:
    the landing then replaces the symlink itself by the directory (``land_dir``
    unlinks it, never following it) and lands the paths below in the same run; redo
    deletes them again and puts the symlink back.  The landing still resolves every
    path with ``O_NOFOLLOW``, so if the symlink is not replaced, nothing is written.
    The same for a path the plan deletes (target ``absent``) below any symlink: it has
    no entry, so it already is what the plan wants (a directory exchanged with a
    symlink since the point leaves the names made in it there)."""
    # capture_images borrows a dir fd for one path at a time (its batch holds file
    # fds, not dir fds), so the cache may be trimmed before each: bounded fds
    if run.dirs.full:
        run.dirs.trim()
    try:
        return run.dirs.parent(relpath)
    except PathEscape:
        target = run.targets.get(relpath)
        if (target is not None and target.kind == "absent"
                or _below_replaced_symlink(run, relpath)):
            raise NotADirectoryError(errno.ENOTDIR, "below a symlink the rewind replaces "
                                     "by a directory", relpath) from None
        raise


def _below_replaced_symlink(run: _Run, relpath: bytes) -> bool:
    """The first symlink among ``relpath``'s ancestors is a directory in the plan."""
    parts = relpath.split(b"/")[:-1]
    for i in range(1, len(parts) + 1):
        ancestor = b"/".join(parts[:i])
        try:
            dir_fd, name = run.dirs.parent(ancestor)
        except (OSError, RewindfsError):
            return False
        st = meta.lstat_at(dir_fd, name)
        if st is not None and meta.kind_of(st) == "symlink":
            target = run.targets.get(ancestor)
            return target is not None and target.kind == "dir"
    return False


def _capture_all(run: _Run, todo: list[bytes]) -> None:
    if not todo:
        return
    put_file = None if run.adopter is None else run.adopter.put
    parent_at = functools.partial(_capture_parent, run)
    try:
        run.seen.update(capture_images(run.root_fd, run.store, run.ws, run.epoch, todo,
                                       parent_at=parent_at, put_file=put_file))
        run.captured.update(todo)
        return
    except (OSError, RewindfsError):
        log.debug("batch capture failed; capturing one by one to name the culprits")
    for path in todo:
        try:
            run.seen.update(capture_images(run.root_fd, run.store, run.ws, run.epoch,
                                           [path], parent_at=parent_at,
                                           put_file=put_file))
            run.captured.add(path)
        except (OSError, RewindfsError) as exc:
            run.uncaptured[path] = exc


def apply_plan(root_fd: int, store, ws: int, plan, *, session: str | None,
               progress=None, invalidate=None, force: bool = False,
               epoch_changed=None, writers=None, fence=None,
               rules: IgnoreRules | None = None) -> RestoreResult:
    """Apply ``plan`` (a ``RewindPlan`` or a store ``Plan``) as a new ``rewind`` epoch
    owned by ``session`` (a redo plan: as a ``redo`` epoch of its own owner).  ``progress(event)`` gets ``{"type": "rewind.written" |
    "rewind.deleted" | "rewind.failed", "path": bytes, …}``; ``invalidate(relpath)`` is
    called after each landed path; ``epoch_changed()`` right after the rewind epoch
    opens and right after it closes (the filesystem re-reads its current epoch).
    ``writers`` (the daemon: ``fence_writes``/``unfence_writes``) lets the run adopt a
    large file it replaces as its pre-image blob instead of copying it
    (``rewind.adopt``); without it every pre-image is a copy.  ``fence`` (the
    daemon: ``fence_rewind``/``unfence_rewind``) refuses changes through the mount to
    the plan's paths while the run lands them (invariant 14); without it (an unmounted
    workspace) there is no mount to fence.  ``rules``: the ignore rules in force, else
    the plan's, else ``.rewindignore`` read before the rewind epoch opens (so an invalid
    file refuses the rewind with nothing changed).  See the module contract for ordering."""
    store_plan = plan.plan if isinstance(plan, RewindPlan) else plan
    requested = plan.requested if isinstance(plan, RewindPlan) else sorted(store_plan.paths)
    if rules is None:
        rules = plan.rules if isinstance(plan, RewindPlan) else None
    if rules is None:
        rules = IgnoreRules.load(root_fd)
    rules = _restore_rules(store, store_plan, rules)
    turn = store.open_turn(ws)
    if turn is not None and not force:
        raise TurnOpen(turn=turn.turn, session=turn.session)
    kind = plan.kind if isinstance(plan, RewindPlan) else "rewind"
    if kind == "redo":
        session = plan.owner
    epoch = store.begin_rewind(ws, store_plan.target, session, kind=kind)
    _notify(epoch_changed)
    # The intent goes down before the first change: from here a crash is recoverable.
    store.put_intent(ws, {"v": 1, "epoch": epoch.id, "target": store_plan.target,
                          "paths": requested, "session": session})
    items = plan.items if isinstance(plan, RewindPlan) else None
    run = _new_run(root_fd, store, ws, epoch.id, progress, invalidate, rules, writers, fence)
    try:
        result = _land_all(run, store_plan, items)
    finally:
        run.dirs.close()
    store.end_rewind(ws)
    _notify(epoch_changed)
    store.clear_intent(ws)
    return result


def _notify(callback) -> None:
    if callback is not None:
        callback()


def _report_damaged(run: _Run, store_plan, result: RestoreResult) -> None:
    """Paths whose deciding journal entry is damaged have no target: name them (the
    rest of the plan still lands; exit code 1)."""
    for path, reason in sorted(store_plan.damaged.items()):
        _report_failure(run, result, Failure(
            path, "index-corrupt",
            f"its history entry in the store is damaged ({reason}); left as is"))


def _land_all(run: _Run, store_plan, items=None) -> RestoreResult:
    L.FAULT.arm()
    result = RestoreResult(run.epoch, store_plan.target)
    run.targets = {a.path: a.image for a in store_plan if a.op != "meta"}
    _report_damaged(run, store_plan, result)
    if items is None:
        groups = _Groups()
        items = [PlannedAction(a, _classify(run.dirs, a, run.rules, groups, run.store))
                 for a in store_plan]
    run.settled = {it.action.path for it in items
                   if it.action.op == "meta" and it.change == "unchanged"}
    try:
        _fence(run, items)
        if run.writers is not None:
            replaced = [it.action.path for it in items if _stageable(it.action, it.change)
                        and it.action.path not in run.uncaptured]
            run.adopter = Adopter(run.store, run.writers, replaced)
        try:
            _precapture(run, [it.action.path for it in items
                              if it.change not in ("unchanged", "ignored")
                              and it.action.path not in run.uncaptured])
            run.store.sync()     # durable before durable (invariant 12): see the contract
            _land_actions(run, store_plan, result)
        finally:
            _settle_adopted(run, result)
    finally:
        if run.fence is not None:
            run.fence.unfence_rewind()
    _fsync_dirs(run)
    return result


def _fence(run: _Run, items) -> None:
    """Fence the plan's paths in the daemon before the precapture (module contract).
    A path whose file is open for writing through the mount is left out of the run:
    its writes may still be in the kernel's writeback cache, and would go to whatever
    inode it is — a file renamed over it would swallow them."""
    if run.fence is None:
        return
    held = set(run.fence.fence_rewind([(it.action.path, _inode_of(run.dirs, it.action.path))
                                       for it in items if it.change != "ignored"]))
    for it in items:
        if it.action.path not in held:
            continue
        if it.change == "unchanged":
            run.held.add(it.action.path)
        else:
            run.uncaptured[it.action.path] = errors.Busy(path=it.action.path)


def _inode_of(dirs: DirCache, path: bytes) -> tuple[int, int] | None:
    """(dev, ino) that ``path`` names now, or None (absent, unreachable)."""
    try:
        dir_fd, name = dirs.parent(path) if path else (dirs.root_fd, None)
        st = os.fstat(dir_fd) if name is None else meta.lstat_at(dir_fd, name)
    except (OSError, RewindfsError):
        return None
    finally:
        if dirs.full:
            dirs.trim()
    return None if st is None else (st.st_dev, st.st_ino)


def _settle_adopted(run: _Run, result: RestoreResult) -> None:
    """After landing: no adopted blob may keep a name in the tree (``rewind.adopt``)."""
    if run.adopter is None:
        return
    for path, exc in run.adopter.settle():
        _report_failure(run, result, Failure(
            path, "shared-blob", f"its pre-image still shares the file's inode ({exc}); "
            "writes to it are refused until the daemon restarts"))


def _land_actions(run: _Run, store_plan, result: RestoreResult) -> None:
    for action in store_plan:
        if _is_ignored(run.rules, action):
            result.counts["ignored"] += 1
            continue
        if action.path in run.held:
            result.counts["unchanged"] += 1
            continue
        if action.op == "meta" or action.image.link_group is not None or run.dirs.full:
            # A directory's mtime is set after every rename into it; a hard link needs
            # its group's first name in place; the dir fds a batch holds are only
            # released (trimmed) after it lands.
            _land_staged(run, result)
        try:
            if action.path in run.uncaptured:
                raise run.uncaptured[action.path]
            change = _land_one(run, action)
        except (OSError, RewindfsError) as exc:
            _record_failure(run, result, action.path, exc)
            continue
        if change == "staged":
            if len(run.staged) >= STAGE_MAX_FILES or run.staged_bytes >= STAGE_MAX_BYTES:
                _land_staged(run, result)
            continue
        _record_landed(run, result, action, change)
    _land_staged(run, result)


def _record_landed(run: _Run, result: RestoreResult, action, change: str) -> None:
    if action.op == "meta" and (change == "unchanged" or action.path in run.settled):
        return      # not counted, as RewindPlan.counts does not: what it did is nothing
    result.counts[change] += 1
    if change != "unchanged":
        kind = "rewind.deleted" if change == "deleted" else "rewind.written"
        _emit(run, {"type": kind, "path": action.path, "op": action.op, "change": change})


def _record_failure(run: _Run, result: RestoreResult, path: bytes, exc) -> None:
    _report_failure(run, result, _failure(path, exc))


def _report_failure(run: _Run, result: RestoreResult, fail: Failure) -> None:
    result.failed.append(fail)
    log.warning("rewind: %r not restored: %s", fail.path, fail.message)
    _emit(run, {"type": "rewind.failed", "path": fail.path, "code": fail.code,
                "message": fail.message})


def _land_staged(run: _Run, result: RestoreResult) -> None:
    """Make the staged batch durable with one ``syncfs``, then rename each into place.

    Crash safety: until its rename a staged file exists only under a temp name (swept
    by ``recover``); after ``syncfs`` its bytes are on disk, so the rename can only
    expose the complete new version."""
    if not run.staged:
        run.dirs.trim()
        return
    batch, run.staged, run.staged_bytes = run.staged, [], 0
    run.store.sync()         # a late capture (_land_one) before anything is durable
    syncfs(run.root_fd)
    landed = []
    for st in batch:
        try:
            if L.land_staged_over(st.dir_fd, st.tmp, st.name, st.action.path):
                run.dirs.forget(st.action.path)     # an empty directory was in the way
        except (OSError, RewindfsError) as exc:
            _record_failure(run, result, st.action.path, exc)
            continue
        landed.append(st)
    # Invalidations and events after the renames, not between them: in the daemon each
    # one wakes other threads, and interleaved they slowed every rename on the GIL.
    for st in landed:
        _after_landing(run, st.dir_fd, st.name, st.action)
        _record_landed(run, result, st.action, st.change)
    run.dirs.trim()


def _land_one(run: _Run, action) -> str:
    try:
        dir_fd, name = run.dirs.parent(action.path)
    except (FileNotFoundError, NotADirectoryError):
        if action.op in ("delete", "meta"):
            return "unchanged"  # no parent: already absent / its mkdir failed (reported)
        raise
    except PathEscape:
        if action.op == "delete":
            # Below a symlink: no entry of ours (the name resolves into the symlink's
            # target, recorded absent by ``_capture_parent``), so nothing to delete.
            return "unchanged"
        raise
    _adopt_group(run, action.image)
    change = _seen_change(run, action)
    if change is None:
        change = _assess(dir_fd, name, action, run.groups, run.store)
    if change == "unchanged":
        _note_group(dir_fd, name, action.path, action.image, run.groups, inode_known=True)
        return change
    if action.path not in run.captured:
        # Write-ahead: the state we replace is recorded before it is touched.
        capture(run.root_fd, run.store, run.ws, run.epoch, [action.path],
                parent=_borrowed(run.dirs))
    if _stageable(action, change):
        tmp = L.stage_file(dir_fd, action.image, run.store, run.epoch, sync=False)
        run.staged.append(_Staged(dir_fd, tmp, name, action, change))
        run.staged_bytes += action.image.size
        return "staged"
    try:
        _land(run, dir_fd, name, action, change)
    finally:
        if action.op != "meta":
            # It may have removed or replaced a directory: no fd of it (or below) survives.
            run.dirs.forget(action.path)
    _after_landing(run, dir_fd, name, action)
    return change


def _seen_change(run: _Run, action) -> str | None:
    """``_assess`` from the image the precapture took of a plain file's current state
    (nothing in this run changes such a path before its own landing), or None to look.

    Only a write of a file with no link group over an entry that is not a directory
    and has one link qualifies; everything else (directories, whose mtimes move as
    neighbours land; hard links) is looked at again."""
    cur, img = run.seen.get(action.path), action.image
    if cur is None or action.op != "write" or img.link_group is not None:
        return None
    if cur.kind == "absent":
        return "created"
    if cur.kind == "dir" or cur.link_group is not None:
        return None
    if cur.kind != "file" or cur.size != img.size or cur.blob != img.blob:
        return "written"
    return "unchanged" if _image_meta_equal(img, cur) else "meta"


def _image_meta_equal(img, cur) -> bool:
    """``meta.meta_equal`` on a captured image instead of a stat."""
    if cur.mode != img.mode or cur.mtime_ns != img.mtime_ns:
        return False
    if meta.can_chown() and (cur.uid, cur.gid) != (img.uid, img.gid):
        return False
    return meta.xattrs_match(img, dict(cur.xattrs))


def _borrowed(dirs: DirCache):
    """``capture``'s ``parent`` context manager over a run's borrowed dir fds."""
    @contextlib.contextmanager
    def parent(relpath):
        yield dirs.parent(relpath)
    return parent


def _stageable(action, change: str) -> bool:
    """Plain file content (no hard-link group) can land in a batch."""
    return (action.op == "write" and change in ("written", "created")
            and action.image.link_group is None)


def _after_landing(run: _Run, dir_fd: int, name: bytes, action) -> None:
    run.dirty.add(split(action.path)[0])
    if run.invalidate is not None:
        run.invalidate(action.path)
    _note_group(dir_fd, name, action.path, action.image, run.groups, inode_known=True)


def _land(run: _Run, dir_fd: int, name: bytes, action, change: str) -> None:
    img, path, op = action.image, action.path, action.op
    if op == "delete":
        L.delete_at(dir_fd, name, path)
    elif op == "mkdir":
        L.land_dir(dir_fd, name, path)
    elif op == "meta":
        L.set_meta_at(dir_fd, name, img, path)
    elif op == "symlink":
        if not _link_to_group(run, dir_fd, name, action):
            L.land_symlink(dir_fd, name, img, run.epoch, path)
    elif op == "mknod":
        if change == "meta":
            L.set_meta_at(dir_fd, name, img, path)
        elif not _link_to_group(run, dir_fd, name, action):
            L.land_special(dir_fd, name, img, run.epoch, path)
    elif op == "write":
        _land_file(run, dir_fd, name, action, change)
    else:
        raise RewindfsError(f"unknown plan action {op!r}")


def _land_file(run: _Run, dir_fd: int, name: bytes, action, change: str) -> None:
    img, path = action.image, action.path
    if change == "meta":
        L.set_meta_at(dir_fd, name, img, path)
    elif not _link_to_group(run, dir_fd, name, action):
        L.land_file(dir_fd, name, img, run.store, run.epoch, path)


def _link_to_group(run: _Run, dir_fd: int, name: bytes, action) -> bool:
    """Land ``action``'s name as a hard link of the first landed name of its link group
    (any non-directory), if one landed in this run; False if none did."""
    img, path = action.image, action.path
    first = run.groups.first.get(img.link_group) if img.link_group is not None else None
    if first is None:
        return False
    src_fd, src_name = run.dirs.parent(first[0])
    L.land_link(dir_fd, name, src_fd, src_name, run.epoch, path)
    # The inode's metadata is shared; a name adopted from outside the plan may
    # carry metadata from after the point.
    st = meta.lstat_at(dir_fd, name)
    if not meta.meta_equal(img, st, meta.xattrs_at(dir_fd, name)):
        L.set_meta_at(dir_fd, name, img, path)
    return True


def _emit(run: _Run, event: dict) -> None:
    if run.progress is not None:
        run.progress(event)


def _failure(path: bytes, exc: BaseException) -> Failure:
    if isinstance(exc, RewindfsError):
        return Failure(path, exc.code, exc.message)
    if isinstance(exc, FileNotFoundError):
        return Failure(path, "parent-missing", f"a parent directory is missing ({exc.strerror})")
    name = errno.errorcode.get(exc.errno, "EIO") if exc.errno else "EIO"
    return Failure(path, "os-error", f"{name}: {exc.strerror or exc}")


def _fsync_dirs(run: _Run) -> None:
    """Make the renames durable before the intent is cleared (one fsync per dir)."""
    run.store.sync()
    for rel in sorted(run.dirty):
        try:
            fd = run.dirs.dir(rel)
        except (OSError, RewindfsError):
            continue
        os.fsync(fd)
        if run.dirs.full:
            run.dirs.trim()


# -- recovery -----------------------------------------------------------------------

def recover(root_fd: int, store, ws: int, *, progress=None, invalidate=None,
            epoch_changed=None, fence=None,
            rules: IgnoreRules | None = None) -> RestoreResult | None:
    """Finish an interrupted rewind from its intent (roll forward), then clear it.

    Returns ``None`` without an intent.  Re-plans the intent's point and lands what is
    still wrong, inside the interrupted rewind epoch if it is still open (else in the
    current epoch), sweeps stale temp names, and closes that rewind epoch."""
    intent = store.get_intent(ws)
    if intent is None:
        return None
    rewind_id, target = intent["epoch"], intent["target"]
    current = store.current_epoch(ws)
    still_open = current.id == rewind_id and current.kind in ("rewind", "redo")
    log.warning("recovering interrupted rewind (epoch %s, to point %s)", rewind_id, target)
    plan = _without_temps(store.plan(ws, target, intent.get("paths")))
    if rules is None:    # an invalid file: BadIgnoreRules, the intent stays for later
        rules = IgnoreRules.load(root_fd)
    rules = _restore_rules(store, plan, rules)
    run = _new_run(root_fd, store, ws, rewind_id if still_open else current.id, progress,
                   invalidate, rules, fence=fence)
    try:
        _sweep(run.dirs, plan)
        result = _land_all(run, plan, None)
    finally:
        run.dirs.close()
    # The interrupted run may have adopted inodes whose landing never happened.
    unshare_epoch(store, ws, rewind_id)
    result.epoch = rewind_id
    if still_open:
        store.end_rewind(ws)
        _notify(epoch_changed)
    store.clear_intent(ws)
    return result


def _sweep(dirs: DirCache, plan) -> None:
    for rel in sorted({split(p)[0] for p in plan.paths}):
        try:
            fd = dirs.dir(rel)
        except (OSError, RewindfsError):
            continue
        L.sweep_temps(fd)
        if dirs.full:
            dirs.trim()

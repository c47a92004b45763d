"""The FUSE filesystem: a passthrough over the workspace's root directory fd.

The daemon opens the workspace directory *before* mounting over it, so every real file
is reached through that fd with ``*at`` calls (``O_NOFOLLOW`` on final components;
intermediate directories are reached through cached ``O_PATH`` fds or a
``tree.walk.open_parent`` walk, never by following a symlink).

Write-ahead (DESIGN invariant 1): every handler that changes the tree first calls
``self._guard(...)`` for every path the change affects, which commits the pre-images
to the store, and only then performs the real syscall.  **No ``await`` sits between the
guard and the mutation** — in fact no handler awaits at all, so each request runs to
completion on the trio thread and requests never interleave (docs/concurrency.md).
If the guard fails, the handler raises ``FUSEError(ENOSPC|EIO)`` and nothing changes
(fail closed, invariant 2).  Paths matched by ``.rewindignore`` pass through uncaptured.

Durable before durable (invariant 12): the store commits pre-images without forcing
them to disk, so every request that makes a change durable — ``fsync``/``fdatasync``
(also the one the kernel sends for an ``O_SYNC`` write or ``msync``), ``fsyncdir``,
and a ``WRITE`` through a handle opened ``O_SYNC``/``O_DSYNC`` (whose ``pwrite`` is
itself durable) — first calls ``store.sync()``; it writes only when a pre-image was
committed since the last sync.  If that fails the request fails with ``EIO`` and the
real file is not synced.

While a rewind lands, every path of its plan is fenced (``fence_rewind``, DESIGN
invariant 14): a change through the mount that the landing could overwrite is answered
``EBUSY`` instead of being acknowledged and then destroyed (docs/concurrency.md).  The
rewind's own temp names (``.rewindfs~…``) do not exist through the mount: lookup says
``ENOENT``, readdir leaves them out, creating or renaming to such a name is ``EPERM``,
and they are never captured.

"Already captured" is an in-memory set per epoch (reset by ``set_epoch``) plus a
per-inode token so a write to an already captured file costs one identity check.

Hard links (invariants 1 and 13): a change to a non-directory with ``st_nlink > 1``
first captures every name of its inode — the names the table knows and, when those are
fewer than the link count, the names a per-mount ``InodeIndex`` finds (one lazy walk of
the tree, then kept current by ``link``/``unlink``/``rename``, dropped after a rewind
lands; the argument is in ``rewind.links``).  Names made before the mount are names
the daemon never saw, so the table alone cannot be enough.

Handlers are thin: they translate FUSE ↔ syscalls and raise ``FUSEError`` only; the
errno is the underlying filesystem's.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import resource
import stat
import threading
import time

import pyfuse3
from pyfuse3 import FUSEError

from rewindfs.store import EpochClosed
from rewindfs.store._errors import RewindfsError

from rewindfs.overlay.tree import syscalls
from rewindfs.overlay.tree.fdbudget import EXHAUSTED
from rewindfs.overlay.capture import capture, images, record_absent, rename_paths
from rewindfs.overlay.tree.ignore import IGNORE_FILE, IgnoreRules
from rewindfs.overlay.errors import BadIgnoreRules, MarkRefused
from rewindfs.overlay.fs.attrs import StatAttr
from rewindfs.overlay.fs.inodes import InodeTable, child
from rewindfs.overlay.fs.latewrites import LateWrites
from rewindfs.overlay.fs import session as _session
from rewindfs.overlay.fs.notify import Notifier
from rewindfs.overlay.tree.walk import open_parent, split
from rewindfs.overlay.tree.meta import TMP_PREFIX
from rewindfs.overlay.rewind.links import InodeIndex

log = logging.getLogger(__name__)

__all__ = ["CACHE_TIMEOUT", "RewindOperations"]

# We are the only writer of the tree while it is mounted, so the kernel may keep
# entries and attributes for long; the restore engine invalidates what it changes.
CACHE_TIMEOUT = 3600.0
_OPEN_DROP = os.O_CREAT | os.O_EXCL | os.O_NOCTTY | getattr(os, "O_DIRECT", 0)
_OPEN_ADD = os.O_NOFOLLOW | os.O_CLOEXEC
_OPEN_SYNC = os.O_SYNC | os.O_DSYNC      # O_SYNC contains O_DSYNC's bit
_CAPS = b"security.capability"


def _handler(fn):
    """Map every failure to an errno at the FUSE boundary (and nothing else).

    The result is the ``async def`` pyfuse3 awaits; its ``sync`` attribute is the same
    handler as a plain function, which the kernel-direct session calls directly (no
    coroutine per request: handlers never await, docs/concurrency.md).

    Each request starts by telling the inode table (its directory fds borrowed before
    may be evicted now).  Out of fds (``EMFILE``/``ENFILE``): the table's cached fds
    are shed — nothing is borrowed any more, the request is over — and this one
    request fails with that errno; the next one finds fds free."""

    @functools.wraps(fn)
    def call(self, *args):
        self.table.tick += 1        # InodeTable.begin_request(), inlined: every request
        try:
            return fn(self, *args)
        except FUSEError:
            raise
        except OSError as exc:
            if exc.errno in EXHAUSTED:
                self._out_of_fds(fn.__name__, exc)
            raise FUSEError(exc.errno or errno.EIO) from None
        except RewindfsError as exc:
            raise FUSEError(exc.errno) from None
        except KeyError:  # an inode or handle the table does not know
            raise FUSEError(errno.ENOENT) from None
        except Exception:
            log.exception("%s failed", fn.__name__)
            raise FUSEError(errno.EIO) from None

    @functools.wraps(fn)
    async def wrapper(self, *args):
        return call(self, *args)

    wrapper.sync = call     # the same handler without a coroutine (the kernel session)
    return wrapper


class _At:
    """``with _At(table, root_fd, path) as (dir_fd, name)``: the parent directory of
    *path* — the table's cached fd (not closed), else a fresh ``open_parent`` walk
    (closed on exit).  A plain class: cheaper per request than ``@contextmanager``."""

    __slots__ = ("fd", "name", "owned")

    def __init__(self, table, root_fd: int, path: bytes):
        head, _, name = path.rpartition(b"/")
        fd = table.dir_fd(head)
        self.owned = fd is None
        if fd is None:
            fd, name = open_parent(root_fd, path)
        self.fd, self.name = fd, name

    def __enter__(self):
        return self.fd, self.name

    def __exit__(self, *exc):
        if self.owned:
            os.close(self.fd)


class RewindOperations(pyfuse3.Operations):
    """pyfuse3 operations; ``store``/``ws`` receive the pre-images."""

    supports_dot_lookup = False
    # Set per mount (on by default, _daemon.writeback_default()).  With the writeback
    # cache a write(2) returns before the daemon sees it, so files opened for writing
    # are captured at open() and turn marks flush dirty pages first: docs/concurrency.md.
    enable_writeback_cache = False
    # Set by the kernel-direct session when it negotiated passthrough (then never the
    # writeback cache): every open goes to the real file without us, so the writes of
    # a handle that can write never reach us (``passthrough_writer``):
    # docs/concurrency.md.
    passthrough = False
    # Set by the kernel-direct session: ``_attr`` answers a ``StatAttr`` (fs/attrs.py)
    # instead of building pyfuse3's EntryAttributes field by field.
    stat_attrs = False

    def __init__(self, root_fd: int, store, ws: int, *, writeback: bool = False,
                 timeout: float = CACHE_TIMEOUT):
        super().__init__()
        self.store = store
        self.ws = ws
        self.root_fd = root_fd
        self.home_dev = os.fstat(root_fd).st_dev     # whose inode numbers stat shows
        self.enable_writeback_cache = writeback
        self.timeout = timeout
        self.table = InodeTable(root_fd)
        # The rules of .rewindignore now, the ones the current epoch began with, and
        # what capture goes by: exempt only where both ignore a path (tree/ignore.py)
        self.file_rules = IgnoreRules.load(root_fd)   # invalid: BadIgnoreRules, no mount
        self.epoch_rules = self.file_rules
        self.rules = self.file_rules
        self.rules_problem: str | None = None    # why a newer .rewindignore is not used
        self.links = InodeIndex(root_fd, self.rules)   # walked at its first use only
        self.epoch_id = store.current_epoch(ws).id
        self._store_gen = store.generation()   # see _follow_store
        self.captured: set[bytes] = set()
        self._token = object()
        self.handles: dict[int, object] = {}
        self.sync_handles: set[int] = set()     # real fds opened O_SYNC / O_DSYNC
        self.writers: set[int] = set()          # handles opened to write (not O_RDONLY)
        self.pt_writers: set[int] = set()       # writable handles passed through
        self.dirs: dict[int, tuple[int, int, list[bytes]]] = {}  # fh → (fd, inode, names)
        self._next_dir = 1
        self._as_root = os.geteuid() == 0
        self.notifier = Notifier()
        self.stats = {"captures": 0, "capture_errors": 0, "disk_syncs": 0}
        # Thread ids of the daemon's own turn-mark flush (``flushing_writes``), and the
        # handles it opened through the mount: their FSYNC only waits for WRITEs.
        self.mark_flushers: set[int] = set()
        self.mark_handles: set[int] = set()
        # Writers of turns a rewind removed (reported by status; latewrites.py).  The
        # mutating handlers call ``_saw``, one attribute test until a rewind arms it.
        self.late = LateWrites()
        self.fenced: set[tuple[int, int]] = set()   # real inodes no one may open to write
        # The running rewind's fence (fence_rewind): its plan's paths, their ancestor
        # directories, and the inodes those paths named when it began.
        self.busy: set[bytes] = set()
        self.busy_dirs: set[bytes] = set()
        self.busy_keys: set[tuple[int, int]] = set()
        self._fd_warned = 0.0

    def mode_dropped(self, ino: int) -> None:
        """The set-id bits of *ino* were dropped behind the kernel's cached attributes
        (HANDLE_KILLPRIV_V2); the kernel-direct session replaces this with a synchronous
        attribute invalidation, before the request's reply."""

    # -- epochs and capture --------------------------------------------------------

    def set_epoch(self, epoch_id: int, recorded=()) -> None:
        """Captures from now on go to *epoch_id*; the "already captured" set restarts
        with *recorded* (paths the epoch was committed with: ``writer_images``)."""
        if epoch_id != self.epoch_id:
            self.epoch_id = epoch_id
            self.captured.clear()
            self.captured.update(recorded)
            self._token = object()
            if self.epoch_rules is not self.file_rules:    # an edited .rewindignore
                self._set_rules(self.file_rules, self.file_rules)   # is in force now
            if self.pt_writers:
                self._capture_passthrough_writers()

    def writer_images(self) -> list:
        """``(path, PreImage)`` of every name of the files passed-through writers hold,
        as they are now, contents stored: for a turn mark to commit with its new epoch
        (``Store.begin_turn``'s ``records``), then ``set_epoch(..., recorded=paths)``.
        Their writes never reach us, so a mark whose epoch began without them would
        leave no state of those files at the mark, and a rewind to it would keep what
        the turn wrote there while saying it restored the mark.  ``MarkRefused`` when
        one cannot be kept (the store full): the caller makes no mark, nothing changed."""
        if not self.pt_writers:
            return []
        items = []
        for node in {id(self.handles[fh]): self.handles[fh] for fh in self.pt_writers}.values():
            items += [(p, node.is_dir) for p in node.paths]
            if not node.is_dir:
                items += self._twins(self._node_stat(node))
        paths = [p for p, d in items if not self.rules.ignored(p, d)]
        try:
            return images(self.root_fd, self.store, paths, parent=self._parent)
        except (RewindfsError, OSError) as exc:
            self.stats["capture_errors"] += 1
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise MarkRefused(path=os.fsdecode(paths[0]) if paths else "a file",
                              reason=reason) from None

    def passthrough_writer(self, fh: int) -> None:
        """Handle *fh* can write and is passed through: its writes will not reach us.
        Its file is captured now (a failure fails the open) and again at every epoch
        change while the handle stays open (``set_epoch``).  An ``O_SYNC``/``O_DSYNC``
        handle's writes are durable when they return, and no ``FSYNC`` tells us first:
        the pre-image is synced here (invariant 12)."""
        self._guard_node(self.handles[fh])
        if fh in self.sync_handles:
            self.store.sync()
        self.pt_writers.add(fh)

    def setid_file(self, fh: int) -> bool:
        """True if a write by a caller without ``CAP_FSETID`` would drop set-id bits
        of *fh*'s file (set-user-ID, or set-group-ID with group execute)."""
        mode = os.fstat(fh).st_mode
        return bool(_setid_bits(mode))

    def _capture_passthrough_writers(self) -> None:
        """Pre-images, in the new epoch, of the files passed-through writers hold.  A
        failure cannot refuse anything (their writes go to the real file directly): it
        is logged and counted, and that file has no pre-image in this epoch."""
        for node in {id(self.handles[fh]): self.handles[fh] for fh in self.pt_writers}.values():
            try:
                self._guard_node(node)
            except FUSEError as exc:
                log.warning("capture at the epoch change of a file written through "
                            "passthrough failed (%s)", os.strerror(exc.errno))

    def epoch_changed(self) -> None:
        """Reload the current epoch from the store (after a rewind or turn mark); a
        rewind or redo epoch arms the late-write watch with the turns it removes."""
        epoch = self.store.current_epoch(self.ws)
        self.set_epoch(epoch.id)
        if epoch.kind in ("rewind", "redo"):
            self.late.rewound(self.store.epochs(self.ws), epoch)

    def _saw(self, ctx, path: bytes) -> None:
        """A mutating request for ``path``: noted if a rewind armed the late-write watch
        (one attribute test otherwise)."""
        if self.late.armed:
            self.late.saw(ctx.pid, path)

    def _saw_node(self, ctx, node) -> None:
        if self.late.armed and node.paths:
            self.late.saw(ctx.pid, node.path)

    def reload_rules(self) -> None:
        """Read ``.rewindignore`` again (it was written, renamed, removed or restored).
        An invalid pattern keeps the previous rules in force — the write itself stands,
        it is the user's file — and leaves the reason in ``rules_problem`` for
        ``status`` and ``turn.begin`` to report until a valid file replaces it."""
        try:
            rules = IgnoreRules.load(self.root_fd)
        except BadIgnoreRules as exc:
            self.rules_problem = exc.kept_previous()
            log.warning("%s", self.rules_problem)
            return
        self.rules_problem = None
        self._set_rules(self.epoch_rules, rules)

    def _set_rules(self, epoch_rules, file_rules) -> None:
        """A rule added since the epoch began exempts nothing from capture until the
        next epoch: the turn that adds ``*.txt`` and deletes ``a.txt`` is rewound with
        ``a.txt`` (tree/ignore.py); one it removes takes effect at once."""
        self.epoch_rules, self.file_rules = epoch_rules, file_rules
        self.rules = epoch_rules.both(file_rules)
        self.links = InodeIndex(self.root_fd, self.rules)
        self._token = object()

    def _follow_store(self) -> None:
        """Before trusting ``captured`` and ``node.seen``: if anything committed to the
        store since we last looked, and it began an epoch (another process using the
        store, not through this daemon), follow it — else a change to a path captured
        in the old epoch would land in the new one without its pre-image.  One
        ``generation()`` read per mutating request; a read of the current epoch only
        after some commit."""
        gen = self.store.generation()
        if gen != self._store_gen:
            self._store_gen = gen
            if self.store.current_epoch(self.ws).id != self.epoch_id:
                self.epoch_changed()

    def _guard(self, items, *, absent: bool = False) -> None:
        """Commit the pre-image of every ``(path, is_dir)`` not yet captured (write-ahead).
        ``absent``: the caller has just seen that none of the paths exists (a create's
        new name), so their pre-image is ``absent`` without looking again."""
        self._follow_store()
        self._guard_followed(items, absent)

    def _guard_followed(self, items, absent: bool = False) -> None:
        """``_guard`` for a caller that has just run ``_follow_store``."""
        todo = [p for p, d in items if p not in self.captured and not self.rules.ignored(p, d)]
        if not todo:
            return
        if log.isEnabledFor(logging.DEBUG):
            log.debug("capture %r in epoch %d", todo, self.epoch_id)
        try:
            try:
                committed = self._capture(todo, absent)
            except EpochClosed:
                # Another process moved the workspace to a new epoch behind our back:
                # follow it (dropping the captured set) and capture there.
                self.epoch_changed()
                todo = [p for p, d in items if not self.rules.ignored(p, d)]
                committed = self._capture(todo, absent)
        except (RewindfsError, OSError) as exc:
            self.stats["capture_errors"] += 1
            log.warning("capture of %d path(s) failed, refusing the change: %s", len(todo), exc)
            code = exc.errno if isinstance(exc, RewindfsError) else (
                exc.errno if exc.errno in EXHAUSTED else errno.EIO)
            raise FUSEError(code) from None
        self.stats["captures"] += len(todo)
        self.captured.update(todo)
        if committed is not None:
            # Our epoch was the open one at that commit (store.Recorded): _follow_store
            # need not read it again unless something commits after it (each create
            # commits one).
            self._store_gen = committed

    def _capture(self, todo, absent: bool = False) -> int | None:
        """``capture`` of *todo*, returning its commit's generation (None: nothing to
        record); out of fds, shed the directory cache and try once more (nothing was
        recorded, nothing changed yet: capture is all or nothing)."""
        if absent:
            return record_absent(self.store, self.ws, self.epoch_id, todo)
        try:
            return capture(self.root_fd, self.store, self.ws, self.epoch_id, todo,
                           parent=self._parent)
        except OSError as exc:
            if exc.errno not in EXHAUSTED or not self.table.shed():
                raise
            return capture(self.root_fd, self.store, self.ws, self.epoch_id, todo,
                           parent=self._parent)

    def _out_of_fds(self, what: str, exc: OSError) -> None:
        shed = self.table.shed()
        now = time.monotonic()
        if now - self._fd_warned > 10:   # one line per 10 s, not one per request
            self._fd_warned = now
            log.warning("%s: %s (fd limit %d); shed %d cached directory fds, refused "
                        "this request", what, exc, resource.getrlimit(
                            resource.RLIMIT_NOFILE)[0], shed)

    def _guard_node(self, node) -> None:
        """Capture every name of *node* before it changes — for a multiply-linked file
        also the names the table does not know (``_twins``)."""
        self._follow_store()
        if node.seen is not self._token:
            items = [(p, node.is_dir) for p in node.paths]
            if not node.is_dir:
                items += self._twins(self._node_stat(node))
            self._guard_followed(items)
            node.seen = self._token

    def _node_stat(self, node) -> os.stat_result | None:
        """The real inode's stat now: by an open handle (exact), else by its first name."""
        try:
            if node.handles:
                return os.fstat(next(iter(node.handles)))
            if node.paths:
                return self._lstat(node.path)
        except OSError:
            pass
        return None

    def _twins(self, st) -> list:
        """``(path, False)`` for every name of the non-directory *st* with more than one
        link: the names the table knows and, if they are fewer than ``st_nlink``, those
        the inode index finds (its first use walks the tree).  Names outside the
        workspace are never found; the count then stays short, and costs only a dict
        lookup per capture after the first walk."""
        if st is None or stat.S_ISDIR(st.st_mode) or st.st_nlink <= 1:
            return []
        key = (st.st_dev, st.st_ino)
        node = self.table.by_key.get(key)
        names = dict.fromkeys(node.paths) if node is not None else {}
        if len(names) < st.st_nlink:
            names.update(dict.fromkeys(self.links.names(*key)))
        return [(p, False) for p in names]

    # -- resolution ----------------------------------------------------------------

    def _parent(self, path: bytes) -> "_At":
        """Context manager yielding ``(dir_fd, name)`` for *path* (cached dir fd if known)."""
        return _At(self.table, self.root_fd, path)

    def _lstat_or_none(self, path: bytes) -> os.stat_result | None:
        """The entry at *path*, or None where there is none — also below a symlink
        (``PathEscape``): the name resolves outside the tree, not to an entry of ours."""
        try:
            return self._lstat(path)
        except (OSError, RewindfsError):
            return None

    def _lstat(self, path: bytes) -> os.stat_result:
        if path == b"":
            return os.fstat(self.root_fd)
        head, _, name = path.rpartition(b"/")
        fd = self.table.dir_fd(head)
        if fd is not None:  # the common case, without a context manager
            return os.stat(name, dir_fd=fd, follow_symlinks=False)
        with self._parent(path) as (fd, name):
            return os.stat(name, dir_fd=fd, follow_symlinks=False)

    def _path(self, node) -> bytes:
        path = node.path
        if path is None:
            raise FUSEError(errno.ENOENT)
        return path

    def _attr(self, node, st) -> pyfuse3.EntryAttributes:
        node.st = st
        if self.stat_attrs:     # the kernel session packs the reply from the stat itself
            return StatAttr(node.ino, st, self.timeout, self.home_dev)
        e = pyfuse3.EntryAttributes()
        e.st_ino = node.ino
        e.generation = 0
        e.entry_timeout = self.timeout
        e.attr_timeout = self.timeout
        e.st_mode = st.st_mode
        e.st_nlink = st.st_nlink
        e.st_uid = st.st_uid
        e.st_gid = st.st_gid
        e.st_rdev = st.st_rdev
        e.st_size = st.st_size
        e.st_blksize = st.st_blksize
        e.st_blocks = st.st_blocks
        e.st_atime_ns = st.st_atime_ns
        e.st_mtime_ns = st.st_mtime_ns
        e.st_ctime_ns = st.st_ctime_ns
        return e

    def _enter(self, path: bytes, st) -> pyfuse3.EntryAttributes:
        """Register *path* → real inode and count one kernel lookup for it."""
        node = self.table.known(path, st)
        node.nlookup += 1
        return self._attr(node, st)

    def _own(self, dir_fd: int, name: bytes, ctx) -> None:
        """New entries belong to the caller, not to the (root) daemon."""
        if not self._as_root or (ctx.uid == 0 and ctx.gid == 0):
            return
        gid = ctx.gid
        pst = os.fstat(dir_fd)
        if pst.st_mode & stat.S_ISGID:
            gid = pst.st_gid
        os.chown(name, ctx.uid, gid, dir_fd=dir_fd, follow_symlinks=False)

    def _created(self, path: bytes, ctx) -> pyfuse3.EntryAttributes:
        with self._parent(path) as (fd, name):
            self._own(fd, name, ctx)
            st = os.stat(name, dir_fd=fd, follow_symlinks=False)
        if path == IGNORE_FILE:
            self.reload_rules()
        return self._enter(path, st)

    # -- lookups and attributes ----------------------------------------------------

    @_handler
    def lookup(self, parent_inode, name, ctx):
        if name.startswith(TMP_PREFIX):
            raise FUSEError(errno.ENOENT)   # a rewind's temp file: not part of the tree
        path = self._new_path(parent_inode, name)
        try:
            st = self._lstat(path)
        except FileNotFoundError:
            neg = pyfuse3.EntryAttributes()  # st_ino 0: the kernel caches the miss
            neg.st_ino = 0
            neg.entry_timeout = self.timeout
            return neg
        return self._enter(path, st)

    @_handler
    def forget(self, inode_list):
        for ino, count in inode_list:
            self.table.forget(ino, count)

    @_handler
    def getattr(self, inode, ctx):
        node = self.table[inode]
        if node.paths:
            return self._attr(node, self._lstat(node.path))
        if node.handles:
            return self._attr(node, os.fstat(next(iter(node.handles))))
        raise FUSEError(errno.ENOENT)

    @_handler
    def setattr(self, inode, attr, fields, fh, ctx):
        node = self.table[inode]
        if log.isEnabledFor(logging.DEBUG):
            log.debug("setattr %r size=%s mode=%s uid=%s gid=%s atime=%s mtime=%s ctime=%s",
                      node, fields.update_size, fields.update_mode, fields.update_uid,
                      fields.update_gid, fields.update_atime, fields.update_mtime,
                      fields.update_ctime)
        if not self._time_push(node, attr, fields):
            self._saw_node(ctx, node)
            if self.busy:
                self._refuse_busy_node(node)
            self._guard_node(node)
        if fields.update_mtime and self.enable_writeback_cache:
            node.kernel_mtime_ns = attr.st_mtime_ns     # see write()
        if node is self.table.root:
            return self._setattr_fd(node, attr, fields, self.root_fd)
        if not node.paths:
            fd = fh if fh in self.handles else next(iter(node.handles), None)
            if fd is None:
                if node.st is not None and not (fields.update_size or fields.update_mode
                                                or fields.update_uid or fields.update_gid):
                    # The writeback cache pushing the times of a file unlinked since:
                    # nothing is left to change.  ENOENT here would become a writeback
                    # error that a later fsync/syncfs reports to an innocent caller.
                    return self._attr(node, node.st)
                raise FUSEError(errno.ENOENT)
            return self._setattr_fd(node, attr, fields, fd)
        with self._parent(node.path) as (fd, name):
            if fields.update_size:
                if fh in self.handles:
                    os.ftruncate(fh, attr.st_size)
                else:
                    if self.fenced:
                        self._refuse_fenced(node.path)
                    wfd = os.open(name, os.O_WRONLY | _OPEN_ADD, dir_fd=fd)
                    try:
                        os.ftruncate(wfd, attr.st_size)
                    finally:
                        os.close(wfd)
            if fields.update_size and getattr(fields, "kill_suidgid", False):
                self._kill_suidgid_at(fd, name)   # HANDLE_KILLPRIV_V2: see write()
            if fields.update_mode:
                # The kernel never chmods a symlink itself, so following is exact here.
                os.chmod(name, stat.S_IMODE(attr.st_mode), dir_fd=fd)
            if fields.update_uid or fields.update_gid:
                os.chown(name, attr.st_uid if fields.update_uid else -1,
                         attr.st_gid if fields.update_gid else -1,
                         dir_fd=fd, follow_symlinks=False)
            if fields.update_atime or fields.update_mtime:
                syscalls.utimensat(fd, name,
                               attr.st_atime_ns if fields.update_atime else None,
                               attr.st_mtime_ns if fields.update_mtime else None)
            return self._attr(node, os.stat(name, dir_fd=fd, follow_symlinks=False))

    def _time_push(self, node, attr, fields) -> bool:
        """True if this setattr is the kernel's writeback cache pushing the times of
        writes we already captured (mtime/ctime only, after a write): no new capture.

        Without it, the times of a write in one epoch, pushed lazily by the kernel after
        a turn boundary, would count as a change in the next epoch.
        """
        if (fields.update_size or fields.update_mode or fields.update_uid
                or fields.update_gid or fields.update_atime):
            return False
        if not fields.update_mtime:
            return True  # ctime only: nothing the real file can be asked to change
        if node.wrote and self.enable_writeback_cache:
            node.wrote = False
            return True
        if node.paths:  # the same mtime again changes nothing
            return self._lstat(node.path).st_mtime_ns == attr.st_mtime_ns
        return False

    def _kill_suidgid_at(self, dir_fd: int, name: bytes) -> None:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        kill = _setid_bits(st.st_mode)
        if stat.S_ISREG(st.st_mode) and kill:
            os.chmod(name, stat.S_IMODE(st.st_mode) & ~kill, dir_fd=dir_fd)

    def _setattr_fd(self, node, attr, fields, fd):
        """setattr through an fd: the root directory, or an unlinked but open file."""
        if fields.update_size:
            os.ftruncate(fd, attr.st_size)
            if getattr(fields, "kill_suidgid", False):
                _kill_suidgid(fd)
        if fields.update_mode:
            os.fchmod(fd, stat.S_IMODE(attr.st_mode))
        if fields.update_uid or fields.update_gid:
            os.fchown(fd, attr.st_uid if fields.update_uid else -1,
                      attr.st_gid if fields.update_gid else -1)
        if fields.update_atime or fields.update_mtime:
            st = os.fstat(fd)
            os.utime(fd, ns=(attr.st_atime_ns if fields.update_atime else st.st_atime_ns,
                             attr.st_mtime_ns if fields.update_mtime else st.st_mtime_ns))
        return self._attr(node, os.fstat(fd))

    @_handler
    def readlink(self, inode, ctx):
        with self._parent(self._path(self.table[inode])) as (fd, name):
            return os.readlink(name, dir_fd=fd)

    @_handler
    def statfs(self, ctx):
        sv = os.statvfs(self.root_fd)
        out = pyfuse3.StatvfsData()
        for attr in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail", "f_files",
                     "f_ffree", "f_favail", "f_namemax"):
            setattr(out, attr, getattr(sv, attr))
        return out

    @_handler
    def access(self, inode, mode, ctx):
        self.table[inode]
        return True

    # -- creating and removing -----------------------------------------------------

    def _new_path(self, parent_inode, name) -> bytes:
        return child(self._path(self.table[parent_inode]), name)

    def _new_name(self, parent_inode, name) -> bytes:
        """``_new_path`` for a name about to be made: not a rewind temp name (``EPERM``),
        not a path the running rewind lands (``EBUSY``)."""
        if name.startswith(TMP_PREFIX):
            raise FUSEError(errno.EPERM)
        path = self._new_path(parent_inode, name)
        if path in self.busy:
            raise FUSEError(errno.EBUSY)
        return path

    @_handler
    def mknod(self, parent_inode, name, mode, rdev, ctx):
        path = self._new_name(parent_inode, name)
        self._saw(ctx, path)
        self._guard([(path, False)])
        with self._parent(path) as (fd, n):
            os.mknod(n, mode, rdev, dir_fd=fd)
        return self._created(path, ctx)

    @_handler
    def mkdir(self, parent_inode, name, mode, ctx):
        path = self._new_name(parent_inode, name)
        self._saw(ctx, path)
        self._guard([(path, True)])
        with self._parent(path) as (fd, n):
            os.mkdir(n, stat.S_IMODE(mode), dir_fd=fd)
        return self._created(path, ctx)

    @_handler
    def symlink(self, parent_inode, name, target, ctx):
        path = self._new_name(parent_inode, name)
        self._saw(ctx, path)
        self._guard([(path, False)])
        with self._parent(path) as (fd, n):
            os.symlink(target, n, dir_fd=fd)
        return self._created(path, ctx)

    @_handler
    def link(self, inode, new_parent_inode, new_name, ctx):
        node = self.table[inode]
        src = self._path(node)
        new = self._new_name(new_parent_inode, new_name)
        self._saw(ctx, new)
        if self.busy:
            self._refuse_busy_node(node)
        self._guard([(new, False)])
        with self._parent(src) as (sfd, sname), self._parent(new) as (dfd, dname):
            os.link(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd, follow_symlinks=False)
            st = os.stat(dname, dir_fd=dfd, follow_symlinks=False)
        # The other names keep their content: the rewind of ``new`` (absent) gives their
        # link count back, so only ``new`` is captured above.
        self.links.add(_key_of(st), src)
        self.links.add(_key_of(st), new)
        self.table.bind(new, node)
        node.nlookup += 1
        return self._attr(node, st)

    @_handler
    def unlink(self, parent_inode, name, ctx):
        path = self._new_path(parent_inode, name)
        self._saw(ctx, path)
        if path in self.busy:
            raise FUSEError(errno.EBUSY)
        st = self._lstat(path)
        self._guard([(path, False), *self._twins(st)])
        with self._parent(path) as (fd, n):
            os.unlink(n, dir_fd=fd)
        self.links.discard(_key_of(st), path)
        self.table.unbind(path, gone=st.st_nlink <= 1)
        if path == IGNORE_FILE:
            self.reload_rules()

    @_handler
    def rmdir(self, parent_inode, name, ctx):
        path = self._new_path(parent_inode, name)
        self._saw(ctx, path)
        if self.busy:
            self._refuse_busy_tree(path)
        self._guard([(path, True)])
        with self._parent(path) as (fd, n):
            os.rmdir(n, dir_fd=fd)
        self.table.unbind(path, gone=True)

    @_handler
    def rename(self, parent_old, name_old, parent_new, name_new, flags, ctx):
        old = self._new_path(parent_old, name_old)
        if name_new.startswith(TMP_PREFIX):
            raise FUSEError(errno.EPERM)
        new = self._new_path(parent_new, name_new)
        self._saw(ctx, new)
        if self.busy:   # a directory being landed into stays where it is
            self._refuse_busy_tree(old)
            self._refuse_busy_tree(new)
        st_old = self._lstat(old)
        try:
            st_new = self._lstat(new)
        except FileNotFoundError:
            st_new = None
        if flags & pyfuse3.RENAME_NOREPLACE and st_new is not None:
            raise FUSEError(errno.EEXIST)
        exchange = bool(flags & pyfuse3.RENAME_EXCHANGE)
        if exchange and st_new is None:
            raise FUSEError(errno.ENOENT)
        self._guard(rename_paths(self.root_fd, old, new, stat.S_ISDIR(st_old.st_mode),
                                 None if st_new is None else stat.S_ISDIR(st_new.st_mode),
                                 exchange=exchange)
                    + self._twins(st_old) + self._twins(st_new))
        # RENAME_WHITEOUT leaves a char device 0:0 at ``old``, whose pre-image (the
        # moved entry's) the guard above has recorded.
        with self._parent(old) as (ofd, oname), self._parent(new) as (nfd, nname):
            syscalls.renameat2(ofd, oname, nfd, nname, flags & (syscalls.RENAME_NOREPLACE |
                                                          syscalls.RENAME_EXCHANGE |
                                                          syscalls.RENAME_WHITEOUT))
        self._renamed(old, new, st_old, st_new, exchange)

    def _renamed(self, old, new, st_old, st_new, exchange) -> None:
        is_dir = stat.S_ISDIR(st_old.st_mode)
        if exchange:
            self.table.exchange(old, new)
            self.links.exchanged(old, new)
        elif st_new is None or (st_new.st_dev, st_new.st_ino) != (st_old.st_dev, st_old.st_ino):
            if st_new is not None:
                gone = stat.S_ISDIR(st_new.st_mode) or st_new.st_nlink <= 1
                self.table.unbind(new, gone=gone)
                self.links.discard(_key_of(st_new), new)
            self.table.move(old, new, is_dir)
            self.links.moved(old, new, None if is_dir else _key_of(st_old))
        if self.links.built and (self.rules.ignored(old, is_dir)
                                 != self.rules.ignored(new, is_dir)):
            # The walk skipped ignored paths: names moved out of one are unknown to it.
            self.links = InodeIndex(self.root_fd, self.rules)
        if IGNORE_FILE in (old, new):
            self.reload_rules()

    # -- files -----------------------------------------------------------------------

    def _real_flags(self, flags: int) -> int:
        real = (flags & ~_OPEN_DROP) | _OPEN_ADD
        if self.enable_writeback_cache:
            # The kernel may read pages of a write-only file and computes append
            # offsets itself, so the real fd must be readable and not O_APPEND.
            if real & os.O_ACCMODE == os.O_WRONLY:
                real = (real & ~os.O_ACCMODE) | os.O_RDWR
            real &= ~os.O_APPEND
        return real

    def _opened(self, fd: int, node, flags: int) -> pyfuse3.FileInfo:
        self.handles[fd] = node
        node.handles.add(fd)
        if flags & _OPEN_SYNC:
            self.sync_handles.add(fd)
        if flags & os.O_ACCMODE != os.O_RDONLY:
            self.writers.add(fd)
        return pyfuse3.FileInfo(fh=fd, keep_cache=True)

    @_handler
    def open(self, inode, flags, ctx):
        node = self.table[inode]
        path = self._path(node)
        if flags & os.O_TRUNC or flags & os.O_ACCMODE != os.O_RDONLY:
            self._saw(ctx, path)
            if self.fenced:
                self._refuse_fenced(path)
            if self.busy:
                self._refuse_busy_node(node)
        if flags & os.O_TRUNC or (self.enable_writeback_cache
                                  and flags & os.O_ACCMODE != os.O_RDONLY):
            # With the writeback cache a write(2) returns before we see it, so the
            # pre-image is taken here, where a failure can still refuse the open
            # (fail closed, invariant 2); see docs/concurrency.md.
            self._guard_node(node)
        with self._parent(path) as (fd, name):
            rfd = os.open(name, self._real_flags(flags), dir_fd=fd)
        if flags & os.O_TRUNC and getattr(ctx, "kill_suidgid", False) and _kill_suidgid(rfd):
            self.mode_dropped(node.ino)   # an unprivileged O_TRUNC (HANDLE_KILLPRIV_V2)
        if ctx.pid in self.mark_flushers:
            self.mark_handles.add(rfd)
        return self._opened(rfd, node, flags)

    @_handler
    def create(self, parent_inode, name, mode, flags, ctx):
        path = self._new_name(parent_inode, name)
        self._saw(ctx, path)
        if self.fenced:
            self._refuse_fenced(path)   # O_CREAT without O_EXCL opens an existing file
        # A name that exists after all (a stale negative dentry) is opened for writing:
        # its inode's other names change with it, so they are captured too.
        before = self._lstat_or_none(path)
        self._guard([(path, False), *self._twins(before)], absent=before is None)
        with self._parent(path) as (fd, n):
            rfd = os.open(n, self._real_flags(flags) | os.O_CREAT | (flags & os.O_EXCL),
                          stat.S_IMODE(mode), dir_fd=fd)   # O_EXCL: EEXIST, as on disk
            try:
                self._own(fd, n, ctx)
                if flags & os.O_TRUNC and getattr(ctx, "kill_suidgid", False):
                    _kill_suidgid(rfd)   # an existing file truncated (HANDLE_KILLPRIV_V2)
                st = os.fstat(rfd)
            except BaseException:
                os.close(rfd)
                raise
        attr = self._enter(path, st)
        node = self.table[attr.st_ino]
        if before is None and st.st_nlink == 1:
            node.nocaps = True     # made just now: no security.capability (getxattr)
        return self._opened(rfd, node, flags), attr

    @_handler
    def read(self, fh, off, size):
        return os.pread(fh, size, off)

    @_handler
    def write(self, fh, off, buf, kill_suidgid=False):
        """``kill_suidgid``: the kernel-direct session with ``HANDLE_KILLPRIV_V2`` says
        the writer lacks ``CAP_FSETID``, so the set-id bits go, as a local write would
        drop them (the daemon writes as root, which keeps them)."""
        node = self.handles[fh]
        self._guard_node(node)
        node.wrote = True
        if fh in self.sync_handles:
            self.store.sync()        # this pwrite is durable when it returns
        if kill_suidgid and _kill_suidgid(fh):
            self.mode_dropped(node.ino)
        view = memoryview(buf)
        done = 0
        while done < len(view):
            done += os.pwrite(fh, view[done:], off + done)
        if node.kernel_mtime_ns is not None:
            # With the writeback cache the kernel owns mtime and pushes it in a SETATTR,
            # which can overtake a queued WRITE (fuse_flush: write_inode_now sends the
            # pages in the background, the times at once).  Our pwrite must not move the
            # real mtime past the kernel's: keep the last one it pushed; a newer write's
            # own push follows (at close, fsync, syncfs — a turn boundary runs one).
            syscalls.futimens(fh, None, node.kernel_mtime_ns)
        return done

    @_handler
    def fallocate(self, fh, mode, off, length):
        """``fallocate(2)`` on an open file — plain, ``KEEP_SIZE``, ``PUNCH_HOLE``,
        ``ZERO_RANGE`` — captured first, like ``write`` (the kernel-direct session only:
        pyfuse3 has no such operation, so through the libfuse session the kernel answers
        ``EOPNOTSUPP``)."""
        node = self.handles[fh]
        self._guard_node(node)
        node.wrote = True
        if fh in self.sync_handles:
            self.store.sync()
        syscalls.fallocate(fh, mode, off, length)
        # The kernel drops its cached attributes after a FALLOCATE and asks again: the
        # real times are the ones to report now (see write()).
        node.kernel_mtime_ns = None

    @_handler
    def copy_file_range(self, fh_in, off_in, fh_out, off_out, length, flags):
        """Copy inside the real filesystem (no bytes through us); the destination is
        captured first, like ``write``.  Returns the number of bytes copied."""
        node = self.handles[fh_out]
        self._guard_node(node)
        node.wrote = True
        if fh_out in self.sync_handles:
            self.store.sync()
        done = os.copy_file_range(fh_in, fh_out, length, off_in, off_out)
        node.kernel_mtime_ns = None
        return done

    async def flush(self, fh):
        """Nothing to do on close(2): ENOSYS makes the kernel stop sending FLUSH at all
        (one round trip less per close; with the writeback cache the kernel still
        writes dirty pages back before close returns, see fuse_flush)."""
        raise FUSEError(errno.ENOSYS)

    @_handler
    def fsync(self, fh, datasync):
        """A turn mark's own fsync (a handle in ``mark_handles``) is answered at once:
        what the mark needs — every WRITE of the file in the daemon's hands — the
        kernel has waited for before sending FSYNC (``fuse_sync_writes``); the disk is
        no part of a mark, and syncing the store and the file made a mark with a
        writer held open wait for a busy disk (docs/benchmarks.md)."""
        if fh in self.mark_handles:
            return
        self.store.sync()            # the pre-images first (invariant 12)
        (os.fdatasync if datasync else os.fsync)(fh)
        self.stats["disk_syncs"] += 1

    @_handler
    def release(self, fh):
        node = self.handles.pop(fh)
        node.handles.discard(fh)
        self.sync_handles.discard(fh)
        self.mark_handles.discard(fh)
        self.writers.discard(fh)
        self.pt_writers.discard(fh)
        os.close(fh)
        if IGNORE_FILE in node.paths:
            self.reload_rules()
        if node.nlookup <= 0 and not node.handles and node.ino in self.table.inodes:
            self.table.drop(node)

    # -- directories -----------------------------------------------------------------

    @_handler
    def opendir(self, inode, ctx):
        path = self._path(self.table[inode])
        if path == b"":
            dfd = os.open(b".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=self.root_fd)
        else:
            with self._parent(path) as (fd, name):
                dfd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | _OPEN_ADD, dir_fd=fd)
        try:
            names = [n for n in map(os.fsencode, os.listdir(dfd))
                     if not n.startswith(TMP_PREFIX)]    # a rewind's temp files
        except BaseException:
            os.close(dfd)
            raise
        fh = self._next_dir
        self._next_dir += 1
        self.dirs[fh] = (dfd, inode, names)
        return fh

    @_handler
    def readdir(self, fh, start_id, token):
        dfd, inode, names = self.dirs[fh]
        base = self._path(self.table[inode])
        for i in range(start_id, len(names)):
            try:
                st = os.stat(names[i], dir_fd=dfd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            path = child(base, names[i])
            node = self.table.known(path, st)
            if not _session.readdir_reply(token, names[i], self._attr(node, st), i + 1):
                if node.nlookup <= 0 and not node.handles:
                    self.table.drop(node)
                return
            node.nlookup += 1

    @_handler
    def releasedir(self, fh):
        dfd, _, _ = self.dirs.pop(fh)
        os.close(dfd)

    @_handler
    def fsyncdir(self, fh, datasync):
        self.store.sync()            # e.g. a rename's pre-images, before the rename is
        os.fsync(self.dirs[fh][0])   # made durable (invariant 12)

    # -- xattrs ------------------------------------------------------------------------

    _NOFOLLOW = {"follow_symlinks": False}

    @contextlib.contextmanager
    def _xpath(self, node):
        """``(target, kwargs)`` for the ``os.*xattr`` calls: the root by its fd, anything
        else as ``/proc/self/fd/<parent>/<name>`` without following a final symlink."""
        path = self._path(node)
        if path == b"":
            yield self.root_fd, {}
            return
        with self._parent(path) as (fd, name):
            yield b"/proc/self/fd/%d/%s" % (fd, name), self._NOFOLLOW

    @_handler
    def getxattr(self, inode, name, ctx):
        # The kernel asks for security.capability before every write(2) (file_remove_privs;
        # FUSE has no SB_NOSEC without handle_killpriv_v2, which pyfuse3 cannot request),
        # so this is a hot path: no context manager when the parent fd is cached.  With
        # HANDLE_KILLPRIV_V2 it still comes once per written file, and before every
        # chown (notify_change's ATTR_KILL_PRIV): a known absence is answered from the
        # node (``Inode.nocaps``), as the kernel caches attributes — only the daemon
        # adds xattrs to the tree while it is mounted (setxattr clears the flag; a
        # rewind's invalidation too).
        node = self.table[inode]
        if node.nocaps and name == _CAPS:
            raise FUSEError(pyfuse3.ENOATTR)
        path = self._path(node)
        head, _, base = path.rpartition(b"/")
        fd = self.table.dir_fd(head) if path else None
        try:
            if fd is not None:
                return os.getxattr(b"/proc/self/fd/%d/%s" % (fd, base), name,
                                   follow_symlinks=False)
            with self._xpath(node) as (p, kw):
                return os.getxattr(p, name, **kw)
        except OSError as exc:
            if exc.errno == errno.ENODATA:
                if name == _CAPS:
                    node.nocaps = True
                raise FUSEError(pyfuse3.ENOATTR) from None
            raise

    @_handler
    def listxattr(self, inode, ctx):
        with self._xpath(self.table[inode]) as (p, kw):
            return [os.fsencode(n) for n in os.listxattr(p, **kw)]

    @_handler
    def setxattr(self, inode, name, value, ctx):
        node = self.table[inode]
        node.nocaps = False
        self._saw_node(ctx, node)
        if self.busy:
            self._refuse_busy_node(node)
        self._guard_node(node)
        with self._xpath(node) as (p, kw):
            os.setxattr(p, name, value, 0, **kw)

    @_handler
    def removexattr(self, inode, name, ctx):
        node = self.table[inode]
        node.nocaps = False
        self._saw_node(ctx, node)
        if self.busy:
            self._refuse_busy_node(node)
        self._guard_node(node)
        with self._xpath(node) as (p, kw):
            try:
                os.removexattr(p, name, **kw)
            except OSError as exc:
                if exc.errno == errno.ENODATA:
                    raise FUSEError(pyfuse3.ENOATTR) from None
                raise

    # -- write fences for the restore engine -----------------------------------------

    def fence_writes(self, key: tuple[int, int]) -> bool:
        """Fence real inode ``key`` (dev, ino) against writers, if none can write now.

        True: no open handle can write to it, and until ``unfence_writes(key)`` every
        new way to write through the mount — ``open`` for writing or with ``O_TRUNC``,
        ``create`` of an existing name, a truncate without a handle — is answered
        ``EBUSY`` while a name resolves to that inode.  False: a writable handle is open
        (or a mapping keeps one); nothing is fenced.  The restore engine fences an inode
        it adopts as a blob until the inode has no workspace name left
        (``rewind.adopt``).  Runs on the trio thread, like every handler, so no
        request interleaves with the check."""
        for fd in self.writers:
            if _key_of(os.fstat(fd)) == key:
                return False
        self.fenced.add(key)
        return True

    def writers_open(self) -> bool:
        """True if some open handle can write.  With the writeback cache only such a
        file can have dirty pages in the kernel: ``close`` (and the release of the last
        reference, e.g. after ``munmap``) writes them back before it returns, so with
        no writer open a turn mark has nothing to flush."""
        return bool(self.writers)

    def writer_paths(self) -> list[bytes]:
        """A name of each file open for writing, relative to the root: the files whose
        WRITEs a turn mark waits for (``Daemon.flush_writes``)."""
        names = (self.handles[fh].path for fh in self.writers
                 if fh in self.handles and self.handles[fh].paths)
        return list(dict.fromkeys(names))

    @contextlib.contextmanager
    def flushing_writes(self):
        """Around a turn mark's fsyncs through the mount from the calling thread
        (``Daemon.flush_writes``): the handles that thread opens meanwhile are the
        mark's own (``fsync``).  Requests name their caller by thread id, which no
        other task can have while this one lives."""
        me = threading.get_native_id()
        self.mark_flushers.add(me)
        try:
            yield
        finally:
            self.mark_flushers.discard(me)

    def unfence_writes(self, key: tuple[int, int]) -> None:
        self.fenced.discard(key)

    def _refuse_fenced(self, path: bytes) -> None:
        try:
            st = self._lstat(path)
        except OSError:
            return
        if _key_of(st) in self.fenced:
            raise FUSEError(errno.EBUSY)

    # -- the fence of a running rewind -----------------------------------------------

    def fence_rewind(self, entries) -> list[bytes]:
        """Fence every path of a rewind's plan until ``unfence_rewind`` (DESIGN
        invariant 14: a write the landing would overwrite is refused, never acknowledged
        and then destroyed).  ``entries``: ``(path, (dev, ino) or None)`` — the inode
        each path names now, looked up by the caller (the restore engine's worker, with
        its own dir fds: the trio thread only does set work here).  Returns the paths
        left out: those open for writing through the mount now — by that name, or by
        another name of that inode — because with the writeback cache their writes may
        still be on their way, and land in that inode whatever name it has; the rewind
        must leave those alone.

        Meanwhile, through the mount: ``open`` for writing or with ``O_TRUNC``,
        ``truncate``, ``chmod``/``chown``/``utimes``, ``setxattr``/``removexattr`` of an
        inode a fenced path named, and ``link`` to it; ``create``/``mknod``/``mkdir``/
        ``symlink``/``link``/``unlink`` of a fenced name; ``rename`` from or to, and
        ``rmdir`` of, a fenced path or any directory above one (the directories being
        landed into) — all answer ``EBUSY``.  Reads, and changes elsewhere, go on.
        Runs on the trio thread, like every handler: no request interleaves."""
        wkeys, wnames = set(), set()
        for fd in self.writers:
            wkeys.add(_key_of(os.fstat(fd)))
            wnames.update(self.handles[fd].paths)
        held = []
        for path, key in entries:
            if path in wnames or key in wkeys:
                held.append(path)
                continue
            if key is not None:
                self.busy_keys.add(key)
            self.busy.add(path)
            head = path.rpartition(b"/")[0]
            while head and head not in self.busy_dirs:
                self.busy_dirs.add(head)
                head = head.rpartition(b"/")[0]
        return held

    def unfence_rewind(self) -> None:
        self.busy.clear()
        self.busy_dirs.clear()
        self.busy_keys.clear()

    def _refuse_busy_node(self, node) -> None:
        if node.key in self.busy_keys or any(p in self.busy for p in node.paths):
            raise FUSEError(errno.EBUSY)

    def _refuse_busy_tree(self, path: bytes) -> None:
        if path in self.busy or path in self.busy_dirs:
            raise FUSEError(errno.EBUSY)

    # -- cache invalidation for the restore engine ----------------------------------

    def invalidate(self, relpath: bytes) -> None:
        """Forget kernel caches for *relpath*: its inode (attrs + data), its entry, and
        its parent's attributes.  Call on the trio thread after the real path changed
        behind the kernel's back.  Never blocks (``fs.notify``); the table drops the name
        if it now names another inode.  ``invalidations_settled()`` waits for delivery.
        """
        self.invalidate_many([relpath])

    def invalidate_many(self, relpaths) -> None:
        """``invalidate`` of each path; a parent's attributes are dropped once per call,
        not once per child (a rewind landing 1,000 files in a directory).  Each path
        stands alone: one that cannot be looked at never costs the others theirs (a
        batch that raised used to be dropped whole, and with it the parent's entry)."""
        parents: dict[int, None] = {}
        relpaths = list(relpaths)
        # The restore engine changed names behind the handlers: walk again when needed.
        self.links = InodeIndex(self.root_fd, self.rules)
        if IGNORE_FILE in relpaths:     # a rewind put another .rewindignore back
            self.reload_rules()
        for relpath in relpaths:
            try:
                self._invalidate_one(relpath, parents)
            except Exception:
                log.exception("cache invalidation of %r failed", relpath)
        for ino in parents:
            # not only the attributes: with NO_OPENDIR the kernel may cache a directory's
            # listing as its "data", and a landing changed the listing behind it
            self.notifier.inode(ino)

    def _invalidate_one(self, relpath: bytes, parents: dict) -> None:
        head, name = split(relpath)
        node = self.table.by_path.get(relpath)
        # Below a directory the landing replaced by a symlink (npm link, a redo), a path
        # has no entry any more: ``PathEscape``, not an OSError — gone all the same.
        st = self._lstat_or_none(relpath)
        if node is not None:
            if st is None or not node.names(st):
                self.table.unbind(relpath, gone=len(node.paths) <= 1)
            node.changed_behind()
            self.notifier.inode(node.ino)
        twin = self.table.by_key.get(_key_of(st)) if st is not None else None
        if twin is not None and (twin is not node or len(twin.paths) > 1):
            # A hard link the kernel knows by other names: its attributes (times,
            # mode, link count) changed with this one.  Those entries go too: with
            # the writeback cache the kernel keeps a cached inode's mtime over what
            # getattr says, and an inode no entry (or open file) holds is dropped.
            twin.changed_behind()
            if twin is not node:
                self.notifier.inode(twin.ino)
            for other in [p for p in twin.paths if p != relpath]:
                above, base = split(other)
                up = self.table.by_path.get(above)
                if up is not None:
                    self.notifier.entry(up.ino, base)
        parent = self.table.by_path.get(head)
        if parent is not None and relpath:
            self.notifier.entry(parent.ino, name)
            parents[parent.ino] = None

    async def invalidations_settled(self) -> None:
        """Wait (without blocking trio) until queued invalidations reached the kernel."""
        await self.notifier.settled()

    def close(self) -> None:
        """Stop the notification thread and close every open fd (after unmount)."""
        self.notifier.close()
        for fd in list(self.handles):
            os.close(fd)
        for dfd, _, _ in self.dirs.values():
            os.close(dfd)
        self.handles.clear()
        self.dirs.clear()

    def statistics(self) -> dict:
        sess = _session.active()
        return {"epoch": self.epoch_id, "captured": len(self.captured),
                "writeback": self.enable_writeback_cache, "passthrough": self.passthrough,
                "session": sess.name if sess is not None else None,
                "fuse_flags": sess.flags if sess is not None else 0,
                "requests": sess.request_counts() if sess is not None else {},
                "request_ns": sess.request_times() if sess is not None else {},
                "spins": sess.spin_counts() if hasattr(sess, "spin_counts") else {},
                # requests served by each FUSE-over-io_uring queue (None: /dev/fuse only)
                "uring_queues": sess.uring_counts() if hasattr(sess, "uring_counts") else None,
                # ... and of those, the ones that waited for the trio thread's lock
                "uring_waits": sess.uring_waits() if hasattr(sess, "uring_waits") else None,
                "store_syncs": self.store.statistics()["durability"]["syncs"],
                "open_files": len(self.handles), **self.stats, **self.table.statistics()}


def _kill_suidgid(fd: int) -> bool:
    """Drop set-user-ID, and set-group-ID if group-executable, as the VFS does for a
    write or truncate by a caller without ``CAP_FSETID`` (``security.capability`` the
    real filesystem removes itself on our write or truncate, whoever we are).  True if
    a bit was dropped."""
    mode = os.fstat(fd).st_mode
    kill = _setid_bits(mode)
    if kill:
        os.fchmod(fd, stat.S_IMODE(mode) & ~kill)
        return True
    return False


def _setid_bits(mode: int) -> int:
    """The set-id bits of *mode* a write or truncate by a caller without ``CAP_FSETID``
    drops: set-user-ID, and set-group-ID only if group-executable (else it marks
    mandatory locking, which stays)."""
    return mode & (stat.S_ISUID | (stat.S_ISGID if mode & stat.S_IXGRP else 0))


def _key_of(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino

"""The daemon: mount over the workspace, serve FUSE and the control socket, unmount.

Order of a mount (each step fails with a typed error and undoes the earlier ones):
validate the directory → refuse if already mounted / stale → open the store and the
workspace id → open the workspace's root fd (*before* mounting over it) → finish an
interrupted rewind from its intent → bind the control socket → ``session.mount`` (the
mount) → report ready → trio loop.  The loop runs until ``unmount`` arrives on the
socket, SIGINT/SIGTERM, or the kernel ends the session (``fusermount3 -u``); then the
mount is removed (``session.unmount``), the socket unlinked, the store closed.

Concurrency: one trio thread runs every FUSE handler and every control request;
see docs/concurrency.md.

Errors never unmount.  The daemon ends only when asked to (``unmount``, a signal) or
when the kernel ends the session; a failure anywhere else — ``accept()`` out of fds, a
control connection's bug, an exception escaping pyfuse3's loop — is logged, costs at
most the one request or client it hit, and the loops go on (docs/reliability.md,
"File descriptors").
"""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import sys

import trio

from rewindfs.store import Store
from rewindfs.store._errors import RewindfsError, StoreFull

from rewindfs.overlay import errors
from rewindfs.overlay.control import server
from rewindfs.overlay.control.autopush import Pushers, final_bound_s
from rewindfs.overlay.control.handoff import Handoff
from rewindfs.overlay.errors import AlreadyMounted, MountFailed, StaleMount
from rewindfs.overlay.fs import session
from rewindfs.overlay.fs.ops import RewindOperations
from rewindfs.overlay.places import (check_workspace, control_socket_path, ensure_runtime_dir,
                                     find_rewindfs_mount, is_inside, lazy_unmount,
                                     mount_table, resolve_store_path, rewindfs_mount_at)
from rewindfs.overlay.rewind import engine
from rewindfs.overlay.tree import syscalls
from rewindfs.overlay.tree.fdbudget import EXHAUSTED, raise_soft_limit

log = logging.getLogger(__name__)

__all__ = ["DaemonContext", "serve_mount"]



class DaemonContext:
    """What control-socket handlers get as ``ctx`` (a ``control.host.DaemonHost``, and
    its own ``LiveMount``: ``live`` is itself).

    ``store``, ``ws`` (workspace id), ``root_fd``, ``workspace_path`` (real path, bytes),
    ``socket_path``, ``fs`` (the ``RewindOperations``).  ``invalidate(relpath)`` and
    ``epoch_changed()`` may be called from the trio thread or from a worker thread
    started with ``trio.to_thread`` (they hop to the trio thread themselves).

    ``mutation_lock`` is owned here, one per daemon: turn marks, rewinds, redos, gc and
    the opening of a ``show`` take it, so no turn mark closes an epoch under a running
    rewind.
    """

    def __init__(self, *, store, ws, root_fd, workspace_path, socket_path, fs, auto=None,
                 mount_dev=None):
        self.mount_dev = mount_dev      # the mount's st_dev: _mount_dev
        self.store = store
        self.ws = ws
        self.root_fd = root_fd
        self.workspace_path = workspace_path
        self.socket_path = socket_path
        self.fs = fs
        self.live = self
        self.mutation_lock = trio.Lock()
        self.busy_with: str | None = None   # the long work under mutation_lock, if any
        self.requests_running = 0           # control requests being served now
        self.shutdown = trio.Event()
        self.unmount_pending = False
        self._real_dev = os.fstat(root_fd).st_dev
        self._handoff = None  # set by _run, once trio runs
        self.pushers = Pushers(self, auto)   # mount --auto NAME: auto = NAME

    def _on_trio(self, fn, *args):
        if trio.lowlevel.in_trio_run():
            return fn(*args)
        return trio.from_thread.run_sync(fn, *args)

    def invalidate(self, relpath: bytes) -> None:
        """Drop kernel caches for *relpath* (its inode and its entry in the parent);
        queued, never blocks — also from a worker thread, where a blocking hop to the
        trio thread per path cost a rewind of 3,000 files a fifth of its time.  From a
        worker the paths travel in batches (``Handoff``: one wake-up of the trio thread
        per burst, not per path); its FIFO contract means that once
        ``to_thread.run_sync`` returns, every path the worker queued has reached
        ``fs.invalidate_many``; ``await invalidations_settled()`` then waits for the
        kernel notifications themselves."""
        if self._handoff is None or trio.lowlevel.in_trio_run():
            self._on_trio(self.fs.invalidate, relpath)
        else:
            self._handoff.put(relpath)

    async def invalidations_settled(self) -> None:
        await self.fs.invalidations_settled()

    def epoch_changed(self) -> None:
        """The store's current epoch changed outside the fs (e.g. a rewind began/ended):
        reload it and restart the "already captured" set."""
        self._on_trio(self.fs.epoch_changed)

    def fence_writes(self, key: tuple[int, int]) -> bool:
        """``RewindOperations.fence_writes`` from any thread (the restore engine's
        worker hops to the trio thread, where no request runs meanwhile)."""
        return self._on_trio(self.fs.fence_writes, key)

    def unfence_writes(self, key: tuple[int, int]) -> None:
        self._on_trio(self.fs.unfence_writes, key)

    def fence_rewind(self, entries) -> list[bytes]:
        """``RewindOperations.fence_rewind`` from the restore engine's worker thread."""
        return self._on_trio(self.fs.fence_rewind, entries)

    def unfence_rewind(self) -> None:
        self._on_trio(self.fs.unfence_rewind)

    def ignore_rules(self):
        """The rules of ``.rewindignore`` now (the last valid ones: the person's last
        word, though capture waits for the next epoch to exempt what a new rule
        adds), which a rewind restores by with the point's; one reference read, safe
        from the restore engine's worker thread (``reload_rules`` swaps it whole)."""
        return self.fs.file_rules

    def request_unmount(self) -> None:
        self.unmount_pending = True

    async def flush_writes(self) -> None:
        """Push the kernel's dirty pages of this mount to the daemon (writeback cache),
        so a turn boundary splits writes at the moment it is requested — only if a file
        is open for writing (``fs.writers_open``): a closed file's pages were written
        back at its last close.  The store is not flushed here: a boundary becomes
        durable through ``_sync_store`` within ``_FLUSH_EVERY_S``, or earlier through
        any fsync that depends on it (docs/store.md "Durability").  Over io_uring it
        first waits for the requests already handed to the queues (``session.settle``)."""
        # over io_uring, first the requests already handed out (a RELEASE sent before
        # the mark was asked must not leave its file looking open for writing at it)
        await session.settle()
        path = self.workspace_path
        if not (self.fs.enable_writeback_cache and self.fs.writers_open()):
            return
        writing = self.fs.writer_paths()

        def sync():
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                syscalls.syncfs(fd)
                # syncfs waits for the pages it wrote back, but FUSE may end a page's
                # writeback before its WRITE has reached us; only fsync waits for those
                # (fuse_sync_writes).  Without it a write(2) that returned before the
                # mark was asked could land in the next turn (test_rel_markrace).
                with self.fs.flushing_writes():
                    for rel in writing:
                        _fdatasync_at(fd, rel)
            finally:
                os.close(fd)

        for attempt in (1, 2):
            try:
                await trio.to_thread.run_sync(sync)
                return
            except OSError as exc:
                if exc.errno not in EXHAUSTED:
                    log.warning("syncfs on the mount failed: %s", exc)
                    return
                if attempt == 2 or not self.fs.table.shed():
                    # without the flush, dirty pages could cross the turn boundary:
                    # refuse this mark rather than misattribute writes
                    raise errors.FdExhausted() from None

    async def bypass_processes(self) -> list[int]:
        """Pids whose cwd is inside the bare directory under the mount (their writes
        bypass capture).  Runs in a thread: stat-ing a cwd inside our own mount would
        otherwise wait on ourselves."""
        return await trio.to_thread.run_sync(_bypass_pids, self.workspace_path, self._real_dev)


def _fdatasync_at(dir_fd: int, rel: bytes) -> None:
    """``fdatasync`` of *rel* through the mount, if it is still a regular file there (a
    name renamed or removed meanwhile is skipped: syncfs pushed its pages).  Out of fds
    it raises, for ``flush_writes`` to shed and retry or refuse the mark."""
    try:
        fd = os.open(rel, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY
                     | os.O_CLOEXEC, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in EXHAUSTED:
            raise
        return
    try:
        if stat.S_ISREG(os.fstat(fd).st_mode):
            os.fdatasync(fd)
    except OSError as exc:
        log.warning("fdatasync of %r at a turn mark failed: %s", rel, exc)
    finally:
        os.close(fd)


def _bypass_pids(ws: bytes, real_dev: int) -> list[int]:
    out = []
    me = os.getpid()
    for name in os.listdir(b"/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            cwd = os.readlink(b"/proc/%s/cwd" % name)
            if not is_inside(cwd, ws):
                continue
            if os.stat(b"/proc/%s/cwd" % name).st_dev == real_dev:
                out.append(int(name))
        except OSError:
            continue
    return sorted(out)


# -- mount table -----------------------------------------------------------------------

# -- main loop --------------------------------------------------------------------------

_FLUSH_EVERY_S = 0.25


async def _sync_store(ctx) -> None:
    """Make the store's commits durable in the background, in a worker thread, within
    ``_FLUSH_EVERY_S`` of being committed.  Turn boundaries rely on it (a mark under a
    heavy write load would otherwise wait 1–40 ms for the disk inside its round trip),
    and it narrows the window in which a change nobody fsynced can reach the disk
    before its pre-image to a quarter second, below ext4's 5 s commit interval
    (docs/store.md "Durability").  Checking costs a lock and two integer reads."""
    while True:
        await trio.sleep(_FLUSH_EVERY_S)
        if not ctx.store.has_unsynced():
            continue
        try:
            await trio.to_thread.run_sync(ctx.store.sync)
        except Exception as exc:   # the next fsync through the mount reports it (EIO)
            log.warning("background sync of the store failed: %s", exc)


_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_early_signals: list[int] = []


def _note_early_signal(signum, _frame) -> None:
    """A stop signal between the mount and trio's receiver: noted, acted on at once
    by ``_run`` (the default action would kill the daemon and leave a stale mount)."""
    _early_signals.append(signum)


async def _signals(ctx, sigs) -> None:
    async for signum in sigs:
        log.info("signal %d: unmounting", signum)
        ctx.shutdown.set()


async def _run(ctx, listener) -> None:
    ctx._handoff = Handoff(trio.lowlevel.current_trio_token(), ctx.fs.invalidate_many)
    # The receiver opens before any task runs: the mount already answers requests,
    # and a request served before a later-scheduled task opened it left a window in
    # which SIGTERM killed the daemon (seen with the kernel session).
    with trio.open_signal_receiver(*_STOP_SIGNALS) as sigs:
        if _early_signals:
            log.info("signal %d before serving: unmounting", _early_signals[0])
            ctx.shutdown.set()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(session.serve, ctx.shutdown.set)
            nursery.start_soon(server.serve_control, ctx, listener)
            nursery.start_soon(_signals, ctx, sigs)
            nursery.start_soon(_sync_store, ctx)
            nursery.start_soon(ctx.pushers.serve)
            await ctx.shutdown.wait()
            await ctx.pushers.finish(final_bound_s())   # done already after `unmount`
            await _answer_running_requests(ctx)
            nursery.cancel_scope.cancel()


_ANSWER_GRACE_S = 10.0


async def _answer_running_requests(ctx) -> None:
    """Before the daemon stops: a rewind, redo, gc or turn mark under way finishes
    (its worker thread runs to the end whatever happens: only its answer could be
    lost, and a person would not know whether the rewind happened), then the requests
    being served get up to ``_ANSWER_GRACE_S`` to send their answers.  New requests are
    refused meanwhile (``DaemonStopping``, control.server)."""
    async with ctx.mutation_lock:
        pass
    with trio.move_on_after(_ANSWER_GRACE_S):
        while ctx.requests_running:
            await trio.sleep(0.01)


def _recover_intent(root_fd: int, store, ws: int) -> None:
    if not store.get_intent(ws):
        return
    log.info("finishing an interrupted rewind")
    engine.recover(root_fd, store, ws)


def _begin_mount(store, ws: int, label: str) -> None:
    """The tree as mounted is a point (docs/history.md) — unless the store's disk is
    full: then the mount serves in the epoch it found, as before mounts began at a
    point, and every change fails closed with ENOSPC until space is freed (refusing
    the mount would leave the person to work in the bare directory, unprotected)."""
    try:
        store.begin_mount(ws, label)
    except StoreFull as exc:
        log.warning("the store is full (%s): serving in the open epoch, every change "
                    "fails with ENOSPC until space is freed", exc)


def serve_mount(dir_path, store_path=None, *, recover: bool = False, ready=None,
                writeback: bool = False, session_kind: str | None = None,
                auto: str | None = None, label: str = "") -> int:
    """Mount the workspace and serve it until unmounted; returns 0 after a clean unmount.

    ``ready()`` is called once the mount is live (before the loop starts).  Errors before
    that raise ``RewindfsError`` subclasses and leave nothing mounted.  *session_kind*:
    the FUSE session layer (``fs.session.choose``: ``kernel`` or ``libfuse``).  *auto*:
    the remote pushed to in the background after every turn end (``mount --auto``;
    checked before mounting: ``UnknownRemote``).  *label*: the epoch the mount starts
    is labelled so (``rewindfs run``: its command; ``Store.begin_mount``).
    """
    session_kind = session.choose(session_kind)
    raise_soft_limit()   # every fd cache takes a share of it: _fdbudget
    store_path = resolve_store_path(store_path)
    try:
        real = check_workspace(dir_path, store_path)
    except StaleMount:
        if not recover:
            raise
        log.info("detaching the stale mount at %s", os.fsdecode(dir_path))
        lazy_unmount(os.path.realpath(os.fsencode(dir_path)))
        real = check_workspace(dir_path, store_path)
    if find_rewindfs_mount(real):
        raise AlreadyMounted(path=os.fsdecode(real))
    # before anything is written (store, intent recovery, socket): a squatted runtime
    # directory stops the mount here
    ensure_runtime_dir(os.path.dirname(control_socket_path(store_path, real)))
    with Store.open(store_path) as store:
        if auto is not None:
            store.remote(auto)       # an unknown name: refused before anything is mounted
        ws = store.workspace(real)
        root_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return _serve(store, ws, root_fd, real, store_path, ready, writeback,
                          session_kind, auto, label)
        finally:
            os.close(root_fd)


def _preload(real: bytes, auto=None) -> None:
    """Import now whatever might be imported later, and drop import paths inside the
    workspace: once mounted, an import that stats a path in our own mount from the trio
    thread (or before the kernel's INIT is answered) would wait on ourselves forever."""
    for name in ("encodings.idna", "rich.console", "rich.markup"):   # ours: imported above
        __import__(name)
    if auto is not None:     # the pusher's S3 client, imported in a worker thread else
        __import__("boto3")
    keep = []
    for entry in sys.path:
        full = os.path.realpath(os.fsencode(entry or os.getcwd()))
        if not is_inside(full, real):
            keep.append(os.path.abspath(entry) if entry else os.getcwd())
    sys.path[:] = keep
    sys.path_importer_cache.clear()


def writeback_default() -> bool:
    """The kernel's writeback cache is on unless ``REWINDFS_WRITEBACK=0`` (measured in
    docs/benchmarks.md; why it keeps write-ahead and fail-closed: docs/concurrency.md)
    — where the kernel session does not get passthrough instead (``fs.session``)."""
    return os.environ.get("REWINDFS_WRITEBACK", "1") != "0"


def _serve(store, ws, root_fd, real, store_path, ready, writeback, session_kind,
           auto=None, label="") -> int:
    writeback = writeback or writeback_default()
    _recover_intent(root_fd, store, ws)
    _begin_mount(store, ws, label)
    _preload(real, auto)
    sock_path = control_socket_path(store_path, real)
    listener = server.bind_socket(sock_path, real)
    try:
        os.umask(0)  # modes come from the caller, already masked by the kernel
        os.chdir("/")  # never keep our own mount (or the bare dir) busy
        fs = RewindOperations(root_fd, store, ws, writeback=writeback)
        for signum in _STOP_SIGNALS:      # from the mount on, a stop signal unmounts
            signal.signal(signum, _note_early_signal)
        try:
            session.mount(fs, real, session_kind)
        except RuntimeError as exc:
            raise MountFailed(path=os.fsdecode(real), reason=str(exc)) from None
        dev = _mount_dev(real)
        try:
            ctx = DaemonContext(store=store, ws=ws, root_fd=root_fd, workspace_path=real,
                                socket_path=sock_path, fs=fs, auto=auto, mount_dev=dev)
            log.info("mounted %s (workspace %d, epoch %d, %s session)", os.fsdecode(real), ws,
                     fs.epoch_id, session_kind)
            if ready is not None:
                ready()
            trio.run(_run, ctx, listener)
        finally:
            _detach_if_moved(dev, real)
            session.unmount()
            fs.close()
            log.info("unmounted %s", os.fsdecode(real))
    finally:
        listener.close()
        try:
            os.unlink(sock_path)
        except FileNotFoundError:
            pass
    return 0


def _mount_dev(real: bytes) -> int | None:
    """Our mount's device number, read from the mount table (a stat of our own mount
    from this thread would wait on ourselves): a client finds this daemon by it once
    the workspace was moved while mounted (its parent renamed), when the socket named
    after the path it has now does not exist (``cli.mount.moved_daemon``)."""
    mnt = rewindfs_mount_at(real)
    return mnt.dev if mnt is not None else None


def _detach_if_moved(dev: int | None, real: bytes) -> None:
    """A workspace moved while mounted: the session would unmount the path it was
    mounted at, where nothing is now, and leave the mount where it went, dead.  It is
    detached where it is (lazily, as the session's own unmount is)."""
    if dev is None:
        return
    for mnt in mount_table():
        if mnt.dev == dev and mnt.fstype == b"fuse.rewindfs" and mnt.point != real:
            log.info("the workspace moved to %s while mounted; detaching it there",
                     os.fsdecode(mnt.point))
            lazy_unmount(mnt.point)


def error_line(exc: BaseException) -> bytes:
    """How a forked daemon reports a startup failure to its parent (one JSON line)."""
    if isinstance(exc, RewindfsError):
        err = exc.to_dict()
    else:
        err = {"code": "mount-failed", "message": f"{type(exc).__name__}: {exc}"}
    return json.dumps(err).encode() + b"\n"

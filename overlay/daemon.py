"""The daemon: mount over the workspace, serve FUSE and the control socket, unmount.

Order of a mount (each step fails with a typed error and undoes the earlier ones):
validate the directory → refuse if already mounted / stale → open the store and the
workspace id → open the workspace's root fd (*before* mounting over it) → finish an
interrupted rewind from its intent → bind the control socket → ``pyfuse3.init`` (the
mount) → report ready → trio loop.  The loop runs until ``unmount`` arrives on the
socket, SIGINT/SIGTERM, or the kernel ends the session (``fusermount3 -u``); then the
mount is removed (``pyfuse3.close(unmount=True)``), the socket unlinked, the store closed.

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
import socket
import subprocess
import sys
import time

import pyfuse3
import trio

from rewindfs.store._errors import RewindfsError

from rewindfs.overlay import errors
from rewindfs.overlay.fs import session
from rewindfs.overlay.control import wire
from rewindfs.overlay.tree import syscalls
from rewindfs.overlay.tree.fdbudget import EXHAUSTED, raise_soft_limit
from rewindfs.overlay.fs.ops import RewindOperations
from rewindfs.overlay.control.handoff import Handoff
from rewindfs.overlay.places import (check_workspace, control_socket_path,
                                     ensure_runtime_dir, is_inside, peer_uid,
                                     resolve_store_path)
from rewindfs.overlay.errors import AlreadyMounted, MountFailed, StaleMount

log = logging.getLogger(__name__)

__all__ = ["DaemonContext", "find_rewindfs_mount", "lazy_unmount", "serve_mount"]

_LISTEN_BACKLOG = 128


class DaemonContext:
    """What control-socket handlers get as ``ctx``.

    ``store``, ``ws`` (workspace id), ``root_fd``, ``workspace_path`` (real path, bytes),
    ``socket_path``, ``fs`` (the ``RewindOperations``).  ``invalidate(relpath)`` and
    ``epoch_changed()`` may be called from the trio thread or from a worker thread
    started with ``trio.to_thread`` (they hop to the trio thread themselves).
    """

    def __init__(self, *, store, ws, root_fd, workspace_path, socket_path, fs):
        self.store = store
        self.ws = ws
        self.root_fd = root_fd
        self.workspace_path = workspace_path
        self.socket_path = socket_path
        self.fs = fs
        self.shutdown = trio.Event()
        self._unmount_pending = False
        self._real_dev = os.fstat(root_fd).st_dev
        self._handoff = None  # set by _run, once trio runs

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

    def request_unmount(self) -> None:
        self._unmount_pending = True

    async def flush_writes(self) -> None:
        """Push the kernel's dirty pages of this mount to the daemon (writeback cache),
        so a turn boundary splits writes at the moment it is requested — only if a file
        is open for writing (``fs.writers_open``): a closed file's pages were written
        back at its last close.  The store is not flushed here: a boundary becomes
        durable through ``_sync_store`` within ``_FLUSH_EVERY_S``, or earlier through
        any fsync that depends on it (docs/store.md "Durability")."""
        path = self.workspace_path
        if not (self.fs.enable_writeback_cache and self.fs.writers_open()):
            return

        def sync():
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                syscalls.syncfs(fd)
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

def _unescape(field: bytes) -> bytes:
    out, i = bytearray(), 0
    while i < len(field):
        if field[i:i + 1] == b"\\" and field[i + 1:i + 4].isdigit():
            out.append(int(field[i + 1:i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


def find_rewindfs_mount(real_path: bytes) -> bool:
    """True if /proc/self/mountinfo lists a ``fuse.rewindfs`` mount at *real_path*."""
    with open("/proc/self/mountinfo", "rb") as f:
        for line in f:
            left, _, right = line.partition(b" - ")
            fields = left.split()
            if len(fields) > 4 and _unescape(fields[4]) == real_path:
                if right.split(b" ", 1)[0] == b"fuse.rewindfs":
                    return True
    return False


def lazy_unmount(path) -> None:
    """Detach a (stale) FUSE mount: ``fusermount3 -uz``."""
    subprocess.run(["fusermount3", "-uz", os.fsdecode(path)], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


# -- control socket --------------------------------------------------------------------

def _bind_socket(sock_path: bytes, workspace: bytes) -> socket.socket:
    """Bind the 0600 control socket in the verified runtime directory
    (``ensure_runtime_dir``); refuse if a live daemon already answers on it.  ``bind``
    never follows a symlink and fails on any existing name (exclusive creation)."""
    ensure_runtime_dir(os.path.dirname(sock_path))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(sock_path)
    except OSError:
        try:
            os.unlink(sock_path)  # left by a dead daemon
        except FileNotFoundError:
            pass
    else:
        raise AlreadyMounted(path=os.fsdecode(workspace))
    finally:
        probe.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(sock_path)
    finally:
        os.umask(old)
    os.chmod(sock_path, 0o600)
    sock.listen(_LISTEN_BACKLOG)
    return sock


async def _serve_connection(ctx, stream: trio.SocketStream) -> None:
    """One client, until it hangs up.  Nothing raised here may end the daemon: a bug
    in serving one connection closes that connection and is logged."""
    async with stream:
        try:
            uid = peer_uid(stream.socket)
            if uid not in (os.getuid(), 0):
                log.warning("refused control connection from uid %d", uid)
                await stream.send_all(wire.reply_error(None, errors.Forbidden(uid=uid)))
                return
            await _read_requests(ctx, stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        except Exception:
            log.exception("control connection failed; closed it")


async def _read_requests(ctx, stream) -> None:
    lines = wire.LineBuffer()   # linear: each byte searched for a newline once
    skipping = False  # inside an oversized line: drop bytes up to its newline
    while True:
        data = await stream.receive_some(65536)
        if not data:
            return
        lines.feed(data)
        while (line := lines.next_line()) is not None:
            if skipping:
                skipping = False
                continue
            if len(line) > wire.MAX_LINE:
                await stream.send_all(wire.reply_error(None, errors.TooLarge()))
                continue
            if not line.strip():
                continue
            await wire.dispatch(ctx, line, stream.send_all)
            if ctx._unmount_pending:
                ctx.shutdown.set()
        if lines.pending() > wire.MAX_LINE:
            if not skipping:
                await stream.send_all(wire.reply_error(None, errors.TooLarge()))
            skipping = True
            lines.clear()


_BACKOFF_S = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0)


async def serve_control(ctx, listener: socket.socket) -> None:
    """Accept control connections until cancelled; each runs in its own task.

    ``accept()`` out of fds (``EMFILE``/``ENFILE``) never ends this loop: the inode
    table's cached fds are shed and the accept retried; if that frees nothing, a reserve
    fd kept for this moment is closed so the waiting client can be accepted and told
    ``fd-exhausted`` (instead of hanging in the backlog), then the reserve is reopened.
    Other accept errors (and a reserve that cannot be had) back off and retry.
    """
    tsock = trio.socket.from_stdlib_socket(listener)
    reserve = _reserve_fd()
    failures = 0
    async with trio.open_nursery() as nursery:
        while True:
            try:
                # wait first: accept() fails with EMFILE before it looks for a client,
                # so without the wait an exhausted daemon would spin here
                await trio.lowlevel.wait_readable(tsock)
                conn, _ = await tsock.accept()
                failures = 0
                nursery.start_soon(_serve_connection, ctx, trio.SocketStream(conn))
                continue
            except OSError as exc:
                if exc.errno in EXHAUSTED and ctx.fs.table.shed():
                    continue
                if exc.errno in EXHAUSTED and reserve is not None:
                    os.close(reserve)
                    reserve = None
                    _refuse_one(listener)
                    reserve = _reserve_fd()
                    continue
                log.warning("accept on the control socket failed: %s", exc)
            except Exception:
                log.exception("serving the control socket failed")
            delay = _BACKOFF_S[min(failures, len(_BACKOFF_S) - 1)]
            failures += 1
            await trio.sleep(delay)
            reserve = reserve if reserve is not None else _reserve_fd()


def _reserve_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


def _refuse_one(listener: socket.socket) -> None:
    """Accept one waiting client on the fd just freed, answer ``fd-exhausted``, close
    (never waits: no client waiting, nothing to do)."""
    try:
        raw, _ = listener.accept()
    except OSError:
        return
    log.warning("out of file descriptors: refused one control connection")
    with raw:
        try:
            raw.setblocking(False)
            raw.send(wire.reply_error(None, errors.FdExhausted()))
            raw.shutdown(socket.SHUT_WR)
            # read what the client sent already: closing on unread data resets the
            # connection (the client's next send fails; its read still gets the line)
            while raw.recv(65536):
                pass
        except OSError:
            pass


# -- main loop --------------------------------------------------------------------------

async def _fuse_main(ctx) -> None:
    """pyfuse3's request loop until the kernel ends the session.  An exception escaping
    it (a bug: handlers map their failures to errnos) is logged and the loop restarted
    after a pause; the request it came from goes unanswered, the mount stays."""
    if os.environ.get("REWINDFS_SLOWLOOP") is None:
        session.install()
    failures, last = 0, 0.0
    try:
        while True:
            try:
                # One reader task: handlers never await, so more would only add overhead.
                await pyfuse3.main(min_tasks=1, max_tasks=1)
                return
            except Exception:
                now = time.monotonic()
                failures = failures + 1 if now - last < 60 else 1
                last = now
                delay = _BACKOFF_S[min(failures - 1, len(_BACKOFF_S) - 1)]
                log.exception("the FUSE request loop failed; restarting it in %.2f s", delay)
                await trio.sleep(delay)
    finally:
        ctx.shutdown.set()  # the kernel ended the session (external unmount) or we did


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


async def _signals(ctx) -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as sigs:
        async for signum in sigs:
            log.info("signal %d: unmounting", signum)
            ctx.shutdown.set()


async def _run(ctx, listener) -> None:
    ctx._handoff = Handoff(trio.lowlevel.current_trio_token(), ctx.fs.invalidate_many)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_fuse_main, ctx)
        nursery.start_soon(serve_control, ctx, listener)
        nursery.start_soon(_signals, ctx)
        nursery.start_soon(_sync_store, ctx)
        await ctx.shutdown.wait()
        nursery.cancel_scope.cancel()


def _recover_intent(root_fd: int, store, ws: int) -> None:
    if not store.get_intent(ws):
        return
    try:
        from rewindfs.overlay.rewind import engine
    except ImportError:
        log.warning("an interrupted rewind is recorded but the restore engine is missing")
        return
    log.info("finishing an interrupted rewind")
    engine.recover(root_fd, store, ws)


def _mount_options() -> set[str]:
    opts = set(pyfuse3.default_options) | {"fsname=rewindfs", "subtype=rewindfs"}
    if os.geteuid() == 0:
        opts.add("allow_other")  # the workspace's owner may not be root
    return opts


def serve_mount(dir_path, store_path=None, *, recover: bool = False, ready=None,
                writeback: bool = False) -> int:
    """Mount the workspace and serve it until unmounted; returns 0 after a clean unmount.

    ``ready()`` is called once the mount is live (before the loop starts).  Errors before
    that raise ``RewindfsError`` subclasses and leave nothing mounted.
    """
    from rewindfs.store import Store

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
        ws = store.workspace(real)
        root_fd = os.open(real, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            return _serve(store, ws, root_fd, real, store_path, ready, writeback)
        finally:
            os.close(root_fd)


def _preload(real: bytes) -> None:
    """Import now whatever might be imported later, and drop import paths inside the
    workspace: once mounted, an import that stats a path in our own mount from the trio
    thread (or before the kernel's INIT is answered) would wait on ourselves forever."""
    for name in ("rewindfs.overlay.rewind.engine", "rewindfs.overlay.control.rewind_methods", "rewindfs.overlay.capture",
                 "encodings.idna", "rich.console", "rich.markup"):
        try:
            __import__(name)
        except ImportError:
            pass
    keep = []
    for entry in sys.path:
        full = os.path.realpath(os.fsencode(entry or os.getcwd()))
        if not is_inside(full, real):
            keep.append(os.path.abspath(entry) if entry else os.getcwd())
    sys.path[:] = keep
    sys.path_importer_cache.clear()


def writeback_default() -> bool:
    """The kernel's writeback cache is on unless ``REWINDFS_WRITEBACK=0`` (measured in
    docs/benchmarks.md; why it keeps write-ahead and fail-closed: docs/concurrency.md)."""
    return os.environ.get("REWINDFS_WRITEBACK", "1") != "0"


def _serve(store, ws, root_fd, real, store_path, ready, writeback) -> int:
    writeback = writeback or writeback_default()
    _recover_intent(root_fd, store, ws)
    _preload(real)
    sock_path = control_socket_path(store_path, real)
    listener = _bind_socket(sock_path, real)
    try:
        os.umask(0)  # modes come from the caller, already masked by the kernel
        os.chdir("/")  # never keep our own mount (or the bare dir) busy
        fs = RewindOperations(root_fd, store, ws, writeback=writeback)
        try:
            pyfuse3.init(fs, os.fsdecode(real), _mount_options())
        except RuntimeError as exc:
            raise MountFailed(path=os.fsdecode(real), reason=str(exc)) from None
        try:
            ctx = DaemonContext(store=store, ws=ws, root_fd=root_fd, workspace_path=real,
                                socket_path=sock_path, fs=fs)
            log.info("mounted %s (workspace %d, epoch %d)", os.fsdecode(real), ws, fs.epoch_id)
            if ready is not None:
                ready()
            trio.run(_run, ctx, listener)
        finally:
            pyfuse3.close(unmount=True)
            fs.close()
            log.info("unmounted %s", os.fsdecode(real))
    finally:
        listener.close()
        try:
            os.unlink(sock_path)
        except FileNotFoundError:
            pass
    return 0


def error_line(exc: BaseException) -> bytes:
    """How a forked daemon reports a startup failure to its parent (one JSON line)."""
    if isinstance(exc, RewindfsError):
        err = exc.to_dict()
    else:
        err = {"code": "mount-failed", "message": f"{type(exc).__name__}: {exc}"}
    return json.dumps(err).encode() + b"\n"

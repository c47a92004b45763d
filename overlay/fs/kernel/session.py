"""A FUSE session of our own: ``/dev/fuse`` read and written directly, no libfuse.

``KernelSession(ops, mountpoint, options)``: ``start()`` mounts and answers the
kernel's INIT (blocking, before anyone can touch the mount); ``serve(ended)`` is the
request loop on the trio thread; ``close()`` unmounts and closes the fd.  Requests
reach the very handlers the libfuse session calls (``fs.ops.RewindOperations``), with
pyfuse3's types — ``dispatch.Dispatcher`` does the translation.

The loop is lean on purpose (docs/benchmarks.md): the fd is non-blocking; one
``poll`` on it and on trio's own epoll fd waits for the next request (at once when one
is queued, else after polling without sleep for up to ``_SPIN_US`` at most ``_IDLE_MS``,
then the loop parks in ``trio.lowlevel.wait_readable``)
and says whether another task (the control socket, a worker thread's result) waits —
only then, or every ``_FAIR_EVERY`` requests for timers, does the loop pass a trio
checkpoint; the request is read with one ``readv`` into a reused buffer, dispatched to
the handler's plain-function twin, answered with one write.  Handlers never await (docs/concurrency.md), so one
request runs to completion before the next is read, as with the libfuse session.
"""

from __future__ import annotations

import errno
import logging
import os
import select
import time

import trio

from rewindfs.overlay.fs.fastwait import trio_internals
from rewindfs.overlay.fs.kernel import mounting, uring, wire
from rewindfs.overlay.fs.kernel.dispatch import Dispatcher, RingDispatcher

log = logging.getLogger(__name__)

__all__ = ["KernelSession", "SessionEnded"]

_FAIR_EVERY = 32
_IDLE_MS = 2          # the longest the loop waits for a request outside trio
_SPIN_US = 100        # how long the loop polls for the next request before sleeping
_GATHER_S = 0.02      # beside io_uring: how long forgets gather (_serve_beside_rings)
_OPCODE = wire.U32_PAIR     # (len, opcode): the first 8 bytes of a request
_MAX_PAGES = 256
_MAX_WRITE = _MAX_PAGES * 4096
_BUFSIZE = _MAX_WRITE + 4096          # the kernel wants room for max_write + headers

# What we ask for whenever the kernel offers it.  Flags we can do without (an older
# kernel): each one missing only costs speed, never behaviour.
_BASE = (wire.ASYNC_READ | wire.ATOMIC_O_TRUNC | wire.BIG_WRITES | wire.AUTO_INVAL_DATA
         | wire.DO_READDIRPLUS | wire.ASYNC_DIO | wire.PARALLEL_DIROPS | wire.MAX_PAGES
         | wire.INIT_EXT)

# Names for REWINDFS_FUSE_HIDE (tests: pretend an older kernel that lacks them).
FLAG_NAMES = {
    "killpriv_v2": wire.HANDLE_KILLPRIV_V2, "no_opendir": wire.NO_OPENDIR_SUPPORT,
    "readdirplus_auto": wire.READDIRPLUS_AUTO, "passthrough": wire.PASSTHROUGH,
    "writeback_cache": wire.WRITEBACK_CACHE, "max_pages": wire.MAX_PAGES,
    "init_ext": wire.INIT_EXT, "readdirplus": wire.DO_READDIRPLUS,
    "atomic_o_trunc": wire.ATOMIC_O_TRUNC, "auto_inval_data": wire.AUTO_INVAL_DATA,
    "async_read": wire.ASYNC_READ, "parallel_dirops": wire.PARALLEL_DIROPS,
}


class SessionEnded(Exception):
    """The kernel ended the connection (unmounted) or never answered INIT."""


def hidden_flags() -> int:
    """Kernel flags ``REWINDFS_FUSE_HIDE`` (comma-separated ``FLAG_NAMES``) hides."""
    mask = 0
    for name in filter(None, os.environ.get("REWINDFS_FUSE_HIDE", "").split(",")):
        mask |= FLAG_NAMES[name.strip()]
    return mask


class KernelSession:
    """One mount's connection.  ``flags``: what INIT settled on (``wire`` bits)."""

    name = "kernel"

    def __init__(self, ops, mountpoint: bytes, options: list[str], *, passthrough=False):
        self.ops = ops
        self.passthrough = passthrough     # asked for; ``flags`` says if granted
        self.mountpoint = mountpoint
        self.options = options
        self.fd: int | None = None
        self.flags = 0
        self.offered = 0
        self.kernel_minor = 0
        self.requests = 0
        self.spin: SpinBudget | None = None    # the polled loop's (its counts: status)
        self._buf = bytearray(_BUFSIZE)
        self.dispatch: Dispatcher | None = None
        self.queues: uring.Queues | None = None     # FUSE over io_uring, when granted

    # -- mount and INIT ------------------------------------------------------------------

    def start(self) -> None:
        """Mount and negotiate; ``OSError`` if the kernel refuses the mount,
        ``SessionEnded`` if it never sends a usable INIT (nothing stays mounted)."""
        fd = mounting.mount_fuse(self.mountpoint, self.options)
        self.fd = fd
        try:
            self._negotiate()
        except BaseException:
            self.close()
            raise
        os.set_blocking(fd, False)

    def _negotiate(self) -> None:
        while True:
            n = os.readv(self.fd, [self._buf])
            _, opcode, unique, *_ = wire.IN_HEADER.unpack_from(self._buf)
            if opcode != wire.INIT:
                self._send(wire.OUT_HEADER.pack(16, -errno.EIO, unique))
                continue
            major, minor, readahead, kflags, kflags2 = wire.INIT_IN.unpack_from(self._buf, 40)
            if major > wire.MAJOR:      # it asks again with ours
                self._send(wire.OUT_HEADER.pack(24, 0, unique)
                           + wire.U32_PAIR.pack(wire.MAJOR, wire.MINOR))
                continue
            if major < wire.MAJOR or n < 40 + 16:
                self._send(wire.OUT_HEADER.pack(16, -errno.EPROTO, unique))
                raise SessionEnded(f"kernel FUSE protocol {major}.{minor} is too old")
            break
        offered = kflags | ((kflags2 << 32) if kflags & wire.INIT_EXT else 0)
        offered &= ~hidden_flags()
        if not offered & wire.INIT_EXT:     # without it the kernel reads no flags2
            offered &= 0xFFFFFFFF
        self.kernel_minor = minor
        self.offered = offered
        want = self.want(offered)
        if offered & wire.OVER_IO_URING and uring.wanted():
            want |= self._prepare_uring()
        self.flags = want & offered
        self.dispatch = Dispatcher(self)
        self.ops.mode_dropped = self._attr_changed
        out = wire.INIT_OUT.pack(
            wire.MAJOR, min(minor, wire.MINOR), readahead, self.flags & 0xFFFFFFFF,
            16, 12, _MAX_WRITE, 1, _MAX_PAGES, 0, self.flags >> 32,
            1 if self.flags & wire.PASSTHROUGH else 0, 0)
        if minor < 23:
            out = out[:24]
        self._send(wire.OUT_HEADER.pack(16 + len(out), 0, unique) + out)
        log.info("kernel FUSE session: protocol 7.%d, flags %#x", minor, self.flags)
        if self.queues is not None:
            if self.flags & wire.OVER_IO_URING:
                self.queues.go(lambda: RingDispatcher(self.dispatch))
                log.info("FUSE over io_uring: %d queues", len(self.queues.queues))
            else:
                self.queues.close_rings()
                self.queues = None

    def _prepare_uring(self) -> int:
        """Every ring made and mapped before the INIT reply (``uring`` module doc):
        ``OVER_IO_URING`` to ask for, or 0 (stay on ``/dev/fuse``) if one failed."""
        queues = uring.Queues(self.fd, _MAX_WRITE + 4096)
        try:
            queues.prepare()
        except uring.UringUnavailable as exc:
            log.warning("FUSE over io_uring unavailable, staying on /dev/fuse: %s", exc)
            return 0
        self.queues = queues
        return wire.OVER_IO_URING

    def want(self, offered: int) -> int:
        """The flags we ask for, given what the kernel *offered*."""
        want = _BASE | wire.HANDLE_KILLPRIV_V2 | wire.READDIRPLUS_AUTO
        if self.passthrough and offered & wire.PASSTHROUGH and os.geteuid() == 0:
            # one or the other per mount: the kernel refuses passthrough together
            # with the writeback cache.  Some opens stay direct I/O (set-id writers,
            # no backing file: dispatch._open_out); a shared mmap of such a file needs
            # DIRECT_IO_ALLOW_MMAP (the kernel refuses it with ENODEV otherwise)
            want |= wire.PASSTHROUGH | wire.DIRECT_IO_ALLOW_MMAP
            self.ops.enable_writeback_cache = False
            self.ops.passthrough = True
        elif self.ops.enable_writeback_cache:
            want |= wire.WRITEBACK_CACHE
        return want

    # -- the request loop ---------------------------------------------------------------

    async def serve(self, ended) -> None:
        """Serve requests until the kernel ends the session; then ``ended()``.
        ``REWINDFS_FUSE_CPROFILE=FILE``: profile the loop (cProfile) into FILE."""
        out = os.environ.get("REWINDFS_FUSE_CPROFILE")
        if not out:
            return await self._serve(ended)
        import cProfile
        prof = cProfile.Profile()
        prof.enable()
        try:
            return await self._serve(ended)
        finally:
            prof.disable()
            prof.dump_stats(out)

    async def _serve(self, ended) -> None:
        if self.queues is not None:
            return await self._serve_beside_rings(ended)
        others, runq = trio_internals()
        if others is not None:
            return await self._serve_polled(ended, others, runq)
        return await self._serve_plain(ended, runq)

    async def _serve_plain(self, ended, runq, gather: float = 0.0) -> None:
        """The loop without trio's epoll fd: read until ``EAGAIN``, then park in
        ``wait_readable``; a checkpoint when a task is runnable (*runq*) and every
        ``_FAIR_EVERY`` requests.  With *gather* (s): once a batch held nothing but
        FORGET, BATCH_FORGET and INTERRUPT, the next one is read *gather* after
        ``/dev/fuse`` became readable (``_serve_beside_rings``)."""
        fd, buf = self.fd, self._buf
        readv, handle, no_reply = os.readv, self.dispatch.handle, self.dispatch.no_reply
        countdown = _FAIR_EVERY
        calm = batch_calm = False       # (with gather) the last batch: no-reply ones only
        try:
            while True:
                try:
                    n = readv(fd, [buf])
                except BlockingIOError:
                    countdown = _FAIR_EVERY
                    calm, batch_calm = batch_calm, True
                    await trio.lowlevel.wait_readable(fd)
                    if gather and calm:
                        await trio.sleep(gather)
                    continue
                except OSError as exc:
                    if _goes_on(exc):
                        continue
                    return
                if gather and _OPCODE.unpack_from(buf)[1] not in no_reply:
                    batch_calm = False
                handle(n)
                countdown -= 1
                if countdown <= 0 or runq:
                    countdown = _FAIR_EVERY
                    await trio.lowlevel.checkpoint()
        finally:
            ended()

    async def _serve_polled(self, ended, others: int, runq) -> None:
        """The loop when trio's epoll fd is known: one ``poll`` on both fds per request
        (it returns at once when a request is queued, else sleeps up to ``_IDLE_MS``),
        then one ``readv`` — two syscalls and no exception per request, where reading
        first cost a failing ``readv`` and two ``poll``s whenever the caller waits for
        each reply.  Before it sleeps in that ``poll`` the loop polls without sleeping
        for up to ``spin_ns()`` (``_spin``) while most of its recent waits were that
        short (``SpinBudget``).  Trio gets a checkpoint whenever its epoll
        fd is ready or a task is runnable (checked before every request), and every
        ``_FAIR_EVERY`` requests; after ``_IDLE_MS`` without a request the loop parks in
        ``wait_readable``."""
        fd, buf = self.fd, self._buf
        readv, handle = os.readv, self.dispatch.handle
        p = select.poll()
        p.register(fd, select.POLLIN)
        p.register(others, select.POLLIN)
        wait = p.poll
        spin = self.spin = SpinBudget(spin_ns())
        clock = time.perf_counter_ns
        countdown = _FAIR_EVERY
        try:
            while True:
                ready = wait(0)
                if ready:
                    pass
                elif spin.ns:
                    ready = _spin(wait, spin.ns)
                    spin.spun(bool(ready))
                    if not ready:
                        ready = wait(_IDLE_MS)
                elif spin.most:            # not spinning now: is it worth it again?
                    asleep = clock()
                    ready = wait(_IDLE_MS)
                    spin.slept(clock() - asleep if ready else _IDLE_MS * 1_000_000)
                else:
                    ready = wait(_IDLE_MS)
                if not ready:
                    countdown = _FAIR_EVERY
                    await trio.lowlevel.wait_readable(fd)
                elif runq or len(ready) > 1 or ready[0][0] != fd:
                    countdown = _FAIR_EVERY
                    await trio.lowlevel.checkpoint()     # trio's turn first
                    if ready[0][0] != fd and (len(ready) == 1 or ready[1][0] != fd):
                        continue
                try:
                    n = readv(fd, [buf])
                except BlockingIOError:
                    continue
                except OSError as exc:
                    if _goes_on(exc):
                        continue
                    return
                handle(n)
                countdown -= 1
                if countdown <= 0:
                    countdown = _FAIR_EVERY
                    await trio.lowlevel.checkpoint()
        finally:
            ended()

    async def _serve_beside_rings(self, ended) -> None:
        """The loop while io_uring queues serve the requests: ``/dev/fuse`` brings only
        FORGET, BATCH_FORGET and INTERRUPT (and everything, if the kernel fell back), so
        no spinning — the trio thread must sleep in its I/O wait, where ``HandOver``
        lends the queue threads the ``serial`` lock.

        Those three are gathered for ``_GATHER_S`` once a batch held nothing else. Why:
        each woke the trio thread, which took ``serial`` from the queue threads to
        forget one inode — in an ``rm -rf`` one ring request in nine found the lock
        held and slept on it (docs/benchmarks.md, ninth pass).  None of them has a
        deadline (node ids are never reused, so a forget may come late; INTERRUPT needs
        no action), and a batch with any other request turns the gathering off."""
        handover = uring.HandOver(self.queues.serial)
        trio.lowlevel.add_instrument(handover)

        def done() -> None:
            trio.lowlevel.remove_instrument(handover)
            ended()
        await self._serve_plain(done, None, gather=_GATHER_S)

    async def settle(self) -> None:
        """Over io_uring: wait until every request the kernel handed to a queue before
        this call was answered (``Queues.settle``; the trio thread sleeps meanwhile, so
        the queue threads can run).  Through ``/dev/fuse`` nothing to do."""
        if self.queues is not None:
            await trio.to_thread.run_sync(self.queues.settle)

    def uring_counts(self) -> list[int] | None:
        """Requests served by each io_uring queue, or None when not on io_uring."""
        return self.queues.counts() if self.queues is not None else None

    def uring_waits(self) -> list[int] | None:
        """Per io_uring queue, the requests that waited for the trio thread to lend the
        ``serial`` lock; None when not on io_uring."""
        return self.queues.waits() if self.queues is not None else None

    def request_counts(self) -> dict[str, int]:
        """Requests served so far, by opcode name (``wire``'s names, lower case)."""
        counts = self.dispatch.counts if self.dispatch is not None else []
        return {wire.OPCODE_NAMES.get(op, str(op)): n for op, n in enumerate(counts) if n}

    def spin_counts(self) -> dict[str, int]:
        """Spins before sleeping that caught a request and that did not (see
        ``SpinBudget``); all 0 in the plain loop."""
        spin = self.spin
        return {"caught": spin.caught, "missed": spin.missed} if spin else {}

    def request_times(self) -> dict[str, int]:
        """Nanoseconds spent per opcode (only with ``REWINDFS_FUSE_TIMES=1``; else {})."""
        times = self.dispatch.times if self.dispatch is not None else []
        return {wire.OPCODE_NAMES.get(op, str(op)): ns for op, ns in enumerate(times) if ns}

    # -- replies and notifications ----------------------------------------------------

    def _send(self, data) -> None:
        try:
            os.write(self.fd, data)
        except OSError as exc:
            if exc.errno != errno.ENOENT:   # ENOENT: the request was interrupted
                raise

    def invalidate_inode(self, ino: int, attr_only: bool = False) -> None:
        """Drop the kernel's attributes (and, unless *attr_only*, cached data) of *ino*.
        May block until a related request finishes: call off the trio thread."""
        payload = wire.INVAL_INODE.pack(ino, -1 if attr_only else 0, 0)
        self._notify(wire.NOTIFY_INVAL_INODE, payload)

    def _attr_changed(self, ino: int) -> None:
        """Attributes-only invalidation from the trio thread, before the reply: safe
        (it takes no lock a pending request holds — only an inode's spinlock)."""
        try:
            self.invalidate_inode(ino, attr_only=True)
        except OSError as exc:
            if exc.errno != errno.ENOENT:    # not cached: nothing to drop
                log.warning("attribute invalidation of inode %d failed: %s", ino, exc)

    def invalidate_entry(self, parent: int, name: bytes) -> None:
        payload = wire.INVAL_ENTRY.pack(parent, len(name), 0) + name + b"\0"
        self._notify(wire.NOTIFY_INVAL_ENTRY, payload)

    def _notify(self, code: int, payload: bytes) -> None:
        fd = self.fd
        if fd is None:
            raise OSError(errno.ENOTCONN, "the session is closed")
        os.write(fd, wire.OUT_HEADER.pack(16 + len(payload), code, 0) + payload)

    def close(self) -> None:
        """Unmount (lazily, unless the kernel already ended the session) and close."""
        fd, self.fd = self.fd, None
        if fd is None:
            return
        queues = self.queues
        try:
            if queues is not None:
                # the threads go on serving until the detach ends the connection (or
                # they see ``stopping``); they need ``serial``, which this thread — the
                # trio thread, no longer in trio — holds
                queues.stop()
                try:
                    mounting.detach(self.mountpoint, fd)
                finally:
                    queues.serial.release()
                    queues.join()
                log.info("requests served: %s, by io_uring queue: %s",
                         self.request_counts(), queues.counts())
                if self.dispatch is not None:
                    self.dispatch.close()
                return
            if self.dispatch is not None:
                log.info("requests served: %s", self.request_counts())
                self.dispatch.close()
            mounting.detach(self.mountpoint, fd)
        finally:
            os.close(fd)


def spin_ns() -> int:
    """How long the request loop polls for the next request before it sleeps:
    ``_SPIN_US`` (``REWINDFS_SPIN_US`` overrides; 0: never), and never when this
    process may run on one CPU only (the caller would wait for our spin to end).

    Why spin: a request's caller blocks until the reply, then usually sends the next
    one within a few µs; a daemon asleep in ``poll`` by then is woken through the
    scheduler, and on a VM whose idle vCPU halted, through the hypervisor — measured
    here as a null round trip of 80–120 µs against ~45 µs with the daemon still
    polling (docs/benchmarks.md, third pass).  The price is up to ``_SPIN_US`` of one
    CPU after the last request of a burst."""
    try:
        us = int(os.environ.get("REWINDFS_SPIN_US", _SPIN_US))
    except ValueError:
        us = _SPIN_US
    if us <= 0 or len(os.sched_getaffinity(0)) < 2:
        return 0
    return us * 1000


# For each 8-bit history of gaps (1: short), whether most of them were short.
_MOSTLY_SHORT = [bin(recent).count("1") >= 5 for recent in range(256)]


class SpinBudget:
    """Whether the request loop polls for the next request before it sleeps, and how
    long: ``ns`` is ``most`` (``spin_ns()``) while most of the last 8 waits for a
    request were shorter than that, else 0.

    Why: a spin pays only when the next request comes within it.  A client that pauses
    between requests — computing, an editor saving every few ms, a build — would
    otherwise cost a spin of one CPU at every pause, also when its short gaps are only
    the RELEASE right after an open (not waited for).  A majority, not the last wait,
    decides: a dense stream keeps spinning through an occasional pause, and the
    alternation of a quick RELEASE and a long pause stops the spin.  ``caught`` /
    ``missed`` count the spins (``status`` → ``fs.spins``)."""

    __slots__ = ("most", "ns", "recent", "caught", "missed")

    def __init__(self, most: int):
        self.most = self.ns = most
        self.recent = 0xFF          # start as a dense stream
        self.caught = self.missed = 0

    def spun(self, caught: bool) -> None:
        """A spin ended: it caught a request or *most* ns passed without one."""
        if caught:
            self.caught += 1
        else:
            self.missed += 1
        self._note(caught)

    def slept(self, ns: int) -> None:
        """A request came *ns* after the loop went to sleep without spinning."""
        self._note(ns < self.most)

    def _note(self, short: bool) -> None:
        self.recent = ((self.recent << 1) | short) & 0xFF
        self.ns = self.most if _MOSTLY_SHORT[self.recent] else 0


def _spin(wait, spin: int):
    """``wait(0)`` until something is ready or *spin* ns passed; yields the CPU
    between polls, so a runnable task on this CPU (the caller itself) goes first."""
    deadline = time.perf_counter_ns() + spin
    ready = None
    while not ready and time.perf_counter_ns() < deadline:
        os.sched_yield()
        ready = wait(0)
    return ready


def _goes_on(exc: OSError) -> bool:
    """After a failed read of ``/dev/fuse``: True to read the next request (this one
    was aborted: ``ENOENT``, or ``EINTR``), False when the session is over (``ENODEV``:
    unmounted); any other error is raised."""
    if exc.errno == errno.ENODEV:
        return False
    if exc.errno in (errno.ENOENT, errno.EINTR):
        return True
    raise exc

"""FUSE over io_uring: the kernel session's opt-in transport (``REWINDFS_URING=1``).

Contract (kernel ≥ 6.14, ``fs/fuse/dev_uring.c``; the facts this module leans on):

- The kernel offers ``FUSE_OVER_IO_URING`` at INIT only while the fuse module's
  ``enable_uring`` parameter is Y, and accepts ring commands while it is Y or the
  connection latched io_uring at INIT.  Root only (the parameter is root's to set).
- It wants one queue per *possible* CPU; until every queue has an entry registered it
  *holds* requests.  A daemon that grants io_uring at INIT and then fails to register
  would hang its mount, so ``Queues.prepare`` creates and maps every ring and buffer
  *before* the INIT reply (a failure there: io_uring is not asked for, the session stays
  on ``/dev/fuse``), and ``Queues.go`` submits the REGISTERs after it.  A REGISTER the
  kernel refuses makes it fall back to ``/dev/fuse`` by itself (``fc->io_uring = 0``).
- FORGET, BATCH_FORGET, INTERRUPT and notifications keep travelling through
  ``/dev/fuse``; the trio loop keeps serving it.
- Each queue is a ring (``IORING_SETUP_SQE128``) served by one thread pinned to its CPU.
  An entry is ``IORING_OP_URING_CMD`` on the ``/dev/fuse`` fd with the 80-byte command
  ``fuse_uring_cmd_req`` and two buffers: a 288-byte header (``in_out`` — the
  ``fuse_in_header`` in, ``fuse_out_header`` out —, ``op_in`` — the op's first, fixed
  argument —, ``ring_ent_in_out``) and a payload of the rest (names, data).  The reply
  (COMMIT_AND_FETCH) commits the answer and fetches the next request in one command.
- Handlers still run one at a time (docs/concurrency.md): a queue thread runs one only
  while it holds ``serial``, which the trio thread holds whenever it runs and lends out
  only while it sleeps in its I/O wait (``HandOver``).

Each entry's memory: the header at offset 0 of its own mapping, then at ``_STAGE`` the
payload buffer, with 128 bytes free in front of it: ``op_in`` is copied there, so the
handlers see one contiguous body (the fixed argument, then the payload) without copying
the payload.  The size of the fixed argument is not in the request; it is
``len - 40 - payload_sz`` (the kernel counts every argument into ``len``).
"""

from __future__ import annotations

import ctypes
import errno
import logging
import mmap
import os
import struct
import threading
import time

import trio

log = logging.getLogger(__name__)

__all__ = ["HandOver", "Queues", "UringUnavailable", "nr_possible_cpus", "wanted"]

PARAM = "/sys/module/fuse/parameters/enable_uring"

# x86_64 syscall numbers (the same on every 64-bit arch that uses the generic table)
_SYS_SETUP, _SYS_ENTER = 425, 426
_SETUP_SQE128 = 1 << 10
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
_FEAT_SINGLE_MMAP = 1 << 0
_ENTER_GETEVENTS, _ENTER_EXT_ARG = 1 << 0, 1 << 3
_OP_URING_CMD = 46
_OP_MSG_RING = 40
_BARRIER = 0xFFFFFFFF              # user_data of a barrier's CQE in a queue's ring
CMD_REGISTER, CMD_COMMIT_AND_FETCH = 1, 2
_SQE_SIZE = 128
_CQE_SIZE = 16

HEADER_SIZE = 288                  # struct fuse_uring_req_header
OP_IN_AT = OP_IN_SIZE = 128        # offset and size of op_in in an entry's header
PAYLOAD_SZ_AT = 256 + 16           # offset of ring_ent_in_out.payload_sz
_STAGE = 4096                      # where op_in is copied, just before the payload
PAYLOAD = _STAGE + 128             # the payload buffer
_WAKE_S = 0.2                      # how often an idle queue thread looks for a stop

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
# syscall(2) is variadic and reads every argument as a long: a Python int would go as a
# C int, and the sixth argument (on the stack) would keep garbage in its upper half
_L = ctypes.c_long


class UringUnavailable(OSError):
    """A ring could not be set up (nothing was asked of the kernel yet)."""


class _SqOff(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("head", "tail", "ring_mask", "ring_entries", "flags", "dropped", "array",
                 "resv1")] + [("user_addr", ctypes.c_uint64)]


class _CqOff(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("head", "tail", "ring_mask", "ring_entries", "overflow", "cqes", "flags",
                 "resv1")] + [("user_addr", ctypes.c_uint64)]


class _Params(ctypes.Structure):
    _fields_ = [(n, ctypes.c_uint32) for n in
                ("sq_entries", "cq_entries", "flags", "sq_thread_cpu", "sq_thread_idle",
                 "features", "wq_fd", "resv0", "resv1", "resv2")] + [
                    ("sq_off", _SqOff), ("cq_off", _CqOff)]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_int64), ("tv_nsec", ctypes.c_int64)]


class _GetEventsArg(ctypes.Structure):
    _fields_ = [("sigmask", ctypes.c_uint64), ("sigmask_sz", ctypes.c_uint32),
                ("min_wait_usec", ctypes.c_uint32), ("ts", ctypes.c_uint64)]


def wanted() -> bool:
    """io_uring is asked for: ``REWINDFS_URING=1``, root, and a fuse module that has
    the parameter (whether the kernel offers it at INIT is the next check)."""
    return (os.environ.get("REWINDFS_URING") == "1" and os.geteuid() == 0
            and os.path.exists(PARAM))


def nr_possible_cpus() -> int:
    """The kernel's ``num_possible_cpus()``: the queues it wants."""
    try:
        with open("/sys/devices/system/cpu/possible") as f:
            text = f.read().strip()
    except OSError:
        return os.cpu_count() or 1
    n = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        n += (int(hi) - int(lo) + 1) if hi else 1
    return n


def _addr(buf) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class _Ring:
    """One io_uring instance with SQE128 and *entries* slots, mapped."""

    def __init__(self, entries: int):
        p = _Params()
        p.flags = _SETUP_SQE128
        fd = _syscall(_L(_SYS_SETUP), _L(entries), ctypes.byref(p))
        if fd < 0:
            err = ctypes.get_errno()
            raise UringUnavailable(err, f"io_uring_setup: {os.strerror(err)}")
        self.fd = fd
        try:
            self.sq_entries, self.cq_entries = p.sq_entries, p.cq_entries
            sq_size = p.sq_off.array + p.sq_entries * 4
            cq_size = p.cq_off.cqes + p.cq_entries * _CQE_SIZE
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            prot = mmap.PROT_READ | mmap.PROT_WRITE
            if p.features & _FEAT_SINGLE_MMAP:
                size = max(sq_size, cq_size)
                self.sq = self.cq = mmap.mmap(fd, size, flags, prot, offset=_OFF_SQ_RING)
            else:
                self.sq = mmap.mmap(fd, sq_size, flags, prot, offset=_OFF_SQ_RING)
                self.cq = mmap.mmap(fd, cq_size, flags, prot, offset=_OFF_CQ_RING)
            self.sqes = mmap.mmap(fd, p.sq_entries * _SQE_SIZE, flags, prot,
                                  offset=_OFF_SQES)
        except BaseException:
            os.close(fd)
            raise
        so, co = p.sq_off, p.cq_off
        self.sq_head_off, self.sq_tail_off, self.sq_mask = so.head, so.tail, p.sq_entries - 1
        self.cq_head_off, self.cq_tail_off = co.head, co.tail
        self.cq_mask, self.cqes_off = p.cq_entries - 1, co.cqes
        for i in range(p.sq_entries):       # the SQ array maps slot i to SQE i
            struct.pack_into("<I", self.sq, so.array + 4 * i, i)
        self.tail = struct.unpack_from("<I", self.sq, so.tail)[0]
        self.arg = _GetEventsArg()
        self.ts = _Timespec(int(_WAKE_S), int(_WAKE_S % 1 * 1e9))
        self.arg.ts = ctypes.addressof(self.ts)

    def push(self, sqe: bytes) -> None:
        """Put one 128-byte SQE in the next slot (submitted by the next ``enter``)."""
        slot = self.tail & self.sq_mask
        self.sqes[slot * _SQE_SIZE:(slot + 1) * _SQE_SIZE] = sqe
        self.tail = (self.tail + 1) & 0xFFFFFFFF
        struct.pack_into("<I", self.sq, self.sq_tail_off, self.tail)   # x86: ordered

    def enter(self, wait: int) -> int:
        """``io_uring_enter``: submit every SQE pushed and not yet taken, wait for
        *wait* completions (at most ``_WAKE_S``); the kernel's result (negative errno)."""
        to_submit = (self.tail - struct.unpack_from("<I", self.sq, self.sq_head_off)[0]) \
            & 0xFFFFFFFF
        if wait:
            ret = _syscall(_L(_SYS_ENTER), _L(self.fd), _L(to_submit), _L(wait),
                           _L(_ENTER_GETEVENTS | _ENTER_EXT_ARG), ctypes.byref(self.arg),
                           _L(ctypes.sizeof(self.arg)))
        else:
            ret = _syscall(_L(_SYS_ENTER), _L(self.fd), _L(to_submit), _L(0), _L(0), None,
                           _L(0))
        return ret if ret >= 0 else -ctypes.get_errno()

    def reap(self):
        """The completions ready now, as (user_data, res), consumed."""
        cq = self.cq
        head = struct.unpack_from("<I", cq, self.cq_head_off)[0]
        tail = struct.unpack_from("<I", cq, self.cq_tail_off)[0]
        out = []
        while head != tail:
            off = self.cqes_off + (head & self.cq_mask) * _CQE_SIZE
            out.append(struct.unpack_from("<Qi", cq, off))
            head = (head + 1) & 0xFFFFFFFF
        struct.pack_into("<I", cq, self.cq_head_off, head)
        return out

    def ready(self) -> bool:
        """A completion waits to be reaped."""
        return (struct.unpack_from("<I", self.cq, self.cq_head_off)[0]
                != struct.unpack_from("<I", self.cq, self.cq_tail_off)[0])

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)     # cancels what is still queued (the kernel ends it ENOTCONN)


class Entry:
    """One ring entry's memory: header, op_in staging, payload."""

    __slots__ = ("index", "mem", "view", "iov", "room", "sqe")

    def __init__(self, index: int, qid: int, fuse_fd: int, payload: int):
        self.index = index
        self.room = payload
        self.mem = mmap.mmap(-1, PAYLOAD + payload)
        self.view = memoryview(self.mem)
        base = _addr(self.mem)
        self.iov = (ctypes.c_uint64 * 4)(base, HEADER_SIZE, base + PAYLOAD, payload)
        sqe = bytearray(_SQE_SIZE)
        # opcode flags ioprio fd | cmd_op pad1 | addr | len op_flags | user_data
        struct.pack_into("<BBHiIIQIIQ", sqe, 0, _OP_URING_CMD, 0, 0, fuse_fd, 0, 0,
                         ctypes.addressof(self.iov), 2, 0, index)
        struct.pack_into("<QQH", sqe, 48, 0, 0, qid)      # fuse_uring_cmd_req
        self.sqe = sqe

    def command(self, op: int, commit_id: int = 0) -> bytes:
        struct.pack_into("<I", self.sqe, 8, op)
        struct.pack_into("<Q", self.sqe, 56, commit_id)
        return bytes(self.sqe)


class Queue:
    """One queue: its ring, entries, thread and count of requests served."""

    def __init__(self, qid: int, fuse_fd: int, depth: int, payload: int):
        self.qid = qid
        self.ring = _Ring(depth)
        try:
            self.entries = [Entry(i, qid, fuse_fd, payload) for i in range(depth)]
        except BaseException:
            self.ring.close()
            raise
        self.served = 0
        self.waits = 0                  # requests that found ``serial`` held
        self.acked = 0                  # the last barrier this queue got past
        self.thread: threading.Thread | None = None
        self.error: int | None = None


class Queues:
    """Every queue of one connection.  ``prepare`` (before the INIT reply), ``go`` (after
    it), ``stop`` / ``join`` (at unmount), ``counts()`` and ``waits()`` for ``status``."""

    def __init__(self, fuse_fd: int, payload: int, depth: int = 2):
        self.fuse_fd = fuse_fd
        self.payload = payload
        self.depth = depth
        self.queues: list[Queue] = []
        self.serial = threading.Lock()
        self.stopping = False
        self.helper: _Ring | None = None        # posts barriers (``settle``)
        self.barrier_lock = threading.Lock()
        self.acked = threading.Condition()
        self.token = 0

    def prepare(self) -> None:
        """Create and map a ring with its entries for every possible CPU; on failure
        close what was made and raise ``UringUnavailable`` (ask for no io_uring)."""
        try:
            if os.environ.get("REWINDFS_URING_FAIL") == "setup":     # tests
                raise UringUnavailable(errno.ENOMEM, "io_uring setup refused (test knob)")
            for qid in range(nr_possible_cpus()):
                self.queues.append(Queue(qid, self.fuse_fd, self.depth, self.payload))
            self.helper = _Ring(4)
        except OSError as exc:
            self.close_rings()
            self.queues.clear()
            raise UringUnavailable(exc.errno or errno.EIO, str(exc)) from None

    def go(self, dispatcher) -> None:
        """Start one thread per queue; each registers its entries and serves them with
        its own ``dispatcher()`` (``dispatch.RingDispatcher``).  The calling thread (the
        one that will run trio) holds ``serial`` from now on."""
        self.serial.acquire()
        for q in self.queues:
            q.thread = threading.Thread(target=self._serve, name=f"rewindfs-uring-{q.qid}",
                                        args=(q, dispatcher()), daemon=True)
            q.thread.start()

    def counts(self) -> list[int]:
        return [q.served for q in self.queues]

    def waits(self) -> list[int]:
        return [q.waits for q in self.queues]

    def settle(self, timeout: float = 5.0) -> bool:
        """Wait until every request the kernel handed to a queue before this call was
        answered (from a worker thread, while the trio thread sleeps and lends
        ``serial``).  A barrier CQE is posted into each live queue's ring
        (``IORING_OP_MSG_RING``); a queue thread woken by it has run the task work that
        delivers earlier requests, and acknowledges once it answered everything it
        reaped and nothing more came with its commits.  Why: through ``/dev/fuse`` one
        FIFO made a RELEASE sent before a turn mark's socket request arrive first; the
        rings are one per CPU and need this to say the same.  False on timeout."""
        with self.barrier_lock:
            live = [q for q in self.queues if q.thread is not None and q.thread.is_alive()]
            if not live or self.helper is None:
                return True
            self.token = token = (self.token + 1) & 0x7FFFFFFF
            for q in live:
                sqe = bytearray(_SQE_SIZE)
                # opcode flags ioprio fd | off: the target's user_data | addr: MSG_DATA
                # | len: the target's res | msg_ring_flags | user_data
                struct.pack_into("<BBHiQQIIQ", sqe, 0, _OP_MSG_RING, 0, 0, q.ring.fd,
                                 _BARRIER, 0, token, 0, q.qid)
                self.helper.push(bytes(sqe))
            self.helper.enter(len(live))
            for _, res in self.helper.reap():
                if res < 0:
                    log.warning("io_uring barrier not posted: %s", os.strerror(-res))
            deadline = time.monotonic() + timeout
            with self.acked:
                while any(q.acked != token and q.thread.is_alive() for q in live):
                    left = deadline - time.monotonic()
                    if left <= 0:
                        log.warning("io_uring queues did not settle in %.1fs", timeout)
                        return False
                    self.acked.wait(left)
            return True

    def stop(self) -> None:
        """Ask every thread to end once idle (they look every ``_WAKE_S``)."""
        self.stopping = True

    def join(self, timeout: float = 10.0) -> None:
        """Wait for the threads (the caller released ``serial``), then close the rings."""
        deadline = time.monotonic() + timeout
        for q in self.queues:
            if q.thread is not None:
                q.thread.join(max(0.0, deadline - time.monotonic()))
                if q.thread.is_alive():
                    log.warning("io_uring queue %d did not stop", q.qid)
        self.close_rings()

    def close_rings(self) -> None:
        for q in self.queues:
            if q.thread is None or not q.thread.is_alive():
                q.ring.close()
        if self.helper is not None:
            self.helper.close()

    # -- a queue's thread -----------------------------------------------------------------

    def _serve(self, q: Queue, disp) -> None:
        try:
            os.sched_setaffinity(0, {q.qid})
        except OSError:
            pass            # a possible CPU that is offline: its queue still registers
        ring = q.ring
        try:
            self._register(q)
            self._loop(q, ring, disp)
        except Exception:
            log.exception("io_uring queue %d failed", q.qid)
        finally:
            ring.close()
            with self.acked:            # a settle waiting for this queue stops waiting
                self.acked.notify_all()

    def _register(self, q: Queue) -> None:
        """Submit a REGISTER per entry.  EAGAIN (the INIT reply not processed yet) is
        retried for a while; another refusal ends this queue (the kernel then falls back
        to ``/dev/fuse`` by itself)."""
        ring = q.ring
        for ent in q.entries:
            ring.push(ent.command(CMD_REGISTER))
        ret = ring.enter(0)
        if ret < 0:
            raise OSError(-ret, f"io_uring_enter: {os.strerror(-ret)}")

    def _loop(self, q: Queue, ring: _Ring, disp) -> None:
        entries, serial = q.entries, self.serial
        retries = 0
        barrier = None
        idle, normal = _reply_policies()
        while True:
            if idle is not None:
                # the reply wakes the caller on this CPU: as SCHED_IDLE from the commit
                # until the next request, the thread yields the CPU to it instead of
                # pushing it to another one (REWINDFS_URING_IDLE_REPLY=1, measured in
                # docs/benchmarks.md); handlers run at the normal policy
                os.sched_setscheduler(0, os.SCHED_IDLE, idle)
                ret = ring.enter(1)
                os.sched_setscheduler(0, os.SCHED_OTHER, normal)
            else:
                ret = ring.enter(1)
            if ret < 0 and ret not in (-errno.EINTR, -errno.ETIME, -errno.EAGAIN,
                                       -errno.EBUSY):
                raise OSError(-ret, f"io_uring_enter: {os.strerror(-ret)}")
            done = ring.reap()
            if not done and self.stopping:
                return
            for i, (index, res) in enumerate(done):
                if index == _BARRIER:
                    barrier = res
                    continue
                ent = entries[index]
                if res == -errno.EAGAIN and retries < 200:     # before INIT took effect
                    retries += 1
                    time.sleep(0.01)
                    ring.push(ent.command(CMD_REGISTER))
                    continue
                if res < 0:
                    q.error = -res
                    if res not in (-errno.ENOTCONN, -errno.ECONNABORTED):
                        log.warning("io_uring queue %d: entry %d ended: %s", q.qid, index,
                                    os.strerror(-res))
                    return          # the connection ended (or the kernel fell back)
                if not serial.acquire(False):
                    q.waits += 1        # the trio thread holds it (status: uring_waits)
                    serial.acquire()
                try:
                    unique = disp.serve(ent)
                finally:
                    serial.release()
                q.served += 1
                ring.push(ent.command(CMD_COMMIT_AND_FETCH, unique))
                if i + 1 < len(done):      # more to do: send this reply now
                    ring.enter(0)
            if barrier is not None:
                ring.enter(0)              # the replies out; what they fetch shows now
                if not ring.ready():
                    with self.acked:
                        q.acked = barrier
                        self.acked.notify_all()
                    barrier = None

def _reply_policies():
    """(SCHED_IDLE's, SCHED_OTHER's parameters) when ``REWINDFS_URING_IDLE_REPLY=1``,
    else (None, None)."""
    if os.environ.get("REWINDFS_URING_IDLE_REPLY") != "1":
        return None, None
    return os.sched_param(0), os.sched_param(0)


class HandOver(trio.abc.Instrument):
    """A trio ``Instrument``: the trio thread holds *lock* whenever it runs and lends it
    only while it sleeps in its I/O wait (``before_io_wait`` → ``after_io_wait``), so a
    queue thread's handler never runs beside a trio task (docs/concurrency.md)."""

    def __init__(self, lock):
        self.lock = lock

    def before_io_wait(self, timeout) -> None:
        self.lock.release()

    def after_io_wait(self, timeout) -> None:
        self.lock.acquire()

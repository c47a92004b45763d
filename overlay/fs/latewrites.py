"""Late writes: changes that reach the workspace from a process of a turn a rewind removed.

A rewind to point E undoes the turns from E on, but it cannot undo their processes: a
background job a removed turn started may write into the restored tree afterwards.
The harness plugin stops the jobs it knows of before it rewinds; this module is the
net under it — it does not refuse anything, it *reports*: ``status`` lists every such
write (pid, command name, path, the turn), ``rewindfs status`` and ``/rewind status``
show them.

How a writer is recognised (``LateWrites.saw``, called by a mutating FUSE request that
carries the caller's pid: create, mknod, mkdir, symlink, link, unlink, rmdir, rename,
setattr, open for writing, set/removexattr).  The writer and then its ancestors (at
most ``MAX_DEPTH``, nearest first) are looked at in ``/proc``:

1. a process whose environment carries ``DSH_REWINDFS_TURN=<session>:<turn>`` (every
   shell the harness plugin's bash tool starts, and whatever that shell starts) belongs
   to that turn: it is late iff that turn is one the rewinds removed — the tag decides;
2. else a process that *started* inside a removed turn's window (``/proc/<pid>/stat``
   starttime, clock ticks since boot) is late.

Windows come from the store's epochs (``started_ns``/``ended_ns``, wall clock),
converted to boot time when a rewind arms them, and never reaching past the moment
the rewind began (a process started after that is judged by its ancestors).  Ticks
are 10 ms, so a process started in the very tick a removed turn began or ended may be
judged either way; a clock step during the window skews it by that step (a report,
not a refusal, so that is acceptable; in exchange a daemon restart loses nothing).

Cost: nothing until a rewind or redo removed a turn (``armed`` is False; the handlers
test that attribute and call nothing).  Armed, a mutating request costs a dict lookup
while its pid's verdict is under a second old, else one ``/proc/<pid>/stat`` read; a
new (pid, starttime) is classified once (its chain's stat and environ files) and the
verdict cached.  What it does not see: a write through a file
descriptor opened before the rewind (``write`` carries no pid; the open did), and a
writer that cleared its environment and started after the window.
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)

__all__ = ["LateWrites", "TURN_ENV"]

TURN_ENV = b"DSH_REWINDFS_TURN"
MAX_DEPTH = 16           # ancestors looked at, writer included
MAX_RECORDS = 200        # late writes kept for status (the first ones)
MAX_VERDICTS = 4096      # (pid, starttime) verdicts cached
MAX_SEEN = 65536         # (pid, path) late writes remembered, so each is logged once
RECHECK_S = 1.0          # a pid's verdict is reused this long without reading /proc
_HZ = os.sysconf("SC_CLK_TCK")


def read_stat(pid: int, proc: str = "/proc") -> tuple[int, int, str] | None:
    """``(ppid, start_ticks, comm)`` of *pid*, or None when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    close = raw.rfind(b")")     # comm may hold spaces and ')'
    fields = raw[close + 2:].split()
    comm = raw[raw.find(b"(") + 1:close].decode("utf-8", "replace")
    return int(fields[1]), int(fields[19]), comm


def read_tag(pid: int, proc: str = "/proc") -> tuple[str, int] | None:
    """``(session, turn)`` from *pid*'s ``DSH_REWINDFS_TURN``, or None."""
    try:
        with open(f"{proc}/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        return None
    for entry in env.split(b"\0"):
        if entry.startswith(TURN_ENV + b"="):
            session, _, turn = entry[len(TURN_ENV) + 1:].rpartition(b":")
            if session and turn.isdigit():
                return session.decode("utf-8", "replace"), int(turn)
    return None


class LateWrites:
    """Which turns the rewinds removed, and the writes their processes made since.

    Runs on the trio thread only (FUSE handlers and ``epoch_changed``): no locking."""

    def __init__(self, proc: str = "/proc"):
        self.proc = proc
        self.armed = False
        # (begin_tick, end_tick, epoch, session, turn) of every removed turn epoch
        self.windows: list[tuple[int, int, int, str | None, int | None]] = []
        self.removed: dict[tuple[str | None, int | None], int] = {}   # (session, turn) → epoch
        self.records: list[dict] = []
        self._seen: set[tuple[int, bytes]] = set()
        self._verdicts: dict[tuple[int, int], dict | None] = {}
        self._recent: dict[int, tuple[float, dict | None]] = {}   # pid → (when, verdict)

    # -- arming -------------------------------------------------------------------

    def rewound(self, epochs, current) -> None:
        """*current* (a ``rewind`` or ``redo`` epoch just opened) restores the point
        ``current.target``: every turn epoch in ``[target, current)`` is removed."""
        if current.target is None:
            return
        boot_now = time.clock_gettime_ns(time.CLOCK_BOOTTIME)
        offset = time.time_ns() - boot_now
        known = {w[2] for w in self.windows}
        for e in epochs:
            if e.kind != "turn" or not current.target <= e.id < current.id or e.id in known:
                continue
            end_ns = e.ended_ns if e.ended_ns is not None else time.time_ns()
            # Ticks are 10 ms: a window never reaches past now, so a process started
            # after the rewind began is judged by its ancestors, not by its own start.
            end = min(_tick(end_ns - offset), _tick(boot_now))
            self.windows.append((_tick(e.started_ns - offset), end, e.id, e.session, e.turn))
            self.removed[(e.session, e.turn)] = e.id
        if self.windows and not self.armed:
            self.armed = True
            log.info("late writes: watching for writers of %d removed turn(s)", len(self.windows))
        self._verdicts.clear()    # a pid judged harmless may belong to a turn removed now
        self._recent.clear()

    # -- the request path ------------------------------------------------------------

    def saw(self, pid: int, path: bytes) -> None:
        """A mutating request of *pid* on *path* (only called while ``armed``)."""
        if not pid or (pid, path) in self._seen:
            return
        verdict = self._verdict(pid)
        if verdict is None:
            return
        if len(self._seen) < MAX_SEEN:      # past that, a repeat may be logged again
            self._seen.add((pid, path))
        if len(self.records) < MAX_RECORDS:
            self.records.append({**verdict, "pid": pid, "path": os.fsdecode(path),
                                 "time_ns": time.time_ns()})
        log.warning("late write: pid %d (%s) changed %r after a rewind removed turn %s of "
                    "session %s, which started it", pid, verdict["comm"], path,
                    verdict["turn"], verdict["session"])

    def _verdict(self, pid: int) -> dict | None:
        # A pid's verdict is trusted for RECHECK_S without reading /proc again (~15 µs a
        # read, on every mutating request for as long as the watch is armed); a pid
        # reused within that second by another process is the price, in a report.
        now = time.monotonic()
        recent = self._recent.get(pid)
        if recent is not None and now - recent[0] < RECHECK_S:
            return recent[1]
        st = read_stat(pid, self.proc)
        if st is None:
            return None
        key = (pid, st[1])
        if key not in self._verdicts:
            if len(self._verdicts) >= MAX_VERDICTS:
                self._verdicts.clear()
            self._verdicts[key] = self._classify(pid, st)
        if len(self._recent) >= MAX_VERDICTS:
            self._recent.clear()
        self._recent[pid] = (now, self._verdicts[key])
        return self._verdicts[key]

    def _classify(self, pid: int, st) -> dict | None:
        """The writer's verdict: the first of it and its ancestors with a turn tag
        decides; before that, one that started inside a removed window is late."""
        comm = st[2]
        for _ in range(MAX_DEPTH):
            tag = read_tag(pid, self.proc)
            if tag is not None:
                epoch = self.removed.get(tag)
                return None if epoch is None else self._hit(comm, pid, epoch, *tag, "tag")
            for begin, end, epoch, session, turn in self.windows:
                if begin <= st[1] <= end:
                    return self._hit(comm, pid, epoch, session, turn, "start-time")
            if st[0] <= 1:
                return None
            pid, st = st[0], read_stat(st[0], self.proc)
            if st is None:
                return None
        return None

    @staticmethod
    def _hit(comm, by, epoch, session, turn, how) -> dict:
        return {"comm": comm, "by": by, "epoch": epoch, "session": session, "turn": turn,
                "how": how}

    def report(self) -> list[dict]:
        """The late writes seen so far (the first ``MAX_RECORDS``)."""
        return list(self.records)


def _tick(boot_ns: int) -> int:
    return boot_ns * _HZ // 1_000_000_000

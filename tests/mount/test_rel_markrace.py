"""A writer that keeps appending while turn marks come: what each mark recorded.

An agent's dev server or test watcher keeps a log open and writes to it while the
harness marks turns.  Seen from outside, the state a mark records for that file must be
one the file really had between the moment the mark was asked for and the moment it
answered: every ``write(2)`` that returned before the mark was requested is in it, none
that started after the mark answered is, and (appends only) it is a prefix of the final
file.  Under passthrough the daemon never sees these writes — the file is captured at
the mark while the writer runs (docs/concurrency.md, "Passthrough keeps write-ahead"):
a capture that copied bytes appended during it as a run of zeros failed here.  Under
the writeback cache the mark pushes dirty pages first, and a racing write's page may
still be missing (as zeros) where a later page is not.  Checked through the CLI
(``rewindfs show eN log``), as a user would look.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from mountkit import cli, mounted

pytestmark = pytest.mark.mount

RECORD = 512            # bytes per write(2): a whole record, so a prefix is recognisable
MARKS = 12
# A log's pace, not a disk's: each mark copies the whole file, and while it copies, an
# unpaced appender (passthrough writes at page-cache speed) may add more than the copy
# took in, so the file grew geometrically — 4.2 GB by the last mark on one CI run, whose
# `show`s then ran the test machine out of memory.  32 KiB, then a millisecond's rest.
PACE_RECORDS, PACE_S = 64, 0.001

VARIANTS = {
    "default": {},                                # passthrough as root (kernel session)
    "writeback": {"REWINDFS_PASSTHROUGH": "0"},   # the writeback cache instead
}


def _record(i: int) -> bytes:
    head = b"record %08d " % i
    return head + b"x" * (RECORD - len(head) - 1) + b"\n"


class Appender(threading.Thread):
    """Appends numbered records to *path* until stopped, paced (``PACE_RECORDS``);
    ``done`` counts the write(2) calls that have returned."""

    def __init__(self, path):
        super().__init__(daemon=True)
        self.path = path
        self.done = 0
        self.stop = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
            try:
                while not self.stop.is_set():
                    assert os.write(fd, _record(self.done)) == RECORD
                    self.done += 1
                    if self.done % PACE_RECORDS == 0:
                        time.sleep(PACE_S)
            finally:
                os.close(fd)
        except BaseException as exc:   # reported by the test, not lost in the thread
            self.error = exc


@pytest.mark.parametrize("env", VARIANTS.values(), ids=VARIANTS.keys())
def test_each_mark_records_a_state_the_racing_appender_left(tmp_path, env):
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "log").write_bytes(b"")
    marks = []   # (epoch, writes returned before the mark was asked, after it answered)
    with mounted(ws, store, env=env) as m:
        passthrough = m.call("status")["fs"]["passthrough"]
        m.call("turn.begin", session="s", turn=1, label="before the writer")
        writer = Appender(ws / "log")
        writer.start()
        try:
            for turn in range(2, MARKS + 2):
                time.sleep(0.02)
                before = writer.done
                epoch = m.call("turn.begin", session="s", turn=turn, label=f"t{turn}")["epoch"]
                marks.append((epoch, before, writer.done))
            deadline = time.monotonic() + 30      # a write after the last mark, too
            while writer.done <= marks[-1][2] and writer.is_alive() \
                    and time.monotonic() < deadline:
                time.sleep(PACE_S)
        finally:
            writer.stop.set()
            writer.join(30)
        assert writer.error is None, writer.error
        m.call("turn.end")
        final = (ws / "log").read_bytes()
    assert len(final) == writer.done * RECORD
    assert writer.done > marks[-1][2], "the writer stopped before the last mark"
    previous = 0
    for epoch, before, after in marks:
        shown = cli("show", f"e{epoch}", "log", "-C", ws, store=store)
        assert shown.returncode == 0, shown.stderr
        seen = shown.stdout.encode()
        # a write in flight while the mark captured may be in or out, and a buffered
        # read may see part of it (docs/concurrency.md); everything before is in
        assert before * RECORD <= len(seen) <= (after + 1) * RECORD, (
            f"e{epoch}: {len(seen)} bytes; writes returned before the mark: {before},"
            f" after it answered: {after}")
        assert seen[:before * RECORD] == final[:before * RECORD], f"e{epoch}: {_diff(seen, final)}"
        if passthrough:
            assert final.startswith(seen), f"e{epoch}: not a state the file had: {_diff(seen, final)}"
        else:
            # The writeback cache writes a log's pages back out of order (cyclic
            # writeback), so the real file the mark captured may still miss a page of
            # a racing write that a later page already shows: only as zeros.
            assert _differs_only_by_zeros(seen, final), f"e{epoch}: {_diff(seen, final)}"
        assert len(seen) >= previous, f"e{epoch}: shorter than the mark before it"
        previous = len(seen)


def _diff(seen: bytes, final: bytes) -> str:
    at = next(i for i, (a, b) in enumerate(zip(seen, final)) if a != b)
    run = len(seen[at:]) - len(seen[at:].lstrip(b"\0"))
    return f"{len(seen)} bytes, differs from offset {at} on ({run} zero bytes there)"


def _differs_only_by_zeros(seen: bytes, final: bytes, page: int = 4096) -> bool:
    for at in range(0, len(seen), page):
        mine, theirs = seen[at:at + page], final[at:at + page]
        if mine != theirs and any(a not in (0, b) for a, b in zip(mine, theirs)):
            return False
    return True

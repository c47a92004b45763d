"""Late writes through a real mount: after a rewind removed turn 2, a write by a process
that turn started is reported by ``status`` (pid, command, path, turn); writes by
processes of the kept turn 1, by processes started after the rewind, and by a process
whose turn tag names a kept turn are not.  A process tagged with a removed turn is
reported by its tag, whenever it started.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from mountkit import cli, mounted
from rewindfs.overlay.control.client import call

pytestmark = pytest.mark.mount


def gated(ws, gate, name, env=None):
    """A process (its own session) that waits for *gate*, then writes *name* in *ws*."""
    script = f'while [ ! -e "{gate}" ]; do sleep 0.02; done; echo late > {name}'
    return subprocess.Popen(["sh", "-c", script], cwd=ws, start_new_session=True,
                            env={"PATH": os.environ["PATH"], **(env or {})})


def next_tick():
    """Wait until the boot clock is in the tick after the next one (process start
    times are kept in 10 ms ticks: this makes "started before" and "after" distinct)."""
    def tick():
        return time.clock_gettime_ns(time.CLOCK_BOOTTIME) * os.sysconf("SC_CLK_TCK") // 10**9
    first = tick()
    while tick() < first + 2:
        time.sleep(0.002)


def test_a_write_by_a_process_of_a_removed_turn_is_reported(tmp_path):
    ws, store, gate = tmp_path / "ws", tmp_path / "store", tmp_path / "gate"
    ws.mkdir()
    procs = []
    with mounted(ws, store) as m:
        try:
            call(m.socket, "turn.begin", {"session": "s1", "turn": 1, "label": "one"})
            (ws / "one.txt").write_text("one\n")
            procs.append(kept := gated(ws, gate, "kept.txt"))
            call(m.socket, "turn.end", {"session": "s1"})
            next_tick()
            turn2 = call(m.socket, "turn.begin", {"session": "s1", "turn": 2, "label": "two"})["epoch"]
            (ws / "two.txt").write_text("two\n")
            procs.append(late := gated(ws, gate, "late.txt"))
            procs.append(tagged_kept := gated(ws, gate, "tagged-kept.txt",
                                              {"DSH_REWINDFS_TURN": "s1:1"}))
            call(m.socket, "turn.end", {"session": "s1"})
            assert "late_writes" not in call(m.socket, "status")

            next_tick()
            call(m.socket, "rewind", {"to": f"e{turn2}", "session": "s1"})
            assert not (ws / "two.txt").exists()
            next_tick()
            procs.append(after := gated(ws, gate, "after.txt"))
            procs.append(tagged_late := gated(ws, gate, "tagged-late.txt",
                                              {"DSH_REWINDFS_TURN": "s1:2"}))
            gate.touch()
            for p in procs:
                assert p.wait(timeout=60) == 0

            for name in ("kept.txt", "tagged-kept.txt", "after.txt", "late.txt", "tagged-late.txt"):
                assert (ws / name).read_text() == "late\n"   # every write went through
            status = call(m.socket, "status")
            seen = sorted((w["path"], w["pid"], w["comm"], w["session"], w["turn"], w["epoch"],
                           w["how"]) for w in status["late_writes"])
            assert seen == sorted([
                ("late.txt", late.pid, "sh", "s1", 2, turn2, "start-time"),
                ("tagged-late.txt", tagged_late.pid, "sh", "s1", 2, turn2, "tag"),
            ])
            assert {kept.pid, tagged_kept.pid, after.pid}.isdisjoint(
                w["pid"] for w in status["late_writes"])
            # The CLI says it too, naming the writer and the turn.
            shown = cli("status", store=store, cwd=ws)
            assert (f"late write: pid {late.pid} (sh) changed late.txt after a rewind removed "
                    f"turn 2 of session s1 (e{turn2}), which started it") in shown.stdout + shown.stderr
        finally:
            gate.touch()
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()

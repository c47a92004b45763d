"""Concurrency: two sessions and a person in one workspace; CLI readers beside a busy
daemon.

- Sessions s1 and s2 take interleaved turns, and a person edits a file between turns
  (an ``idle`` epoch).  A rewind of s1 to its turn 1 lists, *before* anything changes
  (the ``--dry-run`` output, human and ``--json``, and the ``rewind.planned`` event that
  precedes every write), each path s2 or the person changed since that point — also
  one s1 changed again afterwards — and none that only s1 changed.
- ``log``, ``diff``, ``show``, ``status`` and ``gc`` run while a workload keeps
  capturing through the mount: each finishes while the workload progresses, and what
  they read is whole (a stored pre-image is exactly what was there; a live file is one
  of the versions the workload wrote).  ``gc --keep-epochs`` drops history
  meanwhile; the store stays sound.
"""

from __future__ import annotations

import base64
import json
import os
import threading

import pytest

from store_fixtures import assert_sound
from mountkit import cli, mounted
from treesnap import compare, snapshot

pytestmark = pytest.mark.mount


def _jsonl(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _sessions(ws, m):
    """The interleaved history; returns s1's turn-1 epoch."""
    for name in ("a", "b", "c", "shared", "person"):
        (ws / name).write_text(f"{name} v0\n")
    e1 = m.call("turn.begin", session="s1", turn=1, label="s1 t1")["epoch"]
    (ws / "a").write_text("a by s1\n")
    m.call("turn.end")
    m.call("turn.begin", session="s2", turn=1, label="s2 t1")
    (ws / "b").write_text("b by s2\n")
    (ws / "shared").write_text("shared by s2\n")
    (ws / "s2new").write_text("created by s2\n")
    m.call("turn.end")
    (ws / "person").write_text("edited by a person between turns\n")   # idle epoch
    m.call("turn.begin", session="s1", turn=2, label="s1 t2")
    (ws / "c").write_text("c by s1\n")
    (ws / "shared").write_text("shared by s1 again\n")   # s1 last, but s2 was there
    m.call("turn.end")
    m.call("turn.begin", session="s2", turn=2, label="s2 t2")
    (ws / "b").write_text("b by s2, twice\n")
    m.call("turn.end")
    return e1


FOREIGN = {"b", "shared", "s2new", "person"}
OWN_ONLY = {"a", "c"}


def test_rewind_plan_lists_other_sessions_and_idle_edits(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with mounted(ws, tmp_path / "store") as m:
        _sessions(ws, m)
        before = snapshot(ws)

        res = cli("rewind", "1", "--session", "s1", "--dry-run", "--json", "-C", ws,
                  store=m.store)
        assert res.returncode == 0, res.stderr
        recs = _jsonl(res.stdout)
        planned = [r for r in recs if r["type"] == "rewind.planned"]
        assert len(planned) == 1 and planned[0]["dry_run"] is True
        listed = {f["path"]: f for f in planned[0]["foreign"]}
        assert set(listed) == FOREIGN, listed
        assert listed["person"]["kind"] == "idle"
        assert listed["b"]["session"] == "s2" and listed["shared"]["session"] == "s2"
        assert compare(before, snapshot(ws)) == []      # a dry run changes nothing

        res = cli("rewind", "1", "--session", "s1", "--dry-run", "-C", ws, store=m.store)
        assert res.returncode == 0, res.stderr
        for path in FOREIGN:
            assert f"  {path}  " in res.stdout, res.stdout
        for path in OWN_ONLY:
            assert f"  {path}  " not in res.stdout, res.stdout
        assert compare(before, snapshot(ws)) == []

        res = cli("rewind", "1", "--session", "s1", "--json", "-C", ws, store=m.store)
        assert res.returncode == 0, res.stderr
        recs = _jsonl(res.stdout)
        first_write = next(i for i, r in enumerate(recs) if r["type"] == "rewind.written")
        planned = [i for i, r in enumerate(recs) if r["type"] == "rewind.planned"]
        assert planned and planned[0] < first_write
        assert {f["path"] for f in recs[planned[0]]["foreign"]} == FOREIGN
        assert (ws / "a").read_text() == "a v0\n" and (ws / "b").read_text() == "b v0\n"

        # a human real rewind names them before the restore result too
        res = cli("redo", "--session", "s1", "-C", ws, store=m.store)
        assert res.returncode == 0, res.stderr
        res = cli("rewind", "1", "--session", "s2", "-C", ws, store=m.store)
        assert res.returncode == 0, res.stderr
        head, _, tail = res.stdout.partition("restored ")
        for path in ("c", "shared", "person"):     # s1's and the person's, since e(s2 t1)
            assert f"  {path}  " in head, res.stdout
        for path in ("a", "b", "s2new"):           # before the point / s2's own
            assert f"  {path}  " not in res.stdout, res.stdout


# -- readers beside a busy capture -------------------------------------------------------

class Busy(threading.Thread):
    """Atomically replaces ``f0..f9`` (temp + rename) with self-checking content and
    marks turns, until stopped.  ``versions[name]`` = every content it wrote."""

    def __init__(self, ws, m):
        super().__init__(daemon=True)
        self.ws, self.m = ws, m
        self.steps = 0
        self.halt = threading.Event()
        self.error = None
        self.versions: dict[str, set[bytes]] = {}

    @staticmethod
    def content(name: str, n: int) -> bytes:
        return (b"%s generation %d\n" % (name.encode(), n)) * (1 + n % 500)

    def put(self, name: str, data: bytes) -> None:
        self.versions.setdefault(name, set()).add(data)
        tmp = self.ws / f".{name}.tmp"
        tmp.write_bytes(data)
        os.rename(tmp, self.ws / name)

    def run(self):
        try:
            turn = 1
            while not self.halt.is_set():
                if self.steps % 50 == 0:
                    self.m.call("turn.begin", session="busy", turn=turn, label=f"t{turn}")
                    turn += 1
                name = f"f{self.steps % 10}"
                self.put(name, self.content(name, self.steps))
                self.steps += 1
        except Exception as exc:   # noqa: BLE001 — the test reports it
            self.error = exc


def test_cli_readers_do_not_block_capture_or_see_torn_data(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    with mounted(ws, tmp_path / "store") as m:
        busy = Busy(ws, m)
        for i in range(10):
            busy.put(f"f{i}", Busy.content(f"f{i}", 0))
        busy.start()
        try:
            commands = [("status", "--json", "-C", ws), ("log", "--json", "-C", ws),
                        ("diff", "e1", "--json", "-C", ws), ("gc", "--json", "-C", ws),
                        ("gc", "--keep-epochs", "6", "--json", "-C", ws)]
            commands += [("show", "e%d" % e, "f3", "--json", "-C", ws) for e in (2, 3, 4)]
            commands += [("show", "now", "f5", "--json", "-C", ws)]
            for _round in range(3):
                for args in commands:
                    start = busy.steps
                    res = cli(*args, store=m.store)
                    assert busy.steps > start, f"capture made no progress during {args[0]}"
                    if res.returncode != 0 and args[0] in ("show", "diff") and \
                            "unknown-point" in res.stdout + res.stderr:
                        continue     # that epoch does not exist yet, or gc dropped it
                    assert res.returncode == 0, (args, res.stdout, res.stderr)
                    _check_whole(args, _jsonl(res.stdout), busy)
        finally:
            busy.halt.set()
            busy.join(60)
        assert busy.error is None, repr(busy.error)
        m.call("turn.end")
        with m.open_store() as s:
            assert_sound(s)


def _check_whole(args, recs, busy: Busy) -> None:
    kind = args[0]
    if kind == "log":
        ids = [r.get("epoch") for r in recs if "epoch" in r]
        assert ids == sorted(ids) and len(ids) == len(set(ids)), ids
    elif kind == "show":
        data = base64.b64decode(recs[-1]["content_b64"])
        assert data in busy.versions[args[2]], data[:80]


def test_concurrent_rewinds_are_serialised(tmp_path):
    """Two ``rewindfs rewind`` processes at once on one mount: both succeed, one after
    the other (two rewind epochs), and the tree is exactly the point of the later one."""
    import subprocess
    from mountkit import PYTHON, ROOT

    ws = tmp_path / "ws"
    ws.mkdir()
    with mounted(ws, tmp_path / "store") as m:
        snaps, points = {}, {}
        for t in (1, 2, 3):
            points[t] = m.call("turn.begin", session="s", turn=t, label=f"t{t}")["epoch"]
            snaps[points[t]] = snapshot(ws)
            for i in range(20):
                (ws / f"f{i}").write_text(f"turn {t} file {i}\n" * (i + 1))
            m.call("turn.end")
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        procs = [subprocess.Popen([PYTHON, "-m", "rewindfs.overlay.cli", "--store", str(m.store),
                                   "rewind", f"e{points[t]}", "-C", str(ws), "--json"],
                                  cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
                 for t in (1, 2)]
        outs = [p.communicate(timeout=120)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs
        rewinds = [p for p in m.call("points")["points"] if p["kind"] == "rewind"]
        assert len(rewinds) == 2 and rewinds[0]["ended_ns"] <= rewinds[1]["started_ns"]
        assert compare(snaps[rewinds[1]["target"]], snapshot(ws)) == []
        with m.open_store() as s:
            assert_sound(s)

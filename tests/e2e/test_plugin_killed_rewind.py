"""``/rewind own`` interrupted, with the real plugin service (node) against a real daemon.

- The daemon killed (``kill -9``, the OOM killer) after the first path it lands
  (``REWINDFS_FAULT_AFTER``): the rewind left its intent in the store, so ``rewindfs
  mount --recover`` finishes it and the files do come back.  The reply must not say
  they were not rewound, and must say what finishes it.
- The web server stopped with Ctrl-C while the daemon lands (``REWINDFS_PAUSE_AFTER``
  holds the landing): the daemon finishes the rewind alone; the ↩ mark the dead
  server could not take off goes when the session's header asks next, and the fork
  whose files went away, which the dead server could not mark, is marked when its
  header asks.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time

import pytest

from dshkit import harness
from mountkit import cli, mounted
from relkit import Daemon, background, crashing_daemon
from treesnap import compare, snapshot

pytestmark = pytest.mark.e2e

SERVICE = (__import__("pathlib").Path(__file__).resolve().parents[2]
           / "plugin" / "dsh" / "lib" / "service.js")

# rewindOwn of session p, with the plugin's defaults and the test's store; prints its result
SCRIPT = """
import { RewindfsService } from %(service)s;
import { DEFAULTS } from %(config)s;
const [store, cwd] = process.argv.slice(2);
const titles = new Map([['p', '↩ work'], ['c', 'work']]);
const sessions = new Map(['p', 'c'].map((id) => [id, { id, header: { id, cwd } }]));
const ctx = { get: (name) => ({
  sessions,
  sessionTitle: { get: (s) => ({ title: titles.get(s.id) }), rename: (s, t) => titles.set(s.id, t) },
})[name] };
const service = new RewindfsService(ctx, { ...DEFAULTS, store }, { warn: () => {} });
const result = await service.rewindOwn({ id: 'p', session: sessions.get('p') });
console.log(JSON.stringify({ result, titles: Object.fromEntries(titles) }));
"""

# the same service, later: what session p's header asks (its redo state), and c's
HEADER = SCRIPT.replace(
    "const result = await service.rewindOwn({ id: 'p', session: sessions.get('p') });",
    "const result = await service.redoState(process.argv[4]);")


def history(ws, store) -> dict:
    """p ran turns 1 and 2; a rewind owned by fork c went to the start of p's turn 2;
    c ran its own turn.  Returns the snapshot of p's files after its turn 2."""
    with mounted(ws, store) as m:
        m.call("turn.begin", session="p", turn=1, label="one")
        (ws / "a.txt").write_text("p1\n")
        t2 = m.call("turn.begin", session="p", turn=2, label="two")["epoch"]
        (ws / "a.txt").write_text("p2\n")
        (ws / "b.txt").write_text("p's\n")
        (ws / "d").mkdir()
        (ws / "d" / "e.txt").write_text("p's too\n")
        m.call("turn.end")
        mine = snapshot(ws)
        m.call("rewind", to=f"e{t2}", session="c")
        m.call("turn.begin", session="c", turn=2, label="the fork's")
        (ws / "a.txt").write_text("c\n")
        (ws / "c.txt").write_text("c's\n")
        m.call("turn.end")
    return mine


def landed(mine, ws) -> bool:
    """The tree is ``mine``.  Read while the daemon still lands: a walk that meets a
    name gone between its listing and its read (seen once in CI) is not an answer."""
    try:
        return compare(mine, snapshot(ws)) == []
    except FileNotFoundError:
        return False


def header(node, script, store, ws, session) -> dict:
    """What session's header gets from the service, and the titles after it."""
    proc = subprocess.run([node, str(script), str(store), str(ws), session],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


def scripts(tmp_path) -> dict:
    where = {"service": json.dumps(SERVICE.as_uri()),
             "config": json.dumps(SERVICE.with_name("config.js").as_uri())}
    out = {}
    for name, text in (("own", SCRIPT), ("header", HEADER)):
        out[name] = tmp_path / f"{name}.mjs"
        out[name].write_text(text % where)
    return out


def test_a_rewind_own_the_daemon_dies_in_is_finished_by_recover_and_said_so(tmp_path):
    paths = harness()
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    mine = history(ws, store)
    script = scripts(tmp_path)["own"]
    with crashing_daemon(Daemon(ws, store, env={"REWINDFS_FAULT_AFTER": "1"}), ws) as daemon:
        daemon.start()
        proc = subprocess.run([paths["NODE_BIN"], str(script), str(store), str(ws)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout.splitlines()[-1])
        assert daemon.proc.wait(30) != 0                    # it did die mid-landing
    refusal = out["result"]["refusal"]
    assert not out["result"]["ok"] and refusal["code"] == "connection-lost", refusal
    assert "were not rewound" not in refusal["message"], refusal["message"]
    assert "rewindfs mount --recover" in refusal["message"], refusal["message"]
    assert out["titles"] == {"p": "↩ work", "c": "work"}     # nothing known: marks stay

    # what the reply says finishes it does: p's files, exactly
    with background(ws, store, recover=True):
        assert compare(mine, snapshot(ws)) == []
        res = cli("fsck", store=store)
        assert res.returncode == 0, res.stdout + res.stderr


def test_ctrl_c_of_the_server_in_a_rewind_own_leaves_the_files_landed_and_the_mark_goes(
        tmp_path):
    paths = harness()
    ws, store, pause = tmp_path / "ws", tmp_path / "store", tmp_path / "pause"
    ws.mkdir()
    mine = history(ws, store)
    run = scripts(tmp_path)
    env = {"REWINDFS_PAUSE_AFTER": "1", "REWINDFS_PAUSE_FILE": str(pause)}
    with crashing_daemon(Daemon(ws, store, env=env), ws) as daemon:
        daemon.start()
        server = subprocess.Popen([paths["NODE_BIN"], str(run["own"]), str(store), str(ws)],
                                  stdout=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not pause.exists():                  # the landing holds after one path
            assert time.monotonic() < deadline and server.poll() is None
            time.sleep(0.02)
        server.send_signal(signal.SIGINT)
        assert server.wait(30) != 0                # gone before any reply
        pause.unlink()
        while not landed(mine, ws):                # the daemon lands the rest alone
            assert time.monotonic() < deadline
            time.sleep(0.05)
        out = header(paths["NODE_BIN"], run["header"], store, ws, "p")
        assert out["result"]["value"]["canRedo"] is True, out   # its /redo gives c's back
        assert out["titles"]["p"] == "work", out                 # the ↩ mark went
        # c's turn 2 is what the rewind took away: c is marked, and shown the way back
        out = header(paths["NODE_BIN"], run["header"], store, ws, "c")
        assert out["titles"]["c"] == "↩ work", out
        assert out["result"]["value"]["own"]["from"] == "p", out

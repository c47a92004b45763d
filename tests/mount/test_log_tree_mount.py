"""``rewindfs log --tree`` on a mounted workspace: the tree comes through the daemon's
``history`` method (real mount, real turns through the socket, a real rewind through the
CLI), and bad params to that method get structured errors while the daemon serves on."""

from __future__ import annotations

import json

import pytest
from rich.cells import cell_len

from mountkit import cli, mounted
from rewindfs.overlay.control.client import call
from rewindfs.store._errors import RewindfsError
from historykit import contract_parents

pytestmark = pytest.mark.mount


def test_log_tree_through_the_daemon(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    with mounted(ws, store) as m:
        for n in (1, 2, 3):
            m.call("turn.begin", session="s1", turn=n, label=f"step {n}")
            (ws / "a.txt").write_text(f"{n}\n")
            m.call("turn.end", session="s1")
        res = cli("rewind", "t2", "--session", "s1", store=store, cwd=ws)
        assert res.returncode == 0, res.stderr
        assert (ws / "a.txt").read_text() == "1\n"
        m.call("turn.begin", session="s1", turn=4, label="another way")
        (ws / "b.txt").write_text("b\n")

        res = cli("--json", "log", "--tree", store=store, cwd=ws)
        assert res.returncode == 0, res.stderr
        nodes = [json.loads(line) for line in res.stdout.splitlines()]
        assert all(n["type"] == "log.node" for n in nodes)
        plain = [json.loads(line) for line in
                 cli("--json", "log", store=store, cwd=ws).stdout.splitlines()]
        assert [n["epoch"] for n in nodes] == [p["epoch"] for p in plain]
        assert {n["epoch"]: n["parent"] for n in nodes} == contract_parents(plain)
        current = [n for n in nodes if n["current"]]
        assert len(current) == 1 and current[0]["turn"] == 4 and current[0]["paths"] == 1
        t1, t2 = (next(n["epoch"] for n in nodes if n["turn"] == t) for t in (1, 2))
        (rw,) = [n for n in nodes if n["kind"] == "rewind"]
        assert rw["target"] == t2 and rw["session"] == "s1" and rw["children"] == []

        res = cli("log", "--tree", store=store, cwd=ws, env={"COLUMNS": "80"})
        assert res.returncode == 0, res.stderr
        rows = res.stdout.splitlines()
        assert rows[0].startswith("@ ") and '"another way"' in rows[0]
        assert all(cell_len(r) <= 80 for r in rows)
        assert any(f"s1 rewind → t2 (e{t2})" in r for r in rows), rows
        assert rows[-2:] == ["├─╯", rows[-1]] and f"e{t1} " in rows[-1]

        # bad params: structured errors, and the daemon answers on
        for params, code in [({"session": 7}, "bad-params"), ({"session": ""}, "bad-params"),
                             ({"session": "nobody"}, "bad-session")]:
            with pytest.raises(RewindfsError) as exc:
                call(m.socket, "history", params, timeout=60)
            assert exc.value.code == code, params
        assert len(call(m.socket, "history", {"session": "s1"}, timeout=60)["nodes"]) == len(nodes)
        # the plain log names a session it never saw, as the tree does (a typo is not
        # an empty history); the points method still answers [] for it (the dsh plugin
        # lists "no points yet" for a session whose first turn is to come)
        res = cli("log", "--session", "nobody", store=store, cwd=ws)
        assert res.returncode == 3 and "bad-session" in res.stderr, res
        assert call(m.socket, "points", {"session": "nobody"}, timeout=60)["points"] == []

"""``rewindfs log --tree``: the state tree (store ``history``), its lanes, its rows.

Histories are made through the Store API (a redo epoch opened the way the store opens
every epoch, ``_epoch.open_new``, until main creates them itself) and, for the CLI, with
real offline rewinds over a real directory (``restorekit.History``).  The parents are
checked against ``contract_parents``: the contract's anchor rule written out as it is
worded (recursive), independent of the store's one-pass version.
"""

from __future__ import annotations

import json
import re

import pytest
from rich.cells import cell_len

from restorekit import History
from rewindfs.overlay.cli import main
from rewindfs.overlay.cli.graph import NODE, layout
from rewindfs.overlay.control.history import history_sync
from rewindfs.overlay.errors import BadParams
from rewindfs.store import BadSession, Store
from rewindfs.store import _epoch
from store_fixtures import assert_sound
from historykit import contract_parents


def open_redo(store, ws, rewind_id, session):
    """A redo epoch undoing rewind ``rewind_id`` (as main will open it: a new epoch)."""
    with store._w() as txn:
        return _epoch.open_new(txn, store._db, ws, "redo", session=session, target=rewind_id)


def turns(store, ws, session, *numbers):
    return [store.begin_turn(ws, session, n, f"turn {n}").id for n in numbers]


def tree(store, ws) -> dict[int, dict]:
    return {n["epoch"]: n for n in (node.as_dict() for node in store.history(ws))}


# -- the data: parents, forks, current --------------------------------------------------

def test_rewind_then_a_new_turn_is_a_sibling_and_the_rewind_a_leaf(store, ws):
    t1, t2, t3 = turns(store, ws, "s1", 1, 2, 3)
    rw = store.begin_rewind(ws, t2, "s1").id
    t4 = store.begin_turn(ws, "s1", 4, "turn 4").id
    nodes = tree(store, ws)
    assert nodes[t2]["parent"] == t1 and nodes[t4]["parent"] == t1    # siblings
    assert nodes[rw]["parent"] == t3 and nodes[rw]["children"] == []  # leaf, old tip
    assert nodes[t1]["children"] == [t2, t4]
    assert [n["epoch"] for n in nodes.values() if n["current"]] == [t4]
    assert {e: n["parent"] for e, n in nodes.items()} == contract_parents(list(nodes.values()))


def test_turn_ends_and_rewind_ends_keep_the_rule(store, ws):
    """The real sequence: every turn end and rewind end opens an idle epoch."""
    t1 = store.begin_turn(ws, "s1", 1, "a").id
    t2 = store.begin_turn(ws, "s1", 2, "b").id
    idle = store.end_turn(ws).id
    rw = store.begin_rewind(ws, t2, None).id
    after = store.end_rewind(ws).id
    t3 = store.begin_turn(ws, "s1", 3, "c").id
    nodes = tree(store, ws)
    assert nodes[rw]["parent"] == idle and nodes[after]["parent"] == t1
    assert nodes[t3]["parent"] == after and nodes[t3]["current"]
    assert {e: n["parent"] for e, n in nodes.items()} == contract_parents(list(nodes.values()))


def test_redo_returns_to_the_branch_the_rewind_left(store, ws):
    t1, t2, t3 = turns(store, ws, "s1", 1, 2, 3)
    rw = store.begin_rewind(ws, t1, "s1").id
    t4 = store.begin_turn(ws, "s1", 4, "other way").id
    redo = open_redo(store, ws, rw, "s1").id
    t5 = store.begin_turn(ws, "s1", 5, "on the old branch").id
    nodes = tree(store, ws)
    assert nodes[t4]["parent"] is None            # rewound to the very first point
    assert nodes[redo]["parent"] == t4            # a leaf on the branch it left
    assert nodes[t5]["parent"] == t3 == nodes[rw]["parent"]   # back at point rw
    assert nodes[redo]["kind"] == "redo" and nodes[redo]["target"] == rw
    assert {e: n["parent"] for e, n in nodes.items()} == contract_parents(list(nodes.values()))


def test_rewinding_to_a_rewind_goes_back_to_that_branch_tip(store, ws):
    t1, t2 = turns(store, ws, "s1", 1, 2)
    rw = store.begin_rewind(ws, t1, "s1").id
    t3 = store.begin_turn(ws, "s1", 3, "x").id
    back = store.begin_rewind(ws, rw, "s1").id
    t4 = store.begin_turn(ws, "s1", 4, "y").id
    nodes = tree(store, ws)
    assert nodes[back]["parent"] == t3 and nodes[t4]["parent"] == t2
    assert {e: n["parent"] for e, n in nodes.items()} == contract_parents(list(nodes.values()))


def test_forked_sessions_mark_their_first_turn(store, ws):
    t1, t2, _t3 = turns(store, ws, "s1", 1, 2, 3)
    store.fork_session("s2", "s1", 2)
    store.begin_rewind(ws, t2, "s2")
    c1 = store.begin_turn(ws, "s2", 3, "child").id
    c2 = store.begin_turn(ws, "s2", 4, "child again").id
    store.fork_session("s3", "s1", 1)
    store.begin_rewind(ws, t1, "s3")
    g1 = store.begin_turn(ws, "s3", 2, "other child").id
    nodes = tree(store, ws)
    assert nodes[c1]["fork"] == {"session": "s1", "turn": 2} and nodes[c1]["parent"] == t1
    assert nodes[c2]["fork"] is None and nodes[c2]["parent"] == c1
    assert nodes[g1]["fork"] == {"session": "s1", "turn": 1} and nodes[g1]["parent"] is None
    assert [e for e, n in nodes.items() if n["fork"]] == [c1, g1]


def test_a_target_the_workspace_lost_anchors_at_the_root(store, ws):
    """gc drops the oldest epochs: a rewind whose target is gone draws no edge."""
    t1, t2 = turns(store, ws, "s1", 1, 2)
    rw = store.begin_rewind(ws, t1, "s1").id
    t3 = store.begin_turn(ws, "s1", 3, "z").id
    store.gc(grace_s=0, keep_epochs=3, drop_redo=True)
    nodes = tree(store, ws)
    assert t1 not in nodes
    assert nodes[t2]["parent"] is None and nodes[rw]["parent"] == t2
    assert nodes[t3]["parent"] is None and nodes[t3]["current"]


# -- lanes on hand-made parent maps ------------------------------------------------------

def graph(order, parents):
    return [(nid, text) for nid, text in layout(order, parents)]


def test_lanes_of_deep_branches_merge_where_they_meet():
    parents = {2: 1, 3: 2, 4: 3, 5: 4, 6: 1, 7: 3, 1: None}
    assert graph([7, 6, 5, 4, 3, 2, 1], parents) == [
        (7, NODE),
        (6, f"│ {NODE}"),
        (5, f"│ │ {NODE}"),
        (4, f"│ │ {NODE}"),
        (None, "├─┼─╯"),         # 7's and 4's lanes meet at 3, across 6's
        (3, f"{NODE} │"),
        (2, f"{NODE} │"),
        (None, "├─╯"),
        (1, NODE),
    ]


def test_several_branches_merging_into_one_node():
    parents = {1: None, 2: 1, 3: 1, 4: 1, 5: 4}
    assert graph([5, 4, 3, 2, 1], parents) == [
        (5, NODE), (4, NODE), (3, f"│ {NODE}"), (2, f"│ │ {NODE}"),
        (None, "├─┴─╯"), (1, NODE)]


def test_a_lane_that_ends_leaves_a_hole_the_next_tip_takes():
    parents = {7: 1, 6: 4, 5: 2, 4: None, 3: 1, 2: 1, 1: None}
    assert graph([7, 6, 5, 4, 3, 2, 1], parents) == [
        (7, NODE), (6, f"│ {NODE}"), (5, f"│ │ {NODE}"),
        (4, f"│ {NODE} │"),       # a root: its lane ends here
        (3, f"│ {NODE} │"),       # a new tip in the hole, lane 2 stays where it was
        (2, f"│ │ {NODE}"),
        (None, "├─┴─╯"), (1, NODE)]


def test_a_long_straight_history_is_one_lane():
    parents = {i: i - 1 for i in range(2, 200)} | {1: None}
    rows = graph(list(range(199, 0, -1)), parents)
    assert [t for _, t in rows] == [NODE] * 199


def test_a_parent_not_drawn_below_ends_the_lane():
    rows = graph([3, 2], {3: 99, 2: 3})        # 99 not drawn; 2's parent is above it
    assert rows == [(3, NODE), (2, NODE)]


# -- the CLI, offline, with real rewinds ---------------------------------------------------

ESC_LABEL = "fix \x1b]0;pwned\x07 the \x1b[2J build"
LONG_LABEL = "refactor the parser so that every error names its line " * 4
WIDE_LABEL = "解析器のエラーに行番号を付ける" * 6     # two cells a character


class Cli:
    def __init__(self, tmp_path, monkeypatch, capfd):
        self.store_path = tmp_path / "store"
        self.root = tmp_path / "ws"
        self.root.mkdir()
        self.capfd = capfd
        monkeypatch.chdir(self.root)
        monkeypatch.setenv("COLUMNS", "80")

    def run(self, *argv):
        code = main(["--store", str(self.store_path), *argv])
        out, err = self.capfd.readouterr()
        return code, out, err

    def nodes(self, *argv):
        code, out, err = self.run("--json", "log", "--tree", *argv)
        assert code == 0, err
        records = [json.loads(line) for line in out.splitlines()]
        assert all(r["type"] == "log.node" and r["v"] == 1 for r in records), records
        return records


@pytest.fixture
def cli(tmp_path, monkeypatch, capfd):
    c = Cli(tmp_path, monkeypatch, capfd)
    yield c
    with Store.open(c.store_path, create=False) as store:
        assert_sound(store)


def three_turns(cli, labels=("first", "second", "third")) -> list[int]:
    """Turns 1..3 of s1, each writing a.txt, then a turn end; their epoch ids."""
    with Store.open(cli.store_path) as store:
        h = History(store, cli.root)
        ids = []
        for n, label in enumerate(labels, start=1):
            ids.append(store.begin_turn(h.ws, "s1", n, label).id)
            h.write(b"a.txt", f"{n}\n".encode())
        h.end_turn()
        h.close()
    return ids


def new_turn(cli, n, label="after") -> int:
    with Store.open(cli.store_path) as store:
        h = History(store, cli.root)
        eid = store.begin_turn(h.ws, "s1", n, label).id
        h.write(b"b.txt", b"b\n")
        h.end_turn()
        h.close()
    return eid


def test_cli_tree_after_a_real_rewind_and_redo(cli):
    t1, t2, t3 = three_turns(cli)
    assert cli.run("rewind", f"e{t2}")[0] == 0
    assert (cli.root / "a.txt").read_text() == "1\n"
    t4 = new_turn(cli, 4)
    nodes = cli.nodes()
    parents = {n["epoch"]: n["parent"] for n in nodes}
    assert parents == contract_parents(nodes)
    (rw,) = [n for n in nodes if n["kind"] == "rewind"]
    assert rw["target"] == t2 and rw["children"] == [] and rw["session"] is None
    # the new turn hangs off the idle epoch the rewind's end opened, a sibling of t2
    assert parents[parents[t4]] == t1 == parents[t2]
    assert [n["epoch"] for n in nodes if n["current"]] == [nodes[-1]["epoch"]]

    code, out, err = cli.run("log", "--tree")
    assert code == 0, err
    rows = out.splitlines()
    assert rows[0].startswith("@ ")
    row = {re.search(r"(e\d+) ", r).group(1): r for r in rows if re.search(r"e\d+ ", r)}
    # a manual rewind (no owner) names the target's session too
    assert f"rewind → s1 t2 (e{t2})" in row[f"e{rw['epoch']}"], rows
    assert f"e{t4}" in out and "├─╯" in out
    # drawn: t4 and t2 both straight under t1 (the quiet idle epochs are folded away)
    order = [r for r in rows if f"e{t1} " in r or f"e{t2} " in r or f"e{t4} " in r]
    assert [r.split("  ")[0].split()[-1] for r in order] == [f"e{t4}", f"e{t2}", f"e{t1}"]
    assert rows[-1].startswith("○ e") and f"e{t1} " in rows[-1]
    assert rows[-2] == "├─╯", rows
    code, full, _ = cli.run("log", "--tree", "--all")
    assert code == 0 and len(full.splitlines()) > len(rows) and "idle" in full

    # redo (real, offline): turn 4 changed the tree since the rewind, so a plain redo is
    # refused as stale; forced, it goes back to the old branch and the next epoch hangs
    # under t3's tip
    code, _out, err = cli.run("redo")
    assert code == 2 and "turn 4 of s1" in err, err
    assert cli.run("redo", "--force")[0] == 0
    assert (cli.root / "a.txt").read_text() == "3\n"
    (rd,) = [n for n in cli.nodes() if n["kind"] == "redo"]
    assert rd["target"] == rw["epoch"] and rd["session"] is None
    assert f"redo of e{rw['epoch']}" in cli.run("log", "--tree")[1]
    t5 = new_turn(cli, 5, "back on the old branch")
    nodes = cli.nodes()
    parents = {n["epoch"]: n["parent"] for n in nodes}
    assert parents == contract_parents(nodes)
    by_id = {n["epoch"]: n for n in nodes}
    assert by_id[t5]["parent"] is not None
    chain, p = [], t5
    while p is not None:
        chain.append(p)
        p = parents[p]
    assert t3 in chain and t2 in chain and t4 not in chain


def test_cli_tree_current_marker_and_json_fields(cli):
    t1, t2, t3 = three_turns(cli)
    nodes = cli.nodes()
    assert [n["current"] for n in nodes].count(True) == 1 and nodes[-1]["current"]
    first = nodes[0]
    assert {"epoch", "parent", "children", "current", "kind", "session", "turn", "label",
            "target", "paths", "bytes", "started_ns", "fork"} <= set(first)
    assert first["epoch"] == t1 and first["parent"] is None and first["paths"] == 1
    code, out, _ = cli.run("log", "--tree")
    assert code == 0 and out.count("@") == 1 and out.startswith("@ ")


def test_cli_tree_fits_80_columns_and_escapes_labels(cli):
    ids = three_turns(cli, labels=(ESC_LABEL, LONG_LABEL, "short"))
    with Store.open(cli.store_path) as store:
        ws = store.workspace(bytes(cli.root))
        store.fork_session("\x1b[31mred", "s1", 2)
        store.begin_rewind(ws, ids[1], "\x1b[31mred")
        store.begin_turn(ws, "\x1b[31mred", 3, WIDE_LABEL)
    code, out, err = cli.run("log", "--tree", "--all")
    assert code == 0, err
    rows = out.splitlines()
    assert all(cell_len(r) <= 80 for r in rows), "\n".join(rows)
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b]0;pwned\\x07" in out and "\\x1b[31mred" in out
    long_rows = [r for r in rows if "refactor" in r or "解析" in r]
    assert len(long_rows) == 2 and all("…" in r for r in long_rows)
    assert all(r.rstrip().endswith(tuple("0123456789")) for r in long_rows)  # time kept
    assert "fork of s1 at t2" in out
    # --json keeps the text whole
    labels = [n["label"] for n in cli.nodes()]
    assert ESC_LABEL in labels and LONG_LABEL in labels and WIDE_LABEL in labels


def test_cli_tree_with_session_marks_its_nodes(cli):
    t1, t2, t3 = three_turns(cli)
    with Store.open(cli.store_path) as store:
        ws = store.workspace(bytes(cli.root))
        store.fork_session("s2", "s1", 2)
        rw = store.begin_rewind(ws, t2, "s2").id
        store.end_rewind(ws)
        c3 = store.begin_turn(ws, "s2", 3, "child").id
    nodes = {n["epoch"]: n for n in cli.nodes("--session", "s2")}
    mine = {e for e, n in nodes.items() if n["in_session"]}
    assert mine == {t1, t2, rw, c3}             # inherited turns, its rewind, its turn
    code, out, err = cli.run("log", "--tree", "--session", "nobody")
    assert code == 3 and "bad-session" in err
    code, out, err = cli.run("log", "--all")
    assert code == 3 and "--tree" in err


def test_plain_log_of_a_session_it_never_saw_is_refused_like_the_tree(cli):
    """``rewindfs log --session typo`` printed "no history yet" and exited 0, as if the
    workspace were empty, while ``log --tree --session typo`` said bad-session: a typo
    in a session name looked like lost history.  Both refuse it now, naming it."""
    three_turns(cli)
    code, out, err = cli.run("log", "--session", "nobody")
    assert code == 3 and "bad-session" in err and "nobody" in err, (code, out, err)
    assert "no history yet" not in out
    code, out, err = cli.run("log", "--session", "s1")
    assert code == 0 and "no history yet" not in out


def test_empty_workspace_says_so(cli):
    with Store.open(cli.store_path) as store:
        store.workspace(bytes(cli.root))
    code, out, _ = cli.run("log", "--tree")
    assert code == 0 and "no history yet" in out
    assert cli.nodes() == []


# -- the method's params -------------------------------------------------------------------

class _Host:
    def __init__(self, store, ws):
        self.store, self.ws = store, ws


@pytest.mark.parametrize("params,error", [
    ({"session": 5}, BadParams), ({"session": ""}, BadParams), ({"session": ["s1"]}, BadParams),
    ({"session": "\ud800"}, BadParams), ({"session": "a\0b"}, BadSession),
    ({"session": "nobody"}, BadSession),
])
def test_history_params_are_checked(store, ws, params, error):
    turns(store, ws, "s1", 1)
    with pytest.raises(error) as exc:
        history_sync(_Host(store, ws), params)
    assert exc.value.code in ("bad-params", "bad-session")
    assert history_sync(_Host(store, ws), {})["nodes"][0]["turn"] == 1


def test_a_rewind_to_the_first_point_draws_one_root(cli):
    t1, t2, t3 = three_turns(cli)
    assert cli.run("rewind", f"e{t1}")[0] == 0
    t4 = new_turn(cli, 4, "from scratch")
    nodes = {n["epoch"]: n for n in cli.nodes()}
    roots = sorted(e for e, n in nodes.items() if n["parent"] is None)
    assert roots[0] == t1 and len(roots) == 2      # t1, and the idle the rewind left
    code, out, err = cli.run("log", "--tree")
    assert code == 0, err
    rows = out.splitlines()
    assert rows[-1].startswith("◆ root") and f"point e{t1}" in rows[-1]
    assert rows[-2] == "├─╯" and f"e{t1} " in rows[-3] and rows[-3].startswith("│ ○")
    assert rows[0].startswith("@") and any(f"e{t4} " in r and r.startswith("○ ") for r in rows)

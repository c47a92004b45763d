"""The restore engine on a plain directory with a real store (no mount).

History is made by ``restorekit.History`` (real syscalls, captured write-ahead with the
real capture code); every rewind is checked against a snapshot taken at that point.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from rewindfs.overlay.rewind.engine import apply_plan, plan_redo, plan_rewind
from restorekit import History, open_history
from rewindfs.store import NothingToRedo, RedoStale, RewindfsError, TurnOpen
from store_fixtures import assert_sound
from treesnap import compare, snapshot

NS = 1_600_000_000_123_456_789


@pytest.fixture
def hist(tmp_path):
    with open_history(tmp_path) as h:
        yield h


def rewind(h: History, to, **kw):
    plan = plan_rewind(h.fd, h.store, h.ws, to, paths=kw.pop("paths", None),
                       session=kw.pop("session", None))
    return apply_plan(h.fd, h.store, h.ws, plan, session=kw.pop("as_session", None), **kw)


def redo(h: History, session=None):
    return apply_plan(h.fd, h.store, h.ws, plan_redo(h.fd, h.store, h.ws, session=session),
                      session=session)


def same(h: History, snap) -> None:
    diffs = compare(snap, snapshot(h.root, mtimes=True))
    assert diffs == [], "\n".join(diffs)


def build_base(h: History) -> None:
    """A tree made before any capture: the state of every point until touched."""
    os.makedirs(h.p(b"src/pkg"))
    os.makedirs(h.p(b"empty"))
    with open(h.p(b"src/pkg/a.py"), "wb") as f:
        f.write(b"print('a')\n")
    with open(h.p(b"bin.dat"), "wb") as f:
        f.write(bytes(range(256)) * 40)
    os.chmod(h.p(b"bin.dat"), 0o640)
    os.setxattr(h.p(b"src/pkg/a.py"), b"user.tag", b"one")
    os.symlink(b"src/pkg/a.py", h.p(b"link"))
    os.mkfifo(h.p(b"pipe"), 0o600)
    with open(h.p(b"hard1"), "wb") as f:
        f.write(b"shared\n")
    os.link(h.p(b"hard1"), h.p(b"hard2"))
    with open(h.p(b"caf\xe9-\xff.txt"), "wb") as f:      # not UTF-8
        f.write(b"latin-1 name\n")
    for rel in (b"src/pkg/a.py", b"bin.dat", b"hard1", b"caf\xe9-\xff.txt", b"pipe"):
        os.utime(h.p(rel), ns=(NS, NS))
    os.utime(h.p(b"link"), ns=(NS, NS), follow_symlinks=False)


def mess_up(h: History) -> None:
    """One turn's worth of every kind of change."""
    h.write(b"src/pkg/a.py", b"print('changed')\n")
    h.setxattr(b"src/pkg/a.py", b"user.tag", b"two")
    h.setxattr(b"src/pkg/a.py", b"user.extra", b"x")
    h.chmod(b"bin.dat", 0o755)
    h.utime(b"bin.dat", NS + 5)
    h.remove(b"link")
    h.symlink(b"elsewhere", b"link")
    h.remove(b"empty")
    h.write(b"new.txt", b"created in the turn\n")
    h.mkdir(b"newdir")
    h.write(b"newdir/inner", b"inner\n")
    h.write(b"hard1", b"changed through one name\n", also=[b"hard2"])
    h.remove(b"caf\xe9-\xff.txt")
    h.remove(b"pipe")
    h.rename(b"src", b"moved")


def test_rewind_restores_everything_and_redo_undoes_it(hist):
    build_base(hist)
    base = snapshot(hist.root, mtimes=True)
    e1 = hist.turn(1)
    mess_up(hist)
    hist.end_turn()
    after = snapshot(hist.root, mtimes=True)
    assert compare(base, after) != []

    result = rewind(hist, f"e{e1}")
    assert result.failed == [] and result.exit_code == 0
    same(hist, base)
    assert os.stat(hist.p(b"hard1")).st_ino == os.stat(hist.p(b"hard2")).st_ino
    assert os.getxattr(hist.p(b"src/pkg/a.py"), b"user.tag") == b"one"

    assert redo(hist).failed == []
    same(hist, after)
    with pytest.raises(NothingToRedo):      # a stack, not a toggle: nothing left
        redo(hist)
    same(hist, after)
    assert rewind(hist, "t1").failed == []  # going back again is a rewind, by turn number
    same(hist, base)
    assert rewind(hist, "t1").failed == []  # already there: a no-op
    same(hist, base)


def test_second_identical_rewind_changes_nothing(hist):
    build_base(hist)
    e1 = hist.turn(1)
    mess_up(hist)
    hist.end_turn()
    rewind(hist, f"e{e1}")
    plan = plan_rewind(hist.fd, hist.store, hist.ws, f"e{e1}")
    counts = plan.counts()
    assert counts["written"] == counts["created"] == counts["deleted"] == 0, counts
    assert counts["meta"] == 0, [(i.action.path, i.change) for i in plan.items]


def test_stacked_rewinds_reach_every_point(hist):
    snaps, points = [], []
    for n in range(1, 5):
        points.append(hist.turn(n))
        snaps.append(snapshot(hist.root))
        hist.write(b"f", b"version %d\n" % n)
        hist.write(b"d%d" % n, b"only in %d\n" % n) if n % 2 else hist.remove(b"d%d" % (n - 1))
    hist.end_turn()
    final = snapshot(hist.root)
    for i in (2, 0, 3, 1):
        assert rewind(hist, f"e{points[i]}").failed == []
        assert compare(snaps[i], snapshot(hist.root)) == []
    for i in range(4):
        rewind(hist, f"e{points[i]}")
        assert compare(snaps[i], snapshot(hist.root)) == []
    newest = hist.store.epochs(hist.ws)
    first_rewind = next(e for e in newest if e.kind == "rewind")
    rewind(hist, f"e{first_rewind.id}")          # the state before any rewind
    assert compare(final, snapshot(hist.root)) == []


def test_dry_run_classifies_and_lists_foreign_paths(hist):
    build_base(hist)
    e1 = hist.turn(1)
    hist.write(b"bin.dat", b"new content")
    hist.write(b"created.txt", b"x")
    hist.chmod(b"src/pkg/a.py", 0o600)
    hist.end_turn()
    hist.write(b"by-hand.txt", b"a person typed this")      # idle epoch
    hist.turn(2, session="other")
    hist.remove(b"hard2")
    hist.end_turn()
    before = snapshot(hist.root, mtimes=True)
    plan = plan_rewind(hist.fd, hist.store, hist.ws, f"e{e1}", session="s1")
    change = {i.action.path: i.change for i in plan.items if i.change != "unchanged"}
    assert change == {b"bin.dat": "written", b"created.txt": "deleted",
                      b"src/pkg/a.py": "meta", b"by-hand.txt": "deleted",
                      b"hard2": "created"}
    foreign = {p: e.kind for p, e in plan.foreign}
    # hard1 too: removing hard2 changed its link count in the other session's turn
    assert foreign == {b"by-hand.txt": "idle", b"hard2": "turn", b"hard1": "turn"}
    assert compare(before, snapshot(hist.root, mtimes=True)) == []   # planning changes nothing


def test_paths_filter_restores_only_those(hist):
    build_base(hist)
    e1 = hist.turn(1)
    hist.write(b"bin.dat", b"new")
    hist.write(b"src/pkg/a.py", b"new a")
    hist.write(b"src/pkg/b.py", b"new b")
    hist.end_turn()
    assert rewind(hist, f"e{e1}", paths=[b"src"]).failed == []
    assert open(hist.p(b"bin.dat"), "rb").read() == b"new"
    assert open(hist.p(b"src/pkg/a.py"), "rb").read() == b"print('a')\n"
    assert not os.path.exists(hist.p(b"src/pkg/b.py"))


def test_one_failure_is_named_and_the_rest_land(hist):
    build_base(hist)
    e1 = hist.turn(1)
    hist.write(b"bin.dat", b"changed")
    hist.write(b"stuck", b"changed too")
    hist.remove(b"src/pkg/a.py")
    hist.mkdir(b"src/pkg/a.py")
    hist.end_turn()
    # Unobserved content inside a directory that must go: never deleted.
    with open(hist.p(b"src/pkg/a.py/unseen"), "wb") as f:
        f.write(b"nobody recorded me")
    subprocess.run(["chattr", "+i", hist.p(b"stuck")], check=True)
    try:
        result = rewind(hist, f"e{e1}")
    finally:
        subprocess.run(["chattr", "-i", hist.p(b"stuck")], check=True)
    failed = {f.path: f.code for f in result.failed}
    assert failed == {b"stuck": "os-error", b"src/pkg/a.py": "not-empty"}
    assert result.exit_code == 1
    assert open(hist.p(b"bin.dat"), "rb").read() == bytes(range(256)) * 40
    assert open(hist.p(b"src/pkg/a.py/unseen"), "rb").read() == b"nobody recorded me"
    assert not [n for n in os.listdir(hist.root) if n.startswith(b".rewindfs~")]


def test_symlinked_component_never_leads_outside(hist, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    os.makedirs(hist.p(b"dir"))
    with open(hist.p(b"dir/file"), "wb") as f:
        f.write(b"old")
    e1 = hist.turn(1)
    hist.write(b"dir/file", b"new")
    hist.write(b"top", b"top")
    hist.end_turn()
    # Swapped behind the journal's back: the directory becomes a symlink out.
    os.rename(hist.p(b"dir"), hist.p(b"dir.real"))
    os.symlink(os.fsencode(outside), hist.p(b"dir"))
    result = rewind(hist, f"e{e1}")
    assert [(f.path, f.code) for f in result.failed] == [(b"dir/file", "path-escape")]
    assert os.listdir(outside) == []
    assert not os.path.exists(hist.p(b"top"))        # the rest still landed


def test_ignored_paths_are_never_restored_or_deleted(hist):
    e1 = hist.turn(1)
    hist.write(b"build.log", b"captured before the rule existed")
    hist.write(b"keep.txt", b"k")
    hist.end_turn()
    with open(hist.p(b".rewindignore"), "wb") as f:
        f.write(b"*.log\n")
    result = rewind(hist, f"e{e1}")
    assert result.failed == [] and result.counts["ignored"] == 1
    assert os.path.exists(hist.p(b"build.log"))
    assert not os.path.exists(hist.p(b"keep.txt"))


def test_a_rule_the_rewound_turn_added_does_not_keep_what_it_deleted(hist):
    """The restore side of tests/mount/test_rel_ignore.py: ``*.txt`` written and
    ``a.txt`` deleted in the turn; the rewind restores ``a.txt`` (the point's rules do
    not ignore it) and removes the ``.rewindignore`` the turn made.  Ignored only by
    both rule sets, ``b.log`` (made in the turn) stays."""
    hist.write(b"a.txt", b"precious")
    with open(hist.p(b".rewindignore"), "wb") as f:     # in force before the turn too
        f.write(b"*.log\n")
    e1 = hist.turn(1)
    hist.write(b".rewindignore", b"*.log\n*.txt\n")
    hist.remove(b"a.txt")
    hist.end_turn()
    with open(hist.p(b"b.log"), "wb") as f:
        f.write(b"ignored before and after")
    result = rewind(hist, f"e{e1}")
    assert result.failed == []
    assert open(hist.p(b"a.txt"), "rb").read() == b"precious"
    assert open(hist.p(b".rewindignore"), "rb").read() == b"*.log\n"
    assert os.path.exists(hist.p(b"b.log"))


def test_a_point_whose_rules_cannot_be_read_still_restores_the_rest(hist):
    """The point's ``.rewindignore`` (over 1 MiB, so a blob file) is gone from the
    store: its own restore fails and is named (``blob-missing``); the rest lands, by
    no rules of that point — not the whole rewind refused for one unreadable file."""
    hist.write(b"a.txt", b"precious")
    hist.write(b".rewindignore", b"*.log\n" + b"# padding\n" * 110_000)
    e1 = hist.turn(1)
    hist.write(b".rewindignore", b"*.txt\n")
    hist.remove(b"a.txt")
    hist.end_turn()
    away = [os.path.join(dirpath, name)
            for dirpath, _dirs, files in os.walk(os.path.join(hist.store.path, "blobs"))
            for name in files]
    for path in away:
        os.rename(path, path + ".away")
    try:
        result = rewind(hist, f"e{e1}")
    finally:                    # the fixture checks the store is sound at the end
        for path in away:
            os.rename(path + ".away", path)
    assert {f.path: f.code for f in result.failed} == {b".rewindignore": "blob-missing"}
    assert open(hist.p(b"a.txt"), "rb").read() == b"precious"


def test_link_groups_are_rebuilt_and_broken(hist):
    with open(hist.p(b"a"), "wb") as f:
        f.write(b"same")
    os.link(hist.p(b"a"), hist.p(b"b"))
    with open(hist.p(b"c"), "wb") as f:
        f.write(b"solo")
    base = snapshot(hist.root)
    e1 = hist.turn(1)
    hist.remove(b"b", also=[b"a"])
    hist.write(b"b", b"same")                      # same content, separate inode
    hist.remove(b"c")
    hist.link(b"a", b"c")                          # c now shares a's inode
    hist.end_turn()
    assert rewind(hist, f"e{e1}").failed == []
    assert compare(base, snapshot(hist.root)) == []


@pytest.mark.parametrize("point,error", [
    ("e999", "unknown-point"), ("t7", "unknown-point"), ("nonsense", "unknown-point"),
    ("-1", "relative-point"), ("HEAD~1", "relative-point"), ("~1", "relative-point"),
    ("prev", "relative-point"), ("last", "relative-point"),
])
def test_bad_points_change_nothing(hist, point, error):
    build_base(hist)
    hist.turn(1)
    mess_up(hist)
    hist.end_turn()
    before, epochs = snapshot(hist.root, mtimes=True), hist.store.epochs(hist.ws)
    with pytest.raises(RewindfsError) as info:
        rewind(hist, point)
    assert info.value.code == error
    assert info.value.exit_code == (3 if error == "relative-point" else 2)
    same(hist, before)
    assert hist.store.epochs(hist.ws) == epochs


@pytest.mark.parametrize("path", [b"../etc", b"/etc/passwd", b"a/../../b", b"a//b"])
def test_paths_outside_the_workspace_are_refused(hist, path):
    build_base(hist)
    e1 = hist.turn(1)
    mess_up(hist)
    hist.end_turn()
    before = snapshot(hist.root, mtimes=True)
    with pytest.raises(RewindfsError) as info:
        rewind(hist, f"e{e1}", paths=[path])
    assert info.value.exit_code == 3
    same(hist, before)


def test_open_turn_refuses_unless_forced(hist):
    build_base(hist)
    base = snapshot(hist.root, mtimes=True)
    e1 = hist.turn(1)
    mess_up(hist)
    before, epochs = snapshot(hist.root, mtimes=True), hist.store.epochs(hist.ws)
    with pytest.raises(TurnOpen) as info:
        rewind(hist, f"e{e1}")
    assert info.value.code == "turn-open" and info.value.exit_code == 2
    same(hist, before)
    assert hist.store.epochs(hist.ws) == epochs and hist.store.get_intent(hist.ws) is None
    assert rewind(hist, f"e{e1}", force=True).failed == []
    same(hist, base)


def test_nothing_to_redo(hist):
    with pytest.raises(NothingToRedo):
        redo(hist)
    with pytest.raises(NothingToRedo):
        redo(hist, session="s9")


def test_redo_is_per_session(hist):
    e1 = hist.turn(1)
    hist.write(b"f", b"one")
    e2 = hist.turn(2)
    hist.write(b"f", b"two")
    hist.end_turn()
    plan = plan_rewind(hist.fd, hist.store, hist.ws, f"e{e2}")
    apply_plan(hist.fd, hist.store, hist.ws, plan, session="child")   # the undo_for case
    assert open(hist.p(b"f"), "rb").read() == b"one"
    plan = plan_rewind(hist.fd, hist.store, hist.ws, f"e{e1}")
    apply_plan(hist.fd, hist.store, hist.ws, plan, session="other")
    assert not os.path.exists(hist.p(b"f"))
    with pytest.raises(RedoStale) as refused:   # "other" changed the tree since
        redo(hist, session="child")
    assert refused.value.details["changes"][0]["session"] == "other"
    assert not os.path.exists(hist.p(b"f"))
    apply_plan(hist.fd, hist.store, hist.ws,        # forced: undoes the child's rewind,
               plan_redo(hist.fd, hist.store, hist.ws, session="child", force=True),
               session="child")
    assert open(hist.p(b"f"), "rb").read() == b"two"   # not the newest one


def test_redo_compares_the_tree_with_what_the_rewind_left_not_with_a_later_rewinds_result(hist):
    """The sequence hypothesis found (tests/unit/test_history_model.py): s1 rewinds
    (R1), a manual rewind R2 lands another state, a turn edits, a forced redo of R2
    puts the tree back as R1 left it.  R2 and its redo cancel out, the turn's edit is
    gone from the tree: s1's redo discards nothing and goes ahead.  Compared with the
    first stale epoch's start (R2's result) instead, it was refused."""
    t1 = hist.turn(1)
    hist.write(b"a", b"one")
    t2 = hist.turn(2)
    hist.write(b"a", b"two")
    hist.end_turn()
    apply_plan(hist.fd, hist.store, hist.ws,
               plan_rewind(hist.fd, hist.store, hist.ws, f"e{t1}"), session="s1")   # R1
    assert not os.path.exists(hist.p(b"a"))
    apply_plan(hist.fd, hist.store, hist.ws,
               plan_rewind(hist.fd, hist.store, hist.ws, f"e{t2}"), session=None)    # R2
    assert open(hist.p(b"a"), "rb").read() == b"one"
    hist.turn(3)
    hist.write(b"a", b"three")
    hist.end_turn()
    apply_plan(hist.fd, hist.store, hist.ws,
               plan_redo(hist.fd, hist.store, hist.ws, force=True), session=None)    # undo R2
    assert not os.path.exists(hist.p(b"a"))            # as R1 left it
    redo(hist, session="s1")                            # not stale: nothing to discard
    assert open(hist.p(b"a"), "rb").read() == b"two"

"""Hard links made before the mount: every name is captured, the link structure comes back.

The mount is an overmount, so at mount time the daemon knows no name of the tree.  A
file linked as ``d/A`` and ``B`` before mounting, changed in a turn through ``d/A``
alone (the kernel never looks ``B`` up), changes ``B`` too (one inode): the capture must
record ``B`` as well, and a rewind must give back the content under both names AND one
inode with the old link count; redo the reverse.  Issue 12, DESIGN invariants 1 and 13.

Snapshots are taken of the real directory underneath the mount (a dir fd opened before
mounting), so the test itself never shows the daemon a name the change did not use.
"""

from __future__ import annotations

import dataclasses
import os
import random

import pytest

from mountkit import cli, mounted
from relkit import trials
from store_fixtures import assert_sound
from rewindfs.store import Store
from treesnap import compare, snapshot, real_view

pytestmark = pytest.mark.mount


def _linked_tree(ws, names=("B", "e/C")) -> None:
    """``d/A`` = each of *names* (one inode), ``d/solo`` alone."""
    os.makedirs(ws / "d")
    os.makedirs(ws / "e")
    (ws / "d" / "A").write_bytes(b"content\n")
    for name in names:
        os.link(ws / "d" / "A", ws / name)
    (ws / "d" / "solo").write_bytes(b"alone\n")


def _append(p):
    with open(p, "ab") as f:
        f.write(b"more\n")


def _otrunc(p):
    with open(p, "wb") as f:
        f.write(b"new")


def _write_by_fd_after_rm(p):
    """A handle opened before the name goes: the write reaches the other names."""
    fd = os.open(p, os.O_WRONLY)
    try:
        os.unlink(p)
        os.pwrite(fd, b"XX", 0)
    finally:
        os.close(fd)


def _ln_then_append(p):
    os.link(p, os.path.join(os.path.dirname(p), "L"))
    _append(os.path.join(os.path.dirname(p), "L"))


def _rename_then_append(p):
    new = os.path.join(os.path.dirname(p), "R")
    os.rename(p, new)
    _append(new)


def _rename_over_twin(p):
    """``d/A`` renamed over ``B`` (its own twin: rename(2) does nothing) then over solo."""
    root = os.path.dirname(os.path.dirname(p))
    os.rename(p, os.path.join(root, "B"))
    os.rename(p, os.path.join(root, "d", "solo"))


def _exchange_then_append(p):
    """RENAME_EXCHANGE of ``d/A`` with ``d/solo``, then a write through the new name."""
    from rewindfs.overlay.tree.syscalls import RENAME_EXCHANGE, renameat2
    fd = os.open(os.path.dirname(p), os.O_RDONLY | os.O_DIRECTORY)
    try:
        renameat2(fd, b"A", fd, b"solo", RENAME_EXCHANGE)
    finally:
        os.close(fd)
    _append(os.path.join(os.path.dirname(p), "solo"))


CHANGES = {
    "append": _append,
    "truncate": lambda p: os.truncate(p, 2),
    "o_trunc": _otrunc,
    "chmod": lambda p: os.chmod(p, 0o600),
    "chown": lambda p: os.chown(p, 1234, 4321),
    "utimes": lambda p: os.utime(p, ns=(10**9, 2 * 10**9)),
    "setxattr": lambda p: os.setxattr(p, "user.k", b"v"),
    "rm": os.unlink,
    "write_fd_after_rm": _write_by_fd_after_rm,
    "ln": lambda p: os.link(p, os.path.join(os.path.dirname(p), "L")),
    "ln_then_append": _ln_then_append,
    "rename": lambda p: os.rename(p, os.path.join(os.path.dirname(p), "R")),
    "rename_then_append": _rename_then_append,
    "rename_over_twin_and_solo": _rename_over_twin,
    "exchange_then_append": _exchange_then_append,
}


def _snap(top):
    """``treesnap.snapshot`` with the mtimes of files (a directory's mtime moves when a
    rewind lands a name in it, link or not: not this file's subject), plus every file's
    owner."""
    owners = {}
    for dirpath, _dirs, files in os.walk(top):
        for name in files:
            st = os.lstat(os.path.join(dirpath, name))
            owners[os.fsencode(os.path.relpath(os.path.join(dirpath, name), top))] = (
                st.st_uid, st.st_gid)
    tree, links = snapshot(top, mtimes=True)
    tree = {p: dataclasses.replace(n, mtime_ns=None) if n.kind == "dir" else n
            for p, n in tree.items()}
    return (tree, links), owners


def _diff(expected, actual) -> list[str]:
    out = compare(expected[0], actual[0])
    return out + [f"{p!r}: owner {actual[1].get(p)}, expected {o}"
                  for p, o in sorted(expected[1].items()) if actual[1].get(p) != o]


def _assert_same(expected, real, what):
    diffs = _diff(expected, _snap(real))
    assert diffs == [], f"{what}:\n" + "\n".join(diffs[:20])


def _one_inode(real, names, nlink):
    sts = [os.lstat(os.path.join(real, n)) for n in names]
    assert {st.st_ino for st in sts} == {sts[0].st_ino}, f"{names} are not one inode"
    assert sts[0].st_nlink == nlink


def _change_in_a_turn(m, ws, real, change):
    """Turn 1 makes ``change`` through ``d/A``; (snapshot before, its epoch, after)."""
    before = _snap(real)
    e1 = m.call("turn.begin", session="s", turn=1, label="t")["epoch"]
    CHANGES[change](os.path.join(ws, "d", "A"))
    m.call("turn.end")
    return before, e1, _snap(real)


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_change_through_one_name_is_rewound_for_all(change, tmp_path):
    ws = tmp_path / "ws"
    _linked_tree(ws)
    with real_view(ws) as real, mounted(ws, tmp_path / "store") as m:
        before, e1, after = _change_in_a_turn(m, ws, real, change)
        assert _diff(before, after) != [], "the change changed nothing"
        res = m.call("rewind", to=f"e{e1}")
        assert res["failed"] == []
        _assert_same(before, real, f"rewind after {change}")
        _one_inode(real, ["d/A", "B", "e/C"], 3)
        _assert_same(before, ws, f"rewind after {change}, through the mount")
        res = m.call("redo")
        assert res["failed"] == []
        _assert_same(after, real, f"redo after {change}")
        _assert_same(after, ws, f"redo after {change}, through the mount")
    with Store.open(tmp_path / "store") as store:
        assert_sound(store)


@pytest.mark.parametrize("change", ["append", "rm", "rename", "rename_over_twin_and_solo",
                                    "write_fd_after_rm", "exchange_then_append"])
def test_two_names_one_changed(change, tmp_path):
    """The issue's own case: ``d/A`` and ``B`` only, so after an ``rm d/A`` the
    survivor has one link and no walk of the tree would call it a twin."""
    ws = tmp_path / "ws"
    _linked_tree(ws, names=("B",))
    with real_view(ws) as real, mounted(ws, tmp_path / "store") as m:
        before, e1, after = _change_in_a_turn(m, ws, real, change)
        assert m.call("rewind", to=f"e{e1}")["failed"] == []
        _assert_same(before, real, f"rewind after {change}")
        _one_inode(real, ["d/A", "B"], 2)
        assert m.call("redo")["failed"] == []
        _assert_same(after, real, f"redo after {change}")


def test_names_the_kernel_forgot(tmp_path):
    """Links made THROUGH the mount are forgotten too: when the kernel drops its cached
    inodes (memory pressure; here ``drop_caches``) it sends FORGET and the daemon's
    table loses their names — the same state as links made before mounting (this is how
    fsstress seed 135 broke a link group with no error)."""
    ws = tmp_path / "ws"
    ws.mkdir()
    with real_view(ws) as real, mounted(ws, tmp_path / "store") as m:
        os.mkdir(ws / "d")
        (ws / "d" / "A").write_bytes(b"content\n")
        os.link(ws / "d" / "A", ws / "B")
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("2")                    # dentries and inodes: FORGET to the daemon
        before = _snap(real)
        e1 = m.call("turn.begin", session="s", turn=1, label="t")["epoch"]
        _append(ws / "d" / "A")
        m.call("turn.end")
        assert m.call("rewind", to=f"e{e1}")["failed"] == []
        _assert_same(before, real, "rewind after the kernel forgot B")
        _one_inode(real, ["d/A", "B"], 2)


@pytest.mark.parametrize("change", ["append", "rm", "chmod", "rename_then_append"])
def test_offline_rewind_and_redo_rebuild_the_links(change, tmp_path):
    """The turn through the mount, the rewind and redo by the CLI after unmounting."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    _linked_tree(ws)
    with real_view(ws) as real:
        before = _snap(real)
        with mounted(ws, store) as m:
            e1 = m.call("turn.begin", session="s", turn=1, label="t")["epoch"]
            CHANGES[change](os.path.join(ws, "d", "A"))
            m.call("turn.end")
        after = _snap(ws)
        res = cli("rewind", f"e{e1}", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        _assert_same(before, ws, f"offline rewind after {change}")
        _one_inode(real, ["d/A", "B", "e/C"], 3)
        res = cli("redo", "-C", ws, store=store)
        assert res.returncode == 0, res.stderr
        _assert_same(after, ws, f"offline redo after {change}")
    with Store.open(store) as st:
        assert_sound(st)


# -- seeded random sequences --------------------------------------------------------------

class _LinkAgent:
    """Random link/unlink/write/rename/chmod/xattr and directory renames through the
    mount, by names it tracks itself (no listing, so the daemon learns only the names
    the changes use)."""

    def __init__(self, ws, rng: random.Random, names: list[str]):
        self.ws, self.rng, self.names, self.n = str(ws), rng, list(names), 0
        self.dirs = ["d", "e"]

    def _p(self, rel):
        return os.path.join(self.ws, rel)

    def _new(self):
        self.n += 1
        return self.rng.choice(["", *(d + "/" for d in self.dirs)]) + f"n{self.n}"

    def step(self):
        if not self.names:
            return
        name = self.rng.choice(self.names)
        op = self.rng.choice(["write", "append", "truncate", "chmod", "xattr", "link",
                              "link", "unlink", "rename", "rename_over", "rename_dir"])
        p = self._p(name)
        if op == "write":
            with open(p, "r+b") as f:
                f.seek(self.rng.randrange(0, os.path.getsize(p) + 1))
                f.write(self.rng.randbytes(self.rng.randrange(1, 50)))
        elif op == "append":
            _append(p)
        elif op == "truncate":
            os.truncate(p, self.rng.randrange(0, 12))
        elif op == "chmod":
            os.chmod(p, self.rng.choice((0o600, 0o644, 0o755)))
        elif op == "xattr":
            os.setxattr(p, f"user.k{self.rng.randrange(2)}", self.rng.randbytes(4))
        elif op == "link":
            new = self._new()
            os.link(p, self._p(new))
            self.names.append(new)
        elif op == "unlink":
            os.unlink(p)
            self.names.remove(name)
        elif op == "rename_dir":
            old = self.rng.choice(self.dirs)
            self.n += 1
            new = f"m{self.n}"
            os.rename(self._p(old), self._p(new))
            self.dirs[self.dirs.index(old)] = new
            self.names = [new + p[len(old):] if p.startswith(old + "/") else p
                          for p in self.names]
        elif op == "rename":
            new = self._new()
            os.rename(p, self._p(new))
            self.names[self.names.index(name)] = new
        else:
            other = self.rng.choice(self.names)
            if os.path.samefile(p, self._p(other)):
                return          # rename(2) between two names of one inode does nothing
            os.rename(p, self._p(other))
            self.names.remove(name)


def _random_tree(ws, rng: random.Random) -> list[str]:
    """Files in ``.``, ``d``, ``e``; some of them hard-linked in groups of 2–4."""
    os.makedirs(ws / "d")
    os.makedirs(ws / "e")
    names = []
    for i in range(rng.randrange(3, 7)):
        first = rng.choice(["", "d/", "e/"]) + f"f{i}"
        (ws / first).write_bytes(rng.randbytes(rng.randrange(0, 30)))
        names.append(first)
        for j in range(rng.choice((0, 1, 1, 2, 3))):
            other = rng.choice(["", "d/", "e/"]) + f"f{i}_{j}"
            os.link(ws / first, ws / other)
            names.append(other)
    return names


@pytest.mark.parametrize("seed", trials(6))
def test_random_link_sequences_rewind_and_redo(seed, tmp_path):
    """Each trial: a fresh linked tree made before mounting, 3 turns of random changes
    by name, then a rewind to each turn's start and a redo, each checked against the
    snapshot (content, mode, xattrs, link counts and names of every inode)."""
    rng = random.Random(seed)
    ws, store = tmp_path / "ws", tmp_path / "store"
    names = _random_tree(ws, rng)
    with real_view(ws) as real, mounted(ws, store) as m:
        agent = _LinkAgent(ws, rng, names)
        points, snaps = [], []
        for turn in range(1, 4):
            snaps.append(_snap(real))
            points.append(m.call("turn.begin", session="s", turn=turn, label="t")["epoch"])
            for _ in range(rng.randrange(2, 8)):
                agent.step()
        m.call("turn.end")
        final = _snap(real)
        for i in rng.sample(range(len(points)), len(points)):
            res = m.call("rewind", to=f"e{points[i]}")
            assert res["failed"] == []
            _assert_same(snaps[i], real, f"seed {seed}: rewind to turn {i + 1}")
            res = m.call("redo")
            assert res["failed"] == []
            _assert_same(final, real, f"seed {seed}: redo after turn {i + 1}")
    print(f"seed {seed}: 1 trial, 0 failures")

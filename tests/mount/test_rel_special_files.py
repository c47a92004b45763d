"""Special files (fifos, sockets, char and block devices) survive rewind and redo.

Issue 14: fsstress made device nodes in a turn, and a rewind then a redo lost all of
them (they were recorded as ``absent``).  Like ``rsync -a`` and ``tar``, a rewind and a
redo must give each one back with its type, mode, owner, device number and mtime —
made in a turn (rewind: gone, redo: back) or existing before a turn that removes or
replaces them (rewind: back, redo: the turn's state again), mounted and offline.
DESIGN invariants 3 and 13.

Every change goes through the mount; snapshots are of the real directory underneath
(a dir fd opened before mounting) and through the mount.
"""

from __future__ import annotations

import os
import stat

import pytest

from mountkit import cli, mounted, rewind_then_redo
from store_fixtures import assert_sound
from rewindfs.store import Store
from treesnap import compare, exact, real_view

pytestmark = pytest.mark.mount

# name → (file type, permission bits, device number, owner)
SPECIALS = {
    "chr": (stat.S_IFCHR, 0o620, os.makedev(1, 3), (1234, 4321)),
    "blk": (stat.S_IFBLK, 0o640, os.makedev(7, 200), (0, 6)),
    "fifo": (stat.S_IFIFO, 0o604, 0, (1000, 1000)),
    "sock": (stat.S_IFSOCK, 0o755, 0, (42, 43)),
    "d/chr2": (stat.S_IFCHR, 0o600, os.makedev(136, 7), (5, 5)),
}


def _make_specials(top, names=SPECIALS, mtime_base=10**18):
    os.makedirs(os.path.join(top, "d"), exist_ok=True)
    for i, (name, (fmt, perm, rdev, (uid, gid))) in enumerate(sorted(names.items())):
        p = os.path.join(top, name)
        os.mknod(p, fmt | 0o600, rdev)
        os.chown(p, uid, gid)
        os.chmod(p, perm)
        os.utime(p, ns=(mtime_base + i, mtime_base + i * 1000 + 7))


def _assert_same(expected, top, what):
    diffs = compare(expected, exact(top))
    assert diffs == [], f"{what}:\n" + "\n".join(diffs[:30])


def _links_rebuilt(top):
    """Each special file and its second name are one inode again."""
    for name in ("chr", "sock", "sym", "fifo"):
        assert os.lstat(os.path.join(top, name)).st_ino == os.lstat(
            os.path.join(top, "d", name + "-2")).st_ino, name


def _assert_specials(top, names=SPECIALS):
    """Each special file is there with exactly its type, mode, device number, owner."""
    for name, (fmt, perm, rdev, owner) in names.items():
        st = os.lstat(os.path.join(top, name))
        assert stat.S_IFMT(st.st_mode) == fmt, f"{name}: type {stat.S_IFMT(st.st_mode):o}"
        assert stat.S_IMODE(st.st_mode) == perm, name
        assert st.st_rdev == rdev, name
        assert (st.st_uid, st.st_gid) == owner, name


def test_specials_made_in_a_turn_go_on_rewind_and_come_back_on_redo(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    (ws / "d").mkdir(parents=True)
    with real_view(ws) as real, mounted(ws, store) as m:
        before = exact(real)
        e1 = m.call("turn.begin", session="s", turn=1, label="mknod")["epoch"]
        _make_specials(ws)
        m.call("turn.end")
        after = exact(real)
        _assert_specials(real)
        res = m.call("rewind", to=f"e{e1}")
        assert res["failed"] == [], res
        _assert_same(before, real, "rewind")
        _assert_same(before, ws, "rewind, through the mount")
        res = m.call("redo")
        assert res["failed"] == [], res
        _assert_specials(real)
        _assert_same(after, real, "redo")
        _assert_same(after, ws, "redo, through the mount")
    with Store.open(store) as st:
        assert_sound(st)


def _turn_replaces_specials(ws):
    """Remove one, replace one by a file, one by another device, one by a directory;
    chmod/chown/utimes two more."""
    os.unlink(ws / "chr")
    os.unlink(ws / "blk")
    (ws / "blk").write_bytes(b"now a file\n")
    os.unlink(ws / "d" / "chr2")
    os.mknod(ws / "d" / "chr2", stat.S_IFBLK | 0o600, os.makedev(8, 1))
    os.unlink(ws / "sock")
    os.mkdir(ws / "sock")
    os.chmod(ws / "fifo", 0o666)
    os.chown(ws / "fifo", 7, 8)
    os.utime(ws / "fifo", ns=(1, 2))


def test_specials_removed_or_replaced_in_a_turn_come_back(tmp_path):
    ws, store = tmp_path / "ws", tmp_path / "store"
    _make_specials(ws)
    with real_view(ws) as real, mounted(ws, store) as m:
        before = exact(real)
        e1 = m.call("turn.begin", session="s", turn=1, label="replace")["epoch"]
        _turn_replaces_specials(ws)
        m.call("turn.end")
        after = exact(real)
        assert compare(before, after) != [], "the turn changed nothing"
        rewind_then_redo(m, e1, real, before, after, rewound=_assert_specials)
    with Store.open(store) as st:
        assert_sound(st)


def test_offline_rewind_and_redo_of_specials(tmp_path):
    """The turn through the mount; rewind and redo by the CLI with nothing mounted."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    _make_specials(ws, {k: v for k, v in SPECIALS.items() if k != "chr"})
    before = exact(ws)
    with mounted(ws, store) as m:
        e1 = m.call("turn.begin", session="s", turn=1, label="both")["epoch"]
        os.mknod(ws / "chr", stat.S_IFCHR | 0o644, os.makedev(1, 5))
        os.unlink(ws / "fifo")
        os.rename(ws / "d" / "chr2", ws / "moved")
        os.unlink(ws / "sock")
        os.mknod(ws / "sock", stat.S_IFSOCK | 0o700)
        m.call("turn.end")
    after = exact(ws)
    res = cli("rewind", f"e{e1}", "-C", ws, store=store)
    assert res.returncode == 0, res.stderr + res.stdout
    _assert_same(before, ws, "offline rewind")
    res = cli("redo", "-C", ws, store=store)
    assert res.returncode == 0, res.stderr + res.stdout
    _assert_same(after, ws, "offline redo")
    with Store.open(store) as st:
        assert_sound(st)


def test_hard_links_of_specials_and_symlinks_come_back(tmp_path):
    """Any non-directory can have hard links (fsstress links devices and symlinks): a
    turn that chmods one through one name and unlinks another name gives the inode back
    with every name and its link count on rewind, and the turn's state on redo."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    _make_specials(ws)
    os.symlink("target", ws / "sym")
    for name in ("chr", "sock", "sym", "fifo"):
        os.link(ws / name, ws / "d" / (name + "-2"), follow_symlinks=False)
    with real_view(ws) as real, mounted(ws, store) as m:
        before = exact(real)
        e1 = m.call("turn.begin", session="s", turn=1, label="links")["epoch"]
        os.chmod(ws / "d" / "chr-2", 0o666)
        os.chown(ws / "d" / "fifo-2", 9, 9)
        os.unlink(ws / "sock")
        os.unlink(ws / "d" / "sym-2")
        os.link(ws / "fifo", ws / "fifo-3")
        m.call("turn.end")
        after = exact(real)
        rewind_then_redo(m, e1, real, before, after, rewound=_links_rebuilt)
    with Store.open(store) as st:
        assert_sound(st)


def test_rename_whiteout_through_the_mount_leaves_a_whiteout(tmp_path):
    """``renameat2(RENAME_WHITEOUT)`` (fsstress's ``rwhiteout``; overlayfs' whiteouts)
    moves the entry and leaves a char device 0:0 under the old name, as on the real
    filesystem — not a plain rename.  Rewind: the file back, no whiteout; redo: both."""
    from rewindfs.overlay.tree.syscalls import renameat2
    whiteout = 4    # RENAME_WHITEOUT
    ws, store = tmp_path / "ws", tmp_path / "store"
    ws.mkdir()
    (ws / "a").write_bytes(b"content\n")
    with real_view(ws) as real, mounted(ws, store) as m:
        before = exact(real)
        e1 = m.call("turn.begin", session="s", turn=1, label="whiteout")["epoch"]
        fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
        try:
            renameat2(fd, b"a", fd, b"b", whiteout)
        finally:
            os.close(fd)
        m.call("turn.end")
        st = os.lstat(os.path.join(real, "a"))
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0, "no whiteout left behind"
        st = os.lstat(ws / "a")
        assert stat.S_ISCHR(st.st_mode) and st.st_rdev == 0, "the mount shows no whiteout"
        assert (ws / "b").read_bytes() == b"content\n"
        after = exact(real)
        assert m.call("rewind", to=f"e{e1}")["failed"] == []
        _assert_same(before, real, "rewind")
        assert m.call("redo")["failed"] == []
        _assert_same(after, real, "redo")

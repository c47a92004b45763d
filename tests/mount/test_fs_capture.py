"""Every kind of change through a real mount is captured once per epoch, with the
pre-image the path had before the change (so it was recorded before the change)."""

from __future__ import annotations

import errno
import itertools
import os
import stat

import pytest

from mountkit import mounted
from rewindfs.overlay.tree import syscalls

pytestmark = pytest.mark.mount

_turns = itertools.count(1)


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    base = tmp_path_factory.mktemp("fscap")
    with mounted(base / "ws", base / "store") as mnt:
        yield mnt
    from rewindfs.store import Store
    with Store.open(base / "store") as s:
        assert s.fsck().ok


class Turn:
    """A fresh turn (so a fresh epoch) and a fresh directory for one test."""

    def __init__(self, m, name):
        self.m = m
        self.dir = m.ws / name
        self.rel = name.encode()

    def begin(self):
        self.epoch = self.m.call("turn.begin", session="t", turn=next(_turns),
                                 label="test")["epoch"]
        self.before = self.captures()
        return self

    def captures(self):
        return self.m.call("status")["fs"]["captures"]

    def journal(self, epoch=None):
        with self.m.open_store() as s:
            ws = s.workspace(os.fsencode(os.path.realpath(self.m.ws)))
            return dict(s.journal(ws, epoch or self.epoch))

    def content(self, image):
        with self.m.open_store() as s:
            return s.read_blob(image.blob)

    def p(self, *parts):
        return os.path.join(self.dir, *parts)

    def r(self, *parts):
        return b"/".join([self.rel, *(x.encode() for x in parts)])


@pytest.fixture
def t(m, request):
    t = Turn(m, request.node.name.replace("[", "_").replace("]", ""))
    os.mkdir(t.dir)
    return t


def test_write_is_captured_once_with_old_content(t):
    with open(t.p("f"), "w") as f:
        f.write("old")
    t.begin()
    with open(t.p("f"), "r+") as f:
        f.write("n1")
    with open(t.p("f"), "a") as f:
        f.write("+more")
    with open(t.p("f"), "w") as f:  # O_TRUNC
        f.write("n3")
    j = t.journal()
    assert set(j) == {t.r("f")}
    assert j[t.r("f")].kind == "file" and t.content(j[t.r("f")]) == b"old"
    assert t.captures() - t.before == 1
    e1 = t.epoch
    t.begin()
    with open(t.p("f"), "a") as f:
        f.write("!")
    assert t.content(t.journal()[t.r("f")]) == b"n3"
    assert t.content(t.journal(e1)[t.r("f")]) == b"old"
    with open(t.p("f")) as f:
        assert f.read() == "n3!"


def test_truncate_open_trunc_and_ftruncate(t):
    for name in ("a", "b", "c"):
        with open(t.p(name), "w") as f:
            f.write(name * 10)
    t.begin()
    os.truncate(t.p("a"), 3)
    os.close(os.open(t.p("b"), os.O_WRONLY | os.O_TRUNC))
    fd = os.open(t.p("c"), os.O_RDWR)
    os.ftruncate(fd, 1)
    os.close(fd)
    j = t.journal()
    assert {k: t.content(v) for k, v in j.items()} == {
        t.r("a"): b"a" * 10, t.r("b"): b"b" * 10, t.r("c"): b"c" * 10}
    assert os.path.getsize(t.p("a")) == 3 and os.path.getsize(t.p("b")) == 0


def test_metadata_changes(t):
    for name in ("m", "o", "u", "x"):
        with open(t.p(name), "w") as f:
            f.write(name)
        os.chmod(t.p(name), 0o644)
    os.utime(t.p("u"), ns=(5, 1_000_000_000))
    os.setxattr(t.p("x"), "user.gone", b"1")
    t.begin()
    os.chmod(t.p("m"), 0o600)
    os.chown(t.p("o"), 1234, 5678)
    os.utime(t.p("u"), ns=(7, 2_000_000_000))
    os.setxattr(t.p("x"), "user.new", b"2")
    os.removexattr(t.p("x"), "user.gone")
    j = t.journal()
    assert j[t.r("m")].mode == 0o644
    assert (j[t.r("o")].uid, j[t.r("o")].gid) == (0, 0)
    assert j[t.r("u")].mtime_ns == 1_000_000_000
    assert j[t.r("x")].xattrs == ((b"user.gone", b"1"),)
    assert stat.S_IMODE(os.stat(t.p("m")).st_mode) == 0o600
    assert os.stat(t.p("o")).st_uid == 1234
    assert os.stat(t.p("u")).st_mtime_ns == 2_000_000_000
    assert os.listxattr(t.p("x")) == ["user.new"]


def test_creations_are_recorded_absent(t):
    with open(t.p("src"), "w") as f:
        f.write("s")
    t.begin()
    with open(t.p("new"), "w") as f:
        f.write("n")
    os.mkdir(t.p("dir"))
    os.symlink("src", t.p("sym"))
    os.mkfifo(t.p("fifo"))
    os.link(t.p("src"), t.p("hard"))
    j = t.journal()
    for name in ("new", "dir", "sym", "fifo", "hard"):
        assert j[t.r(name)].kind == "absent", name
    assert t.r("src") not in j  # linking does not change the source's content
    assert stat.S_ISFIFO(os.lstat(t.p("fifo")).st_mode)
    assert os.readlink(t.p("sym")) == "src"


def test_unlink_and_rmdir_record_what_was_there(t):
    with open(t.p("f"), "w") as f:
        f.write("bye")
    os.mkdir(t.p("d"), 0o705)
    os.symlink("target", t.p("l"))
    t.begin()
    os.unlink(t.p("f"))
    os.rmdir(t.p("d"))
    os.unlink(t.p("l"))
    j = t.journal()
    assert t.content(j[t.r("f")]) == b"bye"
    assert (j[t.r("d")].kind, j[t.r("d")].mode) == ("dir", 0o705)
    assert (j[t.r("l")].kind, j[t.r("l")].target) == ("symlink", b"target")


def test_rename_captures_subtree_destinations_and_overwritten(t):
    os.makedirs(t.p("d", "y"))
    for rel, data in (("d/x", "X"), ("d/y/z", "Z"), ("a", "A"), ("b", "B")):
        with open(t.p(rel), "w") as f:
            f.write(data)
    t.begin()
    os.rename(t.p("d"), t.p("e"))
    os.rename(t.p("a"), t.p("b"))  # overwrites b
    j = t.journal()
    assert t.content(j[t.r("d", "x")]) == b"X"
    assert t.content(j[t.r("d", "y", "z")]) == b"Z"
    assert j[t.r("d")].kind == j[t.r("d", "y")].kind == "dir"
    for dest in (("e",), ("e", "x"), ("e", "y"), ("e", "y", "z")):
        assert j[t.r(*dest)].kind == "absent", dest
    assert t.content(j[t.r("a")]) == b"A" and t.content(j[t.r("b")]) == b"B"
    with open(t.p("e", "y", "z")) as f:
        assert f.read() == "Z"
    # the moved file is already captured (as absent at its new name): no new capture
    n = t.captures()
    with open(t.p("e", "x"), "a") as f:
        f.write("more")
    assert t.captures() == n


def _renameat2(a, b, flags):
    da = os.open(os.path.dirname(a), os.O_RDONLY | os.O_DIRECTORY)
    db = os.open(os.path.dirname(b), os.O_RDONLY | os.O_DIRECTORY)
    try:
        syscalls.renameat2(da, os.fsencode(os.path.basename(a)), db,
                       os.fsencode(os.path.basename(b)), flags)
    finally:
        os.close(da)
        os.close(db)


def test_rename_exchange_and_noreplace(t):
    os.mkdir(t.p("dir"))
    for rel, data in (("a", "A"), ("dir/in", "I"), ("c", "C")):
        with open(t.p(rel), "w") as f:
            f.write(data)
    t.begin()
    with pytest.raises(OSError) as exc:
        _renameat2(t.p("a"), t.p("c"), syscalls.RENAME_NOREPLACE)
    assert exc.value.errno == errno.EEXIST
    _renameat2(t.p("a"), t.p("dir"), syscalls.RENAME_EXCHANGE)
    assert open(t.p("dir")).read() == "A"
    assert open(t.p("a", "in")).read() == "I"
    j = t.journal()
    assert t.content(j[t.r("a")]) == b"A" and j[t.r("dir")].kind == "dir"
    assert t.content(j[t.r("dir", "in")]) == b"I"
    assert j[t.r("a", "in")].kind == "absent"
    assert t.r("c") not in j  # the refused rename changed nothing
    _renameat2(t.p("c"), t.p("new"), syscalls.RENAME_NOREPLACE)
    assert not os.path.exists(t.p("c")) and open(t.p("new")).read() == "C"


def test_write_through_a_hard_link_captures_every_known_name(t):
    with open(t.p("a"), "w") as f:
        f.write("shared")
    os.link(t.p("a"), t.p("b"))
    os.stat(t.p("b"))  # the overlay learns the second name
    t.begin()
    with open(t.p("a"), "a") as f:
        f.write("!")
    j = t.journal()
    assert t.content(j[t.r("a")]) == t.content(j[t.r("b")]) == b"shared"
    assert j[t.r("a")].link_group == j[t.r("b")].link_group is not None
    assert open(t.p("b")).read() == "shared!"


def test_ignored_paths_pass_through(m, t):
    with open(t.p("keep"), "w") as f:
        f.write("k")
    with open(m.ws / ".rewindignore", "w") as f:
        f.write(f"{t.dir.name}/*.tmp\n{t.dir.name}/cache/\n")
    try:
        t.begin()
        with open(t.p("x.tmp"), "w") as f:
            f.write("t")
        os.makedirs(t.p("cache", "deep"))
        with open(t.p("cache", "deep", "f"), "w") as f:
            f.write("c")
        with open(t.p("keep"), "a") as f:
            f.write("+")
        assert set(t.journal()) == {t.r("keep")}
    finally:
        os.unlink(m.ws / ".rewindignore")


def test_large_file_capture_streams(t):
    data = os.urandom(1 << 20) * 40  # 40 MiB
    with open(t.p("big"), "wb") as f:
        f.write(data)
    t.begin()
    with open(t.p("big"), "r+b") as f:
        f.seek(len(data) // 2)
        f.write(b"changed")
    image = t.journal()[t.r("big")]
    assert image.size == len(data)
    assert t.content(image) == data


def test_unlink_or_rename_of_a_hard_link_captures_the_other_names(t):
    for name in ("a", "c"):
        with open(t.p(name), "w") as f:
            f.write(name)
    os.link(t.p("a"), t.p("b"))
    os.link(t.p("c"), t.p("d"))
    os.stat(t.p("b"))
    os.stat(t.p("d"))
    t.begin()
    os.unlink(t.p("a"))
    os.rename(t.p("c"), t.p("e"))
    j = t.journal()
    assert j[t.r("a")].link_group == j[t.r("b")].link_group is not None
    assert j[t.r("c")].link_group == j[t.r("d")].link_group is not None
    assert j[t.r("e")].kind == "absent"
    assert open(t.p("b")).read() == "a" and os.stat(t.p("b")).st_nlink == 1


def test_epoch_changed_behind_the_daemon_is_followed(t):
    with open(t.p("f"), "w") as f:
        f.write("x")
    t.begin()
    with t.m.open_store() as s:  # not through the socket: the daemon learns on capture
        ws = s.workspace(os.fsencode(os.path.realpath(t.m.ws)))
        # force: another process takes the workspace from the open turn on purpose
        other = s.begin_turn(ws, "elsewhere", 1, "out of band", force=True).id
    with open(t.p("new"), "w") as f:
        f.write("n")
    with open(t.p("f"), "a") as f:
        f.write("y")
    j = t.journal(other)
    assert j[t.r("new")].kind == "absent" and t.content(j[t.r("f")]) == b"x"
    assert t.m.call("status")["epoch"] == other

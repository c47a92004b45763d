"""The FUSE handlers in-process: ``RewindOperations`` over a real directory and a real
store, never mounted; each handler is awaited directly with a fake request context,
as pyfuse3's request loop would call it.

What this proves, beside the real-mount tests (tests/test_fs_capture.py,
tests/test_fs_posix.py, which check the same rules through the kernel): each handler
captures the pre-image of every path it changes, in the current epoch, once per
epoch, *before* the change (the image holds the old state); refusals — rewind temp
names, a running rewind's fence, an adopted inode's write fence, a capture the store
refuses — are the right errno and change nothing; the underlying filesystem's errno
comes through unchanged.  No /dev/fuse needed.

Fakes, and why: pyfuse3's ``RequestContext`` and ``SetattrFields`` cannot be filled in
from Python (read-only attributes), so small stand-ins with the same attribute names
are passed; ``readdir`` replies through ``pyfuse3.readdir_reply``, which needs the
kernel's buffer, so that one function is replaced by a collector.  The kernel cache
notifications the handlers queue have no session to reach and are dropped.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import struct

import pyfuse3
import pytest
from pyfuse3 import FUSEError

# Kits by today's names; the overlay modules by today's names (one line each to
# rewrite after the move into wings).
from store_fixtures import store, store_path  # noqa: F401  (fixtures)
from rewindfs.overlay.fs.ops import RewindOperations
from rewindfs.overlay.rewind.land import TMP_PREFIX
from rewindfs.store import StoreError, StoreFull

ROOT = pyfuse3.ROOT_INODE


class FakeRequest:
    """What pyfuse3 passes handlers as ``ctx``: uid, gid, pid, umask."""

    def __init__(self, uid=None, gid=None, pid=None, umask=0o022):
        self.uid = os.getuid() if uid is None else uid
        self.gid = os.getgid() if gid is None else gid
        self.pid = os.getpid() if pid is None else pid
        self.umask = umask


class Fields:
    """Stand-in for ``pyfuse3.SetattrFields``: which attributes a setattr changes."""

    def __init__(self, **changed):
        for name in ("size", "mode", "uid", "gid", "atime", "mtime", "ctime"):
            setattr(self, "update_" + name, bool(changed.pop(name, False)))
        assert not changed, changed


REQ = FakeRequest()


def attrs(**values) -> pyfuse3.EntryAttributes:
    a = pyfuse3.EntryAttributes()
    for name, value in values.items():
        setattr(a, name, value)
    return a


def errno_of(excinfo) -> int:
    return excinfo.value.errno


class Tree:
    """The unmounted filesystem over ``tmp_path/ws`` plus helpers to reach its inodes
    the way the kernel does (lookup from the root) and to read what the store holds."""

    def __init__(self, tmp_path, store, *, writeback=False):
        self.root = tmp_path / "ws"
        self.root.mkdir(exist_ok=True)
        self.store = store
        self.ws = store.workspace(os.path.realpath(os.fsencode(self.root)))
        self.root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self.fs = RewindOperations(self.root_fd, store, self.ws, writeback=writeback)
        self._turns = 0

    def close(self):
        self.fs.close()
        os.close(self.root_fd)

    def p(self, rel: str):
        return self.root / rel

    def write(self, rel: str, data: bytes | str) -> None:
        """Straight to the real directory (as before the mount: no capture)."""
        mode = "wb" if isinstance(data, bytes) else "w"
        with open(self.p(rel), mode) as f:
            f.write(data)

    def read(self, rel: str) -> bytes:
        with open(self.p(rel), "rb") as f:
            return f.read()

    def turn(self) -> int:
        """A new turn epoch, told to the filesystem as ``turn.begin`` does."""
        self._turns += 1
        epoch = self.store.begin_turn(self.ws, "s", self._turns, "test")
        self.fs.set_epoch(epoch.id)
        self.epoch = epoch.id
        return epoch.id

    def journal(self, epoch=None) -> dict:
        return dict(self.store.journal(self.ws, epoch or self.epoch))

    def content(self, image) -> bytes:
        return self.store.read_blob(image.blob)

    async def ino(self, rel: str) -> int:
        """The FUSE inode of *rel*, looked up component by component."""
        ino = ROOT
        for name in rel.encode().split(b"/"):
            entry = await self.fs.lookup(ino, name, REQ)
            assert entry.st_ino, f"{rel}: no such entry"
            ino = entry.st_ino
        return ino

    async def open(self, rel: str, flags: int) -> int:
        return (await self.fs.open(await self.ino(rel), flags, REQ)).fh

    async def put(self, rel: str, data: bytes, flags=os.O_WRONLY) -> None:
        fh = await self.open(rel, flags)
        try:
            await self.fs.write(fh, 0, data)
        finally:
            await self.fs.release(fh)

    async def setattr(self, rel: str, fh=None, **changes):
        fields = Fields(**{k: True for k in changes})
        a = attrs(**{{"size": "st_size", "mode": "st_mode", "uid": "st_uid",
                      "gid": "st_gid", "atime": "st_atime_ns",
                      "mtime": "st_mtime_ns"}[k]: v for k, v in changes.items()})
        return await self.fs.setattr(await self.ino(rel), a, fields, fh, REQ)


@pytest.fixture
def umask0():
    """The daemon runs with umask 0 (the kernel already applied the caller's)."""
    old = os.umask(0)
    yield
    os.umask(old)


@pytest.fixture
def t(tmp_path, store, umask0):  # noqa: F811  (store: the fixture imported above)
    tree = Tree(tmp_path, store)
    try:
        yield tree
    finally:
        tree.close()


# -- lookups, attributes, directories ---------------------------------------------

async def test_lookup_getattr_and_forget(t):
    t.write("f", b"12345")
    st = os.lstat(t.p("f"))
    entry = await t.fs.lookup(ROOT, b"f", REQ)
    assert entry.st_ino not in (0, ROOT)
    assert (entry.st_size, entry.st_mode, entry.st_nlink) == (5, st.st_mode, 1)
    assert entry.st_mtime_ns == st.st_mtime_ns
    assert (await t.fs.lookup(ROOT, b"f", REQ)).st_ino == entry.st_ino   # stable
    again = await t.fs.getattr(entry.st_ino, REQ)
    assert (again.st_ino, again.st_size) == (entry.st_ino, 5)
    assert (await t.fs.getattr(ROOT, REQ)).st_mode == os.lstat(t.root).st_mode
    await t.fs.forget([(entry.st_ino, 2)])       # the kernel drops both lookups
    with pytest.raises(FUSEError) as exc:
        await t.fs.getattr(entry.st_ino, REQ)
    assert errno_of(exc) == errno.ENOENT


async def test_lookup_of_a_missing_name_is_a_cacheable_negative_entry(t):
    """Not ENOENT raised but an entry with inode 0: the kernel then answers ENOENT
    itself and caches the miss for ``entry_timeout``."""
    neg = await t.fs.lookup(ROOT, b"missing", REQ)
    assert neg.st_ino == 0 and neg.entry_timeout == t.fs.timeout > 0
    with pytest.raises(FUSEError) as exc:          # an inode the table never handed out
        await t.fs.lookup(987654, b"x", REQ)
    assert errno_of(exc) == errno.ENOENT
    with pytest.raises(FUSEError) as exc:
        await t.fs.getattr(987654, REQ)
    assert errno_of(exc) == errno.ENOENT


async def test_rewind_temp_names_do_not_exist_through_the_filesystem(t, monkeypatch):
    tmp = TMP_PREFIX + b"7~00ff"
    t.write(os.fsdecode(tmp), b"half-landed")
    t.write("visible", b"v")
    with pytest.raises(FUSEError) as exc:
        await t.fs.lookup(ROOT, tmp, REQ)
    assert errno_of(exc) == errno.ENOENT
    listed = []
    monkeypatch.setattr(pyfuse3, "readdir_reply",
                        lambda token, name, attr, next_id: listed.append(name) or True)
    fh = await t.fs.opendir(ROOT, REQ)
    try:
        await t.fs.readdir(fh, 0, object())
    finally:
        await t.fs.releasedir(fh)
    assert listed == [b"visible"]


async def test_readdir_lists_resumes_and_stops_when_the_buffer_is_full(t, monkeypatch):
    os.mkdir(t.p("d"))
    for name in ("a", "b", "c"):
        t.write(f"d/{name}", name)
    replies = []
    room = [2]

    def reply(token, name, attr, next_id):
        if room[0] == 0:
            return False                  # the kernel's buffer is full
        room[0] -= 1
        replies.append((name, attr.st_ino, next_id))
        return True

    monkeypatch.setattr(pyfuse3, "readdir_reply", reply)
    d = await t.ino("d")
    fh = await t.fs.opendir(d, REQ)
    try:
        await t.fs.readdir(fh, 0, object())
        assert len(replies) == 2                         # then the buffer was full
        room[0] = 10
        await t.fs.readdir(fh, replies[-1][2], object())   # resume where it stopped
    finally:
        await t.fs.releasedir(fh)
    assert sorted(n for n, _, _ in replies) == [b"a", b"b", b"c"]
    assert [i for _, _, i in replies] == [1, 2, 3]
    # every entry handed out counts as a lookup: getattr answers for it
    for name, ino, _ in replies:
        assert (await t.fs.getattr(ino, REQ)).st_size == 1, name


async def test_read_only_handlers_capture_nothing(t, monkeypatch):
    t.write("f", b"data")
    os.symlink("f", t.p("l"))
    os.setxattr(t.p("f"), "user.k", b"v")
    t.turn()
    fh = await t.open("f", os.O_RDONLY)
    assert await t.fs.read(fh, 1, 2) == b"at"
    await t.fs.release(fh)
    assert await t.fs.readlink(await t.ino("l"), REQ) == b"f"
    assert await t.fs.getxattr(await t.ino("f"), b"user.k", REQ) == b"v"
    assert b"user.k" in await t.fs.listxattr(await t.ino("f"), REQ)
    assert await t.fs.access(await t.ino("f"), os.R_OK, REQ) is True
    assert (await t.fs.statfs(REQ)).f_bsize == os.statvfs(t.root).f_bsize
    monkeypatch.setattr(pyfuse3, "readdir_reply", lambda *a: True)
    dh = await t.fs.opendir(ROOT, REQ)
    await t.fs.readdir(dh, 0, object())
    await t.fs.releasedir(dh)
    assert t.journal() == {} and t.fs.stats["captures"] == 0


# -- capture before each kind of change --------------------------------------------

async def test_write_is_captured_once_per_epoch_with_the_old_content(t):
    t.write("f", b"old")
    e1 = t.turn()
    fh = await t.open("f", os.O_RDWR)
    assert t.journal() == {}            # no writeback cache: a plain open captures nothing
    await t.fs.write(fh, 0, b"n1")
    await t.fs.write(fh, 2, b"n2")
    await t.fs.release(fh)
    await t.put("f", b"n3", os.O_WRONLY | os.O_TRUNC)
    j = t.journal()
    assert list(j) == [b"f"] and j[b"f"].kind == "file" and t.content(j[b"f"]) == b"old"
    assert t.fs.stats["captures"] == 1
    assert t.read("f") == b"n3"
    t.turn()
    await t.put("f", b"!")
    assert t.content(t.journal()[b"f"]) == b"n3"
    assert t.content(t.journal(e1)[b"f"]) == b"old"
    assert t.fs.stats["captures"] == 2


async def test_open_trunc_captures_before_truncating(t):
    t.write("f", b"keep me")
    t.turn()
    fh = await t.open("f", os.O_WRONLY | os.O_TRUNC)
    try:
        assert t.content(t.journal()[b"f"]) == b"keep me"   # before any write
        assert t.read("f") == b""
    finally:
        await t.fs.release(fh)


async def test_writeback_cache_captures_at_open_for_writing(tmp_path, store, umask0):  # noqa: F811
    t = Tree(tmp_path, store, writeback=True)
    try:
        t.write("f", b"before")
        t.turn()
        fh = await t.open("f", os.O_WRONLY | os.O_APPEND)
        try:
            assert t.content(t.journal()[b"f"]) == b"before"
            # the kernel may read pages of the file and computes offsets itself
            flags = fcntl.fcntl(fh, fcntl.F_GETFL)
            assert flags & os.O_ACCMODE == os.O_RDWR and not flags & os.O_APPEND
            assert t.fs.writers_open()
        finally:
            await t.fs.release(fh)
        assert not t.fs.writers_open()
        ro = await t.open("f", os.O_RDONLY)
        await t.fs.release(ro)
        assert t.fs.stats["captures"] == 1
    finally:
        t.close()


async def test_create_records_absent_and_the_file_lands(t):
    t.turn()
    info, entry = await t.fs.create(ROOT, b"new", stat.S_IFREG | 0o640,
                                    os.O_WRONLY | os.O_CREAT, REQ)
    assert [(p, i.kind) for p, i in t.journal().items()] == [(b"new", "absent")]
    assert await t.fs.write(info.fh, 0, b"hello") == 5
    await t.fs.release(info.fh)
    assert t.read("new") == b"hello"
    assert stat.S_IMODE(os.stat(t.p("new")).st_mode) == 0o640
    assert entry.st_ino == await t.ino("new")
    assert t.fs.stats["captures"] == 1            # the write found it captured


async def test_every_kind_of_creation_records_absent(t):
    t.write("src", b"s")
    t.turn()
    await t.fs.mkdir(ROOT, b"dir", stat.S_IFDIR | 0o750, REQ)
    await t.fs.symlink(ROOT, b"sym", b"src", REQ)
    await t.fs.mknod(ROOT, b"fifo", stat.S_IFIFO | 0o600, 0, REQ)
    linked = await t.fs.link(await t.ino("src"), ROOT, b"hard", REQ)
    j = t.journal()
    assert {p: i.kind for p, i in j.items()} == {
        b"dir": "absent", b"sym": "absent", b"fifo": "absent", b"hard": "absent"}
    assert b"src" not in j                       # a link leaves the content alone
    assert stat.S_ISDIR(os.lstat(t.p("dir")).st_mode)
    assert stat.S_IMODE(os.lstat(t.p("dir")).st_mode) == 0o750
    assert os.readlink(t.p("sym")) == "src"
    assert stat.S_ISFIFO(os.lstat(t.p("fifo")).st_mode)
    assert os.stat(t.p("src")).st_nlink == 2 and linked.st_nlink == 2
    assert linked.st_ino == await t.ino("src") == await t.ino("hard")


async def test_unlink_and_rmdir_record_what_was_there(t):
    t.write("f", b"bye")
    os.mkdir(t.p("d"), 0o705)
    os.symlink("target", t.p("l"))
    t.turn()
    for name in (b"f", b"l"):
        await t.fs.lookup(ROOT, name, REQ)
        await t.fs.unlink(ROOT, name, REQ)
    await t.fs.lookup(ROOT, b"d", REQ)
    await t.fs.rmdir(ROOT, b"d", REQ)
    j = t.journal()
    assert t.content(j[b"f"]) == b"bye"
    assert (j[b"d"].kind, j[b"d"].mode) == ("dir", 0o705)
    assert (j[b"l"].kind, j[b"l"].target) == ("symlink", b"target")
    assert os.listdir(t.root) == []


async def test_rename_captures_the_subtree_both_ends_and_the_overwritten(t):
    os.makedirs(t.p("d/y"))
    for rel, data in (("d/x", "X"), ("d/y/z", "Z"), ("a", "A"), ("b", "B")):
        t.write(rel, data)
    t.turn()
    await t.fs.rename(ROOT, b"d", ROOT, b"e", 0, REQ)
    await t.fs.rename(ROOT, b"a", ROOT, b"b", 0, REQ)     # over b
    j = t.journal()
    assert t.content(j[b"d/x"]) == b"X" and t.content(j[b"d/y/z"]) == b"Z"
    assert j[b"d"].kind == j[b"d/y"].kind == "dir"
    for dest in (b"e", b"e/x", b"e/y", b"e/y/z"):
        assert j[dest].kind == "absent", dest
    assert t.content(j[b"a"]) == b"A" and t.content(j[b"b"]) == b"B"
    assert t.read("e/y/z") == b"Z" and t.read("b") == b"A"
    # the moved file is captured already (absent at its new name): no new capture
    n = t.fs.stats["captures"]
    await t.put("e/x", b"more")
    assert t.fs.stats["captures"] == n


async def test_rename_noreplace_and_exchange(t):
    os.mkdir(t.p("dir"))
    for rel, data in (("a", "A"), ("dir/in", "I"), ("c", "C")):
        t.write(rel, data)
    t.turn()
    with pytest.raises(FUSEError) as exc:
        await t.fs.rename(ROOT, b"a", ROOT, b"c", pyfuse3.RENAME_NOREPLACE, REQ)
    assert errno_of(exc) == errno.EEXIST
    assert t.journal() == {}                      # refused before any capture
    with pytest.raises(FUSEError) as exc:         # nothing to exchange with
        await t.fs.rename(ROOT, b"a", ROOT, b"nothing", pyfuse3.RENAME_EXCHANGE, REQ)
    assert errno_of(exc) == errno.ENOENT and t.journal() == {}
    await t.fs.rename(ROOT, b"a", ROOT, b"dir", pyfuse3.RENAME_EXCHANGE, REQ)
    assert t.read("dir") == b"A" and t.read("a/in") == b"I"
    j = t.journal()
    assert t.content(j[b"a"]) == b"A" and j[b"dir"].kind == "dir"
    assert t.content(j[b"dir/in"]) == b"I" and j[b"a/in"].kind == "absent"
    assert b"c" not in j
    await t.fs.rename(ROOT, b"c", ROOT, b"new", pyfuse3.RENAME_NOREPLACE, REQ)
    assert t.read("new") == b"C" and not t.p("c").exists()


async def test_setattr_captures_before_truncate_chmod_chown_utimes(t):
    for name in ("s", "m", "o", "u"):
        t.write(name, name * 4)
        os.chmod(t.p(name), 0o644)
    os.utime(t.p("u"), ns=(5, 1_000_000_000))
    t.turn()
    out = await t.setattr("s", size=1)
    assert out.st_size == 1 and t.read("s") == b"s"
    await t.setattr("m", mode=stat.S_IFREG | 0o600)
    if os.geteuid() == 0:
        await t.setattr("o", uid=1234, gid=5678)
        assert (os.stat(t.p("o")).st_uid, os.stat(t.p("o")).st_gid) == (1234, 5678)
    await t.setattr("u", atime=7, mtime=2_000_000_000)
    j = t.journal()
    assert t.content(j[b"s"]) == b"ssss"
    assert j[b"m"].mode == 0o644 and stat.S_IMODE(os.stat(t.p("m")).st_mode) == 0o600
    assert j[b"u"].mtime_ns == 1_000_000_000
    assert os.stat(t.p("u")).st_mtime_ns == 2_000_000_000
    if os.geteuid() == 0:
        assert (j[b"o"].uid, j[b"o"].gid) == (os.getuid(), os.getgid())


async def test_setattr_through_a_handle_and_of_an_unlinked_open_file(t):
    t.write("f", b"abcdef")
    t.turn()
    fh = await t.open("f", os.O_RDWR)
    ino = await t.ino("f")
    out = await t.fs.setattr(ino, attrs(st_size=2), Fields(size=True), fh, REQ)
    assert out.st_size == 2 and t.content(t.journal()[b"f"]) == b"abcdef"
    await t.fs.unlink(ROOT, b"f", REQ)
    assert not t.p("f").exists()
    assert (await t.fs.getattr(ino, REQ)).st_size == 2      # through the open handle
    out = await t.fs.setattr(ino, attrs(st_size=4), Fields(size=True), None, REQ)
    assert out.st_size == 4
    assert await t.fs.write(fh, 0, b"xy") == 2
    assert await t.fs.read(fh, 0, 10) == b"xy\0\0"
    await t.fs.release(fh)
    with pytest.raises(FUSEError) as exc:
        await t.fs.getattr(ino, REQ)
    assert errno_of(exc) == errno.ENOENT


async def test_setattr_of_the_same_mtime_or_ctime_alone_captures_nothing(t):
    t.write("f", b"x")
    mtime = os.stat(t.p("f")).st_mtime_ns
    t.turn()
    await t.setattr("f", mtime=mtime)                          # no change at all
    ino = await t.ino("f")
    await t.fs.setattr(ino, attrs(), Fields(ctime=True), None, REQ)
    assert t.journal() == {}
    await t.setattr("f", mtime=mtime + 10**9)
    assert t.journal()[b"f"].mtime_ns == mtime


async def test_xattrs_are_captured_and_missing_ones_are_enoattr(t):
    t.write("x", b"x")
    os.setxattr(t.p("x"), "user.gone", b"1")
    t.turn()
    ino = await t.ino("x")
    await t.fs.setxattr(ino, b"user.new", b"2", REQ)
    await t.fs.removexattr(ino, b"user.gone", REQ)
    assert t.journal()[b"x"].xattrs == ((b"user.gone", b"1"),)
    assert os.listxattr(t.p("x")) == ["user.new"]
    for call in (t.fs.getxattr(ino, b"user.none", REQ),
                 t.fs.removexattr(ino, b"user.none", REQ)):
        with pytest.raises(FUSEError) as exc:
            await call
        assert errno_of(exc) == pyfuse3.ENOATTR


_CAP = struct.pack("<IIIII", 0x02000000, 1 << 10, 0, 0, 0)   # cap_net_bind_service=p


async def _caps(t, ino):
    try:
        return await t.fs.getxattr(ino, b"security.capability", REQ)
    except FUSEError as exc:
        assert exc.errno == pyfuse3.ENOATTR
        return None


async def test_a_capability_set_after_its_absence_was_answered_is_seen(t):
    """``security.capability`` is asked before every chown and a file's first write, so
    its absence is remembered per inode — until an xattr changes through us, or a
    rewind lands behind the kernel."""
    t.write("f", b"x")
    info, entry = await t.fs.create(ROOT, b"new", 0o100644, os.O_WRONLY, REQ)
    await t.fs.release(info.fh)
    for name in ("f", "new"):
        ino = await t.ino(name)
        assert await _caps(t, ino) is None
        await t.fs.setxattr(ino, b"security.capability", _CAP, REQ)
        assert await _caps(t, ino) == _CAP
        await t.fs.removexattr(ino, b"security.capability", REQ)
        assert await _caps(t, ino) is None
    ino = await t.ino("f")
    os.setxattr(t.p("f"), "security.capability", _CAP)     # as a landing rewind would
    t.fs.invalidate(b"f")
    assert await _caps(t, ino) == _CAP


async def test_a_change_to_a_hard_link_captures_names_the_table_never_saw(t):
    """``b`` was linked before the filesystem started and is never looked up: the
    inode index walk finds it (what the table alone could not)."""
    t.write("a", b"shared")
    os.link(t.p("a"), t.p("b"))
    t.write("c", b"c")
    os.link(t.p("c"), t.p("d"))
    t.turn()
    await t.put("a", b"!", os.O_WRONLY | os.O_APPEND)
    await t.fs.lookup(ROOT, b"c", REQ)
    await t.fs.unlink(ROOT, b"c", REQ)
    j = t.journal()
    assert t.content(j[b"a"]) == t.content(j[b"b"]) == b"shared"
    assert j[b"a"].link_group == j[b"b"].link_group is not None
    assert j[b"c"].link_group == j[b"d"].link_group is not None
    assert t.read("b") == b"shared!" and os.stat(t.p("d")).st_nlink == 1


async def test_ignored_paths_pass_through_uncaptured(tmp_path, store, umask0):  # noqa: F811
    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / ".rewindignore").write_text("*.tmp\ncache/\n")
    t = Tree(tmp_path, store)
    try:
        t.write("keep", b"k")
        t.turn()
        info, _ = await t.fs.create(ROOT, b"x.tmp", 0o100644, os.O_WRONLY, REQ)
        await t.fs.release(info.fh)
        await t.fs.mkdir(ROOT, b"cache", 0o40755, REQ)
        await t.fs.mkdir(await t.ino("cache"), b"deep", 0o40755, REQ)
        await t.put("keep", b"+", os.O_WRONLY | os.O_APPEND)
        assert set(t.journal()) == {b"keep"}
        assert t.p("x.tmp").exists() and t.p("cache/deep").is_dir()
    finally:
        t.close()


async def test_a_new_rewindignore_exempts_from_capture_from_the_next_epoch(t):
    """Read at release, in force for capture from the next epoch on: the turn that
    writes a rule cannot exempt its own changes from the history (tests/mount/
    test_rel_ignore.py has the rewind that lost files when it could)."""
    t.turn()
    info, _ = await t.fs.create(ROOT, b".rewindignore", 0o100644, os.O_WRONLY, REQ)
    await t.fs.write(info.fh, 0, b"scratch/\n")
    await t.fs.release(info.fh)
    assert t.fs.file_rules.ignored(b"scratch", True)          # read at release
    await t.fs.mkdir(ROOT, b"scratch", 0o40755, REQ)
    assert set(t.journal()) == {b".rewindignore", b"scratch"}
    t.turn()
    await t.fs.mkdir(ROOT, b"scratch2", 0o40755, REQ)
    await t.fs.rmdir(ROOT, b"scratch", REQ)
    assert set(t.journal()) == {b"scratch2"}                # scratch/ is ignored now


async def test_the_epoch_moved_behind_the_filesystem_is_followed(t):
    t.write("f", b"x")
    t.turn()
    # as another process would: the store moves on, the filesystem is not told
    other = t.store.begin_turn(t.ws, "elsewhere", 1, "out of band", force=True).id
    info, _ = await t.fs.create(ROOT, b"new", 0o100644, os.O_WRONLY, REQ)
    await t.fs.release(info.fh)
    await t.put("f", b"y", os.O_WRONLY | os.O_APPEND)
    j = t.journal(other)
    assert j[b"new"].kind == "absent" and t.content(j[b"f"]) == b"x"
    assert t.fs.epoch_id == other and t.journal() == {}


async def test_fsync_makes_the_pre_images_durable_first(t):
    t.write("f", b"x")
    t.store.sync()
    t.turn()
    t.store.sync()
    fh = await t.open("f", os.O_RDWR)
    await t.fs.write(fh, 0, b"y")
    assert t.store.has_unsynced()                 # the capture committed, not synced
    syncs = t.fs.statistics()["store_syncs"]
    await t.fs.fsync(fh, True)
    assert not t.store.has_unsynced()
    assert t.fs.statistics()["store_syncs"] == syncs + 1
    await t.fs.release(fh)
    dh = await t.fs.opendir(ROOT, REQ)
    await t.fs.mkdir(ROOT, b"d", 0o40755, REQ)
    assert t.store.has_unsynced()
    await t.fs.fsyncdir(dh, False)
    assert not t.store.has_unsynced()
    await t.fs.releasedir(dh)


async def test_o_sync_writes_sync_the_store_before_writing(t):
    t.write("f", b"x")
    t.turn()
    t.store.sync()
    fh = await t.open("f", os.O_WRONLY | os.O_DSYNC)
    try:
        await t.fs.write(fh, 0, b"y")           # captured, then synced, then written
        assert not t.store.has_unsynced()
    finally:
        await t.fs.release(fh)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
async def test_new_entries_belong_to_the_caller(t):
    caller = FakeRequest(uid=1234, gid=5678)
    info, _ = await t.fs.create(ROOT, b"f", 0o100644, os.O_WRONLY, caller)
    await t.fs.release(info.fh)
    await t.fs.mkdir(ROOT, b"d", 0o40755, caller)
    await t.fs.symlink(ROOT, b"l", b"f", caller)
    await t.fs.mknod(ROOT, b"p", stat.S_IFIFO | 0o600, 0, caller)
    for name in ("f", "d", "l", "p"):
        st = os.lstat(t.p(name))
        assert (st.st_uid, st.st_gid) == (1234, 5678), name
    os.chown(t.p("d"), 1234, 4321)
    os.chmod(t.p("d"), 0o2775)                    # setgid: new entries take its group
    await t.fs.mkdir(await t.ino("d"), b"sub", 0o40755, caller)
    assert (os.stat(t.p("d/sub")).st_uid, os.stat(t.p("d/sub")).st_gid) == (1234, 4321)
    root_caller = FakeRequest(uid=0, gid=0)
    await t.fs.mkdir(ROOT, b"mine", 0o40755, root_caller)
    assert os.stat(t.p("mine")).st_uid == 0


# -- errnos and refusals -------------------------------------------------------------

async def test_the_underlying_errno_comes_through(t):
    os.mkdir(t.p("full"))
    t.write("full/f", b"x")
    t.write("file", b"x")
    full = await t.ino("full")
    cases = [
        (t.fs.mkdir(ROOT, b"full", 0o40755, REQ), errno.EEXIST),
        (t.fs.rmdir(ROOT, b"full", REQ), errno.ENOTEMPTY),
        (t.fs.rmdir(ROOT, b"file", REQ), errno.ENOTDIR),
        (t.fs.unlink(ROOT, b"missing", REQ), errno.ENOENT),
        (t.fs.unlink(ROOT, b"full", REQ), errno.EISDIR),
        (t.fs.rename(ROOT, b"missing", ROOT, b"x", 0, REQ), errno.ENOENT),
        (t.fs.rename(ROOT, b"full", ROOT, b"file", 0, REQ), errno.ENOTDIR),
        (t.fs.readlink(await t.ino("file"), REQ), errno.EINVAL),
        (t.fs.open(full, os.O_WRONLY, REQ), errno.EISDIR),
        (t.fs.symlink(ROOT, b"file", b"t", REQ), errno.EEXIST),
    ]
    t.turn()
    for call, expected in cases:
        with pytest.raises(FUSEError) as exc:
            await call
        assert errno_of(exc) == expected, (call, errno.errorcode[errno_of(exc)])
    assert t.read("full/f") == b"x" and t.read("file") == b"x"


async def test_rewind_temp_names_cannot_be_made(t):
    t.write("f", b"x")
    os.mkdir(t.p("d"))
    t.turn()
    tmp = TMP_PREFIX + b"1~ab"
    f = await t.ino("f")
    calls = [
        t.fs.create(ROOT, tmp, 0o100644, os.O_WRONLY, REQ),
        t.fs.mkdir(ROOT, tmp, 0o40755, REQ),
        t.fs.symlink(ROOT, tmp, b"f", REQ),
        t.fs.mknod(ROOT, tmp, stat.S_IFIFO | 0o600, 0, REQ),
        t.fs.link(f, ROOT, tmp, REQ),
        t.fs.rename(ROOT, b"f", await t.ino("d"), tmp, 0, REQ),
    ]
    for call in calls:
        with pytest.raises(FUSEError) as exc:
            await call
        assert errno_of(exc) == errno.EPERM
    assert sorted(os.listdir(t.root)) == ["d", "f"] and os.listdir(t.p("d")) == []
    assert t.journal() == {}


async def test_a_running_rewinds_fence_answers_ebusy_and_changes_nothing(t):
    os.makedirs(t.p("d/e"))
    t.write("d/e/f", b"landing")
    t.write("other", b"o")
    st = os.lstat(t.p("d/e/f"))
    t.turn()
    f, e, d = await t.ino("d/e/f"), await t.ino("d/e"), await t.ino("d")
    held = t.fs.fence_rewind([(b"d/e/f", (st.st_dev, st.st_ino)), (b"d/e/g", None)])
    assert held == []
    refused = [
        t.fs.open(f, os.O_WRONLY, REQ),
        t.fs.open(f, os.O_RDONLY | os.O_TRUNC, REQ),
        t.fs.setattr(f, attrs(st_mode=0o100600), Fields(mode=True), None, REQ),
        t.fs.setxattr(f, b"user.k", b"v", REQ),
        t.fs.removexattr(f, b"user.k", REQ),
        t.fs.unlink(e, b"f", REQ),
        t.fs.link(f, ROOT, b"alias", REQ),            # an inode a fenced path names
        t.fs.create(e, b"g", 0o100644, os.O_WRONLY, REQ),   # a fenced name
        t.fs.mkdir(e, b"g", 0o40755, REQ),
        t.fs.symlink(e, b"g", b"f", REQ),
        t.fs.rename(ROOT, b"d", ROOT, b"moved", 0, REQ),     # above a fenced path
        t.fs.rename(ROOT, b"other", e, b"f", 0, REQ),        # over a fenced path
        t.fs.rmdir(d, b"e", REQ),
    ]
    before = os.lstat(t.p("d/e/f"))
    for call in refused:
        with pytest.raises(FUSEError) as exc:
            await call
        assert errno_of(exc) == errno.EBUSY, call
    after = os.lstat(t.p("d/e/f"))
    assert (after.st_mode, after.st_mtime_ns, after.st_nlink) == (
        before.st_mode, before.st_mtime_ns, before.st_nlink)
    assert t.read("d/e/f") == b"landing" and sorted(os.listdir(t.p("d/e"))) == ["f"]
    assert t.journal() == {}
    # reads and changes elsewhere go on
    fh = await t.open("d/e/f", os.O_RDONLY)
    assert await t.fs.read(fh, 0, 4) == b"land"
    await t.fs.release(fh)
    await t.put("other", b"O")
    assert set(t.journal()) == {b"other"}
    t.fs.unfence_rewind()
    await t.put("d/e/f", b"after", os.O_WRONLY | os.O_TRUNC)
    assert t.read("d/e/f") == b"after" and t.content(t.journal()[b"d/e/f"]) == b"landing"


async def test_a_path_open_for_writing_is_held_out_of_the_fence(t):
    t.write("w", b"w")
    t.write("v", b"v")
    os.link(t.p("w"), t.p("w2"))
    key = lambda rel: (os.lstat(t.p(rel)).st_dev, os.lstat(t.p(rel)).st_ino)  # noqa: E731
    fh = await t.open("w", os.O_WRONLY)
    ro = await t.open("v", os.O_RDONLY)
    try:
        held = t.fs.fence_rewind([(b"w", key("w")), (b"w2", key("w2")), (b"v", key("v"))])
        assert sorted(held) == [b"w", b"w2"]          # by name, and by the same inode
        assert t.fs.busy == {b"v"}
    finally:
        t.fs.unfence_rewind()
        await t.fs.release(fh)
        await t.fs.release(ro)


async def test_an_adopted_inodes_write_fence(t):
    t.write("big", b"content")
    t.write("free", b"f")
    st = os.lstat(t.p("big"))
    key = (st.st_dev, st.st_ino)
    fh = await t.open("big", os.O_RDWR)
    assert t.fs.fence_writes(key) is False        # a writer is open: nothing fenced
    assert t.fs.fenced == set()
    await t.fs.release(fh)
    assert t.fs.fence_writes(key) is True
    t.turn()
    big = await t.ino("big")
    for call in (t.fs.open(big, os.O_WRONLY, REQ),
                 t.fs.open(big, os.O_RDONLY | os.O_TRUNC, REQ),
                 t.fs.create(ROOT, b"big", 0o100644, os.O_WRONLY, REQ),
                 t.fs.setattr(big, attrs(st_size=0), Fields(size=True), None, REQ)):
        with pytest.raises(FUSEError) as exc:
            await call
        assert errno_of(exc) == errno.EBUSY
    assert t.read("big") == b"content"
    ro = await t.open("big", os.O_RDONLY)          # reading is fine
    await t.fs.release(ro)
    await t.put("free", b"F")                      # other inodes are not fenced
    t.fs.unfence_writes(key)
    await t.put("big", b"C")
    assert t.read("big") == b"Content"


@pytest.mark.parametrize("error, code", [
    (StoreFull("disk full"), errno.ENOSPC),
    (StoreError("broken"), errno.EIO),
    (OSError(errno.EROFS, "read-only"), errno.EIO),
])
async def test_a_refused_capture_fails_closed(t, monkeypatch, error, code):
    t.write("f", b"original")
    os.mkdir(t.p("d"))
    t.turn()
    f = await t.ino("f")
    fh = await t.open("f", os.O_RDWR)

    def record(*args, **kwargs):
        raise error

    monkeypatch.setattr(t.store, "record", record)
    calls = [
        t.fs.write(fh, 0, b"XX"),
        t.fs.open(f, os.O_WRONLY | os.O_TRUNC, REQ),
        t.fs.setattr(f, attrs(st_size=0), Fields(size=True), None, REQ),
        t.fs.create(ROOT, b"new", 0o100644, os.O_WRONLY, REQ),
        t.fs.mkdir(ROOT, b"nd", 0o40755, REQ),
        t.fs.unlink(ROOT, b"f", REQ),
        t.fs.rmdir(ROOT, b"d", REQ),
        t.fs.rename(ROOT, b"f", ROOT, b"g", 0, REQ),
        t.fs.setxattr(f, b"user.k", b"v", REQ),
    ]
    for call in calls:
        with pytest.raises(FUSEError) as exc:
            await call
        assert errno_of(exc) == code
    await t.fs.release(fh)
    monkeypatch.undo()
    assert sorted(os.listdir(t.root)) == ["d", "f"] and t.read("f") == b"original"
    assert os.listxattr(t.p("f")) == []
    assert t.journal() == {} and t.fs.stats["capture_errors"] == len(calls)
    await t.put("f", b"later")                      # the store is back: it captures
    assert t.content(t.journal()[b"f"]) == b"original"


async def test_create_with_o_excl_of_a_name_that_exists_is_eexist(t):
    """The kernel sends CREATE when its dentry is negative; a name made behind it (a
    process working in the bare directory under the mount) makes that dentry stale.
    ``O_CREAT|O_EXCL`` must still fail then, as on the real filesystem — lock files
    rely on it — instead of opening the existing file."""
    t.write("lock", b"held by someone")
    t.turn()
    with pytest.raises(FUSEError) as exc:
        await t.fs.create(ROOT, b"lock", 0o100644, os.O_WRONLY | os.O_CREAT | os.O_EXCL,
                          REQ)
    assert errno_of(exc) == errno.EEXIST
    assert t.read("lock") == b"held by someone" and t.fs.handles == {}
    info, _ = await t.fs.create(ROOT, b"lock", 0o100644, os.O_WRONLY | os.O_CREAT, REQ)
    await t.fs.release(info.fh)                   # without O_EXCL: opens it, as open(2)
    assert t.read("lock") == b"held by someone"


async def test_readdir_skips_names_gone_since_opendir(t, monkeypatch):
    for name in ("a", "b", "c"):
        t.write(name, name)
    listed = []
    monkeypatch.setattr(pyfuse3, "readdir_reply",
                        lambda token, name, attr, next_id: listed.append(name) or True)
    fh = await t.fs.opendir(ROOT, REQ)
    os.unlink(t.p("b"))
    await t.fs.readdir(fh, 0, object())
    await t.fs.releasedir(fh)
    assert sorted(listed) == [b"a", b"c"]


async def test_removing_or_renaming_rewindignore_reloads_the_rules(t):
    t.write(".rewindignore", "*.tmp\n")
    t.fs.reload_rules()
    t.turn()
    info, _ = await t.fs.create(ROOT, b"a.tmp", 0o100644, os.O_WRONLY, REQ)
    await t.fs.release(info.fh)
    assert t.journal() == {}
    await t.fs.lookup(ROOT, b".rewindignore", REQ)
    await t.fs.rename(ROOT, b".rewindignore", ROOT, b"old-rules", 0, REQ)
    info, _ = await t.fs.create(ROOT, b"b.tmp", 0o100644, os.O_WRONLY, REQ)
    await t.fs.release(info.fh)
    assert t.journal()[b"b.tmp"].kind == "absent"
    t.write(".rewindignore", "*.log\n")
    t.fs.reload_rules()
    await t.fs.lookup(ROOT, b".rewindignore", REQ)
    await t.fs.unlink(ROOT, b".rewindignore", REQ)
    info, _ = await t.fs.create(ROOT, b"c.log", 0o100644, os.O_WRONLY, REQ)
    await t.fs.release(info.fh)
    assert t.journal()[b"c.log"].kind == "absent"


async def test_the_root_directory_itself_is_captured_before_it_changes(t):
    os.chmod(t.root, 0o755)
    os.setxattr(t.root, "user.r", b"1")
    t.turn()
    await t.fs.setattr(ROOT, attrs(st_mode=stat.S_IFDIR | 0o700), Fields(mode=True),
                       None, REQ)
    await t.fs.setxattr(ROOT, b"user.r", b"2", REQ)
    image = t.journal()[b""]
    assert (image.kind, image.mode, image.xattrs) == ("dir", 0o755, ((b"user.r", b"1"),))
    assert stat.S_IMODE(os.stat(t.root).st_mode) == 0o700
    assert os.getxattr(t.root, "user.r") == b"2"


async def test_a_write_after_an_epoch_moved_behind_the_filesystem_is_captured(t):
    """Found by the in-process tests (the mount test of the same rule starts with a
    capture that fails, which is when the filesystem followed, until it learned to look
    at the store's generation before trusting what it captured).  The store is shared
    by several processes (docs/store.md); the state of ``f`` at the new point is ``b``,
    and only a pre-image in that epoch can say so."""
    t.write("f", b"a")
    t.turn()
    await t.put("f", b"b")                       # captured (``a``) in this turn
    other = t.store.begin_turn(t.ws, "elsewhere", 1, "out of band", force=True).id
    await t.put("f", b"c")                       # no capture: f counts as captured
    assert t.fs.epoch_id == other
    assert t.content(t.journal(other)[b"f"]) == b"b"


async def test_an_epoch_moved_right_after_a_create_is_followed(t):
    """A create commits its ``absent`` record, and the filesystem then trusts its epoch
    while nothing else has committed: an epoch begun after that commit must still be
    seen before the next change."""
    t.write("f", b"a")
    t.turn()
    await t.put("f", b"b")
    info, _ = await t.fs.create(ROOT, b"new", 0o100644, os.O_WRONLY | os.O_CREAT, REQ)
    await t.fs.release(info.fh)
    other = t.store.begin_turn(t.ws, "elsewhere", 1, "out of band", force=True).id
    await t.put("f", b"c")
    assert t.fs.epoch_id == other
    assert t.content(t.journal(other)[b"f"]) == b"b"


async def test_a_create_keeps_the_first_image_of_a_name_recorded_before(t):
    """A create records its new name ``absent`` without asking the store first; a name
    already recorded in the epoch — here by the daemon before it restarted, when the
    file still had content — keeps that first image, so a rewind brings the content
    back rather than deleting the file."""
    t.write("f", b"first")
    t.turn()
    await t.fs.unlink(ROOT, b"f", REQ)                    # captured: "first"
    again = RewindOperations(t.root_fd, t.store, t.ws)   # a new daemon, same epoch
    try:
        info, _ = await again.create(ROOT, b"f", 0o100644,
                                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, REQ)
        await again.release(info.fh)
    finally:
        again.close()
    assert t.content(t.journal()[b"f"]) == b"first"


async def test_a_create_of_a_name_recorded_before_does_not_hide_the_next_epoch(t):
    """A create whose name the epoch recorded already (here by the daemon before it
    restarted) commits nothing: the store's generation stays.  The daemon must not take
    the number its empty transaction would have had as its own commit — the next commit
    is another process beginning an epoch, and a change after it, to a path the daemon
    captured in the old epoch, must still get its pre-image in the new one."""
    t.write("f", b"first")
    t.write("g", b"g1")
    t.turn()
    await t.fs.unlink(ROOT, b"f", REQ)                    # f recorded by this daemon
    again = RewindOperations(t.root_fd, t.store, t.ws)   # a new daemon, same epoch
    try:
        g = (await again.lookup(ROOT, b"g", REQ)).st_ino
        fh = (await again.open(g, os.O_WRONLY, REQ)).fh
        await again.write(fh, 0, b"g2")                    # g captured by the new one
        await again.release(fh)
        info, _ = await again.create(ROOT, b"f", 0o100644,
                                     os.O_WRONLY | os.O_CREAT | os.O_EXCL, REQ)
        await again.release(info.fh)                       # recorded before: no commit
        other = t.store.begin_turn(t.ws, "elsewhere", 1, "out of band", force=True).id
        fh = (await again.open(g, os.O_WRONLY | os.O_TRUNC, REQ)).fh
        await again.write(fh, 0, b"g3")
        await again.release(fh)
        assert again.epoch_id == other
    finally:
        again.close()
    assert t.content(t.journal(other)[b"g"]) == b"g2"


async def test_create_truncating_a_hard_linked_name_captures_every_name(t):
    t.write("a", b"shared")
    os.link(t.p("a"), t.p("b"))
    t.turn()
    info, _ = await t.fs.create(ROOT, b"a", 0o100644,
                                os.O_WRONLY | os.O_CREAT | os.O_TRUNC, REQ)
    await t.fs.release(info.fh)
    assert t.read("b") == b""                         # the shared inode was truncated
    j = t.journal()
    assert t.content(j[b"a"]) == b"shared"
    assert t.content(j[b"b"]) == b"shared"            # b changed too: captured first


async def test_a_number_that_comes_back_as_a_directory_is_a_new_inode(t):
    """A rewind's landing removed a file behind the kernel and made a directory that
    ext4 gave the file's freed number (it hands a freed number out at once).  The same
    ``(dev, ino)``, another kind: a new FUSE inode, as for any new entry (fs/inodes.py's
    contract), not the file's old one still taken for a non-directory (whose children
    were then walked from the root on every lookup, and whose last rmdir left its key
    behind for the next reuse)."""
    os.mkdir(t.p("sub"))
    for i in range(50):
        t.write("sub/x", b"a file")
        before = await t.fs.lookup(await t.ino("sub"), b"x", REQ)
        number = os.lstat(t.p("sub/x")).st_ino
        os.unlink(t.p("sub/x"))
        os.mkdir(t.p("sub/x"))
        if os.lstat(t.p("sub/x")).st_ino == number:
            break
        os.rename(t.p("sub/x"), t.p(f"sub/spare{i}"))
    else:
        pytest.fail("the backing filesystem never gave a freed number out again")
    t.fs.invalidate(b"sub/x")           # as the restore engine does after a landing
    after = await t.fs.lookup(await t.ino("sub"), b"x", REQ)
    assert stat.S_ISDIR(after.st_mode)
    assert after.st_ino != before.st_ino
    t.write("sub/x/inside", b"child")
    assert (await t.fs.lookup(after.st_ino, b"inside", REQ)).st_size == 5
    assert t.fs.table.dir_fd(b"sub/x") is not None

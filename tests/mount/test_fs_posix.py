"""POSIX behaviour through the mount equals the bare filesystem's: errnos, links,
fifos, xattrs, times, open-but-unlinked files, and the inode table under kernel forgets."""

from __future__ import annotations

import errno
import os
import stat
import threading

import pytest

from mountkit import mounted
from rewindfs.overlay.tree import syscalls

pytestmark = pytest.mark.mount


@pytest.fixture(scope="module")
def m(tmp_path_factory):
    base = tmp_path_factory.mktemp("posix")
    with mounted(base / "ws", base / "store") as mnt:
        yield mnt


@pytest.fixture
def d(m, request):
    p = m.ws / request.node.name
    p.mkdir()
    return p


def errno_of(fn, *args, **kw):
    try:
        fn(*args, **kw)
    except OSError as exc:
        return exc.errno
    return 0


def test_errnos_match_the_underlying_fs(d):
    (d / "f").write_text("x")
    (d / "full").mkdir()
    (d / "full" / "x").write_text("x")
    (d / "empty").mkdir()
    assert errno_of(os.stat, d / "missing") == errno.ENOENT
    assert errno_of(os.mkdir, d / "f") == errno.EEXIST
    assert errno_of(os.open, d / "f", os.O_CREAT | os.O_EXCL | os.O_WRONLY) == errno.EEXIST
    assert errno_of(os.rmdir, d / "full") == errno.ENOTEMPTY
    assert errno_of(os.rename, d / "empty", d / "full") == errno.ENOTEMPTY
    assert errno_of(os.unlink, d / "empty") == errno.EISDIR
    assert errno_of(os.rmdir, d / "f") == errno.ENOTDIR
    assert errno_of(os.listdir, d / "f") == errno.ENOTDIR
    assert errno_of(os.rename, d / "f", d / "full") == errno.EISDIR
    assert errno_of(os.rename, d / "full", d / "full" / "x" / "y") in (errno.EINVAL,
                                                                        errno.ENOTDIR)
    assert errno_of(os.getxattr, d / "f", "user.none") == errno.ENODATA
    assert errno_of(os.removexattr, d / "f", "user.none") == errno.ENODATA
    assert errno_of(os.readlink, d / "f") == errno.EINVAL
    os.rename(d / "empty", d / "full" / "x2")  # dir into another dir works
    assert (d / "full" / "x2").is_dir()


def test_fifo_symlink_and_hard_links(d):
    os.mkfifo(d / "p", 0o640)
    assert stat.S_ISFIFO(os.stat(d / "p").st_mode)
    got = []
    t = threading.Thread(target=lambda: got.append(open(d / "p").read()))
    t.start()
    with open(d / "p", "w") as f:
        f.write("through the fifo")
    t.join(30)
    assert got == ["through the fifo"]
    os.symlink("../elsewhere/target", d / "l")
    assert os.readlink(d / "l") == "../elsewhere/target"
    assert stat.S_ISLNK(os.lstat(d / "l").st_mode)
    (d / "a").write_text("a")
    os.link(d / "a", d / "b")
    os.link(d / "b", d / "c")
    assert os.stat(d / "a").st_nlink == 3
    assert os.stat(d / "a").st_ino == os.stat(d / "c").st_ino
    os.unlink(d / "b")
    assert os.stat(d / "c").st_nlink == 2
    with open(d / "c", "a") as f:
        f.write("+")
    assert (d / "a").read_text() == "a+"


def test_times_modes_owners(d):
    f = d / "f"
    f.write_text("x")
    os.utime(f, ns=(1_000_000_007, 2_000_000_009))
    st = os.stat(f)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_007, 2_000_000_009)
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        syscalls.utimensat(fd, b"f", None, 3_000_000_000)  # UTIME_OMIT for atime
    finally:
        os.close(fd)
    st = os.stat(f)
    assert (st.st_atime_ns, st.st_mtime_ns) == (1_000_000_007, 3_000_000_000)
    os.chmod(f, 0o4751)
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o4751
    os.chown(f, 4321, 8765)
    assert (os.stat(f).st_uid, os.stat(f).st_gid) == (4321, 8765)
    os.symlink("f", d / "l")
    os.lchown(d / "l", 11, 12)
    assert (os.lstat(d / "l").st_uid, os.stat(d / "l").st_uid) == (11, 4321)


def test_xattrs(d):
    f = d / "f"
    f.write_text("x")
    os.setxattr(f, "user.a", b"1")
    os.setxattr(f, "user.b", b"\x00\xff" * 100)
    assert sorted(os.listxattr(f)) == ["user.a", "user.b"]
    assert os.getxattr(f, "user.b") == b"\x00\xff" * 100
    os.setxattr(f, "user.a", b"2", os.XATTR_REPLACE)
    assert os.getxattr(f, "user.a") == b"2"
    os.removexattr(f, "user.a")
    assert os.listxattr(f) == ["user.b"]
    os.mkdir(d / "sub")
    os.setxattr(d / "sub", "user.dir", b"yes")
    assert os.getxattr(d / "sub", "user.dir") == b"yes"
    os.symlink("f", d / "l")
    assert os.listxattr(d / "l", follow_symlinks=False) == []


def test_unlinked_open_file_keeps_working(d):
    f = d / "f"
    f.write_text("data")
    fd = os.open(f, os.O_RDWR)
    try:
        os.unlink(f)
        assert not f.exists()
        os.pwrite(fd, b"DATA and more", 0)
        assert os.pread(fd, 100, 0) == b"DATA and more"
        assert os.fstat(fd).st_size == 13 and os.fstat(fd).st_nlink == 0
        os.ftruncate(fd, 4)
        assert os.fstat(fd).st_size == 4
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)


def test_statfs_and_big_sparse_io(d):
    sv = os.statvfs(d)
    assert sv.f_bsize > 0 and sv.f_blocks > 0
    with open(d / "sparse", "wb") as f:
        f.seek(10 << 20)
        f.write(b"end")
    assert os.path.getsize(d / "sparse") == (10 << 20) + 3
    with open(d / "sparse", "rb") as f:
        f.seek(5 << 20)
        assert f.read(4) == b"\0\0\0\0"


def test_many_files_survive_kernel_forgets(d):
    for i in range(1500):
        sub = d / f"s{i % 30}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i}").write_text(str(i))
    assert sum(len(files) for _, _, files in os.walk(d)) == 1500
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")  # the kernel forgets dentries/inodes: the table must follow
    os.rename(d / "s3", d / "renamed")
    for i in range(1500):
        name = "renamed" if i % 30 == 3 else f"s{i % 30}"
        assert (d / name / f"f{i}").read_text() == str(i)
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")
    os.rename(d / "renamed", d / "s3")
    assert (d / "s3" / "f3").read_text() == "3"


def test_new_entries_belong_to_the_caller(d):
    """The daemon runs as root; what a user creates through the mount is the user's."""
    os.chmod(d, 0o777)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(r)
            os.chdir(d)  # the tmp dirs above are root-only; work relative to d
            os.setgid(65534)
            os.setuid(65534)
            with open("mine", "w") as f:
                f.write("x")
            os.mkdir("mydir")
            os.symlink("mine", "mylink")
            os.write(w, b"ok")
        except BaseException as exc:
            os.write(w, repr(exc).encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        assert f.read() == b"ok"
    os.waitpid(pid, 0)
    for name in ("mine", "mydir", "mylink"):
        st = os.lstat(d / name)
        assert (st.st_uid, st.st_gid) == (65534, 65534), name


def test_root_directory_metadata(m):
    before = stat.S_IMODE(os.stat(m.ws).st_mode)
    os.chmod(m.ws, 0o751)
    os.setxattr(m.ws, "user.root", b"r")
    try:
        assert stat.S_IMODE(os.stat(m.ws).st_mode) == 0o751
        assert os.getxattr(m.ws, "user.root") == b"r"
    finally:
        os.removexattr(m.ws, "user.root")
        os.chmod(m.ws, before)


def _evict_inodes() -> None:
    """What memory pressure does: the kernel drops unused dentries and inodes (it then
    FORGETs them, and a later stat looks the name up again)."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("2\n")


def test_an_inode_number_stays_while_the_file_exists(tmp_path):
    """A file's serial number changed when the kernel evicted its inode: a stat gave 2,
    the next (after a FORGET and a new LOOKUP) 3 — what pjdfstest's rename/10.t saw
    under load ("expect <inode> lstat …" failed), and what makes git re-read its index
    entries and an editor say the file was replaced.  The kernel session shows the real
    file's number (the bare directory's, so also across remounts); a file on another
    device inside the workspace keeps a number of ours, which no real one can equal."""
    ws, store = tmp_path / "ws", tmp_path / "store"
    (ws / "sub").mkdir(parents=True)
    (ws / "f").write_text("x")
    os.link(ws / "f", ws / "sub" / "link")
    bare = {n: os.lstat(ws / n).st_ino for n in ("f", "sub", "sub/link")}
    with mounted(ws, store, extra=("--session", "kernel")) as m:
        seen = {n: os.lstat(m.ws / n).st_ino for n in bare}
        assert seen == bare, (seen, bare)
        assert [e.inode() for e in os.scandir(m.ws) if e.name == "f"] == [bare["f"]]
        (m.ws / "new").write_text("y")
        made = os.lstat(m.ws / "new").st_ino
        _evict_inodes()
        assert {n: os.lstat(m.ws / n).st_ino for n in bare} == bare
        assert os.lstat(m.ws / "new").st_ino == made
        os.rename(m.ws / "new", m.ws / "sub" / "moved")
        _evict_inodes()
        assert os.lstat(m.ws / "sub" / "moved").st_ino == made


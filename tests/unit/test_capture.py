"""Capture, resolution, ignore rules and the socket path — in-process, no mount.

Real store on disk (the ``store`` fixture ends with fsck), real files in tmp dirs.
"""

from __future__ import annotations

import os

import pytest

from rewindfs.overlay.capture import capture, snapshot, subtree
from rewindfs.overlay.tree.ignore import IgnoreRules
from rewindfs.overlay.places import control_socket_path
from rewindfs.overlay.tree.walk import PathEscape, open_dir, open_parent
from rewindfs.store import BadPath, PreImage, StoreFull


@pytest.fixture
def root(tmp_path):
    d = tmp_path / "tree"
    d.mkdir()
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    yield d, fd
    os.close(fd)


def test_snapshot_kinds(root, store):
    d, fd = root
    (d / "f").write_bytes(b"hello")
    os.chmod(d / "f", 0o640)
    os.utime(d / "f", ns=(1, 123456789))
    os.setxattr(d / "f", "user.k", b"v")
    (d / "sub").mkdir(mode=0o750)
    os.symlink("f", d / "ln")
    os.mkfifo(d / "pipe")

    f = snapshot(fd, b"f", store)
    assert (f.kind, f.mode, f.size, f.mtime_ns) == ("file", 0o640, 5, 123456789)
    assert f.xattrs == ((b"user.k", b"v"),)
    assert store.read_blob(f.blob) == b"hello"
    assert f.link_group is None

    assert snapshot(fd, b"sub", store).kind == "dir"
    assert snapshot(fd, b"sub", store).mode == 0o750
    link = snapshot(fd, b"ln", store)
    assert (link.kind, link.target) == ("symlink", b"f")
    assert snapshot(fd, b"pipe", store).kind == "fifo"
    assert snapshot(fd, b"missing", store) == PreImage.ABSENT
    assert snapshot(fd, b"missing/deeper", store) == PreImage.ABSENT
    assert snapshot(fd, b"f/below-a-file", store) == PreImage.ABSENT


def test_hard_links_share_a_link_group(root, store):
    d, fd = root
    (d / "a").write_bytes(b"x")
    os.link(d / "a", d / "b")
    a, b = snapshot(fd, b"a", store), snapshot(fd, b"b", store)
    assert a.link_group is not None and a.link_group == b.link_group
    st = os.stat(d / "a")
    assert a.link_group == f"{st.st_dev}:{st.st_ino}".encode()


def test_symlinked_parent_is_refused(root, store, tmp_path):
    d, fd = root
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_bytes(b"s")
    os.symlink(outside, d / "esc")
    with pytest.raises(PathEscape):
        snapshot(fd, b"esc/secret", store)
    with pytest.raises(PathEscape):
        open_parent(fd, b"esc/secret")
    with pytest.raises(PathEscape):
        open_parent(fd, b"../x")
    with pytest.raises(PathEscape):
        open_parent(fd, b"/etc/passwd")
    with pytest.raises(BadPath):
        open_parent(fd, b"a//b")
    dfd, name = open_parent(fd, b"esc")  # the final component is not followed
    os.close(dfd)
    assert name == b"esc"


def test_open_dir_walks_without_following(root):
    d, fd = root
    (d / "a" / "b").mkdir(parents=True)
    sub = open_dir(fd, b"a/b")
    try:
        assert os.fstat(sub).st_ino == os.stat(d / "a" / "b").st_ino
    finally:
        os.close(sub)


def test_capture_records_once_per_epoch(root, store, ws):
    d, fd = root
    (d / "f").write_bytes(b"one")
    epoch = store.current_epoch(ws).id
    assert capture(fd, store, ws, epoch, [b"f", b"new", b"f"]) == store.generation()
    assert [p for p, _ in store.journal(ws, epoch)] == [b"f", b"new"]
    (d / "f").write_bytes(b"two")
    assert capture(fd, store, ws, epoch, [b"f"]) is None  # first image wins: no commit
    images = dict(store.journal(ws, epoch))
    assert store.read_blob(images[b"f"].blob) == b"one"
    assert images[b"new"] == PreImage.ABSENT


def test_large_file_is_streamed_and_deduplicated(root, store, ws):
    d, fd = root
    data = os.urandom(1 << 20) * 24  # 24 MiB
    (d / "big").write_bytes(data)
    (d / "copy").write_bytes(data)
    epoch = store.current_epoch(ws).id
    capture(fd, store, ws, epoch, [b"big", b"copy"])
    images = dict(store.journal(ws, epoch))
    assert images[b"big"].blob == images[b"copy"].blob
    assert images[b"big"].size == len(data)


def test_capture_fails_closed_on_store_full(root, store, ws, monkeypatch):
    d, fd = root
    (d / "f").write_bytes(b"data")
    epoch = store.current_epoch(ws).id

    def full(*a, **k):
        raise StoreFull("test")

    monkeypatch.setattr(store, "record", full)
    with pytest.raises(StoreFull):
        capture(fd, store, ws, epoch, [b"f"])
    monkeypatch.undo()
    assert not store.is_recorded(ws, epoch, b"f")


def test_subtree_lists_without_entering_symlinks(root, tmp_path):
    d, fd = root
    (d / "t" / "u").mkdir(parents=True)
    (d / "t" / "u" / "f").write_bytes(b"")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x").write_bytes(b"")
    os.symlink(tmp_path / "elsewhere", d / "t" / "ln")
    got = dict(subtree(fd, b"t"))
    assert got == {b"t": True, b"t/u": True, b"t/u/f": False, b"t/ln": False}
    assert dict(subtree(fd, b"t/ln")) == {b"t/ln": False}
    assert dict(subtree(fd, b"nope")) == {b"nope": False}


def test_ignore_rules(root):
    d, fd = root
    (d / ".rewindignore").write_text("node_modules/\n*.log\n!keep.log\n/build\n")
    rules = IgnoreRules.load(fd)
    assert rules.ignored(b"node_modules", True)
    assert rules.ignored(b"a/node_modules/x.js", False)
    assert rules.ignored(b"x.log", False)
    assert not rules.ignored(b"keep.log", False)
    assert rules.ignored(b"build/out.o", False)
    assert not rules.ignored(b"src/build/out.o", False)
    assert not rules.ignored(b".rewindignore", False)
    assert not IgnoreRules.load(os.open(d / "..", os.O_RDONLY)).ignored(b"x.log")




def test_control_socket_path_is_pure(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/1000")
    p = control_socket_path("/nonexistent/store", "/nonexistent/ws")
    assert p.startswith(b"/run/user/1000/rewindfs-%d/" % os.getuid())
    assert p.endswith(b".sock") and len(p.rsplit(b"/", 1)[1]) == 16 + 5
    assert p == control_socket_path(b"/nonexistent/store", b"/nonexistent/ws")
    import hashlib
    digest = hashlib.sha256(b"/nonexistent/store\0/nonexistent/ws").hexdigest()[:16].encode()
    assert p.endswith(digest + b".sock")
    monkeypatch.setenv("XDG_RUNTIME_DIR", "")
    assert control_socket_path("/s", "/w").startswith(b"/tmp/rewindfs-")
    # real paths: a symlinked workspace gives the same socket as its target
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "alias")
    assert control_socket_path("/s", tmp_path / "alias") == control_socket_path(
        "/s", tmp_path / "real")


# -- capture_images: contents put in batches ------------------------------------------

def _fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_capture_images_batches_match_one_by_one_snapshots(root, store, ws, monkeypatch):
    """Across several content batches (forced small), with small, identical, large and
    empty files, a symlink, a directory and a missing path: every image is the one a
    plain ``snapshot`` takes, the journal holds it, and no fd is left open."""
    from rewindfs.overlay.capture import _ContentBatch, capture_images
    from rewindfs.overlay.tree.walk import DirCache
    d, fd = root
    (d / "sub").mkdir()
    for i in range(7):
        (d / "sub" / f"f{i}").write_bytes(b"small %d" % (i % 3))
    (d / "big").write_bytes(os.urandom((1 << 20) + 5))
    (d / "empty").write_bytes(b"")
    os.symlink("sub/f0", d / "link")
    monkeypatch.setattr(_ContentBatch, "MAX_FILES", 3)
    paths = sorted([b"sub", b"big", b"empty", b"link", b"missing"]
                   + [b"sub/f%d" % i for i in range(7)])
    epoch = store.current_epoch(ws).id
    dirs, before = DirCache(fd), _fd_count()
    try:
        got = capture_images(fd, store, ws, epoch, paths, parent_at=dirs.parent)
    finally:
        dirs.close()
    assert _fd_count() == before
    expected = {p: snapshot(fd, p, store) for p in paths}
    assert got == expected
    assert dict(store.journal(ws, epoch)) == expected
    assert store.read_blob(got[b"big"].blob) == (d / "big").read_bytes()
    assert got[b"sub/f0"].blob == got[b"sub/f3"].blob != got[b"sub/f1"].blob


def test_capture_images_fails_closed_when_a_batch_put_fails(root, store, ws, monkeypatch):
    from rewindfs.overlay.capture import _ContentBatch, capture_images
    from rewindfs.overlay.tree.walk import DirCache
    d, fd = root
    for i in range(5):
        (d / f"f{i}").write_bytes(b"data %d" % i)
    monkeypatch.setattr(_ContentBatch, "MAX_FILES", 2)
    puts = []

    def put_fds(fds):           # the second batch fails, after the first was stored
        puts.append(len(fds))
        if len(puts) == 2:
            raise StoreFull("test")
        return type(store).put_fds(store, fds)

    monkeypatch.setattr(store, "put_fds", put_fds)
    paths = [b"f%d" % i for i in range(5)]
    epoch = store.current_epoch(ws).id
    dirs, before = DirCache(fd), _fd_count()
    try:
        with pytest.raises(StoreFull):
            capture_images(fd, store, ws, epoch, paths, parent_at=dirs.parent)
    finally:
        dirs.close()
    assert puts == [2, 2] and _fd_count() == before
    assert store.unrecorded(ws, epoch, paths) == paths

"""A rewind adopts a large file it replaces as its own pre-image blob (no copy) — and
copies instead whenever adopting would not be safe (overlay/rewind/adopt.py).

Files of a few MiB: above the store's inline limit (1 MiB), so each is a blob file.
Every test ends with the store's own fsck, which also reports a blob file that still
shares its inode with a workspace name (``shared-blob``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
import xxhash

from mountkit import mounted
from rewindfs.overlay.rewind.engine import apply_plan, plan_redo, plan_rewind, recover
from restorekit import History, open_history
from rewindfs.store import Store
from store_fixtures import assert_sound

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
SIZE = 3 << 20 | 12345


class Fence:
    """The daemon's write fence, as the restore engine sees it (offline stand-in)."""

    def __init__(self, allow=True):
        self.allow, self.fenced, self.calls = allow, set(), []

    def fence_writes(self, key):
        self.calls.append(key)
        if self.allow:
            self.fenced.add(key)
        return self.allow

    def unfence_writes(self, key):
        self.fenced.discard(key)


def preimage_blob(store, ws, epoch, path: bytes):
    """(key, blob file stat) of ``path``'s pre-image in ``epoch``."""
    img = dict(store.journal(ws, epoch))[path]
    return img.blob, os.stat(store.blobs.file_path(img.blob))


def blob_links(store) -> list[int]:
    out = []
    for dirpath, _dirs, files in os.walk(store.blobs.root):
        if os.path.basename(dirpath) != "tmp":
            out += [os.lstat(os.path.join(dirpath, f)).st_nlink for f in files]
    return out


@pytest.fixture
def hist(tmp_path):
    with open_history(tmp_path) as h:
        yield h
        assert all(n == 1 for n in blob_links(h.store)), blob_links(h.store)


def big_history(h: History, rel=b"big.bin"):
    """A large file changed in turn 1 (8 bytes at offset 0); returns (e1, old, new)."""
    old = os.urandom(SIZE)
    with open(h.p(rel), "wb") as f:
        f.write(old)
    e1 = h.turn(1)
    new = b"changed!" + old[8:]
    h.write(rel, new)
    h.end_turn()
    return e1, old, new


def read(h, rel=b"big.bin") -> bytes:
    with open(h.p(rel), "rb") as f:
        return f.read()


# -- offline, with a stand-in fence -------------------------------------------------

def test_rewind_adopts_the_replaced_inode_and_redo_restores(hist):
    e1, old, new = big_history(hist)
    inode = os.stat(hist.p(b"big.bin")).st_ino
    fence = Fence()
    res = apply_plan(hist.fd, hist.store, hist.ws, plan_rewind(hist.fd, hist.store, hist.ws,
                     f"e{e1}"), session=None, writers=fence)
    assert res.failed == []
    assert read(hist) == old
    key, st = preimage_blob(hist.store, hist.ws, res.epoch, b"big.bin")
    assert st.st_ino == inode and st.st_nlink == 1          # adopted, now the store's only
    assert key == xxhash.xxh3_128(new).digest()
    assert fence.fenced == set() and fence.calls == [(st.st_dev, inode)]
    redo = apply_plan(hist.fd, hist.store, hist.ws, plan_redo(hist.fd, hist.store, hist.ws),
                      session=None, writers=fence)
    assert redo.failed == []
    assert read(hist) == new
    assert hist.store.read_blob(key) == new
    assert fence.fenced == set()


def test_without_a_fence_or_when_refused_the_preimage_is_a_copy(hist):
    e1, old, new = big_history(hist)
    inode = os.stat(hist.p(b"big.bin")).st_ino
    fence = Fence(allow=False)      # the daemon saw a writer
    plan = plan_rewind(hist.fd, hist.store, hist.ws, f"e{e1}")
    res = apply_plan(hist.fd, hist.store, hist.ws, plan, session=None, writers=fence)
    assert res.failed == [] and read(hist) == old
    _key, st = preimage_blob(hist.store, hist.ws, res.epoch, b"big.bin")
    assert st.st_ino != inode and fence.calls        # asked, refused, copied
    redo = apply_plan(hist.fd, hist.store, hist.ws, plan_redo(hist.fd, hist.store, hist.ws),
                      session=None)                     # writers=None: the offline CLI
    assert redo.failed == [] and read(hist) == new


def test_a_file_with_two_links_is_copied(hist):
    old = os.urandom(SIZE)
    with open(hist.p(b"big.bin"), "wb") as f:
        f.write(old)
    os.link(hist.p(b"big.bin"), hist.p(b"twin.bin"))
    e1 = hist.turn(1)
    hist.write(b"big.bin", b"changed!" + old[8:], also=[b"twin.bin"])
    hist.end_turn()
    inode = os.stat(hist.p(b"big.bin")).st_ino
    res = apply_plan(hist.fd, hist.store, hist.ws,
                     plan_rewind(hist.fd, hist.store, hist.ws, f"e{e1}"), session=None,
                     writers=Fence())
    assert res.failed == []
    assert read(hist) == old and read(hist, b"twin.bin") == old
    _key, st = preimage_blob(hist.store, hist.ws, res.epoch, b"big.bin")
    assert st.st_ino != inode


def test_store_on_another_filesystem_copies(tmp_path):
    from tmpfskit import small_tmpfs
    (tmp_path / "ws").mkdir()
    with small_tmpfs(tmp_path / "tmpfs", "64m") as mnt:
        store = Store.open(mnt / "store")
        h = History(store, tmp_path / "ws")
        try:
            e1, old, new = big_history(h)
            inode = os.stat(h.p(b"big.bin")).st_ino
            res = apply_plan(h.fd, store, h.ws, plan_rewind(h.fd, store, h.ws, f"e{e1}"),
                             session=None, writers=Fence())
            assert res.failed == [] and read(h) == old
            key, st = preimage_blob(store, h.ws, res.epoch, b"big.bin")
            assert st.st_ino != inode       # EXDEV: copied
            assert store.read_blob(key) == new
            redo = apply_plan(h.fd, store, h.ws, plan_redo(h.fd, store, h.ws), session=None,
                              writers=Fence())
            assert redo.failed == [] and read(h) == new
            assert_sound(store)
        finally:
            h.close()
            store.close()


def test_file_changed_after_planning_is_stored_under_its_real_key(hist):
    """The plan hashed one content; before the precapture the file changes (same size):
    the adopted blob's key is the hash of what the inode holds when linked."""
    e1, old, new = big_history(hist)
    plan = plan_rewind(hist.fd, hist.store, hist.ws, f"e{e1}")
    later = b"LATER!!!" + new[8:]
    with open(hist.p(b"big.bin"), "r+b") as f:         # same inode, same size
        f.write(later[:8])
    res = apply_plan(hist.fd, hist.store, hist.ws, plan, session=None, writers=Fence())
    assert res.failed == [] and read(hist) == old
    key, _st = preimage_blob(hist.store, hist.ws, res.epoch, b"big.bin")
    assert key == xxhash.xxh3_128(later).digest()
    assert hist.store.read_blob(key) == later


def test_store_adopts_what_the_inode_holds_after_the_link(tmp_path):
    """``put_adopted`` hashes the linked inode: a change between an earlier hash and
    the link cannot give the blob a wrong key."""
    store = Store.open(tmp_path / "store")
    try:
        src = tmp_path / "f"
        src.write_bytes(os.urandom(SIZE))
        tmp = store.adoption_path()
        os.link(src, tmp)
        with open(src, "r+b") as f:
            f.write(b"afterlnk")
        key, size = store.put_adopted(tmp)
        assert key == xxhash.xxh3_128(src.read_bytes()).digest() and size == SIZE
        os.unlink(src)
        assert store.read_blob(key)[:8] == b"afterlnk"
        assert not os.path.exists(tmp)
    finally:
        store.close()


def test_landing_failure_after_adopt_unshares_the_blob(hist):
    """The target blob is corrupt, so the restored file cannot land: the workspace
    keeps its file, and the store's adopted blob gets a private copy (a later write to
    the file must not change the stored pre-image)."""
    e1, old, new = big_history(hist)
    target = dict(hist.store.journal(hist.ws, e1))[b"big.bin"].blob
    with open(hist.store.blobs.file_path(target), "r+b") as f:
        f.write(bytes([old[0] ^ 0xFF]))    # a byte that surely differs (old is random)
    fence = Fence()
    res = apply_plan(hist.fd, hist.store, hist.ws,
                     plan_rewind(hist.fd, hist.store, hist.ws, f"e{e1}"), session=None,
                     writers=fence)
    assert [f.code for f in res.failed] == ["blob-corrupt"]
    assert read(hist) == new
    key, st = preimage_blob(hist.store, hist.ws, res.epoch, b"big.bin")
    assert st.st_nlink == 1 and st.st_ino != os.stat(hist.p(b"big.bin")).st_ino
    assert fence.fenced == set()
    with open(hist.p(b"big.bin"), "r+b") as f:
        f.write(b"scribble")
    assert hist.store.read_blob(key) == new
    # repair the target so the fixture's fsck passes on the rest
    with open(hist.store.blobs.file_path(target), "r+b") as f:
        f.write(old[:1])


CHILD = textwrap.dedent("""
    import os, sys
    from rewindfs.store import Store
    from rewindfs.overlay.rewind.engine import apply_plan, plan_rewind
    class Fence:
        def fence_writes(self, key): return True
        def unfence_writes(self, key): pass
    store_path, ws_path, point = sys.argv[1:4]
    store = Store.open(store_path)
    ws = store.workspace(os.fsencode(ws_path))
    fd = os.open(ws_path, os.O_RDONLY | os.O_DIRECTORY)
    plan = plan_rewind(fd, store, ws, point)
    sys.exit(apply_plan(fd, store, ws, plan, session=None, writers=Fence()).exit_code)
""")


def test_crash_between_adopt_and_landing_is_recovered(hist):
    """Killed after the restored file was staged but before it was renamed: the
    adopted blob still shares the workspace file's inode; ``recover`` lands the file
    and leaves the store with private blobs."""
    e1, old, new = big_history(hist)
    env = dict(os.environ, REWINDFS_FAULT_AFTER="1",
               PYTHONPATH=os.pathsep.join([REPO, os.path.join(REPO, "tests")]))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(hist.store.path),
                           hist.root, f"e{e1}"], env=env, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()
    assert read(hist) == new
    assert 2 in blob_links(hist.store)              # the adopted inode, still shared
    res = recover(hist.fd, hist.store, hist.ws)
    assert res is not None and res.failed == []
    assert read(hist) == old
    redo = apply_plan(hist.fd, hist.store, hist.ws, plan_redo(hist.fd, hist.store, hist.ws),
                      session=None)
    assert redo.failed == [] and read(hist) == new


# -- through a real mount ------------------------------------------------------------

pytest_mount = pytest.mark.mount


def _change_in_turn(m, ws, real_fd):
    """Turn 1 changes big.bin through the mount; return its new content and the inode
    (as seen in the bare directory) that now holds it."""
    m.call("turn.begin", session="s", turn=1, label="l")
    with open(ws / "big.bin", "r+b") as f:
        f.write(b"changed!")
    m.call("turn.end")
    return (ws / "big.bin").read_bytes(), os.stat(b"big.bin", dir_fd=real_fd).st_ino


def _mount_history(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    old = os.urandom(SIZE)
    (ws / "big.bin").write_bytes(old)
    return ws, old


@pytest_mount
def test_mount_rewind_and_redo_adopt(tmp_path):
    ws, old = _mount_history(tmp_path)
    real = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with mounted(ws, tmp_path / "store") as m:
            new, inode = _change_in_turn(m, ws, real)
            res = m.call("rewind", to="t1", session="s")
            assert res["failed"] == []
            assert (ws / "big.bin").read_bytes() == old
            with open(os.open(b"big.bin", os.O_RDONLY, dir_fd=real), "rb") as f:
                assert f.read() == old
            store = m.open_store()
            try:
                ws_id = store.workspace(os.fsencode(os.path.realpath(ws)))
                key, st = preimage_blob(store, ws_id, res["epoch"], b"big.bin")
                assert st.st_ino == inode and st.st_nlink == 1
                assert key == xxhash.xxh3_128(new).digest()
            finally:
                store.close()
            res = m.call("redo", session="s")
            assert res["failed"] == []
            assert (ws / "big.bin").read_bytes() == new
            # the file is writable again (no fence left behind)
            with open(ws / "big.bin", "r+b") as f:
                f.write(b"again!!!")
    finally:
        os.close(real)
    store = Store.open(tmp_path / "store")
    try:
        assert all(n == 1 for n in blob_links(store))
        assert_sound(store)
    finally:
        store.close()


@pytest_mount
def test_mount_open_writer_means_busy_then_copy(tmp_path):
    """A handle open for writing through the mount when the rewind begins: the rewind
    leaves that file alone (``busy``, exit 1: its writes, maybe still in the writeback
    cache, would go to whatever inode it is — DESIGN invariant 14), so a write through
    the handle afterwards is kept; the next rewind, once it is closed, lands it and
    its pre-image holds that write."""
    ws, old = _mount_history(tmp_path)
    real = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with mounted(ws, tmp_path / "store") as m:
            new, _inode = _change_in_turn(m, ws, real)
            writer = open(ws / "big.bin", "r+b")
            try:
                res = m.call("rewind", to="t1", session="s")
                assert [(f["path"], f["code"]) for f in res["failed"]] == [("big.bin", "busy")]
                assert res["exit_code"] == 1
                writer.write(b"LATEWRIT")
                writer.flush()
                os.fsync(writer.fileno())
            finally:
                writer.close()
            late = b"LATEWRIT" + new[8:]
            assert (ws / "big.bin").read_bytes() == late
            res = m.call("rewind", to="t1", session="s")
            assert res["failed"] == []
            assert (ws / "big.bin").read_bytes() == old
            store = m.open_store()
            try:
                ws_id = store.workspace(os.fsencode(os.path.realpath(ws)))
                key, _st = preimage_blob(store, ws_id, res["epoch"], b"big.bin")
                assert store.read_blob(key) == late
            finally:
                store.close()
            assert m.call("redo", session="s")["failed"] == []
            assert (ws / "big.bin").read_bytes() == late
    finally:
        os.close(real)
    store = Store.open(tmp_path / "store")
    try:
        assert_sound(store)
    finally:
        store.close()


# -- the daemon's fence, its handlers called in-process ------------------------------

def test_fence_refuses_new_writers_until_lifted(tmp_path):
    import errno
    from types import SimpleNamespace

    import pyfuse3
    import trio

    from rewindfs.overlay.fs.ops import RewindOperations

    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "f").write_bytes(b"content")
    key = (os.stat(ws / "f").st_dev, os.stat(ws / "f").st_ino)
    store = Store.open(tmp_path / "store")
    root_fd = os.open(ws, os.O_RDONLY | os.O_DIRECTORY)
    ops = RewindOperations(root_fd, store, store.workspace(os.fsencode(ws)))
    ctx = SimpleNamespace(uid=0, gid=0, pid=os.getpid(), umask=0o022)

    async def refused(coro):
        with pytest.raises(pyfuse3.FUSEError) as exc:
            await coro
        return exc.value.errno == errno.EBUSY

    async def main():
        ino = (await ops.lookup(pyfuse3.ROOT_INODE, b"f", ctx)).st_ino
        reader = await ops.open(ino, os.O_RDONLY, ctx)
        assert ops.fence_writes(key)                     # a reader does not count
        assert await refused(ops.open(ino, os.O_RDWR, ctx))
        assert await refused(ops.open(ino, os.O_WRONLY, ctx))
        assert await refused(ops.open(ino, os.O_RDONLY | os.O_TRUNC, ctx))
        assert await refused(ops.create(pyfuse3.ROOT_INODE, b"f", 0o644, os.O_WRONLY, ctx))
        attr = pyfuse3.EntryAttributes()
        attr.st_size = 0
        fields = SimpleNamespace(**{f"update_{n}": n == "size" for n in (
            "size", "mode", "uid", "gid", "atime", "mtime", "ctime")})
        assert await refused(ops.setattr(ino, attr, fields, None, ctx))
        second = await ops.open(ino, os.O_RDONLY, ctx)   # reading stays allowed
        ops.unfence_writes(key)
        writer = await ops.open(ino, os.O_RDWR, ctx)
        assert not ops.fence_writes(key)                 # a writable handle is open
        for fi in (reader, second, writer):
            await ops.release(fi.fh)
        assert ops.fence_writes(key)
        ops.unfence_writes(key)

    try:
        trio.run(main)
        assert (ws / "f").read_bytes() == b"content"
    finally:
        ops.close()
        os.close(root_fd)
        store.close()


def test_sampled_difference_and_full_hash_agree(hist):
    """Planning proves "written" from a sample when the start differs, hashes when the
    sample matches: a change in the middle is still found, an equal file is unchanged."""
    old = os.urandom(SIZE)
    for rel in (b"start", b"middle", b"same"):
        with open(hist.p(rel), "wb") as f:
            f.write(old)
    e1 = hist.turn(1)
    mid = SIZE // 2
    # flip the byte (not overwrite it with b"X": random data holds that byte 1 in 256)
    hist.write(b"start", bytes([old[0] ^ 0xFF]) + old[1:])
    hist.write(b"middle", old[:mid] + bytes([old[mid] ^ 0xFF]) + old[mid + 1:])
    hist.write(b"same", old)
    hist.end_turn()
    key = dict(hist.store.journal(hist.ws, e1))[b"start"].blob
    with open(hist.p(b"start"), "rb") as f:
        assert hist.store.blob_differs(key, f.fileno())
    with open(hist.p(b"middle"), "rb") as f:
        assert not hist.store.blob_differs(key, f.fileno())    # unknown: hash it
    plan = plan_rewind(hist.fd, hist.store, hist.ws, f"e{e1}")
    changes = {it.action.path: it.change for it in plan.items}
    assert changes == {b"start": "written", b"middle": "written", b"same": "meta"} or \
        changes == {b"start": "written", b"middle": "written", b"same": "unchanged"}
    res = apply_plan(hist.fd, hist.store, hist.ws, plan, session=None, writers=Fence())
    assert res.failed == []
    assert read(hist, b"start") == read(hist, b"middle") == read(hist, b"same") == old


def test_store_adopting_a_small_file_keeps_no_link(tmp_path):
    """A file that shrank to inline size before ``put_adopted`` is stored inline, and
    the store drops its temp name (the user's file must not keep an extra link)."""
    store = Store.open(tmp_path / "store")
    try:
        src = tmp_path / "f"
        src.write_bytes(b"small now")
        tmp = store.adoption_path()
        os.link(src, tmp)
        key, size = store.put_adopted(tmp)
        assert size == 9 and store.read_blob(key) == b"small now"
        assert not os.path.exists(tmp) and os.stat(src).st_nlink == 1
        assert_sound(store)
    finally:
        store.close()
